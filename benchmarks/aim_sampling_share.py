"""How much of ``aim``'s workload error is the sampling of rows, and how much the model.

Runs ``aim``'s rounds once per seed, then releases from the same state twice: rows as many as
the noisy total (what ``aim`` publishes) and 20x as many (nearly the model's own marginals:
sampling noise shrinks with the rows). The gap between the two is what a better sampler could
win at most; the second column against the reference AIM is what the model itself is worth.

    python benchmarks/aim_sampling_share.py --table adult --eps 1
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    from benchmarks.aim_tables import table_parser

    parser = table_parser(__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1000, 1001, 1002])
    parser.add_argument("--scale", type=int, default=20, help="rows x this for the second")
    args = parser.parse_args()

    from benchmarks.aim_tables import load_counts
    from medrelease.evidence.workload import workload_error
    from medrelease.plan import PublicFacts
    from medrelease.release import plan_release
    from medrelease.synthetic import aim_rounds, pgm
    from medrelease.synthetic import release as synthetic

    config, counts = load_counts(args.table, args.rows)
    sample, synthesize = pgm.sample, aim_rounds.AIMRounds.synthesize
    errors: dict[int, list[tuple[float, float]]] = {1: [], args.scale: []}
    for seed in args.seeds:
        plan = plan_release("aim", {"epsilon": args.eps}, 0, seed, PublicFacts.of(config))
        run = synthetic.aim_rounds(counts, config, plan)
        run.run()
        for scale in errors:
            # the same final fit and sampler seed; only the number of rows drawn differs
            pgm.sample = lambda model, rows, s, k=scale: sample(model, rows * k, s)
            aim_rounds.AIMRounds.synthesize = lambda self, s: (
                (codes := synthesize(self, s)[0]), len(next(iter(codes.values()))))
            try:
                again = copy.copy(run)
                again.rng = copy.deepcopy(run.rng)
                rows = synthetic.synthetic_release(again, counts, plan).rows.to_frame()
            finally:
                pgm.sample, aim_rounds.AIMRounds.synthesize = sample, synthesize
            error = workload_error(counts, rows)
            errors[scale].append((error.mean_two_way, error.mean_three_way))
        print(f"seed {seed}: " + ", ".join(
            f"rows x{k}: {e[-1][0]:.4f} / {e[-1][1]:.4f}" for k, e in errors.items()), flush=True)
    for scale, values in errors.items():
        mean = np.array(values).mean(axis=0)
        print(f"{args.table}, eps {args.eps:g}, rows x{scale}: mean TVD 2-way {mean[0]:.4f} / "
              f"3-way {mean[1]:.4f}")


if __name__ == "__main__":
    main()
