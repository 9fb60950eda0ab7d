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

SPLITS = {  # name: (eps_candidates, eps_cells, eps_ladder, eps_suppression, rungs), as shares
    "default": None,  # whatever medrelease/mechanisms/ipa.py ships
    "no ladder .05/.90/.05": (0.05, 0.90, None, 0.05, 0),
    "1 rung .05/.70/.20/.05": (0.05, 0.70, 0.20, 0.05, 1),
    "1 rung .05/.60/.30/.05": (0.05, 0.60, 0.30, 0.05, 1),
    "1 rung .05/.62/.31/.02": (0.05, 0.62, 0.31, 0.02, 1),
    "1 rung .05/.56/.37/.02": (0.05, 0.56, 0.37, 0.02, 1),
    "1 rung .05/.66/.27/.02": (0.05, 0.66, 0.27, 0.02, 1),
    "2 rungs .05/.55/.35/.05": (0.05, 0.55, 0.35, 0.05, 2),
    "2 rungs .05/.50/.43/.02": (0.05, 0.50, 0.43, 0.02, 2),
}


def params_for(split: tuple | None, epsilon: float) -> dict:
    if split is None:
        return {"epsilon": epsilon}
    cand, cells, ladder, sup, rungs = split
    out = {"epsilon": epsilon, "eps_candidates": cand * epsilon, "eps_cells": cells * epsilon,
           "eps_suppression": sup * epsilon, "ladder_rungs": rungs}
    if rungs:
        out["eps_ladder"] = ladder * epsilon
    return out


def non_star_share(table, dimensions, n_rows: int) -> float:
    labels = table[list(dimensions)].astype(str).to_numpy()
    return float((labels != "*").any(axis=1).sum() / n_rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_361_000)
    parser.add_argument("--eps", type=float, nargs="+", default=[1.0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--only", nargs="*", help="split names (prefix match)")
    args = parser.parse_args()

    from medrelease.aggregate import aggregate
    from medrelease.config import find_config
    from medrelease.nps import generate_nps
    from medrelease.release import PublicFacts, release_from_counts

    config = find_config("nps-sample")
    counts = aggregate(generate_nps(args.rows, seed=2020), config)
    facts = PublicFacts.of(config)
    print(f"NPS-like, {args.rows:,} rows, {counts.cell_keys.size:,} cells, {args.runs} runs\n")
    print("| eps | split | rows under a non-* class: mean (worst) | IL mean (worst) | "
          "NCP | EMD | Rate | P(top node) | s/run |")
    print("|---|---|---|---|---|---|---|---|---|")
    for epsilon in args.eps:
        for name, split in SPLITS.items():
            if (args.only and not any(name.startswith(o) for o in args.only)):
                continue
            shares, ils, parts, tops, times = [], [], [], [], []
            for run in range(args.runs):
                t0 = time.perf_counter()
                result = release_from_counts(counts, "ipa", params_for(split, epsilon),
                                             seed=1000 + run, workers=2, facts=facts)
                times.append(time.perf_counter() - t0)
                shares.append(non_star_share(result.table, counts.dimensions, counts.n_rows))
                il = result.released_il
                ils.append(il.il)
                parts.append((il.ncp, il.emd, il.rate))
                cand = result.candidates
                tops.append(float(cand.loc[cand["score"].idxmax(), "selection_probability"]))
            ncp, emd, rate = np.mean(parts, axis=0)
            print(f"| {epsilon:g} | {name} | {np.mean(shares):.3f} ({min(shares):.3f}) | "
                  f"{np.mean(ils):.3f} ({max(ils):.3f}) | {ncp:.3f} | {emd:.3f} | {rate:.3f} | "
                  f"{np.mean(tops):.3f} | {np.mean(times):.2f} |", flush=True)


if __name__ == "__main__":
    main()
