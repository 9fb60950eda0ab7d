"""Private-PGM (``mbi``) as ``aim`` uses it: estimation from noisy marginals, model marginals
for scoring, and sampling. Nothing here sees the data: only noisy measurements (DP outputs),
public domains and the taxonomies' code maps.

``jax`` is imported on first use (64-bit floats, CPU), so the rest of the product does not pay
for it. A coarse-level measurement is an ``mbi.LinearMeasurement`` whose query sums the fine
clique marginal through the taxonomy's level maps (``LevelQuery``): hashable (part of jax's
compile-cache key) and with its operator norm, so mbi needs no power iteration.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

os.environ.setdefault("JAX_PLATFORMS", "cpu")


@cache
def mbi() -> Any:
    """The ``mbi`` module, with jax in 64-bit mode (mbi's estimates stall in float32)."""
    import jax

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_enable_compilation_cache", False)  # mbi: many small programs
    import mbi as module

    return module


@dataclass(frozen=True)
class LevelQuery:
    """Sums a fine clique marginal (axes in clique order) to taxonomy levels: per axis a tuple
    leaf -> coarse code, or None for an axis kept at its leaves."""

    maps: tuple[tuple[int, ...] | None, ...]
    sizes: tuple[int, ...]

    def __call__(self, factor: Any) -> Any:
        import jax.numpy as jnp

        values = factor.values
        for axis, (groups, size) in enumerate(zip(self.maps, self.sizes, strict=True)):
            if groups is None:
                continue
            onehot = np.zeros((len(groups), size))
            onehot[np.arange(len(groups)), np.asarray(groups)] = 1.0
            values = jnp.moveaxis(jnp.tensordot(values, jnp.asarray(onehot), axes=([axis], [0])),
                                  -1, axis)
        return values.reshape(-1)

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

    def __call__(self, factor: Any) -> Any:
        import jax.numpy as jnp

        return factor.datavector() * jnp.asarray(self.weights)

    def op_norm_sq(self) -> float:
        return float(max(w * w for w in self.weights))


def domain(names: tuple[str, ...], sizes: tuple[int, ...]) -> Any:
    return mbi().Domain(names, sizes)


def measurement(noisy: np.ndarray, clique: tuple[str, ...], sigma: float,
                query: LevelQuery | ScaledQuery | None) -> Any:
    """A noisy marginal as mbi's linear measurement (identity query at leaf level)."""
    module = mbi()
    if query is None:
        return module.LinearMeasurement(np.asarray(noisy, dtype=np.float64).reshape(-1), clique,
                                        stddev=float(sigma))
    return module.LinearMeasurement(np.asarray(noisy, dtype=np.float64).reshape(-1), clique,
                                    stddev=float(sigma), query=query)


def estimate(model_domain: Any, measurements: list, iters: int, total: float,
             warm_start: Any = None, tol: float | None = None) -> Any:
    """Private-PGM's mirror descent on every measurement so far (warm-started), with the
    noisy total of the leaf-level 1-way measurements; stops early once the loss improves by
    less than ``tol`` (relative) over two blocks of 50 steps (mbi's own rule)."""
    module = mbi()
    return module.estimation.MirrorDescent().estimate(
        model_domain, measurements, known_total=total, iters=iters, warm_start=warm_start,
        tol=tol)


def model_marginal(model: Any, clique: tuple[str, ...]) -> np.ndarray:
    """The model's marginal on ``clique`` (axes in clique order), in counts.

    A clique inside one of the model's cliques is a sum of its fitted marginal; any other is
    computed from the model's potentials by variable elimination in numpy (``ModelPotentials``):
    mbi's own ``variable_elimination`` is jit-compiled per clique and per model structure, i.e.
    anew every round, and op by op it is slower still (measured: over 100 s a round on Adult).
    """
    return ModelPotentials.of(model).marginal(clique)


@dataclass
class ModelPotentials:
    """A fitted model's log-potentials as numpy tables (one conversion per model)."""

    tables: list[tuple[tuple[str, ...], np.ndarray]]
    marginals: list[tuple[tuple[str, ...], np.ndarray]]
    sizes: dict[str, int]
    total: float

    @classmethod
    def of(cls, model: Any) -> ModelPotentials:
        cached = _POTENTIALS.get(id(model))
        if cached is not None and cached[0] is model:
            return cached[1]
        tables = [(tuple(f.domain.attributes), np.asarray(f.values, dtype=np.float64))
                  for f in model.potentials.tables.values()]
        marginals = [(tuple(f.domain.attributes), np.asarray(f.values, dtype=np.float64))
                     for f in model.marginals.tables.values()]
        dom = model.domain
        out = cls(tables, marginals, dict(zip(dom.attributes, dom.shape, strict=True)), float(model.total))
        _POTENTIALS.clear()
        _POTENTIALS[id(model)] = (model, out)
        return out

    def marginal(self, clique: tuple[str, ...]) -> np.ndarray:
        """A sum of a fitted clique marginal that holds ``clique``; else sum-product over every
        attribute outside ``clique``, smallest intermediate first."""
        for attrs, table in self.marginals:
            if set(clique) <= set(attrs):
                drop = tuple(i for i, a in enumerate(attrs) if a not in clique)
                kept = [a for a in attrs if a in clique]
                summed = table.sum(axis=drop) if drop else table
                return np.transpose(summed, [kept.index(a) for a in clique])
        factors = [(attrs, table) for attrs, table in self.tables if attrs]
        keep = set(clique)
        eliminate = {a for attrs, _ in factors for a in attrs} - keep
        while eliminate:
            z = min(eliminate, key=lambda a: self._joined_size(factors, a))
            eliminate.discard(z)
            involved = [f for f in factors if z in f[0]]
            factors = [f for f in factors if z not in f[0]]
            attrs, table = _log_product(involved)
            axis = attrs.index(z)
            factors.append((attrs[:axis] + attrs[axis + 1:], _logsumexp(table, axis)))
        _, table = _log_product([*factors, (clique, np.zeros(tuple(self.sizes[a]
                                                                  for a in clique)))], clique)
        table = np.exp(table - table.max())
        return table * (self.total / table.sum())

    def _joined_size(self, factors: list, attribute: str) -> int:
        joined = {a for attrs, _ in factors if attribute in attrs for a in attrs}
        return int(np.prod([self.sizes[a] for a in joined]))


_POTENTIALS: dict[int, tuple[Any, ModelPotentials]] = {}


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


def model_size_mb(model_domain: Any, cliques: list[tuple[str, ...]]) -> float:
    return float(mbi().junction_tree.hypothetical_model_size(model_domain, cliques))


def sample(model: Any, rows: int, seed: int) -> dict[str, np.ndarray]:
    """``rows`` synthetic records from the model, as leaf codes per attribute.

    mbi samples with numpy's global generator; it is seeded here from the release's own
    stream (sampling is post-processing of DP measurements: it costs no budget).
    """
    state = np.random.get_state()
    np.random.seed(seed % 2**32)
    try:
        data = model.synthetic_data(rows=rows)
    finally:
        np.random.set_state(state)
    return {name: np.asarray(data.data[name], dtype=np.int64) for name in model.domain.attributes}
