"""Private-PGM (McKenna et al. 2019) as ``aim`` uses it, in numpy: estimation from noisy
marginals by mirror descent, model marginals for scoring, and sampling. Nothing here sees the
data: only noisy measurements (DP outputs), public domains and the taxonomies' code maps.

Why not ``mbi`` itself (which the benchmarks' reference AIM runs, and whose results the tests
compare with): mbi runs on jax, which compiles one XLA program per model structure, and in
AIM every round is a new structure. In a fresh process (a served run) that compilation was two
thirds of a release's time (Adult: 191 s of 516 s; docs/results/aim.md). The same algorithm in
numpy compiles nothing. It is mbi's ``MirrorDescent`` (Armijo step search, step size 2 / (L x
total), a callback block of 50 steps for the early stop) with mbi's L2 loss and Lipschitz bound,
calibrated on mbi's junction tree (``junction_tree.py``) by two-pass message passing; one
calibration per step instead of mbi's two (the marginals of an accepted step are the next step's).

A coarse-level measurement is a linear query of the fine clique marginal: ``LevelQuery`` sums
it through the taxonomy's level maps, ``ScaledQuery`` scales a 1-way over merged values; each
has its adjoint (the gradient) and operator norm (the Lipschitz bound).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from math import prod

import numpy as np
from threadpoolctl import threadpool_limits

from medrelease.synthetic.axis_sums import AxisGroups
from medrelease.synthetic.junction_tree import Clique, make_junction_tree
from medrelease.synthetic.junction_tree import model_size_mb as _tree_size_mb

CHECK_EVERY = 50  # steps between the early-stop checks (mbi's callback block)
# The sampler's random order within a parent group: at least this many random bits beside the
# group and the row index in one int64, else a stable argsort on 32 random bits. Rows tied on
# their random bits (about m^2 / 2^(bits+1) pairs in a group of m rows) go in index order
# either way; the rows are exchangeable, so the law is that of a random tie-break.
MIN_RANDOM_BITS = 24
# Two departures from mbi's mirror descent, each measured (docs/results/aim.md, "Fits that
# converge"): the step size grows by 5 % after an accepted step (mbi: 1 %), and a warm start
# starts from the step size the last fit ended with (mbi: from 2 / (L x total) every fit).
# mbi's step needs ~1,000 steps to grow 20,000-fold, which a 1,361,000-row table needs: its
# fits stopped far from their optimum (loss 3.2e5 after the final 1,000 steps; 6.1e4 after
# 500 with these two), the model moved less than the noise, AIM annealed every round and
# measured 3 marginals instead of 8.
STEP_GROWTH = 1.05
CARRY_STEP = True
# The calibration's exponentials in float32 (the log-potentials, their sums and every marginal
# stay float64): numpy's float64 exp has no AVX2 kernel and was half of a step at 1,361,000
# rows (18 ms against 4.4 ms in float32 for 1.24 M cells). The exponent is rounded to float32
# first: a relative error of about |x| x 6e-8 (3e-6 at exp(-50), an entry 2e-22 of the node's
# largest; below exp(-87) zero, and every sum holds exp(0) = 1). mbi computes everything in
# float32. Error measured both ways
# (docs/results/aim.md): Adult 5 seeds 0.0368 / 0.0889 (float64: 0.0379 / 0.0911); 1,361,000
# rows 3 seeds 0.0685 / 0.1903 (0.0675 / 0.1897), the same with a float64 final fit: the
# rounds take another path, the final model's precision is not what differs.
EXP_DTYPE = np.float32


@dataclass(frozen=True)
class Domain:
    """Attribute names and their sizes, in the model's order."""

    attributes: tuple[str, ...]
    shape: tuple[int, ...]

    @cached_property
    def sizes(self) -> dict[str, int]:
        return dict(zip(self.attributes, self.shape, strict=True))

    def shape_of(self, clique: Clique) -> tuple[int, ...]:
        return tuple(self.sizes[a] for a in clique)

    def cells(self, clique: Clique) -> int:
        return prod(self.shape_of(clique))


@dataclass(frozen=True)
class LevelQuery:
    """Sums a fine clique marginal (axes in clique order) to taxonomy levels: per axis a tuple
    leaf -> coarse code, or None for an axis kept at its leaves."""

    maps: tuple[tuple[int, ...] | None, ...]
    sizes: tuple[int, ...]

    @cached_property
    def _groups(self) -> tuple[AxisGroups | None, ...]:
        return tuple(None if groups is None else AxisGroups.of(groups, size)
                     for groups, size in zip(self.maps, self.sizes, strict=True))

    def forward(self, table: np.ndarray) -> np.ndarray:
        values = table
        for axis, groups in enumerate(self._groups):
            if groups is not None:
                values = groups.sum(values, axis)
        return values.reshape(-1)

    def adjoint(self, vector: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """The transpose: each coarse cell's value copied to every fine cell summed into it."""
        values = vector.reshape(tuple(s if g is not None else f for g, s, f
                                      in zip(self.maps, self.sizes, shape, strict=True)))
        for axis, groups in enumerate(self.maps):
            if groups is not None:
                values = np.take(values, np.asarray(groups), axis=axis)
        return values

    def op_norm_sq(self) -> float:
        """||Q||^2 = the largest number of fine cells summed into one coarse cell."""
        largest = 1
        for groups in self.maps:
            if groups is not None:
                largest *= int(np.bincount(np.asarray(groups)).max())
        return float(largest)


@dataclass(frozen=True)
class ScaledQuery:
    """A 1-way marginal over merged values, each entry scaled (1 for a kept value,
    1/sqrt(k) for a group of k merged leaves, whose noisy sum has k times the variance):
    a leaf-level measurement re-expressed on the merged domain with one noise scale."""

    weights: tuple[float, ...]

    @cached_property
    def _weights(self) -> np.ndarray:
        return np.asarray(self.weights, dtype=np.float64)

    def forward(self, table: np.ndarray) -> np.ndarray:
        return table.reshape(-1) * self._weights

    def adjoint(self, vector: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return (vector * self._weights).reshape(shape)

    def op_norm_sq(self) -> float:
        return float(max(w * w for w in self.weights))


@dataclass(frozen=True)
class Measurement:
    """A noisy marginal (flat, the query's output order) of ``clique`` with its noise scale."""

    noisy: np.ndarray
    clique: Clique
    stddev: float
    query: LevelQuery | ScaledQuery | None = None

    def forward(self, table: np.ndarray) -> np.ndarray:
        return table.reshape(-1) if self.query is None else self.query.forward(table)

    def adjoint(self, vector: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return vector.reshape(shape) if self.query is None else self.query.adjoint(vector, shape)

    def op_norm_sq(self) -> float:
        return 1.0 if self.query is None else self.query.op_norm_sq()


def domain(names: tuple[str, ...], sizes: tuple[int, ...]) -> Domain:
    return Domain(tuple(names), tuple(int(s) for s in sizes))


def measurement(noisy: np.ndarray, clique: tuple[str, ...], sigma: float,
                query: LevelQuery | ScaledQuery | None) -> Measurement:
    """A noisy marginal as a linear measurement (identity query at leaf level)."""
    return Measurement(np.asarray(noisy, dtype=np.float64).reshape(-1), tuple(clique),
                       float(sigma), query)


@dataclass
class Model:
    """A fitted model: log-potentials and fitted marginals (counts) on its cliques (axes in
    clique order), and the total it is scaled to."""

    domain: Domain
    cliques: tuple[Clique, ...]
    potentials: dict[Clique, np.ndarray]
    marginals: dict[Clique, np.ndarray]
    total: float
    gain: float = 1.0  # the last step size, in units of mirror descent's first (2 / (L total))
    _cache: dict[Clique, np.ndarray] = field(default_factory=dict, repr=False)

    def marginal(self, clique: Clique) -> np.ndarray:
        """The model's marginal on ``clique`` (axes in clique order), in counts: a sum of a
        fitted clique marginal that holds it, else sum-product over every attribute outside
        it, smallest intermediate first (variable elimination)."""
        clique = tuple(clique)
        if clique in self._cache:
            return self._cache[clique]
        for attrs, table in self.marginals.items():
            if set(clique) <= set(attrs):
                axes, perm = _reduce(attrs, clique)
                return np.transpose(table.sum(axis=axes) if axes else table, perm)
        parts: dict[frozenset[str], list[str]] = {}
        for a in clique:
            parts.setdefault(self._components.get(a, frozenset({a})), []).append(a)
        if len(parts) > 1:  # independent parts of the model: the product of their marginals
            out = self._product([(tuple(p), self.marginal(tuple(p))) for p in parts.values()],
                                clique)
            self._cache[clique] = out
            return out
        # Only the factors connected to the clique's attributes: every other part of the model
        # sums to a constant, which the normalization below removes (a wide table's model is
        # mostly separate parts early in the rounds: eliminating all of them for every
        # candidate was most of a round's scoring).
        reach = set().union(*(self._components.get(a, {a}) for a in clique))
        factors = [(attrs, table) for attrs, table in self.potentials.items()
                   if attrs and attrs[0] in reach]
        keep = set(clique)
        # in domain order, so that ties go the same way in every process (a set's order
        # follows string hashing: the same seed gave another release in another process)
        present = {a for attrs, _ in factors for a in attrs} - keep
        eliminate = [a for a in self.domain.attributes if a in present]
        sizes = self.domain.sizes
        while eliminate:
            z = _cheapest(eliminate, factors, sizes)
            eliminate.remove(z)
            involved = [f for f in factors if z in f[0]]
            factors = [f for f in factors if z not in f[0]]
            attrs, table = _log_product(involved)
            axis = attrs.index(z)
            factors.append((attrs[:axis] + attrs[axis + 1:], _logsumexp(table, axis)))
        _, table = _log_product([*factors, (clique, np.zeros(self.domain.shape_of(clique)))],
                                clique)
        table = np.exp(table - table.max())
        out = table * (self.total / table.sum())
        self._cache[clique] = out
        return out


    def _product(self, parts: list[tuple[Clique, np.ndarray]], clique: Clique) -> np.ndarray:
        """The joint of independent parts (each a marginal in counts summing to the total):
        their outer product over the total to the power of parts - 1, in ``clique``'s axis
        order. A wide table's model is mostly independent parts: each part's marginal is
        computed once and shared by every candidate that crosses it (issue 55)."""
        order: list[str] = []
        table = np.ones(())
        for attrs, part in parts:
            table = np.multiply.outer(table, part / self.total)
            order.extend(attrs)
        perm = [order.index(a) for a in clique]
        return np.transpose(table, perm) * self.total

    @cached_property
    def _components(self) -> dict[str, frozenset[str]]:
        """Each attribute's connected part of the model (attributes joined by a clique)."""
        parent = {a: a for a in self.domain.attributes}

        def root(a: str) -> str:
            while parent[a] != a:
                parent[a] = parent[parent[a]]
                a = parent[a]
            return a

        for attrs in self.potentials:
            for a in attrs[1:]:
                parent[root(a)] = root(attrs[0])
        parts: dict[str, set[str]] = {}
        for a in self.domain.attributes:
            parts.setdefault(root(a), set()).add(a)
        return {a: frozenset(parts[root(a)]) for a in self.domain.attributes}


def _cheapest(eliminate: list[str], factors: list, sizes: dict[str, int]) -> str:
    """The attribute whose elimination joins the fewest cells (the first in ``eliminate``'s
    order on a tie: ``min``'s rule), in exact integers."""
    best, best_size = eliminate[0], None
    for attribute in eliminate:
        joined: set[str] = set()
        for attrs, _ in factors:
            if attribute in attrs:
                joined.update(attrs)
        size = prod(sizes[a] for a in joined)
        if best_size is None or size < best_size:
            best, best_size = attribute, size
    return best


def model_marginal(model: Model, clique: tuple[str, ...]) -> np.ndarray:
    """The model's marginal on ``clique`` (axes in clique order), in counts."""
    return model.marginal(clique)


def model_size_mb(model_domain: Domain, cliques: list[tuple[str, ...]]) -> float:
    return _tree_size_mb(model_domain.attributes, model_domain.shape, cliques)


def _log_product(factors: list, order: tuple[str, ...] | None = None
                 ) -> tuple[tuple[str, ...], np.ndarray]:
    """The sum of log-tables over the union of their attributes (``order`` if given)."""
    union = list(order) if order else []
    for attrs, _ in factors:
        union.extend(a for a in attrs if a not in union)
    total = None
    for attrs, table in factors:
        perm = sorted(range(len(attrs)), key=lambda i: union.index(attrs[i]))
        moved = np.transpose(table, perm)
        shape = [1] * len(union)
        for i in perm:
            shape[union.index(attrs[i])] = table.shape[i]
        moved = moved.reshape(shape)
        total = moved if total is None else total + moved
    return tuple(union), total


def _logsumexp(table: np.ndarray, axis: int) -> np.ndarray:
    top = table.max(axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    return np.log(np.exp(table - top).sum(axis=axis)) + np.squeeze(top, axis=axis)




def _align(source: Clique, target: Clique, shape: tuple[int, ...]) -> tuple[list[int], tuple[int, ...]]:
    """How a table on ``source`` (axes in its order, ``shape``) broadcasts into ``target``'s
    axes: the transposition into target order, then the shape with 1 on the missing axes."""
    perm = sorted(range(len(source)), key=lambda i: target.index(source[i]))
    out = [1] * len(target)
    for i in perm:
        out[target.index(source[i])] = shape[i]
    return perm, tuple(out)


def _broadcast_sum(parts: list[np.ndarray], shape: tuple[int, ...],
                   owned: bool = False) -> np.ndarray:
    """The sum of ``parts`` (each broadcastable to ``shape``) as an array of ``shape``: one
    pass for the first two parts, none for a zero fill first. With ``owned`` (the parts are
    the caller's to give away) a lone part of the full shape is returned as it is; else the
    result is always a new array (the calibration writes into it)."""
    if owned and len(parts) == 1 and parts[0].shape == shape and parts[0].dtype == np.float64:
        return parts[0]
    out = np.empty(shape)
    if not parts:
        out.fill(0.0)
    elif len(parts) == 1:
        out[...] = parts[0]
    else:
        np.add(parts[0], parts[1], out=out)
        for part in parts[2:]:
            out += part
    return out


def _reduce(source: Clique, target: Clique) -> tuple[tuple[int, ...], list[int]]:
    """How a table on ``source`` sums to ``target`` (a subset): the axes summed out, then the
    transposition of what is left (source order) into target order."""
    axes = tuple(i for i, a in enumerate(source) if a not in target)
    kept = [a for a in source if a in target]
    return axes, [kept.index(a) for a in target]


def _maximal(cliques: list[Clique], model_domain: Domain) -> tuple[Clique, ...]:
    """The cliques not contained in another, larger first, each with its attributes in domain
    order, as the junction tree's nodes are (one convention throughout; measured, it does not
    change the calibration's time)."""
    out: list[Clique] = []
    for clique in sorted(dict.fromkeys(cliques), key=len, reverse=True):
        if not any(set(clique) <= set(other) for other in out):
            out.append(tuple(a for a in model_domain.attributes if a in clique))
    return tuple(out)


def _home(clique: Clique, candidates: tuple[Clique, ...], model_domain: Domain) -> Clique:
    """The smallest (in cells) of ``candidates`` that holds ``clique`` (mbi's routing)."""
    return min((c for c in candidates if set(clique) <= set(c)), key=model_domain.cells)


class Marginalizer:
    """Every marginal of one table that is asked for (attribute subsets, each in domain order),
    through shared intermediate sums: sum out first the attribute that the most targets lack
    (weighted by its size), compute those targets from the smaller table, repeat for the rest.
    On Adult's final model (seed 1000) a node of 109,760 cells gives its eight targets for
    three passes over it instead of eight. Built once per model structure."""

    def __init__(self, source: Clique, targets: list[Clique], sizes: dict[str, int]) -> None:
        self.steps: list[tuple[int, tuple[int, ...]]] = []  # (input table, axes summed out)
        self.found: dict[Clique, int] = {}                   # target -> table index
        self._plan(0, source, list(dict.fromkeys(targets)), sizes)

    def _plan(self, table: int, attrs: Clique, targets: list[Clique],
              sizes: dict[str, int]) -> None:
        remaining = []
        for target in targets:
            if target == attrs:
                self.found[target] = table
            else:
                remaining.append(target)
        while remaining:
            def merit(a: str, group: list[Clique] = remaining) -> float:
                return sum(1 for t in group if a not in t) * np.log(sizes[a] + 1.0)
            drop = max((a for a in attrs if any(a not in t for t in remaining)), key=merit)
            group = [t for t in remaining if drop not in t]
            remaining = [t for t in remaining if drop in t]
            # sum out every attribute no target of the group needs (at least ``drop``)
            needed = set().union(*[set(t) for t in group])
            keep = tuple(a for a in attrs if a in needed)
            self.steps.append((table, tuple(i for i, a in enumerate(attrs) if a not in keep)))
            self._plan(len(self.steps), keep, group, sizes)

    def __call__(self, table: np.ndarray) -> dict[Clique, np.ndarray]:
        tables = [table]
        for source, axes in self.steps:
            tables.append(tables[source].sum(axis=axes, dtype=np.float64))
        if tables[0].dtype != np.float64 and 0 in self.found.values():
            tables[0] = tables[0].astype(np.float64)  # marginals are float64 throughout
        return {target: tables[index] for target, index in self.found.items()}


class Calibration:
    """One model structure (the potentials' cliques over a domain): its junction tree rooted,
    and how every table moves between potentials, tree nodes and separators. Built once per
    structure; ``marginals`` is then two passes of numpy over the tree.

    The tree's nodes are in domain order, so a separator has the same axis order in a node
    and its parent and a message moves between them by a reshape."""

    def __init__(self, model_domain: Domain, cliques: tuple[Clique, ...]) -> None:
        self.domain, self.cliques = model_domain, cliques
        tree = make_junction_tree(model_domain.attributes, model_domain.shape, cliques)
        nodes = tree.nodes
        self.shapes = [model_domain.shape_of(n) for n in nodes]
        near: dict[int, list[int]] = {i: [] for i in range(len(nodes))}
        for i, j in tree.edges:
            near[i].append(j)
            near[j].append(i)
        self.parent = [-1] * len(nodes)
        self.preorder: list[int] = []
        seen: set[int] = set()
        for start in sorted(range(len(nodes)), key=lambda i: -prod(self.shapes[i])):
            if start in seen:
                continue
            stack = [start]
            seen.add(start)
            while stack:
                k = stack.pop()
                self.preorder.append(k)
                for j in near[k]:
                    if j not in seen:
                        seen.add(j)
                        self.parent[j] = k
                        stack.append(j)
        # per non-root node: the axes summed out towards its parent, and the separator's
        # shape as a broadcast into the parent's axes (the way down reads the separator from
        # the parent's ``Marginalizer``)
        self.up_axes: list[tuple[int, ...]] = []
        self.into_parent: list[tuple[int, ...]] = []
        for k, node in enumerate(nodes):
            p = self.parent[k]
            if p < 0:
                self.up_axes.append(())
                self.into_parent.append(())
                continue
            sep = set(node) & set(nodes[p])
            self.up_axes.append(tuple(i for i, a in enumerate(node) if a not in sep))
            self.into_parent.append(tuple(s if a in sep else 1
                                          for a, s in zip(nodes[p], self.shapes[p], strict=True)))
        self.node_of = {c: nodes.index(_home(c, nodes, model_domain)) for c in cliques}
        self.into_node = {c: _align(c, nodes[self.node_of[c]], model_domain.shape_of(c))
                          for c in cliques}
        # per node: the marginals asked of it (its potentials' cliques, its children's
        # separators), all in domain order
        self.separators = [tuple(a for a in node if p >= 0 and a in nodes[p])
                           for node, p in zip(nodes, self.parent, strict=True)]
        self.assigned: list[list[Clique]] = [[] for _ in nodes]
        for c in cliques:
            self.assigned[self.node_of[c]].append(c)
        asked = [list(a) for a in self.assigned]
        for k, p in enumerate(self.parent):
            if p >= 0:
                asked[p].append(self.separators[k])
        self.marginalizers = [Marginalizer(node, asked[k], model_domain.sizes)
                              for k, node in enumerate(nodes)]

    def _node_potential(self, k: int, potentials: dict[Clique, np.ndarray]) -> np.ndarray:
        """The sum of the potentials assigned to node ``k``, broadcast to its shape (one
        pass for the first two)."""
        return _broadcast_sum(
            [np.transpose(potentials[c], self.into_node[c][0]).reshape(self.into_node[c][1])
             for c in self.assigned[k]], self.shapes[k])

    def marginals(self, potentials: dict[Clique, np.ndarray], total: float
                  ) -> dict[Clique, np.ndarray]:
        """Each potential clique's marginal, scaled to ``total``. Collect: each node's
        beliefs, exponentiated against their maximum per separator cell, summed to its
        separator (the log of that sum is the message up). Distribute: a node's marginal is
        its conditional given the separator (exp(beliefs - message)) times the parent's
        marginal of the separator. Every exponent is <= 0: nothing overflows."""
        beliefs = [self._node_potential(k, potentials) for k in range(len(self.shapes))]
        weights: list[np.ndarray | None] = [None] * len(beliefs)
        sums: list[np.ndarray | None] = [None] * len(beliefs)
        for k in reversed(self.preorder):
            p = self.parent[k]
            if p < 0:
                continue
            b, axes = beliefs[k], self.up_axes[k]
            top = b.max(axis=axes, keepdims=True)
            np.subtract(b, top, out=b)
            w = _exp(b)
            sums[k] = w.sum(axis=axes, keepdims=True, dtype=np.float64)
            weights[k] = w
            beliefs[p] += (np.log(sums[k]) + top).reshape(self.into_parent[k])
        asked: list[dict[Clique, np.ndarray] | None] = [None] * len(beliefs)
        for k in self.preorder:
            p = self.parent[k]
            if p < 0:
                b = beliefs[k]
                np.subtract(b, b.max(), out=b)
                node = _exp(b)
                np.multiply(node, total / node.sum(dtype=np.float64), out=node,
                            casting="unsafe")
            else:
                separator = asked[p][self.separators[k]].reshape(sums[k].shape)
                node = weights[k]
                np.multiply(node, separator / sums[k], out=node, casting="unsafe")
                weights[k] = sums[k] = None
            asked[k] = self.marginalizers[k](node)
        return {clique: asked[self.node_of[clique]][clique] for clique in self.cliques}


def _exp(log_values: np.ndarray) -> np.ndarray:
    """exp of ``log_values`` (all <= 0) in ``EXP_DTYPE``: a new array when that differs from
    the input's type, else in place."""
    if log_values.dtype == EXP_DTYPE:
        return np.exp(log_values, out=log_values)
    return np.exp(log_values, dtype=EXP_DTYPE)


@lru_cache(maxsize=64)  # a run builds one per round; a long-lived process keeps few
def _calibration(model_domain: Domain, cliques: tuple[Clique, ...]) -> Calibration:
    return Calibration(model_domain, cliques)


@dataclass
class _Pooled:
    """The measurements of one marginal through one query, pooled: for y_i with sigma_i,
    ``sum_i ||Q mu - y_i||^2 / (2 sigma_i^2) = w ||Q mu - ybar||^2 / 2 + const`` with
    ``w = sum_i 1 / sigma_i^2`` and ``ybar`` their precision-weighted mean: one query and
    one adjoint per step however often AIM measured that marginal."""

    home: Clique
    clique: Clique
    first: Measurement  # the first of them: its query and adjoint serve them all
    weight: float
    mean: np.ndarray
    constant: float


class L2Loss:
    """mbi's L2 loss ``sum_m ||(Q_m mu_{c_m} - y_m) / sigma_m||^2 / 2`` over the potentials'
    cliques, with its gradient and mbi's Lipschitz bound of that gradient."""

    def __init__(self, model_domain: Domain, measurements: list[Measurement],
                 cliques: tuple[Clique, ...]) -> None:
        self.domain = model_domain
        homes = [_home(m.clique, cliques, model_domain) for m in measurements]
        blocks: dict[Clique, float] = {}
        for h, m in zip(homes, measurements, strict=True):
            share = m.op_norm_sq() / max(m.stddev, 1e-12) ** 2
            blocks[h] = blocks.get(h, 0.0) + share * model_domain.cells(h) / model_domain.cells(m.clique)
        self.lipschitz = max(blocks.values()) if blocks else 1.0
        groups: dict[tuple, list[Measurement]] = {}
        for h, m in zip(homes, measurements, strict=True):
            groups.setdefault((h, m.clique, m.query), []).append(m)
        self.pooled = []
        for (home, clique, _), group in groups.items():
            precision = np.array([1.0 / max(m.stddev, 1e-12) ** 2 for m in group])
            ys = [m.noisy for m in group]
            weight = float(precision.sum())
            mean = sum(p * y for p, y in zip(precision, ys, strict=True)) / weight
            constant = 0.5 * (sum(float(p * (y @ y)) for p, y in zip(precision, ys, strict=True))
                              - weight * float(mean @ mean))
            self.pooled.append(_Pooled(home, clique, group[0], weight, mean, constant))
        self.reduce = {(g.home, g.clique): _reduce(g.home, g.clique) for g in self.pooled}
        self.expand = {(g.home, g.clique): _align(g.clique, g.home, model_domain.shape_of(g.clique))
                       for g in self.pooled}

    def __call__(self, marginals: dict[Clique, np.ndarray], gradient: bool = True
                 ) -> tuple[float, dict[Clique, np.ndarray] | None]:
        loss = 0.0
        projected: dict[tuple[Clique, Clique], np.ndarray] = {}
        parts: dict[tuple[Clique, Clique], np.ndarray] = {}
        for g in self.pooled:
            key = (g.home, g.clique)
            if key not in projected:
                axes, perm = self.reduce[key]
                table = marginals[g.home]
                projected[key] = np.transpose(table.sum(axis=axes) if axes else table, perm)
            mu = projected[key]
            diff = g.first.forward(mu) - g.mean
            loss += 0.5 * g.weight * float(diff @ diff) + g.constant
            if gradient:
                part = g.first.adjoint(g.weight * diff, mu.shape)
                parts[key] = parts[key] + part if key in parts else part
        if not gradient:
            return loss, None
        pieces: dict[Clique, list[np.ndarray]] = {clique: [] for clique in marginals}
        for (home, clique), part in parts.items():
            perm, shape = self.expand[(home, clique)]
            pieces[home].append(np.transpose(part, perm).reshape(shape))
        return loss, {clique: _broadcast_sum(pieces[clique], self.domain.shape_of(clique),
                                             owned=True)
                      for clique in marginals}


def _step(theta: np.ndarray, grad: np.ndarray, alpha: float) -> np.ndarray:
    """``theta - alpha * grad`` as one new array (no temporary for ``alpha * grad``)."""
    out = np.multiply(grad, -alpha)
    out += theta
    return out


def _expanded(warm_start: Model | None, cliques: tuple[Clique, ...], model_domain: Domain
              ) -> dict[Clique, np.ndarray]:
    """Potentials on ``cliques``: zeros, plus each of the warm start's potentials added into
    the smallest new clique that holds it (the same distribution, as mbi's ``expand``)."""
    out = {c: np.zeros(model_domain.shape_of(c)) for c in cliques}
    if warm_start is None:
        return out
    for clique, table in warm_start.potentials.items():
        home = _home(clique, cliques, model_domain)
        perm, shape = _align(clique, home, table.shape)
        out[home] = out[home] + np.transpose(table, perm).reshape(shape)
    return out


def estimate(model_domain: Domain, measurements: list[Measurement], iters: int, total: float,
             warm_start: Model | None = None, tol: float | None = None) -> Model:
    """Private-PGM's mirror descent on every measurement so far (warm-started), scaled to the
    noisy total of the leaf-level 1-way measurements: mbi's ``MirrorDescent`` (Armijo: a step
    is kept when the loss falls by at least half the linear prediction, the step size then
    grows by ``STEP_GROWTH``, else halves; with mbi's 1 % growth and no carried step it is
    mbi's step for step, tests/unit/test_aim_estimator.py). Runs ``iters`` steps rounded up to blocks of
    ``CHECK_EVERY``; with ``tol`` it stops once the loss improved by at most ``tol``
    (relative) over two blocks in a row (mbi's rule)."""
    with threadpool_limits(limits=1, user_api="blas"):
        return _mirror_descent(model_domain, measurements, iters, total, warm_start, tol)


def _mirror_descent(model_domain: Domain, measurements: list[Measurement], iters: int,
                    total: float, warm_start: Model | None, tol: float | None) -> Model:
    """``estimate``'s loop. BLAS on one thread: its products here are a few thousand numbers,
    and OpenBLAS waking its threads for each cost 10-70x the product on a busy machine
    (a dot product of 16,554 numbers: 4 us alone, 0.3 ms with another process running)."""
    cliques = _maximal([m.clique for m in measurements], model_domain)
    calibration = _calibration(model_domain, cliques)
    loss_fn = L2Loss(model_domain, measurements, cliques)
    theta = _expanded(warm_start, cliques, model_domain)
    unit = 2.0 / (loss_fn.lipschitz * total)
    carried = warm_start.gain if warm_start is not None and CARRY_STEP else 1.0
    alpha = unit * max(1.0, carried)
    mu = calibration.marginals(theta, total)
    loss, grad = loss_fn(mu)
    previous, stalls = np.inf, 0
    for _block in range(-(-iters // CHECK_EVERY)):
        for _ in range(CHECK_EVERY):
            trial = {c: _step(theta[c], grad[c], alpha) for c in cliques}
            trial_mu = calibration.marginals(trial, total)
            trial_loss, trial_grad = loss_fn(trial_mu)
            predicted = sum(float(np.vdot(grad[c], mu[c]) - np.vdot(grad[c], trial_mu[c]))
                            for c in cliques)
            if loss - trial_loss >= 0.5 * alpha * predicted:
                theta, mu, loss, grad = trial, trial_mu, trial_loss, trial_grad
                alpha *= STEP_GROWTH
            else:
                alpha *= 0.5
        if tol is not None:
            stalls = stalls + 1 if previous - loss <= tol * max(abs(loss), 1.0) else 0
            previous = loss
            if stalls >= 2:
                break
    return Model(model_domain, cliques, theta, mu, float(total), gain=alpha / unit)


def sample(model: Model, rows: int, seed: int) -> dict[str, np.ndarray]:
    """``rows`` synthetic records from the model, as leaf codes per attribute.

    mbi's own sampler's law (``MarkovRandomField.synthetic_data``, method "round") in numpy:
    attributes in the junction tree's reverse elimination order, each drawn from its
    conditional given the attributes already drawn that share a junction-tree clique with it,
    by randomized rounding (within each group of rows with the same parents, the rows' ranks in
    a random order, jittered, read through the conditional CDF). mbi's version is a Python loop
    over every parent group plus jax message passing op by op (90 s of a 516 s Adult run, 120 s
    of 224 s at 1,361,000 rows, on a loaded machine; docs/results/aim.md); this
    one is vectorized, takes the marginals from the model (``Model.marginal``) and draws from
    its own generator (``seed``). Its law is tested
    against mbi's on every clique marginal (tests/unit/test_aim_sampler.py). Sampling is
    post-processing of DP measurements: it costs no budget.
    """
    rng = np.random.default_rng(seed)
    domain = model.domain
    sizes = domain.sizes
    tree = make_junction_tree(domain.attributes, domain.shape, tuple(model.cliques))
    cliques = [set(cl) for cl in tree.nodes]
    order = list(tree.elimination)[::-1]
    total = max(1, int(rows))
    data: dict[str, np.ndarray] = {}
    used: set[str] = set()
    for column in order:
        related = set().union(*[cl for cl in cliques if column in cl]) if cliques else set()
        parents = tuple(a for a in domain.attributes if a in used and a in related)
        used.add(column)
        joint = np.asarray(model.marginal((*parents, column)), dtype=np.float64)
        if not parents:
            data[column] = _round_column(joint.reshape(-1), total, rng)
            continue
        data[column] = _conditional_column(joint, [data[a] for a in parents],
                                           [sizes[a] for a in parents], total, rng)
    return {name: np.asarray(data[name], dtype=np.int64) for name in domain.attributes}


def _round_column(counts: np.ndarray, total: int, rng: np.random.Generator) -> np.ndarray:
    """``total`` values with the counts' proportions by randomized rounding, shuffled."""
    counts = np.clip(counts, 0.0, None)
    counts = counts * (total / counts.sum())
    frac, whole = np.modf(counts)
    whole = whole.astype(np.int64)
    extra = total - int(whole.sum())
    if extra > 0:
        whole[rng.choice(counts.size, extra, replace=False, p=frac / frac.sum())] += 1
    values = np.repeat(np.arange(counts.size, dtype=np.int64), whole)
    rng.shuffle(values)
    return values


def _conditional_column(joint: np.ndarray, parent_codes: list[np.ndarray],
                        parent_sizes: list[int], total: int,
                        rng: np.random.Generator) -> np.ndarray:
    """One value per row from ``joint``'s conditional on the row's parents (the last axis is
    the column drawn): per parent group, the rows' ranks in a random order plus a uniform
    jitter, divided by the group's size, through the conditional CDF (stratified sampling)."""
    values = joint.shape[-1]
    table = np.clip(joint.reshape(-1, values), 0.0, None)
    key = np.ravel_multi_index(tuple(parent_codes), tuple(parent_sizes))
    # rows by group, in a random order within each group (one sort on the group in the high
    # bits and random bits below; the model's cliques are far below 2^31 cells): a row's
    # position in its group is its rank
    index_bits = max(1, (total - 1).bit_length())
    random_bits = min(32, 63 - index_bits - max(1, (prod(parent_sizes) - 1).bit_length()))
    if random_bits >= MIN_RANDOM_BITS:
        # the row's index in the low bits of the sorted value itself: numpy's sort of int64 is
        # vectorized, its argsort is not (1,361,000 values: 0.04 s against 0.17 s); the same
        # random words, their top bits
        words = rng.integers(0, 2 ** 32, total, dtype=np.int64) >> (32 - random_bits)
        packed = ((key.astype(np.int64) << (random_bits + index_bits))
                  | (words << index_bits) | np.arange(total, dtype=np.int64))
        packed.sort()
        order = packed & ((1 << index_bits) - 1)
    elif prod(parent_sizes) < 2 ** 31:
        order = np.argsort((key.astype(np.int64) << 32)
                           | rng.integers(0, 2 ** 32, total, dtype=np.int64), kind="stable")
    else:  # (a clique beyond any model size allowed; the same order, slower)
        order = np.lexsort((rng.random(total), key))
    sorted_key = key[order]
    starts = np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]])
    counts = np.diff(np.r_[starts, total])
    groups = sorted_key[starts]
    group = np.repeat(np.arange(groups.size), counts)
    u = (np.arange(total) - starts[group] + rng.random(total)) / counts[group]
    rows = table[groups]
    mass = rows.sum(axis=1, keepdims=True)
    cdf = np.divide(rows, mass, out=np.zeros_like(rows), where=mass != 0).cumsum(axis=1)
    # one searchsorted over every group's CDF, each shifted by 2 x its group (a CDF is in
    # [0, 1]); the rows in group order make the needles ascending
    shifted = (cdf + 2.0 * np.arange(groups.size)[:, None]).reshape(-1)
    found = np.empty(total, dtype=np.int64)
    found[order] = np.searchsorted(shifted, u + 2.0 * group, side="right") - group * values
    return np.minimum(found, values - 1)
