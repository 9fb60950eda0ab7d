"""The patient-normalised table of a chain of tables: one weighted row per deepest row, in
which every patient weighs exactly the same.

For a chain patients -> admissions -> diagnoses, a row holds a patient's columns and the
number of rows each of its child tables has for it (``patients.n_admissions``), then one of its
admissions' columns and counts, then one of that admission's diagnoses' columns. A patient with
``k_a`` admissions, the i-th with ``k_d,i`` diagnoses, gives rows of weight
``L / (k_a k_d,i)``; a patient (or an admission) without children gives one row whose deeper
columns hold the marker ``ABSENT`` (counts: 0), of weight ``L`` (``L / k_a``). So each
patient's rows weigh ``L`` in total, whatever they hold: every marginal of the table moves by
at most ``L`` in L1 (hence in L2) when one patient comes or goes. ``L`` = the product of
lcm(1..max_children) over the chain's child tables keeps every weight a whole number, so the
counts stay integers for the discrete Gaussian.

This is PrivPetal's observation (Cai, Xiao, Yang 2025: a parent and its group of children as
one record of a "permutation relation", sensitivity 1 per parent), with one child per record
and each child weighted by its share of the parent, extended down the chain. Within a slice of
fixed counts every row weighs the same, so each conditional the generator reads (an admission
given its patient's columns and count) is the table's own conditional, unbiased.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from medrelease.relational.schema import EncodedTable, RelSchema, RelTable
from medrelease.synthetic.space import Attribute, MarginalSpace, taxonomy_attribute

ABSENT = "(none)"  # the value of a child table's column in a row that has no such child


@dataclass(frozen=True)
class PathColumn:
    """A column of the patient-normalised table: a released column of ``table``, or (``child``
    set) the number of ``child`` rows a ``table`` row has."""

    name: str
    table: str
    column: str | None = None
    child: str | None = None
    absent: int | None = None  # leaf code of ABSENT (columns of child tables)


def absent_attribute(attribute: Attribute) -> Attribute:
    """``attribute`` with one more leaf, ABSENT, which is its own node at every level below
    '*' (so a rare-value merge never groups it with a real value)."""
    maps, labels = [], []
    for level, (codes, names) in enumerate(zip(attribute.level_maps, attribute.level_labels,
                                               strict=True)):
        top = level == len(attribute.level_maps) - 1 and len(names) == 1
        extra = 0 if top else len(names)
        maps.append(np.append(np.asarray(codes, dtype=np.int64), extra))
        labels.append(tuple(names) if top else (*names, ABSENT))
    return Attribute(attribute.name, (*attribute.leaf_labels, ABSENT), tuple(maps),
                     tuple(labels), attribute.ordered)


def count_attribute(name: str, max_children: int) -> Attribute:
    """The number of children, 0..max_children, ordered (merged in runs of neighbours)."""
    labels = tuple(str(k) for k in range(max_children + 1))
    return Attribute(name, labels, (np.arange(max_children + 1, dtype=np.int64),
                                    np.zeros(max_children + 1, dtype=np.int64)),
                     (labels, ("*",)), ordered=True)


def table_columns(schema: RelSchema, table: RelTable) -> list[tuple[PathColumn, Attribute]]:
    """The columns a table contributes to every chain through it: its released columns, then
    one count per child table (of any chain)."""
    out = []
    child_table = table.parent is not None
    for column in table.columns:
        attribute = taxonomy_attribute(column.taxonomy, f"{table.name}.{column.name}")
        if child_table:
            attribute = absent_attribute(attribute)
        out.append((PathColumn(attribute.name, table.name, column=column.name,
                               absent=attribute.size - 1 if child_table else None), attribute))
    for child in schema.children(table.name):
        name = f"{table.name}.n_{child.name}"
        out.append((PathColumn(name, table.name, child=child.name),
                    count_attribute(name, int(child.max_children or 1))))
    return out


class TableSpace(MarginalSpace):
    """A ``MarginalSpace`` over given attributes, cell codes and weights (the relational
    tables are not a dataset config's count table; everything after construction is aim's)."""

    def __init__(self, attributes: tuple[Attribute, ...], codes: list[np.ndarray],
                 weights: np.ndarray) -> None:  # (no super().__init__: it reads a CountTable)
        self.attributes = tuple(attributes)
        self.codes = [np.asarray(c, dtype=np.int64) for c in codes]
        self.weights = np.asarray(weights, dtype=np.float64)


@dataclass(frozen=True)
class PathTable:
    """A chain's patient-normalised table, aggregated to distinct cells with summed weights."""

    tables: tuple[str, ...]
    scale: int
    columns: tuple[PathColumn, ...]
    attributes: tuple[Attribute, ...]
    codes: tuple[np.ndarray, ...]
    weights: np.ndarray  # int64, one per cell; they sum to scale x patients

    @cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def space(self) -> TableSpace:
        """A fresh marginal space (aim's rounds merge values in place: one per run)."""
        return TableSpace(self.attributes, [c.copy() for c in self.codes], self.weights)

    @property
    def patients(self) -> int:
        return int(self.weights.sum() // self.scale)


def chain_columns(schema: RelSchema, chain: tuple[RelTable, ...]
                  ) -> list[tuple[PathColumn, Attribute]]:
    return [pair for table in chain for pair in table_columns(schema, table)]


def path_table(schema: RelSchema, tables: dict[str, EncodedTable],
               chain: tuple[RelTable, ...], normalise: bool = True) -> PathTable:
    """The patient-normalised table of ``chain`` (root first) from the bounded, encoded
    tables: one row per deepest row, expanded level by level (never a loop over rows).

    ``normalise=False`` is the comparison the design was measured against (the join at
    sensitivity m, as a flattened table is released today): every row weighs 1, and ``scale``
    is then a patient's largest weight, the product of the chain's max_children."""
    scale = schema.scale(chain) if normalise else math.prod(
        int(t.max_children or 1) for t in chain[1:])
    columns = chain_columns(schema, chain)
    counts = {child.name: np.bincount(tables[child.name].parent_row,
                                      minlength=tables[t.name].rows).astype(np.int64)
              for t in chain for child in schema.children(t.name)}
    root = tables[chain[0].name]
    current = np.arange(root.rows, dtype=np.int64)  # the row of the chain's last table so far
    weight = np.full(root.rows, scale if normalise else 1, dtype=np.int64)
    codes: dict[str, np.ndarray] = {}
    _fill(codes, columns, chain[0], tables, counts, current, np.ones(root.rows, dtype=bool))
    for depth in range(1, len(chain)):
        table, parent = chain[depth], chain[depth - 1]
        child = tables[table.name]
        k = np.where(current >= 0, counts[table.name][np.maximum(current, 0)], 0)
        copies = np.maximum(k, 1)
        expand = np.repeat(np.arange(current.size), copies)
        weight = np.repeat(weight // copies if normalise else weight, copies)
        for name in list(codes):
            codes[name] = codes[name][expand]
        order = np.argsort(child.parent_row, kind="stable")
        first = np.searchsorted(child.parent_row[order], np.arange(tables[parent.name].rows))
        offset = np.arange(expand.size) - np.repeat(np.cumsum(copies) - copies, copies)
        has = np.repeat(k > 0, copies)
        nxt = np.full(expand.size, -1, dtype=np.int64)
        nxt[has] = order[first[current[expand[has]]] + offset[has]]
        current = nxt
        _fill(codes, columns, table, tables, counts, current, has)
    stacked = np.stack([codes[c.name] for c, _ in columns], axis=1)
    cells, inverse = np.unique(stacked, axis=0, return_inverse=True)
    summed = np.bincount(inverse.reshape(-1), weights=weight, minlength=len(cells))
    return PathTable(tuple(t.name for t in chain), scale, tuple(c for c, _ in columns),
                     tuple(a for _, a in columns),
                     tuple(np.ascontiguousarray(cells[:, i]) for i in range(cells.shape[1])),
                     np.rint(summed).astype(np.int64))


def _fill(codes: dict[str, np.ndarray], columns: list[tuple[PathColumn, Attribute]],
          table: RelTable, tables: dict[str, EncodedTable], counts: dict[str, np.ndarray],
          rows: np.ndarray, present: np.ndarray) -> None:
    """The columns of ``table`` for each expanded row: its values where the row has a
    ``table`` row, ABSENT (counts 0) where it has none."""
    source = tables[table.name]
    safe = np.where(present, rows, 0)
    for column, _ in columns:
        if column.table != table.name:
            continue
        if column.child is not None:
            values = counts[column.child][safe] if source.rows else np.zeros(rows.size, np.int64)
            codes[column.name] = np.where(present, values, 0)
        else:
            values = (source.codes[column.column][safe] if source.rows
                      else np.zeros(rows.size, np.int64))
            codes[column.name] = (np.where(present, values, column.absent)
                                  if column.absent is not None else values)
