"""Coverage of the published 95 % intervals, measured: do they hold as often as they say?

Every release publishes error bars computed from its DP outputs and public parameters alone
(``error_bars`` in the manifest; EVALUATION.md, "Intervals are tested, not trusted"). This
script releases the same table many times per mechanism and eps, and counts how often a stated
interval holds the input's true value:

* ``ipa``: every published (class, value) cell — its count's selective interval (given that it
  passed its threshold) against the rows it stands for; and every informative value's total —
  the sum of its cells' noise plus what the pool's threshold may remove — against the input's
  count of that value;
* ``histogram``: every cell of the node's domain (released or 0) and every value's total over
  the node's classes, against the input's counts;
* ``diffgen``: every leaf partition x class count, against the input's rows generalized to the
  release's cut;
* ``aim``: every workload marginal's TVD bound (and every measured marginal's, at its levels),
  against the TVD between the input and the released rows.

Target (issue 35): 93-97 % per mechanism for the count intervals; aim's bounds (a union of
high-probability events, conservative by construction) at least 93 %. Engine calls, no Prefect:
the intervals are the mechanism's, the flow adds nothing to them.

    python benchmarks/coverage.py                                  # 100 runs, eps 0.5 and 1
    python benchmarks/coverage.py --runs 20 --mechanisms ipa histogram --tables nps
    python benchmarks/coverage.py --write docs/results/coverage.md
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from medrelease.data.aggregate import aggregate  # noqa: E402
from medrelease.data.config import find_config  # noqa: E402
from medrelease.evidence.coverage import RUNNERS, Table, Tally  # noqa: E402

TABLES = {"adult": ("adult-ipa", "adult"), "nps": ("nps-sample", None)}  # (counts, class) configs
MECHANISMS = ("ipa", "histogram", "diffgen", "aim")


def load(name: str) -> Table:
    from medrelease.storage.io import read_input
    from schemas.input import validate_input

    counts_name, class_name = TABLES[name]
    config = find_config(counts_name)
    frame = validate_input(read_input(config), config)
    class_config = find_config(class_name) if class_name else None
    class_frame = (validate_input(read_input(class_config), class_config) if class_config
                   else None)
    return Table(name, config, aggregate(frame, config), frame, class_config, class_frame)


# -- main ----------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--aim-runs", type=int, default=None,
                        help="runs of aim (default: --runs); each takes 10-100 s")
    parser.add_argument("--eps", type=float, nargs="+", default=[0.5, 1.0])
    parser.add_argument("--tables", nargs="+", default=list(TABLES), choices=list(TABLES))
    parser.add_argument("--mechanisms", nargs="+", default=list(MECHANISMS),
                        choices=list(MECHANISMS))
    parser.add_argument("--write", type=Path, default=None, help="also write a Markdown table")
    args = parser.parse_args()
    rows = []
    started = time.perf_counter()
    for name in args.tables:
        table = load(name)
        for mechanism in args.mechanisms:
            if mechanism == "diffgen" and table.class_config is None:
                print(f"{name}: diffgen needs a class column; the NPS-like table has none")
                continue
            runs = args.aim_runs if mechanism == "aim" and args.aim_runs else args.runs
            for epsilon in args.eps:
                tally = Tally()
                took = time.perf_counter()
                for run in range(runs):
                    tally.merge(RUNNERS[mechanism](table, epsilon, 1000 * run + 17))
                seconds = time.perf_counter() - took
                for kind in tally.stated:
                    share = tally.held[kind] / tally.stated[kind]
                    width = np.mean(tally.widths.get(kind, [np.nan]))
                    rows.append({"mechanism": mechanism, "table": name, "eps": epsilon,
                                 "runs": runs, "statement": kind,
                                 "intervals": tally.stated[kind],
                                 "coverage %": round(100 * share, 1),
                                 "mean width": round(float(width), 3),
                                 "seconds": round(seconds, 1)})
                    print(f"{mechanism:9s} {name:5s} eps {epsilon:<4g} runs {runs:3d}  "
                          f"{kind:40s} {tally.stated[kind]:8d} intervals  coverage "
                          f"{100 * share:5.1f} %  mean width {width:9.3f}  ({seconds:.0f} s)",
                          flush=True)
    frame = pd.DataFrame(rows)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    if args.write is not None:
        args.write.write_text(
            f"# Coverage of the published 95 % intervals\n\n"
            f"`python benchmarks/coverage.py {' '.join(sys.argv[1:])}` "
            f"({datetime.now(UTC):%Y-%m-%d %H:%M} UTC, this machine)\n\n"
            + markdown_table(frame) + "\n")


def markdown_table(frame: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |"
              for row in frame.itertuples(index=False)]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
