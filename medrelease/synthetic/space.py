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
from medrelease.synthetic.axis_sums import sum_axis

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


@dataclass(frozen=True)
class Merge:
    """A column's values after merging rare ones: new code -> the leaves it stands for.
    Decided from a DP measurement (post-processing), so it is public."""

    column: int
    keep: np.ndarray                 # leaves kept as they are
    members: tuple[np.ndarray, ...]  # per new code
    merged: int                      # leaves merged into groups

    def expand(self, codes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Each model code back to a leaf: a merged group's leaves uniformly at random."""
        sizes = np.array([m.size for m in self.members])
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        flat = np.concatenate(self.members)
        pick = np.floor(rng.random(codes.size) * sizes[codes]).astype(np.int64)
        return flat[starts[codes] + pick]


def merge_rare(attribute: Attribute, keep: np.ndarray) -> tuple[Attribute, np.ndarray, Merge]:
    """Leaves not in ``keep`` merged into one value per taxonomy parent (level 1; the whole
    domain without a level below '*'). Coarser levels map a group as its leaves do: a group
    never crosses a parent, so the taxonomy stays a tree over the new values."""
    parent = (attribute.level_maps[1] if len(attribute.level_maps) > 1
              else np.zeros(attribute.size, dtype=np.int64))
    kept = np.flatnonzero(keep)
    rare_parents = np.unique(parent[~keep])
    mapping = np.empty(attribute.size, dtype=np.int64)
    mapping[kept] = np.arange(kept.size)
    mapping[~keep] = kept.size + np.searchsorted(rare_parents, parent[~keep])
    members = tuple([np.array([leaf]) for leaf in kept]
                    + [np.flatnonzero(~keep & (parent == p)) for p in rare_parents])
    first = np.array([m[0] for m in members])
    parent_labels = (attribute.level_labels[1] if len(attribute.level_labels) > 1 else ("*",))
    labels = tuple([attribute.leaf_labels[leaf] for leaf in kept]
                   + [f"{parent_labels[p]} (rare)" for p in rare_parents])
    maps = (np.arange(len(members), dtype=np.int64),
            *(np.asarray(m)[first] for m in attribute.level_maps[1:]))
    merged = Attribute(attribute.name, labels, maps, (labels, *attribute.level_labels[1:]))
    return merged, mapping, Merge(-1, keep, members, int((~keep).sum()))


class MarginalSpace:
    """The released attributes, the count table's cells as leaf codes, and marginals of them."""

    def __init__(self, counts: CountTable, informative_taxonomy: Taxonomy | None = None) -> None:
        attrs = [taxonomy_attribute(t, n) for t, n in zip(counts.taxonomies, counts.dimensions,
                                                           strict=True)]
        codes = counts.dimension_columns() if counts.dimensions else []  # contiguous columns
        for column in counts.informative.columns:
            values = counts.informative[column].astype(str).tolist()
            attrs.append(domain_attribute(column, values, informative_taxonomy))
            codes.append(counts.inf_codes())
        self.attributes: tuple[Attribute, ...] = tuple(attrs)
        self.codes = [np.asarray(c, dtype=np.int64) for c in codes]
        self.weights = counts.counts.astype(np.float64)

    def merge(self, column: int, keep: np.ndarray) -> Merge:
        """Merge the column's values outside ``keep`` (see ``merge_rare``), in place."""
        attribute, mapping, merge = merge_rare(self.attributes[column], keep)
        attrs = list(self.attributes)
        attrs[column] = attribute
        self.attributes = tuple(attrs)
        self.codes[column] = mapping[self.codes[column]]
        return Merge(column, keep, merge.members, merge.merged)

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


class RollUps:
    """One attribute set's marginal at every level combination asked, each computed from the
    nearest one already computed (the same levels with the last coarse axis back at its
    leaves): a candidate set of three columns at up to 4 x 2 x 4 levels costs one
    ``sum_axis`` per combination, on a table already summed on its other axes, instead of up to
    three on the fine table."""

    def __init__(self, space: MarginalSpace, columns: Columns, fine: np.ndarray) -> None:
        self.space, self.columns = space, columns
        self.done: dict[Levels, np.ndarray] = {(0,) * len(columns): fine}

    def __call__(self, levels: Levels) -> np.ndarray:
        levels = tuple(levels)
        if levels not in self.done:
            axis = max(i for i, level in enumerate(levels) if level)
            coarser = self((*levels[:axis], 0, *levels[axis + 1:]))
            attribute = self.space.attributes[self.columns[axis]]
            self.done[levels] = sum_axis(coarser, axis, attribute.level_maps[levels[axis]],
                                         attribute.cardinality(levels[axis]))
        return self.done[levels]
