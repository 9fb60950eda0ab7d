"""``aim``'s estimator settings side by side: error (workload TVD) and time per setting and seed.

Each setting is a name, mirror descent's step growth, whether a warm start carries the step
size, and aim parameters; every setting runs the same seeds in this process, one after the
other (nothing is compiled: the estimator is numpy), and prints each run and the mean.

    python benchmarks/aim_settings.py --table adult --eps 1 --seeds 1000 1001 1002
    python benchmarks/aim_settings.py --table adult --exp-dtype float64 --settings 'defaults:1.05:1:{}'
    python benchmarks/aim_settings.py --table nps --rows 1361000 --settings \\
        'mbi-steps:1.01:0:{"iters":500,"final_iters":1000}' 'ours:1.05:1:{}'

The defaults compare mbi's step rule at the old defaults (500 steps a round, 1,000 final) with
the current ones (docs/results/aim.md, "Fits that converge").
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_SETTINGS = [
    'mbi-steps, 500/1000:1.01:0:{"iters":500,"final_iters":1000}',
    'carried 5% steps, 500/1000:1.05:1:{"iters":500,"final_iters":1000}',
    'carried 5% steps, 200/300:1.05:1:{"iters":200,"final_iters":300}',
    "carried 5% steps, 100/300 (defaults):1.05:1:{}",
]


def parse(setting: str) -> tuple[str, float, bool, dict]:
    name, growth, carry, params = setting.split(":", 3)
    return name, float(growth), bool(int(carry)), json.loads(params)


def main() -> None:
    from benchmarks.aim_tables import table_parser

    parser = table_parser(__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1000, 1001, 1002])
    parser.add_argument("--settings", nargs="+", default=DEFAULT_SETTINGS,
                        help="name:step growth:carry (0/1):aim params as JSON")
    parser.add_argument("--exp-dtype", choices=["float32", "float64"], default="float32",
                        help="the calibration's exponentials (pgm.EXP_DTYPE; float32 is aim's)")
    args = parser.parse_args()

    from benchmarks.aim_tables import load_counts
    from medrelease.evidence.workload import workload_error
    from medrelease.plan import PublicFacts
    from medrelease.release import plan_release
    from medrelease.synthetic import pgm
    from medrelease.synthetic import release as synthetic

    config, counts = load_counts(args.table, args.rows)
    pgm.EXP_DTYPE = np.dtype(args.exp_dtype).type
    print(f"table {args.table} ({counts.n_rows:,} rows), eps {args.eps:g}, seeds {args.seeds}, "
          f"exponentials in {args.exp_dtype}", flush=True)
    for name, growth, carry, params in map(parse, args.settings):
        pgm.STEP_GROWTH, pgm.CARRY_STEP = growth, carry
        runs = []
        for seed in args.seeds:
            plan = plan_release("aim", {"epsilon": args.eps, **params}, 0, seed,
                                PublicFacts.of(config))
            started, cpu = time.perf_counter(), time.process_time()
            run = synthetic.aim_rounds(counts, config, plan)
            run.run()
            result = synthetic.synthetic_release(run, counts, plan)
            wall, cpu = time.perf_counter() - started, time.process_time() - cpu
            error = workload_error(counts, result.rows.to_frame())
            runs.append((error.mean_two_way, error.mean_three_way, wall, cpu,
                         len(run.state.records)))
            print(f"  {name}, seed {seed}: TVD {error.mean_two_way:.4f} / "
                  f"{error.mean_three_way:.4f}, {wall:.1f} s wall, {cpu:.1f} s CPU, "
                  f"{len(run.state.records)} rounds", flush=True)
        a = np.array(runs)
        print(f"{name}: mean TVD {a[:, 0].mean():.4f} / {a[:, 1].mean():.4f}, "
              f"{a[:, 2].mean():.1f} s wall, {a[:, 3].mean():.1f} s CPU, "
              f"{a[:, 4].mean():.1f} rounds", flush=True)


if __name__ == "__main__":
    main()
