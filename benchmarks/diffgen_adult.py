"""DiffGen on Adult: classification accuracy BA / LA / CA (issue 5; paper: BA 85.3 %, LA 75.5 %,
BA - CA about 3 % at eps = 1, h = 10), and k-anonymity's information loss next to IPA's.

    python benchmarks/diffgen_adult.py [--runs 5] [--eps 1.0] [--h 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--eps", type=float, nargs="*", default=[1.0])
    parser.add_argument("--h", type=int, nargs="*", default=[10])
    args = parser.parse_args()

    from medrelease.data.config import find_config
    from medrelease.data.input_schema import validate_input
    from medrelease.evidence.classification import diffgen_heldout, split
    from medrelease.storage.io import read_input

    config = find_config("adult")
    frame = validate_input(read_input(config), config)
    train, test = split(frame, 0.3, seed=0)
    label = config.class_columns[0]
    print(f"Adult: {len(train):,} training / {len(test):,} test records, class {label!r}")
    print(f"{'eps':>5} {'h':>3} {'score':>8} {'BA %':>6} {'LA %':>6} {'CA %':>6} {'BA-CA':>6}"
          f" {'rows':>7}")
    for eps in args.eps:
        for h in args.h:
            for score in ("max", "infogain"):
                results = []
                for run in range(args.runs):
                    scores, out = diffgen_heldout(
                        train, test, config,
                        {"epsilon": eps, "specializations": h, "score": score}, seed=run)
                    results.append((scores, len(out.table)))
                ba = results[0][0].baseline * 100
                la = results[0][0].lower_bound * 100
                ca = statistics.mean(r.release for r, _ in results) * 100
                rows = statistics.mean(n for _, n in results)
                print(f"{eps:>5} {h:>3} {score:>8} {ba:6.1f} {la:6.1f} {ca:6.1f} {ba - ca:6.1f}"
                      f" {rows:7.0f}")


if __name__ == "__main__":
    main()
