"""Wall time of the commands that run nothing: ``--help``, ``release --help``, ``mechanisms``,
``ledger``, ``init`` and ``check``.

Each command runs in a fresh process, as a steward types it (the console entry point,
``deployments.entry:main``), ``--repeat`` times; the median and the fastest are printed.
``init`` drafts a config for the table in a temporary dataset root (``MEDRELEASE_DATASETS``)
and ``check`` then validates that config and the table. Issue 37 asks for ``check`` under 3 s on
a 26k-row table and the others within 1.5 s from a warm disk (none may start Prefect's server;
``tests/test_cli_fast.py`` checks that none imports Prefect); this prints, it asserts nothing.

    python benchmarks/cli_timing.py                       # Adult (30,162 rows), occupation
    python benchmarks/cli_timing.py --csv FILE --informative COLUMN
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ADULT = ROOT.parent / "shared" / "data" / "adult" / "adult.csv"
ENTRY = "import sys; from deployments.entry import main; sys.argv[0] = 'medrelease'; main()"


def timed(argv: list[str], env: dict[str, str], repeat: int) -> tuple[float, float, int]:
    """Median and fastest wall time of ``medrelease ARGV`` in fresh processes, and its code."""
    seconds, code = [], 0
    for _ in range(repeat):
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", ENTRY, *argv], env=env,
                              capture_output=True, text=True)
        seconds.append(time.perf_counter() - started)
        code = done.returncode
    return statistics.median(seconds), min(seconds), code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=ADULT)
    parser.add_argument("--informative", default="occupation")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="medrelease-cli-timing-") as scratch:
        root = Path(scratch) / "datasets"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "MEDRELEASE_DATASETS": str(root),
               "MEDRELEASE_HOME": str(Path(scratch) / "home"), "COLUMNS": "160"}
        rows = sum(1 for _ in args.csv.open(encoding="utf-8")) - 1
        print(f"{args.csv.name}: {rows:,} rows; {args.repeat} fresh process(es) each; "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} core(s)")
        for label, argv in (
            ("medrelease --help", ["--help"]),
            ("medrelease release --help", ["release", "--help"]),
            ("medrelease mechanisms", ["mechanisms"]),
            ("medrelease ledger", ["ledger"]),
            ("medrelease ledger verify", ["ledger", "verify"]),
            ("medrelease init", None),
            ("medrelease check", ["check", "timed"]),
        ):
            if argv is None:  # init writes: a fresh name per run
                names = [f"timed{i}" for i in range(args.repeat)]
                runs = [timed(["init", str(args.csv), "--name", n, "--root", str(root),
                               "--informative", args.informative], env, 1) for n in names]
                timed(["init", str(args.csv), "--name", "timed", "--root", str(root),
                       "--informative", args.informative], env, 1)
                median = statistics.median(r[0] for r in runs)
                best, code = min(r[1] for r in runs), max(r[2] for r in runs)
            else:
                median, best, code = timed(argv, env, args.repeat)
            print(f"  {label:<28} median {median:5.2f} s   fastest {best:5.2f} s   exit {code}")


if __name__ == "__main__":
    main()
