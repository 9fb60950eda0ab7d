"""Coverage of the published 95 % intervals (``intervals.csv``), measured: do they hold as often
as they say?

Every DP release publishes ``intervals.csv`` beside its data: one row per estimate a
researcher reads (``count``: a released cell; ``total``: a value's total; ``marginal``: a cell
of a declared analysis or of a 1-way marginal, aim), computed from DP outputs and public
parameters only. This script releases the same table many times per mechanism through the
engine's own functions (``medrelease/evidence/coverage.py``) and counts how often a row holds
the input's true value: per estimate (each row), and simultaneous (every row of a family —
the informative column's totals, one declared analysis — at once).

Tables: Adult (``adult-ipa``; DiffGen on ``adult``), the NPS-like sample (``nps-sample``), the
planted-threshold table (320 classes x (1,000 rows of C + 25 rows of P, the threshold at eps
1): selection bites) and the NPS-like generator with repeat admissions and a privacy unit of
one admission per patient (``nps-unit``: the intervals claim the bounded table; the same rows
against the whole input show the bias the unit cut's published count measures).

Target (issue 54): per-estimate 93-97 % per mechanism and kind, simultaneous at least 95 %.

    python benchmarks/coverage.py                                    # every table, 100 runs
    python benchmarks/coverage.py --runs 20 --mechanisms ipa --tables planted
    python benchmarks/coverage.py --write docs/results/coverage-table.md
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from medrelease.data.aggregate import aggregate  # noqa: E402
from medrelease.data.config import find_config, load_config  # noqa: E402
from medrelease.evidence.coverage import (  # noqa: E402
    RUNNERS,
    Table,
    Tally,
    unit_config,
    write_planted_dataset,
)

TABLES = ("adult", "nps", "planted", "nps-unit")
MECHANISMS = ("ipa", "histogram", "diffgen", "aim")
SKIP = {("nps", "diffgen"), ("planted", "diffgen"), ("nps-unit", "diffgen")}  # no class column


def _read(config):
    from medrelease.data.input_schema import validate_input
    from medrelease.storage.io import read_input

    return validate_input(read_input(config), config)


def load(name: str, scratch: Path) -> Table:
    """One benchmark table (the configs, rows and count table)."""
    if name == "adult":
        config, classes = find_config("adult-ipa"), find_config("adult")
        frame = _read(config)
        return Table(name, config, aggregate(frame, config), frame, classes, _read(classes))
    if name == "nps":
        config = find_config("nps-sample")
        frame = _read(config)
        return Table(name, config, aggregate(frame, config), frame, None)
    if name == "planted":
        config = load_config(write_planted_dataset(scratch / "planted"))
        frame = _read(config)
        return Table(name, config, aggregate(frame, config), frame, None)
    if name == "nps-unit":
        from medrelease.data.nps import generate_nps

        config = unit_config(find_config("nps-sample"), "patient_id", 1)
        frame = generate_nps(20_000, seed=2020, repeat_admissions=True)
        frame = frame.astype({c: str for c in frame.columns if c != "patient_id"})
        return Table(name, config, aggregate(frame, config), frame, None)
    raise ValueError(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--aim-runs", type=int, default=None,
                        help="runs of aim (default: --runs)")
    parser.add_argument("--eps", type=float, nargs="+", default=[1.0])
    parser.add_argument("--tables", nargs="+", default=list(TABLES), choices=list(TABLES))
    parser.add_argument("--mechanisms", nargs="+", default=list(MECHANISMS),
                        choices=list(MECHANISMS))
    parser.add_argument("--write", type=Path, default=None, help="also write a Markdown table")
    args = parser.parse_args()
    rows = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.tables:
            table = load(name, Path(scratch))
            for mechanism in args.mechanisms:
                if (name, mechanism) in SKIP:
                    continue
                runs = args.aim_runs if mechanism == "aim" and args.aim_runs else args.runs
                for epsilon in args.eps:
                    tally = Tally()
                    took = time.perf_counter()
                    for run in range(runs):
                        tally.merge(RUNNERS[mechanism](table, epsilon, 1000 * run + 17))
                    seconds = time.perf_counter() - took
                    for kind in sorted(tally.stated):
                        share = tally.held[kind] / tally.stated[kind]
                        width = np.mean(tally.widths.get(kind, [np.nan]))
                        rows.append({"mechanism": mechanism, "table": name, "eps": epsilon,
                                     "runs": runs, "statement": kind,
                                     "checked": tally.stated[kind],
                                     "coverage %": round(100 * share, 1),
                                     "mean width": round(float(width), 1),
                                     "seconds": round(seconds, 1)})
                        print(f"{mechanism:9s} {name:8s} eps {epsilon:<4g} runs {runs:3d}  "
                              f"{kind:44s} {tally.stated[kind]:9d} checked  coverage "
                              f"{100 * share:5.1f} %  mean width {width:9.1f}  "
                              f"({seconds:.0f} s)", flush=True)
    frame = pd.DataFrame(rows)
    total = time.perf_counter() - started
    print(f"\ntotal {total:.0f} s")
    if args.write is not None:
        args.write.write_text(
            f"`python benchmarks/coverage.py {' '.join(sys.argv[1:])}` "
            f"({datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {total:.0f} s)\n\n"
            + markdown_table(frame) + "\n")


def markdown_table(frame: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |"
              for row in frame.itertuples(index=False)]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
