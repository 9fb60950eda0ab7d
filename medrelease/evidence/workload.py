"""Workload error: total variation distance over 2-way and 3-way marginals, on raw domains.

One yardstick for every tool (EVALUATION.md): for each marginal dimension x informative and
dimension x dimension x informative, the TVD between the input's distribution and the
release's, where a generalized value spreads its rows uniformly over the raw values (taxonomy
leaves) it covers, and ``*`` over the whole domain. Raw releases (synthetic data, shuffled
columns) are the special case where every value is a leaf.

Only the input's cells and the release's label groups are touched, never the product domain:
TVD = 1/2 (sum over x in supp(p) of |p(x) - q(x)| + (1 - sum over x in supp(p) of q(x))).
Everything here reads the raw input: steward-side evaluation and benchmarks, never published.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pandas as pd

from medrelease.data.aggregate import CountTable
from medrelease.data.taxonomy import SUPPRESSED


@dataclass(frozen=True)
class WorkloadError:
    two_way: dict[str, float]
    three_way: dict[str, float]

    @property
    def mean_two_way(self) -> float:
        return float(np.mean(list(self.two_way.values()))) if self.two_way else float("nan")

    @property
    def mean_three_way(self) -> float:
        return float(np.mean(list(self.three_way.values()))) if self.three_way else float("nan")


def workload_error(counts: CountTable, released: pd.DataFrame) -> WorkloadError:
    """TVD of every 2-way (dimension x informative) and 3-way (two dimensions x informative)
    marginal between the aggregated input ``counts`` and a ``released`` table."""
    dims = counts.dimensions
    source = _input_cells(counts)
    groups = _released_groups(counts, released)
    two = {d: _tvd(counts, source, groups, (i,)) for i, d in enumerate(dims)}
    three = {f"{dims[i]} x {dims[j]}": _tvd(counts, source, groups, (i, j))
             for i, j in itertools.combinations(range(len(dims)), 2)}
    return WorkloadError(two, three)


def rows_kept_share(released: pd.DataFrame, dimensions: tuple[str, ...] | list[str],
                    input_rows: int) -> float:
    """EVALUATION.md's "rows kept": released rows under a class that is not all '*', as a share
    of the input's rows (meaningful for releases of true rows, not for synthetic ones)."""
    labels = released[list(dimensions)].astype(str).to_numpy()
    return float((labels != SUPPRESSED).any(axis=1).sum() / input_rows) if input_rows else 0.0


def _input_cells(counts: CountTable) -> pd.DataFrame:
    codes = counts.dimension_codes()
    frame = pd.DataFrame(codes, columns=[f"d{i}" for i in range(codes.shape[1])])
    frame["inf"] = counts.inf_codes()
    frame["n"] = counts.counts
    return frame


def _label_index(taxonomy) -> dict[str, tuple[int, int]]:
    """Label -> (level, code), the finest level first (a leaf's own label is level 0)."""
    index: dict[str, tuple[int, int]] = {}
    for level, labels in enumerate(taxonomy.level_labels):
        for code, label in enumerate(labels):
            index.setdefault(str(label), (level, code))
    return index


def _released_groups(counts: CountTable, released: pd.DataFrame) -> pd.DataFrame:
    """Released rows grouped by (level, code) per dimension and informative code."""
    columns = {}
    for i, (name, taxonomy) in enumerate(zip(counts.dimensions, counts.taxonomies, strict=True)):
        index = _label_index(taxonomy)
        labels = released[name].astype(str)
        uniques, inverse = np.unique(labels.to_numpy(), return_inverse=True)
        looked = np.array([index.get(u, (-1, -1)) for u in uniques], dtype=np.int64).reshape(-1, 2)
        columns[f"l{i}"] = looked[inverse, 0]
        columns[f"c{i}"] = looked[inverse, 1]
    columns["inf"] = _informative_codes(counts, released)
    frame = pd.DataFrame(columns)
    keys = list(frame.columns)
    grouped = frame.groupby(keys, sort=False).size().rename("n").reset_index()
    if (grouped[[f"l{i}" for i in range(len(counts.dimensions))]] < 0).any(axis=None):
        raise ValueError("the release holds a dimension label its taxonomy does not know")
    return grouped


def _informative_codes(counts: CountTable, released: pd.DataFrame) -> np.ndarray:
    """The input's informative code of each released row; -1 for values the input lacks."""
    names = list(counts.informative.columns)
    known = counts.informative.astype(str).reset_index(drop=True)
    known["inf"] = np.arange(len(known))
    rows = released[names].astype(str).reset_index(drop=True)
    merged = rows.merge(known, on=names, how="left")
    return merged["inf"].fillna(-1).astype(np.int64).to_numpy()


def _tvd(counts: CountTable, source: pd.DataFrame, groups: pd.DataFrame,
         dims: tuple[int, ...]) -> float:
    keys = [f"d{i}" for i in dims] + ["inf"]
    p = source.groupby(keys, sort=False)["n"].sum().reset_index()
    p["p"] = p["n"] / p["n"].sum()
    total = groups["n"].sum()
    if total == 0:
        return 1.0
    q_at = np.zeros(len(p))
    level_cols = [f"l{i}" for i in dims]
    marg = groups.groupby(level_cols + [f"c{i}" for i in dims] + ["inf"], sort=False)["n"].sum()
    marg = marg.reset_index()
    for levels, part in marg.groupby(level_cols, sort=False):
        levels = levels if isinstance(levels, tuple) else (levels,)
        spread = part["n"].to_numpy(dtype=np.float64) / total
        probe = pd.DataFrame({"inf": p["inf"].to_numpy()})
        for i, level in zip(dims, levels, strict=True):
            taxonomy = counts.taxonomies[i]
            spread = spread / taxonomy.level_leaf_counts[level][part[f"c{i}"].to_numpy()]
            probe[f"c{i}"] = taxonomy.level_codes[level][p[f"d{i}"].to_numpy()]
        weights = part[[f"c{i}" for i in dims] + ["inf"]].assign(w=spread)
        hit = probe.merge(weights, on=[f"c{i}" for i in dims] + ["inf"], how="left")["w"]
        q_at += hit.fillna(0.0).to_numpy()
    inside = np.abs(p["p"].to_numpy() - q_at).sum()
    outside = max(0.0, 1.0 - q_at.sum())
    return float(0.5 * (inside + outside))
