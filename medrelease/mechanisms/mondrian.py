"""``mondrian``: multidimensional k-anonymity (LeFevre et al. 2006; seed 004's comparator).

Syntactic model — no differential privacy. Works on counts: the input is aggregated to cells
(finest dimension vector, informative value); partitions are cut recursively at the weighted
median of the dimension with the widest normalized range, in taxonomy leaf order.
* strict: a cut separates values <= median from values > median, allowed only if both sides
  keep at least k rows;
* relaxed: rows carrying the median value may be divided between the sides so both halves are
  as equal as possible (still >= k each).
Each final partition is released with, per dimension, the raw value when it holds one value, an
interval ``[low-high]`` for numeric taxonomies, or the lowest taxonomy label covering all of
its values for categorical ones; informative values stay raw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np
import pandas as pd
from pydantic import Field

from medrelease.data.aggregate import CountTable, aggregate
from medrelease.data.config import DatasetConfig
from medrelease.data.taxonomy import Taxonomy
from medrelease.errors import ParameterError
from medrelease.evidence.metrics import ILParts
from medrelease.mechanisms.base import (
    Capabilities,
    MechanismBase,
    MechanismParams,
    ReleaseShape,
    RowsOutput,
)
from medrelease.privacy.guarantee import Guarantee, StepDraws

LABEL = "syntactic model — no differential privacy"


class MondrianParams(MechanismParams):
    k: int = Field(default=10, ge=2, description="minimum partition size")
    variant: Literal["strict", "relaxed"] = Field(default="strict",
                                                  description="median rows on one side or split")


@dataclass
class _Part:
    codes: np.ndarray   # (cells, q) leaf codes
    inf: np.ndarray     # (cells,)
    counts: np.ndarray  # (cells,)


def _split(part: _Part, k: int, sizes: np.ndarray, relaxed: bool) -> tuple[_Part, _Part] | None:
    total = int(part.counts.sum())
    if total < 2 * k:
        return None
    spans = (part.codes.max(axis=0) - part.codes.min(axis=0)) / np.maximum(sizes - 1, 1)
    for dim in np.argsort(-spans, kind="stable"):
        if spans[dim] <= 0:
            return None
        values = part.codes[:, dim]
        order = np.argsort(values, kind="stable")
        sorted_values, sorted_counts = values[order], part.counts[order]
        cumulative = np.cumsum(sorted_counts)
        median_pos = int(np.searchsorted(cumulative, total / 2))
        median = sorted_values[median_pos]
        left = values <= median
        left_rows = int(part.counts[left].sum())
        if not relaxed:
            if left_rows == total:  # everything at or below the median: cut just below it
                left = values < median
                left_rows = int(part.counts[left].sum())
            if k <= left_rows <= total - k:
                return (_Part(part.codes[left], part.inf[left], part.counts[left]),
                        _Part(part.codes[~left], part.inf[~left], part.counts[~left]))
            continue
        # relaxed: rows at the median value are shared out to balance the halves
        below = values < median
        at = values == median
        need_left = total // 2 - int(part.counts[below].sum())
        at_idx = np.flatnonzero(at)
        at_cum = np.cumsum(part.counts[at_idx])
        take = np.clip(need_left - np.concatenate(([0], at_cum[:-1])), 0, part.counts[at_idx])
        left_counts = np.where(below, part.counts, 0)
        left_counts[at_idx] = take
        right_counts = part.counts - left_counts
        if left_counts.sum() >= k and right_counts.sum() >= k:
            lk, rk = left_counts > 0, right_counts > 0
            return (_Part(part.codes[lk], part.inf[lk], left_counts[lk]),
                    _Part(part.codes[rk], part.inf[rk], right_counts[rk]))
    return None


def partition(counts: CountTable, k: int, relaxed: bool = False) -> list[_Part]:
    """Mondrian's recursive median cuts over the count table."""
    if counts.n_rows < k:
        raise ParameterError(f"mondrian: the table has {counts.n_rows} rows, fewer than k={k}")
    sizes = np.array([t.n_leaves for t in counts.taxonomies], dtype=np.float64)
    stack = [_Part(counts.dimension_codes(), counts.inf_codes(), counts.counts)]
    done: list[_Part] = []
    while stack:
        part = stack.pop()
        halves = _split(part, k, sizes, relaxed)
        if halves is None:
            done.append(part)
        else:
            stack.extend(halves)
    return done


def _label(taxonomy: Taxonomy, leaf_codes: np.ndarray) -> tuple[str, float]:
    """A readable label covering all leaves, and its NCP."""
    low, high = int(leaf_codes.min()), int(leaf_codes.max())
    if low == high:
        return str(taxonomy.leaves[low]), 0.0
    if taxonomy.kind == "numeric":
        width = high - low + 1
        return f"[{taxonomy.leaves[low]}-{taxonomy.leaves[high]}]", width / taxonomy.n_leaves
    for level in range(1, taxonomy.height + 1):
        codes = np.unique(taxonomy.level_codes[level][leaf_codes])
        if codes.size == 1:
            code = int(codes[0])
            return taxonomy.level_labels[level][code], float(taxonomy.ncp(level)[code])
    return "*", 1.0


class Mondrian(MechanismBase):
    name: ClassVar[str] = "mondrian"
    capabilities: ClassVar[Capabilities] = Capabilities(
        summary="syntactic k-anonymity, no DP",
        gives="real rows in multidimensional k-anonymous groups (no noise, no DP)",
        kind="rows",
        audit_designs=(),
        loss_reason="none should be missing: every row is released in a group of at least k",
    )
    selection: ClassVar[str] = "none"
    Params: ClassVar[type[MechanismParams]] = MondrianParams

    def guarantee(self, params: MondrianParams) -> Guarantee:
        return Guarantee.no_dp_claim(
            self.name, LABEL,
            f"{params.variant} Mondrian: every partition has at least k={params.k} rows")


    def row_bounds(self, params: MondrianParams, shape: ReleaseShape) -> tuple[int, int]:
        return shape.rows, shape.rows

    def release_rows(self, table: pd.DataFrame, config: DatasetConfig, params: MondrianParams,
                     rng: np.random.Generator, draws: StepDraws | None,
                     key: bytes | None) -> RowsOutput:
        """Partition the aggregated count table (Mondrian reads counts, never single rows)."""
        counts = aggregate(table, config)
        released, il = self.release_counts(counts, params, rng)
        return RowsOutput(released, ReleaseShape(rows=counts.n_rows), il)

    def release_counts(self, counts: CountTable, params: MondrianParams,
                       rng: np.random.Generator) -> tuple[pd.DataFrame, ILParts]:
        parts = partition(counts, params.k, params.variant == "relaxed")
        columns: dict[str, list[np.ndarray]] = {d: [] for d in counts.dimensions}
        inf_rows: list[np.ndarray] = []
        ncp_total = 0.0
        for part in parts:
            rows = int(part.counts.sum())
            row_ncp = 0.0
            for i, (name, taxonomy) in enumerate(zip(counts.dimensions, counts.taxonomies,
                                                     strict=True)):
                label, ncp = _label(taxonomy, part.codes[:, i])
                columns[name].append(np.full(rows, label, dtype=object))
                row_ncp += ncp
            ncp_total += rows * row_ncp / max(len(counts.dimensions), 1)
            inf_rows.append(np.repeat(part.inf, part.counts))
        inf_codes = np.concatenate(inf_rows)
        table = pd.DataFrame({name: np.concatenate(values) for name, values in columns.items()})
        for name in counts.informative.columns:
            table[name] = counts.informative[name].to_numpy()[inf_codes]
        table = table.iloc[rng.permutation(len(table))].reset_index(drop=True)
        return table, ILParts(ncp_total / counts.n_rows, 0.0, 0.0)
