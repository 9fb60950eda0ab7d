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
    ordered: bool = False  # leaves in the order of numbers (a numeric taxonomy's bins)

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
    return Attribute(name, tuple(taxonomy.level_labels[0]), maps, tuple(taxonomy.level_labels),
                     ordered=taxonomy.kind in ("numeric", "binned"))


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
    """A column's values after merging rare ones: new code -> the leaves it stands for, and
    the weight each leaf gets when a sampled group is expanded back to leaves. Decided from
    a DP measurement (post-processing), so all of it is public."""

    column: int
    keep: np.ndarray                 # leaves kept as they are
    members: tuple[np.ndarray, ...]  # per new code
    merged: int                      # leaves merged into groups
    weights: tuple[np.ndarray, ...] = ()  # per new code, per member: its expansion weight
    groups: np.ndarray | None = None  # the group each rare leaf joined (``rare_groups``)

    def expand(self, codes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Each model code back to a leaf. The rows of a group get its leaves in proportion to
        their weights by systematic sampling over the rows in a random order: a leaf of weight
        w in a group of weight W that received n rows gets floor or ceil of n w / W rows (no
        second layer of random spread; without weights, every leaf weighs the same)."""
        out = np.empty(codes.size, dtype=np.int64)
        order = rng.permutation(codes.size)
        grouped = order[np.argsort(codes[order], kind="stable")]
        bounds = np.searchsorted(codes[grouped], np.arange(len(self.members) + 1))
        for code, members in enumerate(self.members):
            rows = grouped[bounds[code]:bounds[code + 1]]
            if not rows.size:
                continue
            if members.size == 1:
                out[rows] = members[0]
                continue
            weight = (np.asarray(self.weights[code], dtype=np.float64) if self.weights
                      else np.ones(members.size))
            if not weight.sum() > 0:
                weight = np.ones(members.size)
            edges = np.cumsum(weight) / weight.sum()
            points = (np.arange(rows.size) + rng.random()) / rows.size
            pick = np.minimum(np.searchsorted(edges, points, side="right"), members.size - 1)
            out[rows] = members[pick]
        return out


Z_95 = 1.959963984540054  # the standard normal's 97.5 % quantile


def projected_weights(noisy: np.ndarray) -> np.ndarray:
    """The noisy counts projected on the counts that are >= 0 and sum to their noisy sum (the
    least-squares fit under those constraints: ``max(0, y - lam)`` with ``lam >= 0``), so no
    weight exceeds its own noisy count (post-processing); the positive parts, or equal
    weights, when the sum is not positive. (Used to make a measurement a distribution.)"""
    y = np.asarray(noisy, dtype=np.float64)
    total = float(y.sum())
    if total <= 0:
        positive = np.maximum(y, 0.0)
        return positive if positive.sum() > 0 else np.ones_like(y)
    ordered = np.sort(y)[::-1]
    cumulative = np.cumsum(ordered) - total
    k = np.arange(1, y.size + 1)
    fits = ordered - cumulative / k > 0
    last = int(np.flatnonzero(fits)[-1])
    lam = max(0.0, float(cumulative[last] / (last + 1)))
    return np.maximum(y - lam, 0.0)


def shrunk_weights(noisy: np.ndarray, sigma: float) -> np.ndarray:
    """How a merged group's rows are shared among its leaves: each leaf's noisy count shrunk
    towards the group's mean by how much of their spread the noise explains (James-Stein:
    ``mean + max(0, 1 - sigma^2 / s^2) (y - mean)``, ``s^2`` their sample variance), then held
    to ``[0, y + 1.96 sigma]``, the upper end of the leaf's own 95 % interval. Leaves merge
    because their counts are below 3 sigma, so their differences are mostly noise: weighting
    by the raw counts piled a group's rows on its noisiest leaf (every age 85-89 became 89,
    docs/results/analyses.md), an even spread ignores a measured difference, and neither
    bounds a leaf by its measurement. Equal weights when every cap is 0. Post-processing of
    round 0's measurement."""
    y = np.asarray(noisy, dtype=np.float64)
    cap = np.maximum(y + Z_95 * sigma, 0.0)
    if y.size < 2:
        return np.ones_like(y)
    mean = float(y.mean())
    spread = float(y.var(ddof=1))
    keep = max(0.0, 1.0 - sigma ** 2 / spread) if spread > 0 else 0.0
    weights = np.clip(mean + keep * (y - mean), 0.0, cap)
    if weights.sum() <= 0:
        weights = cap if cap.sum() > 0 else np.ones_like(y)
    return weights


def rare_groups(attribute: Attribute, keep: np.ndarray, noisy: np.ndarray | None = None,
                threshold: float = 0.0, sigma: float = 0.0) -> np.ndarray:
    """The group (an integer per leaf) each rare leaf joins: its taxonomy parent at level 1.
    A column with no level between its leaves and '*' whose leaves are ordered (numeric bins)
    groups its rare leaves in runs of neighbours instead, each closed once its noisy sum
    reaches ``threshold`` x sigma x sqrt(its size): one group for the whole column would
    erase every association of its values (ages spread evenly over the whole range)."""
    if len(attribute.level_maps) > 2 or noisy is None or not attribute.ordered:
        return (attribute.level_maps[1] if len(attribute.level_maps) > 1
                else np.zeros(attribute.size, dtype=np.int64))
    group = np.zeros(attribute.size, dtype=np.int64)
    current, total, size = 0, 0.0, 0
    for leaf in range(attribute.size):
        if keep[leaf]:
            continue
        group[leaf] = current
        total += float(noisy[leaf])
        size += 1
        if total >= threshold * sigma * np.sqrt(size):
            current, total, size = current + 1, 0.0, 0
    return group


def merge_rare(attribute: Attribute, keep: np.ndarray, groups: np.ndarray | None = None
               ) -> tuple[Attribute, np.ndarray, Merge]:
    """Leaves not in ``keep`` merged into one value per group (``rare_groups``: their taxonomy
    parent at level 1; the whole domain without a level below '*'). Coarser levels map a group
    as its leaves do: a group never crosses a parent, so the taxonomy stays a tree over the
    new values."""
    parent = groups if groups is not None else rare_groups(attribute, keep)
    kept = np.flatnonzero(keep)
    rare_parents = np.unique(parent[~keep])
    mapping = np.empty(attribute.size, dtype=np.int64)
    mapping[kept] = np.arange(kept.size)
    mapping[~keep] = kept.size + np.searchsorted(rare_parents, parent[~keep])
    members = tuple([np.array([leaf]) for leaf in kept]
                    + [np.flatnonzero(~keep & (parent == p)) for p in rare_parents])
    first = np.array([m[0] for m in members])
    if not (groups is not None and attribute.ordered and len(attribute.level_labels) == 2):
        parent_labels = (attribute.level_labels[1] if len(attribute.level_labels) > 1
                         else ("*",))
        labels = tuple([attribute.leaf_labels[leaf] for leaf in kept]
                       + [f"{parent_labels[p]} (rare)" for p in rare_parents])
    else:  # runs of neighbours: named by their first and last leaves
        labels = tuple([attribute.leaf_labels[leaf] for leaf in kept]
                       + [_run_label(attribute, m) for m in members[kept.size:]])
    maps = (np.arange(len(members), dtype=np.int64),
            *(np.asarray(m)[first] for m in attribute.level_maps[1:]))
    merged = Attribute(attribute.name, labels, maps, (labels, *attribute.level_labels[1:]),
                       attribute.ordered)
    return merged, mapping, Merge(-1, keep, members, int((~keep).sum()))


def _run_label(attribute: Attribute, members: np.ndarray) -> str:
    first, last = attribute.leaf_labels[members[0]], attribute.leaf_labels[members[-1]]
    return f"{first} (rare)" if first == last else f"{first} .. {last} (rare)"


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

    def merge(self, column: int, keep: np.ndarray, groups: np.ndarray | None = None,
              weights: tuple[np.ndarray, ...] = ()) -> Merge:
        """Merge the column's values outside ``keep`` (see ``merge_rare``), in place."""
        attribute, mapping, merge = merge_rare(self.attributes[column], keep, groups)
        attrs = list(self.attributes)
        attrs[column] = attribute
        self.attributes = tuple(attrs)
        self.codes[column] = mapping[self.codes[column]]
        return Merge(column, keep, merge.members, merge.merged, weights, groups)

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
