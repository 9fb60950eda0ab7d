"""Ledger throughput: reserve + finalize (mark released) per second, SQLite and PostgreSQL, with
1, 4 and 16 concurrent clients (each a process, as releases on several hosts would be).

    python benchmarks/ledger_bench.py [--seconds 6] [--clients 1 4 16] [--prefill 0]

Every configuration starts on a new ledger (a new SQLite file; a new database made by
``ledger init-db`` in a throw-away PostgreSQL cluster, reached as the service role) with
``--prefill`` spends already in it, then all clients charge one source for ``--seconds``. A
charge checks the whole ledger against its journal first (``verify``), so its cost grows with
the ledger: the line says how many spends the ledger held at the end. Prints one line per
configuration and a Markdown table (docs/results/ledger.md).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from medrelease.privacy.ledger import SpendRequest
from medrelease.privacy.ledger_backends import open_ledger


def _request(number: int) -> SpendRequest:
    return SpendRequest(source="bench", dataset="bench", mechanism="ipa", epsilon=1e-4,
                        delta=0.0, lifetime_epsilon=100.0, lifetime_delta=1e-5,
                        flow_run_id=f"run-{os.getpid()}-{number}", privacy_unit="row")


def _client(location: str, seconds: float, start, counts) -> None:
    ledger = open_ledger(location)
    start.wait()
    deadline = time.perf_counter() + seconds
    done = 0
    while time.perf_counter() < deadline:
        spend = ledger.reserve(_request(done))
        ledger.mark(spend, "released", release_id=f"r-{os.getpid()}-{done}")
        done += 1
    counts.put(done)


def measure(location: str, clients: int, seconds: float, prefill: int) -> tuple[float, int]:
    """(charges per second, spends in the ledger at the end)."""
    ledger = open_ledger(location)
    for number in range(prefill):
        ledger.mark(ledger.reserve(_request(number)), "released", release_id=f"p-{number}")
    context = mp.get_context("spawn")
    start, counts = context.Event(), context.Queue()
    procs = [context.Process(target=_client, args=(location, seconds, start, counts))
             for _ in range(clients)]
    for proc in procs:
        proc.start()
    time.sleep(2.0)  # every client imported and connected before the clock starts
    began = time.perf_counter()
    start.set()
    total = sum(counts.get(timeout=seconds + 600) for _ in procs)
    elapsed = time.perf_counter() - began
    for proc in procs:
        proc.join(timeout=60)
    return total / elapsed, len(ledger.spends())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--prefill", type=int, default=0,
                        help="spends in the ledger before the clock starts")
    args = parser.parse_args()

    from deployments.local_postgres import running_cluster

    rows = []
    with tempfile.TemporaryDirectory() as folder, running_cluster() as cluster:
        os.environ["MEDRELEASE_HOME"] = folder  # the PostgreSQL ledger's head file
        for backend in ("sqlite", "postgresql"):
            for clients in args.clients:
                if backend == "sqlite":
                    location = str(Path(folder) / f"ledger-{clients}.sqlite")
                else:
                    location = cluster.url(cluster.fresh_database(), "medrelease_service")
                rate, spends = measure(location, clients, args.seconds, args.prefill)
                rows.append((backend, clients, rate, spends))
                print(f"{backend:10s} clients={clients:2d}  {rate:7.1f} reserve+finalize/s  "
                      f"(ledger at the end: {spends} spends)", flush=True)
    print(f"\n{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, {args.seconds:g} s "
          f"per configuration, prefill {args.prefill}\n")
    print("| back-end | clients | reserve+finalize per s | spends at the end |")
    print("|---|---|---|---|")
    for backend, clients, rate, spends in rows:
        print(f"| {backend} | {clients} | {rate:.1f} | {spends} |")


if __name__ == "__main__":
    main()
