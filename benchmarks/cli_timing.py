"""Wall time of the commands that run nothing: ``--help``, ``release --help``, ``mechanisms``,
``ledger``, ``init`` and ``check``; then ``init``, ``check`` and ``release`` on two generated
tables (issue 55): a 20-column, 20,000-row survey with nine continuous columns (released with
its default mechanism, ``aim``) and an 8,000-row, 11-column cohort (``ipa`` and ``aim``).

Each command runs in a fresh process, as a steward types it (the console entry point,
``deployments.entry:main``), ``--repeat`` times; the median and the fastest are printed.
``init`` drafts a config for the table in a temporary dataset root (``MEDRELEASE_DATASETS``)
and ``check`` then validates that config and the table. Issue 37 asks for ``check`` under 3 s on
a 26k-row table and the others within 1.5 s from a warm disk (none may start Prefect's server;
``tests/unit/test_cli_fast.py`` checks that none imports Prefect); this prints, it asserts nothing.

    python benchmarks/cli_timing.py                       # Adult (30,162 rows), occupation
    python benchmarks/cli_timing.py --csv FILE --informative COLUMN
    python benchmarks/cli_timing.py --generated-only      # the two generated tables only

A release is a TEST release (``--seed 1``) in the scratch home, through the Prefect flow with
its ephemeral API, as ``medrelease release`` runs it; its time includes Prefect's start-up.
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


def generated_tables(repeat: int) -> None:
    """init, check and release on the issue's two generated shapes, each command in a fresh
    process (``medrelease.data.shapes``): a release with no edit of what init drafted."""
    from medrelease.data.shapes import cohort_table, wide_survey

    with tempfile.TemporaryDirectory(prefix="medrelease-cli-timing-") as scratch:
        root = Path(scratch) / "datasets"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "MEDRELEASE_DATASETS": str(root),
               "MEDRELEASE_HOME": str(Path(scratch) / "home"), "COLUMNS": "160"}
        for name, table, mechanisms in (
                ("survey", wide_survey(20_000, 20, 9), [None]),
                ("cohort", cohort_table(8_000, 11), ["ipa", None])):
            csv = table.write(Path(scratch) / f"{name}.csv")
            print(f"{name}: {len(table.frame):,} rows, {len(table.frame.columns)} columns "
                  f"({table.shape}); load average {os.getloadavg()[0]:.1f}")
            runs = [timed(["init", str(csv), "--name", f"{name}{i}", "--root", str(root),
                           "--informative", table.informative], env, 1) for i in range(repeat)]
            print(f"  {'medrelease init':<34} median {statistics.median(r[0] for r in runs):6.2f}"
                  f" s   exit {max(r[2] for r in runs)}")
            median, _, code = timed(["check", f"{name}0"], env, repeat)
            print(f"  {'medrelease check':<34} median {median:6.2f} s   exit {code}")
            for mechanism in mechanisms:
                argv = ["release", f"{name}0", "--seed", "1",
                        *(["--mechanism", mechanism] if mechanism else [])]
                started = time.perf_counter()
                done = subprocess.run([sys.executable, "-c", ENTRY, *argv], env=env,
                                      capture_output=True, text=True)
                seconds = time.perf_counter() - started
                used = mechanism or "default (" + ("aim" if "aim" in done.stdout else "?") + ")"
                refused = "Refusing to publish event" in done.stdout + done.stderr
                print(f"  {'medrelease release ' + used:<34} {seconds:6.2f} s   exit "
                      f"{done.returncode}{'   (Prefect refused an event)' if refused else ''}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=ADULT)
    parser.add_argument("--informative", default="occupation")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--generated-only", action="store_true",
                        help="only the two generated tables of issue 55")
    args = parser.parse_args()
    if not args.generated_only and args.csv.is_file():
        commands(args)
    generated_tables(args.repeat)


def commands(args: argparse.Namespace) -> None:
    """The commands that run nothing, and init/check on ``args.csv``."""
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
