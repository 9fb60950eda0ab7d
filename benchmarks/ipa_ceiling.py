"""The noise-free ceiling of a thresholded single-node release (ipa's form) on the workload error.

For each lattice node: every cell with at least ``--tau`` true rows is kept exactly, every other
row is pooled under ``*`` with its raw informative value and its true count, and no noise is
drawn. The best mean TVD over the nodes (2-way / 3-way marginals, EVALUATION.md) is what no
budget split, node score or ladder of that form can go below (docs/results/README.md).

    python benchmarks/ipa_ceiling.py nps            # all 256 nodes, 100,000 rows, tau 25
    python benchmarks/ipa_ceiling.py adult --limit 150
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def rows_of(lattice, counts, node, class_keys, inf_codes, reps) -> pd.DataFrame:
    """Rows of (class, value) cells at ``node``, repeated by ``reps``, labels from taxonomies."""
    codes = lattice.class_codes_from_keys(class_keys)
    labels = [np.asarray(tax.level_labels[node[i]], dtype=object)[codes[:, i]]
              for i, tax in enumerate(counts.taxonomies)]
    return labelled_rows(counts, labels, inf_codes, reps)


def labelled_rows(counts, labels: list[np.ndarray], inf_codes, reps) -> pd.DataFrame:
    """Released rows: each cell's dimension labels and raw informative value, ``reps`` times."""
    frame = pd.DataFrame({name: np.repeat(column, reps)
                          for name, column in zip(counts.dimensions, labels, strict=True)})
    values = counts.informative.iloc[np.repeat(inf_codes, reps)].reset_index(drop=True)
    for column in values.columns:
        frame[column] = values[column].to_numpy()
    return frame


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", choices=["nps", "adult"])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--tau", type=int, default=25, help="ipa's cell threshold (eps 1: 25)")
    parser.add_argument("--limit", type=int, help="only the N least generalized nodes that keep "
                                                  "at least half the rows")
    args = parser.parse_args()

    from peers import load_table

    from medrelease.data.lattice import Lattice
    from medrelease.evidence.workload import workload_error

    counts = load_table(args.table, args.rows).counts
    lattice = Lattice(counts)
    chosen = None
    if args.limit:
        kept_half = [(sum(lv / h for lv, h in zip(t.node, lattice.heights, strict=True) if h),
                      t.node) for t in lattice.iter_tables(lattice.dfs_order())
                     if t.counts[t.counts >= args.tau].sum() >= counts.n_rows / 2]
        chosen = {node for _, node in sorted(kept_half)[:args.limit]}
    top = lattice.nodes[-1]
    results = []
    for table in lattice.iter_tables(lattice.dfs_order()):
        if chosen is not None and table.node not in chosen:
            continue
        kept = table.counts >= args.tau
        left = np.bincount(table.inf_codes[~kept], weights=table.counts[~kept],
                           minlength=counts.n_inf).astype(np.int64)
        pooled = np.flatnonzero(left)
        released = pd.concat([
            rows_of(lattice, counts, table.node, table.class_keys[kept], table.inf_codes[kept],
                    table.counts[kept]),
            rows_of(lattice, counts, top, np.zeros(pooled.size, dtype=np.int64), pooled,
                    left[pooled]),
        ], ignore_index=True)
        error = workload_error(counts, released)
        results.append((error.mean_two_way, error.mean_three_way,
                        table.counts[kept].sum() / counts.n_rows, table.node))
    print(f"{args.table}: {len(results)} of {len(lattice.nodes)} nodes, tau {args.tau}")
    print("| TVD 2-way | TVD 3-way | rows in kept cells | node |\n|---|---|---|---|")
    best = sorted(results)[:3] + sorted(results, key=lambda r: r[1])[:3]
    for two, three, share, node in dict.fromkeys(best):
        print(f"| {two:.3f} | {three:.3f} | {share:.3f} | {node} |")


if __name__ == "__main__":
    main()
