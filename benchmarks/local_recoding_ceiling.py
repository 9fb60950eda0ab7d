"""Noise-free ceiling of *local recoding* in ipa's form (issue 13), next to the single-node one.

ipa's form publishes (class, raw informative value) cells that hold at least tau rows. A
single lattice node generalizes every row of a dimension the same way; local recoding gives
different parts of the table different levels (DiffGen's top-down specialization). This script
asks whether that form *could* beat the shuffled-columns reference on the workload error if it
were free: no noise, no budget, true counts, the split choices made by looking at the data.

Top-down greedy: a region (one label per dimension, all '*' at the root) is split one level
down along the dimension whose children score highest with ipa's score
``sum over cells w(E) * max(0, n - tau + 1)``, ``w = 1 - NCP``, while that beats the region
kept whole. Rows of a leaf's cells below tau fall back to the parent region's cells, and so on
up to the root, where every remaining row is kept under '*' (the most generous pool). The
workload error is EVALUATION.md's (medrelease.evidence.workload).

    python benchmarks/local_recoding_ceiling.py nps        # 100,000 rows, tau 25
    python benchmarks/local_recoding_ceiling.py adult
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


@dataclass
class Data:
    leaves: np.ndarray        # input cells x dimensions, leaf codes
    inf: np.ndarray           # informative code per input cell
    n: np.ndarray             # rows per input cell
    taxonomies: tuple
    n_inf: int
    tau: int


def region_weight(data: Data, levels: tuple[int, ...], codes: tuple[int, ...]) -> float:
    ncp = [t.ncp(lv)[c] for t, lv, c in zip(data.taxonomies, levels, codes, strict=True)]
    return 1.0 - float(np.mean(ncp))


def spread_weight(data: Data, idx: np.ndarray, levels, codes) -> float:
    """1 - mean over dimensions of the TVD between the region's true leaf distribution and the
    uniform spread over its label's leaves (data-dependent: allowed here, nothing is private)."""
    losses = []
    for dim, (tax, level, code) in enumerate(zip(data.taxonomies, levels, codes, strict=True)):
        covered = np.flatnonzero(tax.level_codes[level] == code)
        true = np.bincount(data.leaves[idx, dim], weights=data.n[idx],
                           minlength=tax.n_leaves)[covered]
        true = true / max(true.sum(), 1)
        losses.append(0.5 * np.abs(true - 1.0 / covered.size).sum())
    return 1.0 - float(np.mean(losses))


WEIGHT = {"ncp": lambda data, idx, levels, codes: region_weight(data, levels, codes),
          "spread": spread_weight}
CHOICE = {"w": "ncp"}


def weight_of(data: Data, idx: np.ndarray, levels, codes) -> float:
    return WEIGHT[CHOICE["w"]](data, idx, levels, codes)


def leaf_score(data: Data, idx: np.ndarray, weight: float) -> float:
    per_value = np.bincount(data.inf[idx], weights=data.n[idx], minlength=data.n_inf)
    return weight * float(np.maximum(0, per_value - data.tau + 1).sum())


def children(data: Data, idx: np.ndarray, levels, codes, dim: int):
    """(levels, codes, rows) of each non-empty child one level down along ``dim``."""
    level = levels[dim] - 1
    child = data.taxonomies[dim].level_codes[level][data.leaves[idx, dim]]
    order = np.argsort(child, kind="stable")
    values, starts = np.unique(child[order], return_index=True)
    bounds = [*list(starts[1:]), order.size]
    new_levels = (*levels[:dim], level, *levels[dim + 1:])
    return [(new_levels, (*codes[:dim], int(v), *codes[dim + 1:]), idx[order[s:e]])
            for v, s, e in zip(values, starts, bounds, strict=True)]


def grow(data: Data, idx: np.ndarray, levels, codes, placed: list) -> np.ndarray:
    """Split greedily, place kept cells into ``placed``; return the rows left for the parent."""
    own = leaf_score(data, idx, weight_of(data, idx, levels, codes))
    best, best_kids = own, None
    for dim, level in enumerate(levels):
        if level == 0:
            continue
        kids = children(data, idx, levels, codes, dim)
        score = sum(leaf_score(data, rows, weight_of(data, rows, lv, cd))
                    for lv, cd, rows in kids)
        if score > best:
            best, best_kids = score, kids
    if best_kids is None:
        return keep_cells(data, idx, levels, codes, placed)
    left = np.concatenate([grow(data, rows, lv, cd, placed) for lv, cd, rows in best_kids])
    return keep_cells(data, left, levels, codes, placed)


def keep_cells(data: Data, idx: np.ndarray, levels, codes, placed: list,
               keep_all: bool = False) -> np.ndarray:
    per_value = np.bincount(data.inf[idx], weights=data.n[idx], minlength=data.n_inf)
    kept = per_value >= (1 if keep_all else data.tau)
    for v in np.flatnonzero(kept):
        placed.append((levels, codes, int(v), int(per_value[v])))
    return idx[~kept[data.inf[idx]]]


def released_frame(counts, placed: list) -> pd.DataFrame:
    from ipa_ceiling import labelled_rows

    labels = [np.array([tax.level_labels[p[0][i]][p[1][i]] for p in placed], dtype=object)
              for i, tax in enumerate(counts.taxonomies)]
    return labelled_rows(counts, labels, [p[2] for p in placed], [p[3] for p in placed])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", choices=["nps", "adult"])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--tau", type=int, default=25, help="ipa's cell threshold (eps 1: 25)")
    parser.add_argument("--weight", choices=sorted(WEIGHT), default="ncp",
                        help="region weight: ipa's 1 - NCP, or 1 - the TVD of uniform spreading "
                             "(data-dependent, an oracle)")
    args = parser.parse_args()
    CHOICE["w"] = args.weight

    from peers import load_table, shuffled

    from medrelease.evidence.workload import rows_kept_share, workload_error

    table = load_table(args.table, args.rows)
    counts = table.counts
    data = Data(counts.dimension_codes(), counts.inf_codes(), counts.counts.astype(np.int64),
                counts.taxonomies, counts.n_inf, args.tau)
    start = time.perf_counter()
    top = tuple(t.height for t in counts.taxonomies)
    placed: list = []
    left = grow(data, np.arange(data.n.size), top, (0,) * len(top), placed)
    keep_cells(data, left, top, (0,) * len(top), placed, keep_all=True)
    released = released_frame(counts, placed)
    error = workload_error(counts, released)
    regions = len({(p[0], p[1]) for p in placed})
    reference = workload_error(counts, shuffled(table, seed=0))
    print(f"{args.table}: {counts.n_rows} rows, tau {args.tau}, {regions} regions, "
          f"{time.perf_counter() - start:.1f} s")
    print("| release | TVD 2-way | TVD 3-way | rows kept |\n|---|---|---|---|")
    share = rows_kept_share(released, counts.dimensions, counts.n_rows)
    print(f"| local recoding, noise-free | {error.mean_two_way:.3f} | "
          f"{error.mean_three_way:.3f} | {share:.3f} |")
    print(f"| shuffled columns | {reference.mean_two_way:.3f} | {reference.mean_three_way:.3f} | - |")
    worst = sorted(error.two_way.items(), key=lambda kv: -kv[1])
    print("2-way per dimension (local recoding / shuffled): " + ", ".join(
        f"{d} {v:.3f}/{reference.two_way[d]:.3f}" for d, v in worst))


if __name__ == "__main__":
    main()
