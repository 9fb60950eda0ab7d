"""DiffGen on the MIMIC-III demo joined per admission (the paper's MIMIC experiment, issue 5).

Seven categorical predictors plus the set of ICD-9 codes, class in-hospital death; two thirds of
the admissions train, one third tests, as in the paper (h = 5, eps in 0.1 ... 1). The demo has
129 admissions, so the numbers are noisy and far from the paper's 36,000 episodes.

    python benchmarks/diffgen_mimic.py [--runs 10] [--eps 0.1 0.25 0.5 1] [--h 5]
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
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--eps", type=float, nargs="*", default=[0.1, 0.25, 0.5, 1.0])
    parser.add_argument("--h", type=int, nargs="*", default=[5])
    parser.add_argument("--source", default=str(ROOT.parent / "shared/data/mimic-iii-demo"))
    args = parser.parse_args()

    from medrelease.data.config import find_config
    from medrelease.data.input_schema import validate_input
    from medrelease.data.mimic import admissions_table
    from medrelease.evidence.classification import diffgen_heldout, split

    config = find_config("mimic-demo")
    frame = validate_input(admissions_table(args.source), config)
    train, test = split(frame, 1 / 3, seed=0)
    label = config.class_columns[0]
    print(f"MIMIC-III demo: {len(train)} training / {len(test)} test admissions, class {label!r}")
    print(f"{'eps':>5} {'h':>3} {'score':>8} {'BA %':>6} {'LA %':>6} {'CA %':>6} {'sd':>5}"
          f" {'set splits':>10} {'kept':>5} {'rows':>5}")
    for eps in args.eps:
        for h in args.h:
            for score in ("max", "infogain"):
                results, set_splits, kept, rows = [], [], [], []
                for run in range(args.runs):
                    scores, out = diffgen_heldout(
                        train, test, config,
                        {"epsilon": eps, "specializations": h, "score": score}, seed=run)
                    results.append(scores)
                    steps = out.details["set_specializations"]
                    set_splits.append(len(steps))
                    kept.append(sum(s["children_kept"] for s in steps))
                    rows.append(len(out.table))
                ca = [r.release * 100 for r in results]
                print(f"{eps:>5} {h:>3} {score:>8} {results[0].baseline * 100:6.1f}"
                      f" {results[0].lower_bound * 100:6.1f} {statistics.mean(ca):6.1f}"
                      f" {statistics.pstdev(ca):5.1f} {statistics.mean(set_splits):10.1f}"
                      f" {statistics.mean(kept):5.1f} {statistics.mean(rows):5.0f}")


if __name__ == "__main__":
    main()
