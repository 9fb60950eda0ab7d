"""Scale benchmark: NPS-like extracts of millions of rows through the release flow, on the thread
runner and on the Dask runner; prints wall time and peak memory (issue 7).

Each extract is written once (in 1M-row chunks) under ``var/bench/``. Every (rows, runner) pair
runs the whole flow (streamed validation + aggregation, budget, fan-out, selection, checks,
publish; no evaluation) in a fresh child process; the parent samples the resident memory of the
child and all its descendants (Dask's worker processes) every 0.2 s and reports the peak sum.

    python benchmarks/scale_bench.py [--rows 1400000 10000000 30000000] [--runners thread dask]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
CHUNK = 1_000_000
# "dask-files": the extract as one file per million rows, each read and aggregated on a worker.
RUNNERS = {"thread": "thread", "dask": "dask", "dask-files": "dask"}


def write_extract(rows: int, folder: Path, parts: bool = False) -> Path:
    """The NPS-like extract of ``rows`` rows, generated in 1M-row chunks so memory stays small:
    one CSV file, or (``parts``) one file per chunk in a folder, named by a pattern."""
    from medrelease.data.nps import generate_nps

    folder.mkdir(parents=True, exist_ok=True)
    if parts:
        whole = write_extract(rows, folder)
        target = folder / f"nps_{rows}_parts"
        if not target.exists():
            partial = folder / f".{target.name}.partial"
            partial.mkdir(exist_ok=True)
            with whole.open(encoding="utf-8") as source:
                header = source.readline()
                for number, chunk in enumerate(iter(lambda: source.readlines(CHUNK * 40), [])):
                    (partial / f"part-{number:03d}.csv").write_text(header + "".join(chunk))
            partial.replace(target)
        return target / "part-*.csv"
    target = folder / f"nps_{rows}.csv"
    if target.exists():
        return target
    partial = folder / f".{target.name}.partial"
    with partial.open("w", encoding="utf-8") as handle:
        for start in range(0, rows, CHUNK):
            part = generate_nps(min(CHUNK, rows - start), seed=1000 + start // CHUNK,
                                start_id=start)
            part.to_csv(handle, index=False, header=start == 0)
    partial.replace(target)
    return target


def child(rows: int, runner: str, extract: str, config_path: str) -> None:
    from flows.release import ReleaseRequest, release_flow

    started = time.perf_counter()
    # ipa named: the figures in docs/results are ipa's (the sample's default is now aim)
    result = release_flow(ReleaseRequest(dataset=config_path, input_path=extract, seed=1,
                                         mechanism="ipa", task_runner=RUNNERS[runner],
                                         evaluate=False))
    print("RESULT " + json.dumps({"wall": time.perf_counter() - started,
                                  "released_rows": result["manifest"]["released_rows"],
                                  "input_rows": result["record"]["input_rows"]}), flush=True)


def tree_rss(process) -> tuple[int, int]:
    """(resident memory of the process and all its descendants, of the process alone)."""
    import psutil

    total, own = 0, 0
    for p in [process, *process.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            rss = p.memory_info().rss
            total += rss
            own = rss if p is process else own
    return total, own


def measure(rows: int, runner: str, extract: Path, config: Path, env: dict) -> dict:
    import psutil

    started = time.perf_counter()
    log = ROOT / "var" / "bench" / f"child-{rows}-{runner}.log"
    proc = subprocess.Popen([sys.executable, __file__, "--child", "--rows", str(rows),
                             "--runners", runner, "--extract", str(extract),
                             "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=log.open("w"), text=True, env=env)
    handle, peak, peak_own, peak_at = psutil.Process(proc.pid), 0, 0, ""
    while proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            total, own = tree_rss(handle)
            if total > peak:  # when, to read against the task times in the child's log
                peak, peak_own, peak_at = total, own, time.strftime("%H:%M:%S")
        time.sleep(0.2)
    wall = time.perf_counter() - started
    out = proc.stdout.read() if proc.stdout else ""
    line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        last = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        return {"rows": rows, "runner": runner,
                "error": f"exit {proc.returncode}: {last[0][:200]} (see {log})"}
    result = json.loads(line[len("RESULT "):])
    return {"rows": rows, "runner": runner, "flow_wall_s": result["wall"],
            "process_wall_s": wall, "peak_rss_gb": peak / 1e9,
            "peak_flow_process_gb": peak_own / 1e9, "peak_at": peak_at,
            "released_rows": result["released_rows"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="*", default=[1_400_000, 10_000_000,
                                                                 30_000_000])
    parser.add_argument("--runners", nargs="*", default=list(RUNNERS), choices=list(RUNNERS))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--extract", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args()
    bench = ROOT / "var" / "bench"
    if args.child:
        child(args.rows[0], args.runners[0], args.extract, args.config)
        return
    from flow_bench import write_config

    env = {**os.environ, "MEDRELEASE_HOME": str(bench / "home"),
           "PREFECT_HOME": str(bench / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "DO_NOT_TRACK": "1", "PREFECT_LOGGING_TO_API_ENABLED": "false",
           "MEDRELEASE_DATASETS": str(bench)}
    print(f"{'rows':>12} {'runner':>10} {'flow wall s':>12} {'process s':>10} {'peak GB':>8}"
          f" {'rows out':>10}  {'flow process GB at peak':>23} {'peak at':>8}", flush=True)
    for rows in args.rows:
        for runner in args.runners:
            extract = write_extract(rows, bench, parts=runner == "dask-files")
            config = write_config(extract, bench)
            r = measure(rows, runner, extract, config, env)
            if "error" in r:
                print(f"{rows:>12,} {runner:>10} failed: {r['error']}", flush=True)
                continue
            print(f"{rows:>12,} {runner:>10} {r['flow_wall_s']:12.1f} {r['process_wall_s']:10.1f}"
                  f" {r['peak_rss_gb']:8.2f} {r['released_rows']:>10,}"
                  f"  {r['peak_flow_process_gb']:23.2f} {r['peak_at']:>8}", flush=True)


if __name__ == "__main__":
    main()
