"""Marginals of the aggregated count table on the taxonomies' levels (``aim``'s data side).

A released attribute is a dimension (its taxonomy) or the informative column (its declared
domain, optionally with a taxonomy over it). A *candidate* marginal is a set of attributes and a
level for each; it is computed from the count table (never from rows): the fine marginal of the
attribute set by one ``bincount`` over the cells, then each level by summing the fine axes
through the taxonomy's leaf -> level code maps. The roll-up maps are public (taxonomies only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from medrelease.data.aggregate import CountTable
from medrelease.data.taxonomy import Taxonomy

Columns = tuple[int, ...]
Levels = tuple[int, ...]


@dataclass(frozen=True)
class Attribute:
    """One released column as the synthesizer sees it: leaves and their level code maps."""

    name: str
    leaf_labels: tuple[str, ...]
    level_maps: tuple[np.ndarray, ...]  # level l (0 = leaves): leaf code -> code at l
    level_labels: tuple[tuple[str, ...], ...]

    @property
    def size(self) -> int:
        return len(self.leaf_labels)

    @property
    def levels(self) -> int:
        """Levels below '*' that a measurement may use (the top '*' is the empty marginal)."""
        return max(1, len(self.level_maps) - 1)

    def cardinality(self, level: int) -> int:
        return len(self.level_labels[level])


def taxonomy_attribute(taxonomy: Taxonomy, name: str) -> Attribute:
    maps = tuple(np.asarray(c, dtype=np.int64) for c in taxonomy.level_codes)
    return Attribute(name, tuple(taxonomy.level_labels[0]), maps, tuple(taxonomy.level_labels))


def domain_attribute(name: str, values: list[str], taxonomy: Taxonomy | None) -> Attribute:
    """The informative column over its declared domain; with a taxonomy, each domain value is
    one of its leaves (a value it does not cover is a config error, named)."""
    values = [str(v) for v in values]
    if taxonomy is None:
        return Attribute(name, tuple(values), (np.arange(len(values), dtype=np.int64),),
                         (tuple(values),))
    index = {label: i for i, label in enumerate(taxonomy.level_labels[0])}
    missing = [v for v in values if v not in index]
    if missing:
        raise ValueError(f"the taxonomy of {name!r} does not cover {len(missing)} value(s) of its "
                         f"declared domain (first: {missing[0]!r})")
    leaf = np.array([index[v] for v in values], dtype=np.int64)
    maps = []
    labels = []
    for level in range(taxonomy.height + 1):
        codes = np.asarray(taxonomy.level_codes[level], dtype=np.int64)[leaf]
        used, dense = np.unique(codes, return_inverse=True)
        maps.append(dense.astype(np.int64))
        labels.append(tuple(taxonomy.level_labels[level][c] for c in used))
    return Attribute(name, tuple(values), tuple(maps), tuple(labels))


class MarginalSpace:
    """The released attributes, the count table's cells as leaf codes, and marginals of them."""

    def __init__(self, counts: CountTable, informative_taxonomy: Taxonomy | None = None) -> None:
        attrs = [taxonomy_attribute(t, n) for t, n in zip(counts.taxonomies, counts.dimensions,
                                                           strict=True)]
        codes = list(counts.dimension_codes().T) if counts.dimensions else []
        for column in counts.informative.columns:
            values = counts.informative[column].astype(str).tolist()
            attrs.append(domain_attribute(column, values, informative_taxonomy))
            codes.append(counts.inf_codes())
        self.attributes: tuple[Attribute, ...] = tuple(attrs)
        self.codes = [np.asarray(c, dtype=np.int64) for c in codes]
        self.weights = counts.counts.astype(np.float64)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.attributes)

    def shape(self, columns: Columns, levels: Levels | None = None) -> tuple[int, ...]:
        levels = levels or (0,) * len(columns)
        return tuple(self.attributes[c].cardinality(lv) for c, lv in zip(columns, levels,
                                                                           strict=True))

    def cells(self, columns: Columns, levels: Levels | None = None) -> int:
        return math.prod(self.shape(columns, levels))

    def fine_marginal(self, columns: Columns) -> np.ndarray:
        """Counts of the attribute set at leaf level, dense, axes in ``columns`` order."""
        shape = self.shape(columns)
        if not columns:
            return np.array(self.weights.sum())
        flat = np.zeros(len(self.weights), dtype=np.int64)
        for c, size in zip(columns, shape, strict=True):
            flat *= size
            flat += self.codes[c]
        return np.bincount(flat, weights=self.weights, minlength=math.prod(shape)).reshape(shape)

    def roll_up(self, fine: np.ndarray, columns: Columns, levels: Levels) -> np.ndarray:
        """A fine marginal summed to ``levels`` (public code maps; works on model estimates too)."""
        out = fine
        for axis, (c, level) in enumerate(zip(columns, levels, strict=True)):
            if level:
                out = sum_axis(out, axis, self.attributes[c].level_maps[level],
                               self.attributes[c].cardinality(level))
        return out


def sum_axis(array: np.ndarray, axis: int, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """Sum the entries of ``axis`` that share a group code (``groups`` per index of the axis)."""
    onehot = np.zeros((groups.size, n_groups))
    onehot[np.arange(groups.size), groups] = 1.0
    return np.moveaxis(np.tensordot(array, onehot, axes=([axis], [0])), -1, axis)
