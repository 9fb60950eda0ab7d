"""Set-valued predictors for DiffGen (ALGORITHMS.md §4): item sets generalized over a taxonomy.

A record's items (an admission's ICD-9 codes) generalize to a *set value*: the set of item
taxonomy nodes that cover them. A column starts with two values, the empty set (records without
items; public, never split) and ``{*}``. Specializing node ``u`` (``k`` children) splits every
value ``s`` that holds ``u`` into the ``2^k - 1`` children ``s - {u} + S``, one per non-empty
subset ``S`` of ``u``'s children, and each record moves to the child its items select.

Emptiness test (the paper's "noisy count of each child partition"): every child gets a count
plus discrete Laplace noise of scale ``1/eps_test``; a record is in exactly one child, so the
whole vector costs ``eps_test``. A child is kept if its noisy count reaches the threshold.
Children without records must face the same test, or the output would tell which item
combinations occur: there are too many to enumerate, so the number that pass is drawn exactly
(the exact binomial, by geometric skips: ``randomness.tail_binomial``) and that many are
picked uniformly among them. Records of children that fail stay in ``s``, which then keeps ``u``
unspecialized for good (a *remainder*): no record is lost and every released value is a true
generalization of the record's items.

The threshold is the smallest integer at which the expected number of spurious children per
split value, ``(2^k - 1) P(Z >= threshold)``, is at most ``spurious_per_split`` — on the ICD-9
root (19 chapters) and a small budget this exceeds any count a small table has, which is the
honest price of testing half a million possible children.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from medrelease.data.taxonomy import Taxonomy
from medrelease.errors import ParameterError
from medrelease.privacy.randomness import (
    discrete_laplace,
    discrete_laplace_tail,
    noise_epsilon,
    tail_binomial,
)

Node = tuple[int, int]  # (level, code) in the item taxonomy
MAX_SPURIOUS_DRAWS = 100_000


@dataclass(frozen=True)
class ItemSets:
    """The distinct item-set cells of a column: items as leaf codes, grouped per cell (CSR)."""

    owner: np.ndarray  # cell index of every item
    items: np.ndarray  # leaf code of every item
    n_sets: int
    sizes: np.ndarray  # items per cell


def encode_item_sets(values: pd.Series, separator: str, taxonomy: Taxonomy
                     ) -> tuple[np.ndarray, ItemSets]:
    """Per row, the index of its distinct item-set cell; missing or blank cells have no items."""
    text = values.astype("string").fillna("")
    row_set, distinct = pd.factorize(text, sort=False)
    parts = pd.Series(list(distinct), dtype="string").str.split(separator, regex=False).explode()
    parts = parts.str.strip()
    parts = parts[parts.notna() & (parts != "")]
    leaf = taxonomy.encode(parts.reset_index(drop=True)).astype(np.int64)
    pairs = np.unique(np.column_stack([parts.index.to_numpy(np.int64), leaf]), axis=0)
    owner, items = (pairs[:, 0], pairs[:, 1]) if pairs.size else (np.zeros(0, np.int64),) * 2
    sizes = np.bincount(owner, minlength=len(distinct))
    return row_set.astype(np.int64), ItemSets(owner, items, len(distinct), sizes)


@dataclass(frozen=True)
class SetValue:
    nodes: tuple[Node, ...]            # sorted taxonomy nodes
    frozen: frozenset[Node] = frozenset()  # nodes whose children failed: never split again


@dataclass(frozen=True)
class ChildGroups:
    """Records' children under one candidate node: per affected cell, its (parent, subset) group."""

    node: Node
    kids: np.ndarray           # codes of the node's children (one level down)
    cells: np.ndarray          # affected item-set cells
    group: np.ndarray          # group index per affected cell
    parent: np.ndarray         # parent value per group
    masks: np.ndarray          # (groups, words) uint64 bitmask of the children present


@dataclass
class SetCut:
    """One set-valued column's pool of values, the cells' current values, and the split history."""

    taxonomy: Taxonomy
    values: list[SetValue] = field(default_factory=list)
    history: list[tuple[Node, dict[tuple[int, bytes], int]]] = field(default_factory=list)

    EMPTY = 0
    ROOT = 1

    def __post_init__(self) -> None:
        if not self.values:
            self.values = [SetValue(()), SetValue(((self.taxonomy.height, 0),))]

    def initial(self, itemsets: ItemSets) -> np.ndarray:
        return np.where(itemsets.sizes > 0, self.ROOT, self.EMPTY).astype(np.int64)

    def label(self, index: int) -> str:
        names = self.taxonomy.level_labels
        return "|".join(names[level][code] for level, code in self.values[index].nodes)

    def candidates(self) -> list[Node]:
        """Nodes that some value holds and may still split (from earlier private choices only)."""
        return sorted({n for v in self.values for n in v.nodes if n[0] > 0 and n not in v.frozen})

    def children_of(self, node: Node) -> np.ndarray:
        level, code = node
        under = self.taxonomy.level_codes[level] == code
        return np.unique(self.taxonomy.level_codes[level - 1][under])

    def groups(self, node: Node, itemsets: ItemSets, assign: np.ndarray,
               replaying: bool = False) -> ChildGroups:
        """Which child of ``node`` every affected cell falls into (vectorized over items).

        ``replaying``: the split of ``node`` is being replayed, so values that hold it count as
        unsplit (their freezing came from this very split).
        """
        level, code = node
        holds = np.array([node in v.nodes and (replaying or node not in v.frozen)
                          for v in self.values])
        affected = holds[assign]
        taxonomy = self.taxonomy
        kids = self.children_of(node)
        sel = affected[itemsets.owner] & (taxonomy.level_codes[level][itemsets.items] == code)
        owner = itemsets.owner[sel]
        child = np.searchsorted(kids, taxonomy.level_codes[level - 1][itemsets.items[sel]])
        words = max(1, math.ceil(kids.size / 64))
        masks = np.zeros((itemsets.n_sets, words), dtype=np.uint64)
        np.bitwise_or.at(masks, (owner, child // 64),
                         np.left_shift(np.uint64(1), (child % 64).astype(np.uint64)))
        cells = np.flatnonzero(affected)
        keys = np.column_stack([assign[cells].astype(np.uint64), masks[cells]])
        unique, group = np.unique(keys, axis=0, return_inverse=True)
        return ChildGroups(node, kids, cells, group.reshape(-1),
                           unique[:, 0].astype(np.int64), unique[:, 1:].copy())

    def specialize(self, groups: ChildGroups, group_counts: np.ndarray, eps_test: float,
                   spurious_per_split: float, rng: np.random.Generator,
                   assign: np.ndarray, max_values: int | None = None
                   ) -> dict[str, float | int | str]:
        """Split ``groups.node``: noisy emptiness test, spurious children, remainders; in place.

        ``max_values`` (public: DiffGen's cell ceiling over the other columns' cut sizes): a
        split whose kept children would take the column past it keeps none of them — every
        record stays in its parent, which keeps ``node`` for good (a remainder). That decision
        reads the noisy test's outcome only (post-processing), so the step's epsilon is
        unchanged, and no cell beyond the ceiling is ever drawn."""
        node, k = groups.node, groups.kids.size
        threshold = emptiness_threshold(k, eps_test, spurious_per_split)
        noisy = group_counts + discrete_laplace(rng, eps_test, group_counts.size)
        pass_probability = discrete_laplace_tail(eps_test, threshold)
        new_children: dict[tuple[int, bytes], int] = {}
        parents = [i for i, v in enumerate(self.values) if node in v.nodes and node not in v.frozen]
        room = None if max_values is None else max_values - len(self.values)
        children: list[SetValue] = []
        over = False
        for parent in parents:
            mine = np.flatnonzero(groups.parent == parent)
            observed = {groups.masks[g].tobytes() for g in mine}
            kept = [groups.masks[g] for g in mine if noisy[g] >= threshold]
            n_spurious = tail_binomial(rng, (1 << k) - 1 - len(observed), eps_test, threshold)
            if room is not None and len(children) + len(kept) + n_spurious > room:
                over = True  # the split is not made: no child is kept, nothing more is drawn
                break
            kept += _random_masks(rng, k, groups.masks.shape[1], n_spurious, observed)
            for mask in kept:
                new_children[(parent, mask.tobytes())] = len(self.values) + len(children)
                children.append(self._child(self.values[parent], node, groups.kids, mask))
        if over:
            new_children, children = {}, []
        self.values.extend(children)
        for parent in parents:
            old = self.values[parent]
            self.values[parent] = SetValue(old.nodes, old.frozen | {node})
        self.history.append((node, new_children))
        self._move(groups, assign, new_children)
        level, code = node
        step: dict[str, float | int | str] = {
            "node": self.taxonomy.level_labels[level][code], "children_possible": (1 << k) - 1,
            "threshold": threshold, "children_kept": len(new_children),
            "expected_spurious_per_value": ((1 << k) - 1) * pass_probability}
        if over:
            step["not_made"] = "its kept children would exceed the leaf-cell ceiling"
        return step

    def replay(self, itemsets: ItemSets) -> np.ndarray:
        """Current values of new cells (held-out records) under the recorded splits."""
        assign = self.initial(itemsets)
        for node, children in self.history:
            self._move(self.groups(node, itemsets, assign, replaying=True), assign, children)
        return assign

    @staticmethod
    def _move(groups: ChildGroups, assign: np.ndarray,
              children: dict[tuple[int, bytes], int]) -> None:
        target = np.array([children.get((int(p), m.tobytes()), -1)
                           for p, m in zip(groups.parent, groups.masks, strict=True)],
                          dtype=np.int64)
        moved = target[groups.group] if target.size else np.zeros(0, np.int64)
        assign[groups.cells[moved >= 0]] = moved[moved >= 0]

    @staticmethod
    def _child(parent: SetValue, node: Node, kids: np.ndarray, mask: np.ndarray) -> SetValue:
        bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[: kids.size]
        present = {(node[0] - 1, int(kids[j])) for j in np.flatnonzero(bits)}
        return SetValue(tuple(sorted((set(parent.nodes) - {node}) | present)), parent.frozen)


def emptiness_threshold(k: int, eps_test: float, spurious_per_split: float) -> int:
    """Smallest integer t >= 1 with (2^k - 1) P(Z >= t) <= spurious_per_split."""
    log_children = k * math.log(2.0) + math.log1p(-(2.0 ** -k))
    eps = noise_epsilon(eps_test)
    need = (log_children - math.log1p(math.exp(-eps)) - math.log(spurious_per_split))
    threshold = max(1, math.ceil(need / eps))
    children = (1 << k) - 1
    while children * discrete_laplace_tail(eps_test, threshold) > spurious_per_split:
        threshold += 1
    while threshold > 1 and children * discrete_laplace_tail(eps_test, threshold - 1) \
            <= spurious_per_split:
        threshold -= 1
    return threshold


def _random_masks(rng: np.random.Generator, k: int, words: int, count: int,
                  taken: set[bytes]) -> list[np.ndarray]:
    """``count`` distinct non-empty subsets of k children, uniformly among those not taken."""
    if count > MAX_SPURIOUS_DRAWS:
        raise ParameterError("the emptiness test would keep more than "
                             f"{MAX_SPURIOUS_DRAWS:,} spurious item combinations")
    chosen: list[np.ndarray] = []
    seen = set(taken)
    while len(chosen) < count:
        bits = np.zeros(words * 64, dtype=np.uint8)
        bits[:k] = rng.integers(0, 2, size=k, dtype=np.uint8)
        mask = np.packbits(bits, bitorder="little").view(np.uint64)
        key = mask.tobytes()
        if bits.any() and key not in seen:
            seen.add(key)
            chosen.append(mask)
    return chosen
