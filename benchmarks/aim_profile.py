"""Where a fresh-process ``aim`` release spends its time (``docs/results/aim.md``).

Runs one release of ``aim`` with its defaults in THIS process (run it fresh: nothing compiled
yet, as a served run) and prints the wall time split into: mirror descent (``pgm.estimate``),
scoring (``AIMRounds.score``), sampling (``pgm.sample``), the rest; the rounds run and the error
(workload TVD) so that a speed change can be checked not to move it. (Before ``aim`` ran its own
numpy estimator it also split out jax's compilation: docs/results/aim.md.)

    python benchmarks/aim_profile.py --table adult --eps 1 --seed 1000
    python benchmarks/aim_profile.py --table nps --rows 1361000 --eps 1
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SPENT: dict[str, float] = defaultdict(float)
CPU: dict[str, float] = defaultdict(float)  # process CPU time (all threads) in the same spans
CALLS: dict[str, int] = defaultdict(int)


def timed(owner: object, name: str, label: str) -> None:
    """Wrap ``owner.name`` so its wall time adds to ``SPENT[label]`` (outermost call only)."""
    inner = getattr(owner, name)
    active = [0]

    def wrapper(*args, **kwargs):
        if active[0]:
            return inner(*args, **kwargs)
        active[0] += 1
        started, cpu = time.perf_counter(), time.process_time()
        try:
            return inner(*args, **kwargs)
        finally:
            active[0] -= 1
            SPENT[label] += time.perf_counter() - started
            CPU[label] += time.process_time() - cpu
            CALLS[label] += 1

    setattr(owner, name, wrapper)


def main() -> None:
    from benchmarks.aim_tables import table_parser

    parser = table_parser(__doc__)
    parser.add_argument("--seed", type=int, default=1000)
    parser.add_argument("--params", default="{}", help="extra aim parameters (JSON)")
    parser.add_argument("--no-error", dest="error", action="store_false")
    args = parser.parse_args()
    process_start = time.perf_counter()

    from benchmarks.aim_tables import load_counts

    config, counts = load_counts(args.table, args.rows)

    from medrelease.synthetic import aim_rounds, pgm
    from medrelease.synthetic import release as synthetic

    timed(pgm, "estimate", "mirror descent (pgm.estimate)")
    timed(pgm, "sample", "sampling (pgm.sample)")
    timed(aim_rounds.AIMRounds, "score", "scoring (AIMRounds.score)")
    timed(aim_rounds.AIMRounds, "synthesize", "final fit + sampling (AIMRounds.synthesize)")
    timed(aim_rounds.AIMRounds, "_model_answer", "model answers for annealing")
    timed(synthetic, "researcher_error_bars", "error bars")

    from medrelease.release import PublicFacts, plan_release

    params = {"epsilon": args.eps, **json.loads(args.params)}
    started, cpu = time.perf_counter(), time.process_time()
    plan = plan_release("aim", params, 0, args.seed, PublicFacts.of(config))
    run = synthetic.aim_rounds(counts, config, plan)
    run.run()
    result = synthetic.synthetic_release(run, counts, plan)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu

    print(f"table {args.table} ({counts.n_rows:,} rows, {len(counts.counts):,} cells), eps "
          f"{args.eps:g}, seed {args.seed}, params {params}")
    print(f"release (rounds + sampling + error bars): {wall:6.1f} s wall, {cpu:6.1f} s CPU "
          f"(all threads; less sensitive to a loaded machine); process until release "
          f"done {time.perf_counter() - process_start:6.1f} s; rounds {len(run.state.records)}")
    for label, seconds in sorted(SPENT.items(), key=lambda kv: -kv[1]):
        cpu_part = f"{CPU[label]:7.1f} s CPU" if label in CPU else " " * 13
        print(f"  {label:55s} {seconds:7.1f} s wall {cpu_part} ({CALLS.get(label, 0)} calls)")
    if args.error:
        from medrelease.evidence.workload import workload_error

        frame = result.rows.to_frame() if hasattr(result.rows, "to_frame") else result.rows
        error = workload_error(counts, frame)
        print(f"workload TVD 2-way {error.mean_two_way:.4f} / 3-way {error.mean_three_way:.4f}")


if __name__ == "__main__":
    main()
