"""Drawing rows from a fitted model *given* other columns: a patient's admissions given the
patient, an admission's diagnoses given the admission and its patient.

``pgm.sample`` draws whole rows; a child table needs the model's conditional law of the
child's columns given its parent's (already drawn) columns. It is exact on the model: the
columns that are neither given nor drawn are summed out first, then the columns to draw are
eliminated one by one (smallest table first); each column's conditioning set is its neighbours
at its elimination, and the columns are drawn in the reverse order, each from the model's
marginal on (its conditioning set, itself) computed by variable elimination
(``pgm.Model.marginal``) — forward sampling on a triangulation of the model's graph. Nothing
here reads data: the model and the merges are DP outputs; drawing is post-processing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from medrelease.synthetic import pgm
from medrelease.synthetic.space import Merge


@dataclass
class ModelView:
    """A fitted model with its run's rare-value merges: each column's leaf <-> model codes."""

    model: pgm.Model
    merges: dict[str, Merge]
    leaf_sizes: dict[str, int]
    max_cells: int = 5_000_000
    reduced: list[str] = field(default_factory=list)  # conditioning cut to fit max_cells

    def to_model(self, name: str, leaves: np.ndarray) -> np.ndarray:
        """Model codes of leaf codes (a merged leaf becomes its group's code)."""
        merge = self.merges.get(name)
        if merge is None:
            return np.asarray(leaves, dtype=np.int64)
        mapping = np.empty(self.leaf_sizes[name], dtype=np.int64)
        for code, members in enumerate(merge.members):
            mapping[members] = code
        return mapping[np.asarray(leaves, dtype=np.int64)]

    def model_codes_of_leaf(self, name: str, leaf: int) -> list[int]:
        """The model codes that stand for ``leaf`` alone (none when it shares a group)."""
        merge = self.merges.get(name)
        if merge is None:
            return [leaf]
        return [c for c, m in enumerate(merge.members) if m.size == 1 and int(m[0]) == leaf]

    def to_leaves(self, name: str, codes: np.ndarray, rng: np.random.Generator,
                  forbid_leaf: int | None = None) -> np.ndarray:
        """Leaf codes of model codes: a merged group's rows shared among its leaves by the
        merge's weights (``Merge.expand``), never to ``forbid_leaf``."""
        merge = self.merges.get(name)
        if merge is None:
            return np.asarray(codes, dtype=np.int64)
        if forbid_leaf is not None:
            merge = _without_leaf(merge, forbid_leaf)
        return merge.expand(np.asarray(codes, dtype=np.int64), rng)


def _without_leaf(merge: Merge, leaf: int) -> Merge:
    """The merge with ``leaf``'s expansion weight 0 in every group that has other leaves."""
    weights = []
    for code, members in enumerate(merge.members):
        weight = (np.asarray(merge.weights[code], dtype=np.float64).copy() if merge.weights
                  else np.ones(members.size))
        hit = members == leaf
        if hit.any() and members.size > 1:
            weight[hit] = 0.0
            if not weight.sum() > 0:
                weight = np.where(hit, 0.0, 1.0)
        weights.append(weight)
    return replace(merge, weights=tuple(weights))


def sampling_plan(view: ModelView, given: Sequence[str], targets: Sequence[str]
                  ) -> list[tuple[str, tuple[str, ...]]]:
    """(column, its conditioning columns) in drawing order, for ``targets`` given ``given``.

    The model's graph (an edge between two columns of one clique) is triangulated by
    eliminating first every other column (summed out), then the targets, each time the one
    whose neighbourhood has the fewest cells; a target's neighbours at its elimination are
    given or drawn before it. A conditioning set whose table would exceed ``max_cells`` loses
    its largest given columns first (an approximation, recorded in ``view.reduced``)."""
    model = view.model
    sizes = model.domain.sizes
    adjacency: dict[str, set[str]] = {a: set() for a in model.domain.attributes}
    for clique in model.cliques:
        for a in clique:
            adjacency[a] |= set(clique) - {a}
    given_set, target_set = set(given), set(targets)
    hidden = [a for a in model.domain.attributes if a not in given_set | target_set]
    order_key = {a: i for i, a in enumerate(model.domain.attributes)}

    def cells(a: str) -> int:
        return math.prod(sizes[b] for b in adjacency[a] | {a})

    def eliminate(a: str) -> set[str]:
        neighbours = adjacency.pop(a)
        for b in neighbours:
            adjacency[b] |= neighbours - {b}
            adjacency[b].discard(a)
        return neighbours

    remaining = list(hidden)
    while remaining:
        a = min(remaining, key=lambda x: (cells(x), order_key[x]))
        remaining.remove(a)
        eliminate(a)
    plan: list[tuple[str, tuple[str, ...]]] = []
    remaining = list(targets)
    while remaining:
        a = min(remaining, key=lambda x: (cells(x), order_key[x]))
        remaining.remove(a)
        condition = sorted(eliminate(a), key=order_key.__getitem__)
        while condition and math.prod(sizes[b] for b in [*condition, a]) > view.max_cells:
            drop = max((b for b in condition if b in given_set), default=None,
                       key=lambda b: sizes[b]) or max(condition, key=lambda b: sizes[b])
            condition.remove(drop)
            view.reduced.append(f"{a} | {drop}")
        plan.append((a, tuple(condition)))
    return plan[::-1]


def sample_given(view: ModelView, given: Mapping[str, np.ndarray], targets: Sequence[str],
                 rows: int, rng: np.random.Generator,
                 allowed: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """``rows`` draws of ``targets`` (model codes) from the model's law given the ``given``
    columns' model codes (one per row), each column restricted to its ``allowed`` codes.

    Within each group of rows with the same conditioning values the draws are stratified
    (``pgm``'s randomized rounding through the conditional CDF). A group whose conditional
    puts no mass on an allowed value draws from the column's allowed marginal instead."""
    allowed = allowed or {}
    out: dict[str, np.ndarray] = {}
    if rows <= 0:
        return {t: np.zeros(0, dtype=np.int64) for t in targets}
    codes = {k: np.asarray(v, dtype=np.int64) for k, v in given.items()}
    sizes = view.model.domain.sizes
    for column, condition in sampling_plan(view, list(given), targets):
        joint = np.clip(np.asarray(view.model.marginal((*condition, column)), dtype=np.float64),
                        0.0, None)
        mask = allowed.get(column)
        if mask is not None:
            joint = joint * np.asarray(mask, dtype=np.float64)
        table = joint.reshape(-1, sizes[column])
        fallback = np.clip(np.asarray(view.model.marginal((column,)), dtype=np.float64),
                           0.0, None).reshape(-1)
        if mask is not None:
            fallback = fallback * np.asarray(mask, dtype=np.float64)
        if not fallback.sum() > 0:
            fallback = (np.ones(sizes[column]) if mask is None
                        else np.asarray(mask, dtype=np.float64))
        empty = ~(table.sum(axis=1) > 0)
        table[empty] = fallback
        if not condition:
            drawn = pgm._round_column(table.reshape(-1), rows, rng)
        else:
            drawn = pgm._conditional_column(table.reshape(joint.shape),
                                            [codes[c] for c in condition],
                                            [sizes[c] for c in condition], rows, rng)
        codes[column] = out[column] = np.asarray(drawn, dtype=np.int64)
    return out
