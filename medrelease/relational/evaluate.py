"""What a researcher checks in a relational release (ALGORITHMS.md §8): referential
integrity, the children-per-parent distribution, and parent attribute x child attribute on the
join (total variation distance between the true and the released 2-way distributions).

Steward-side evidence: it reads the input tables. Every function takes the tables as the schema
names them (input keys or fresh keys alike) and returns numbers, never values.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from medrelease.relational.schema import RelSchema, RelTable

SEPARATOR = "."  # a joined column is named "<table>.<column>"


def integrity(schema: RelSchema, frames: Mapping[str, pd.DataFrame]) -> dict[str, int]:
    """Counts of broken promises (all 0 for a sound release): duplicate or missing keys,
    references to no row (orphans), parents with more children than ``max_children``."""
    out = {"duplicate_keys": 0, "missing_keys": 0, "orphans": 0, "over_max_children": 0}
    for table in schema.tables:
        frame = frames[table.name]
        if table.key:
            out["duplicate_keys"] += int(frame[table.key].duplicated().sum())
            out["missing_keys"] += int(frame[table.key].isna().sum())
        if table.parent is not None:
            parent = schema.table(table.parent)
            ref = frame[table.parent_key]
            out["orphans"] += int((~ref.isin(set(frames[parent.name][parent.key]))).sum())
            out["over_max_children"] += int((ref.value_counts() > table.max_children).sum())
    return out


def children_distribution(schema: RelSchema, frames: Mapping[str, pd.DataFrame],
                          child: str) -> np.ndarray:
    """Share of parent rows with 0, 1, ..., max_children children (more than the bound counted
    at the bound: what any release under it can show)."""
    table = schema.table(child)
    parent = schema.table(table.parent)
    counts = frames[child][table.parent_key].value_counts()
    per_parent = frames[parent.name][parent.key].map(counts).fillna(0).to_numpy(dtype=np.int64)
    clipped = np.minimum(per_parent, table.max_children)
    hist = np.bincount(clipped, minlength=table.max_children + 1).astype(np.float64)
    return hist / max(hist.sum(), 1.0)


def tvd(p: np.ndarray, q: np.ndarray) -> float:
    return 0.5 * float(np.abs(np.asarray(p, float) - np.asarray(q, float)).sum())


def joined(schema: RelSchema, frames: Mapping[str, pd.DataFrame], grain: str) -> pd.DataFrame:
    """The rows of ``grain`` joined with their parent, grandparent ... (inner joins: the join a
    researcher runs), every released column named ``<table>.<column>``."""
    lineage = (*schema.ancestors(grain), schema.table(grain))
    out = _prefixed(lineage[-1], frames[grain])
    for child, parent in zip(lineage[::-1], lineage[-2::-1], strict=False):
        right = _prefixed(parent, frames[parent.name])
        out = out.merge(right, left_on=f"{child.name}{SEPARATOR}{child.parent_key}",
                        right_on=f"{parent.name}{SEPARATOR}{parent.key}", how="inner")
    return out


def _prefixed(table: RelTable, frame: pd.DataFrame) -> pd.DataFrame:
    keep = [c for c in (table.key, table.parent_key) if c] + list(table.column_names)
    return frame[keep].rename(columns={c: f"{table.name}{SEPARATOR}{c}" for c in keep})


def cross_pairs(schema: RelSchema, grain: str) -> list[tuple[str, str]]:
    """Every (ancestor's column, grain table's column) pair, as joined column names."""
    table = schema.table(grain)
    own = [f"{grain}{SEPARATOR}{c}" for c in table.column_names]
    return [(f"{a.name}{SEPARATOR}{c}", o) for a in schema.ancestors(grain)
            for c in a.column_names for o in own]


def all_cross_pairs(schema: RelSchema, grain: str) -> list[tuple[str, str]]:
    """Every pair of columns from two different tables of the join at ``grain``'s rows."""
    lineage = (*schema.ancestors(grain), schema.table(grain))
    out = []
    for i, upper in enumerate(lineage):
        for lower in lineage[i + 1:]:
            out += [(f"{upper.name}{SEPARATOR}{a}", f"{lower.name}{SEPARATOR}{b}")
                    for a in upper.column_names for b in lower.column_names]
    return out


def pair_tvd(truth: pd.DataFrame, released: pd.DataFrame, pair: tuple[str, str]) -> float:
    """TVD of one 2-way distribution (every cell of either table; an empty release: 1)."""
    a = truth.groupby(list(pair), observed=True).size()
    b = released.groupby(list(pair), observed=True).size() if len(released) else a * 0
    a = a / max(a.sum(), 1)
    b = b / b.sum() if b.sum() > 0 else b
    both = a.to_frame("a").join(b.to_frame("b"), how="outer").fillna(0.0)
    return tvd(both["a"].to_numpy(), both["b"].to_numpy()) if b.sum() > 0 else 1.0


def mean_pair_tvd(truth: pd.DataFrame, released: pd.DataFrame,
                  pairs: list[tuple[str, str]]) -> float:
    truth = truth.astype({c: str for pair in pairs for c in pair})
    released = released.astype({c: str for pair in pairs for c in pair})
    return float(np.mean([pair_tvd(truth, released, p) for p in pairs]))
