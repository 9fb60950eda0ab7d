"""How the sound ``ipa`` spends its budget: node choice, cells, fallback ladder, '*' pool.

For each budget split (and ladder length) this prints, over several runs on the NPS-like table:
the share of input rows released with their raw diagnosis under a non-'*' class (mean and the
worst run), the released table's IL (NCP + EMD + Rate), the probability the top-scored node is
chosen, and the engine time. The defaults in ``medrelease/mechanisms/ipa.py`` come from here.

    python benchmarks/ipa_split.py                         # 1,361,000 rows, eps 1, 10 runs
    python benchmarks/ipa_split.py --rows 20000 --eps 0.5 1 2 --runs 5
"""

from __future__ import annotations

import argparse
import time

import numpy as np

SPLITS = {  # name: (eps_candidates, eps_cells, eps_ladder, eps_suppression, rungs[, floor])
    # a sixth entry = pool_every_value with that floor (the '*' pool over the public domain)
    "default": None,  # whatever medrelease/mechanisms/ipa.py ships
    "no ladder .05/.90/.05": (0.05, 0.90, None, 0.05, 0),
    "1 rung .05/.62/.31/.02": (0.05, 0.62, 0.31, 0.02, 1),
    "1 rung .05/.60/.30/.05": (0.05, 0.60, 0.30, 0.05, 1),
    "1 rung .05/.56/.37/.02": (0.05, 0.56, 0.37, 0.02, 1),
    "2 rungs .05/.50/.43/.02": (0.05, 0.50, 0.43, 0.02, 2),
    "every value .05/.62/.31/.02 floor 10": (0.05, 0.62, 0.31, 0.02, 1, 10),
    "every value .05/.55/.30/.10 floor 1": (0.05, 0.55, 0.30, 0.10, 1, 1),
    "every value .05/.55/.30/.10 floor 10": (0.05, 0.55, 0.30, 0.10, 1, 10),
    "every value .05/.50/.25/.20 floor 10": (0.05, 0.50, 0.25, 0.20, 1, 10),
    "every value no ladder .05/.75/.20 floor 10": (0.05, 0.75, None, 0.20, 0, 10),
}


def params_for(split: tuple | None, epsilon: float) -> dict:
    if split is None:
        return {"epsilon": epsilon}
    cand, cells, ladder, sup, rungs = split[:5]
    out = {"epsilon": epsilon, "eps_candidates": cand * epsilon, "eps_cells": cells * epsilon,
           "eps_suppression": sup * epsilon, "ladder_rungs": rungs}
    if rungs:
        out["eps_ladder"] = ladder * epsilon
    if len(split) > 5:
        out.update(pool_every_value=True, pool_floor=split[5])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_361_000)
    parser.add_argument("--eps", type=float, nargs="+", default=[1.0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--only", nargs="*", help="split names (prefix match)")
    parser.add_argument("--tvd", action="store_true",
                        help="also the workload error (mean TVD of 2-way and 3-way marginals)")
    args = parser.parse_args()

    from medrelease.data.aggregate import aggregate
    from medrelease.data.config import find_config
    from medrelease.data.nps import generate_nps
    from medrelease.evidence.workload import rows_kept_share, workload_error
    from medrelease.plan import PublicFacts
    from medrelease.release import release_from_counts

    config = find_config("nps-sample")
    counts = aggregate(generate_nps(args.rows, seed=2020), config)
    facts = PublicFacts.of(config)
    print(f"NPS-like, {args.rows:,} rows, {counts.cell_keys.size:,} cells, {args.runs} runs\n")
    print("| eps | split | rows under a non-* class: mean (worst) | IL mean (worst) | "
          "NCP | EMD | Rate | P(top node) | s/run | TVD 2-way | TVD 3-way |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for epsilon in args.eps:
        for name, split in SPLITS.items():
            if (args.only and not any(name.startswith(o) for o in args.only)):
                continue
            shares, ils, parts, tops, times, tvds = [], [], [], [], [], []
            for run in range(args.runs):
                t0 = time.perf_counter()
                result = release_from_counts(counts, "ipa", params_for(split, epsilon),
                                             seed=1000 + run, workers=2, facts=facts)
                times.append(time.perf_counter() - t0)
                shares.append(rows_kept_share(result.table, counts.dimensions, counts.n_rows))
                il = result.released_il
                ils.append(il.il)
                parts.append((il.ncp, il.emd, il.rate))
                cand = result.candidates
                tops.append(float(cand.loc[cand["score"].idxmax(), "selection_probability"]))
                if args.tvd:
                    error = workload_error(counts, result.table)
                    tvds.append((error.mean_two_way, error.mean_three_way))
            two, three = np.mean(tvds, axis=0) if tvds else (float("nan"), float("nan"))
            ncp, emd, rate = np.mean(parts, axis=0)
            print(f"| {epsilon:g} | {name} | {np.mean(shares):.3f} ({min(shares):.3f}) | "
                  f"{np.mean(ils):.3f} ({max(ils):.3f}) | {ncp:.3f} | {emd:.3f} | {rate:.3f} | "
                  f"{np.mean(tops):.3f} | {np.mean(times):.2f} | {two:.3f} | {three:.3f} |",
                  flush=True)


if __name__ == "__main__":
    main()
