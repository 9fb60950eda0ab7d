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


def joined(schema: RelSchema, frames: Mapping[str, pd.DataFrame], grain: str,
           counts: bool = False) -> pd.DataFrame:
    """The rows of ``grain`` joined with their parent, grandparent ... (inner joins: the join a
    researcher runs), every released column named ``<table>.<column>``; with ``counts``, each
    table's ``n_<child>`` columns too (``with_counts``)."""
    if counts:
        frames = with_counts(schema, frames)
    lineage = (*schema.ancestors(grain), schema.table(grain))
    out = _prefixed(schema, lineage[-1], frames[grain], counts)
    for child, parent in zip(lineage[::-1], lineage[-2::-1], strict=False):
        right = _prefixed(schema, parent, frames[parent.name], counts)
        out = out.merge(right, left_on=f"{child.name}{SEPARATOR}{child.parent_key}",
                        right_on=f"{parent.name}{SEPARATOR}{parent.key}", how="inner")
    return out


def _prefixed(schema: RelSchema, table: RelTable, frame: pd.DataFrame,
              counts: bool = False) -> pd.DataFrame:
    keep = [c for c in (table.key, table.parent_key) if c] + list(table.column_names)
    if counts:
        keep += [f"n_{c.name}" for c in schema.children(table.name)]
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


def with_counts(schema: RelSchema, frames: Mapping[str, pd.DataFrame]
                ) -> dict[str, pd.DataFrame]:
    """Each table with its rows' number of children in each child table (``n_<child>``, more
    than the bound counted at the bound), as the models see them."""
    out = {name: frame.copy() for name, frame in frames.items()}
    for table in schema.tables[1:]:
        parent = schema.table(table.parent)
        counts = frames[table.name][table.parent_key].value_counts()
        per = out[parent.name][parent.key].map(counts).fillna(0).astype(int)
        out[parent.name][f"n_{table.name}"] = np.minimum(per, table.max_children).astype(str)
    return out


def analysis_tvd(truth: pd.DataFrame, released: pd.DataFrame, columns: list[str]) -> float:
    """TVD of one declared analysis's distribution on the join (an empty release: 1)."""
    a = truth.astype(str).groupby(columns, observed=True).size()
    if not len(released):
        return 1.0
    b = released.astype(str).groupby(columns, observed=True).size()
    both = (a / a.sum()).to_frame("a").join((b / b.sum()).to_frame("b"), how="outer").fillna(0)
    return tvd(both["a"].to_numpy(), both["b"].to_numpy())


def evaluate_relational(schema: RelSchema, truth: Mapping[str, pd.DataFrame],
                        released: Mapping[str, pd.DataFrame]) -> dict:
    """The steward's cross-table accuracy of a relational release against its input tables
    (numbers only, never a value): integrity of the released tables, the children-per-parent
    distribution per child table, parent attribute x child attribute on the join at every
    child table's grain (each pair's TVD and their mean), and the declared analyses."""
    out: dict = {"integrity": integrity(schema, released), "children_per_parent": {},
                 "cross_table": {}, "analyses": []}
    for table in schema.tables[1:]:
        true_hist = children_distribution(schema, truth, table.name)
        released_hist = children_distribution(schema, released, table.name)
        out["children_per_parent"][table.name] = {
            "parent": table.parent, "tvd": tvd(true_hist, released_hist),
            "input_share": [round(float(x), 4) for x in true_hist],
            "released_share": [round(float(x), 4) for x in released_hist]}
        pairs = all_cross_pairs(schema, table.name)
        true_join = joined(schema, truth, table.name).astype(str)
        released_join = joined(schema, released, table.name).astype(str)
        each = {f"{a} × {b}": pair_tvd(true_join, released_join, (a, b)) for a, b in pairs}
        out["cross_table"][table.name] = {
            "pairs": len(pairs), "mean_tvd": float(np.mean(list(each.values()))) if each
            else None, "worst": sorted(each.items(), key=lambda kv: -kv[1])[:5],
            "tvd": each}
    for analysis in schema.analyses:
        deepest = max((c.split(SEPARATOR, 1)[0] for c in analysis),
                      key=lambda t: len(schema.ancestors(t)))
        value = analysis_tvd(joined(schema, truth, deepest, counts=True),
                             joined(schema, released, deepest, counts=True), list(analysis))
        out["analyses"].append({"columns": list(analysis), "grain": deepest, "tvd": value})
    return out
