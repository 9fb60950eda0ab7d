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
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # mbi is imported on first use (jax's start-up); its types, for the reader
    from mbi import LinearMeasurement as Measurement
    from mbi import MarkovRandomField as Model

os.environ.setdefault("JAX_PLATFORMS", "cpu")


@cache
def mbi() -> Any:
    """The ``mbi`` module, with jax in 64-bit mode (mbi's estimates stall in float32) and
    jax's persistent compilation cache under the data home (``compile_cache_folder``)."""
    import jax

    jax.config.update("jax_enable_x64", True)
    folder = compile_cache_folder()
    if folder is None:
        jax.config.update("jax_enable_compilation_cache", False)
    else:
        jax.config.update("jax_compilation_cache_dir", str(folder))
        # every program: a fresh process otherwise compiles the small ones again each time
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    import warnings

    with warnings.catch_warnings():  # mbi warns about the cache it was not designed around
        warnings.simplefilter("ignore", UserWarning)
        import mbi as module

    return module


COMPILE_CACHE_ENV = "MEDRELEASE_COMPILE_CACHE"


def compile_cache_folder() -> Path | None:
    """Where jax keeps compiled programs across processes: ``MEDRELEASE_COMPILE_CACHE`` if set
    ("off" disables), else ``$MEDRELEASE_HOME/cache/jax`` (``var/cache/jax``); None (no
    cache) when the folder cannot be made or written. Safe to delete at any time.

    What it holds: XLA programs keyed by jax on the program text, jax/jaxlib version, flags
    and machine. Nothing here sees the data: a program's constants can only be public
    (taxonomy code maps) or DP outputs (the group weights of merged values); noisy
    measurements and the noisy total are its arguments. Two processes writing one entry at
    once: a reader of a half-written entry gets an error that jax turns into a warning and a
    compilation."""
    from medrelease.settings import project_root

    setting = os.environ.get(COMPILE_CACHE_ENV, "")
    if setting.lower() in {"off", "0", "false", "none"}:
        return None
    # the process's data home, never a context's isolated one (the publication audit's
    # neighbouring worlds are temporary; the cache is chosen once per process and outlives them)
    home = Path(os.environ.get("MEDRELEASE_HOME", project_root() / "var"))
    folder = Path(setting) if setting else home.resolve() / "cache" / "jax"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".writable-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError:
        return None
    return folder


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
                query: LevelQuery | ScaledQuery | None) -> Measurement:
    """A noisy marginal as mbi's linear measurement (identity query at leaf level)."""
    module = mbi()
    if query is None:
        return module.LinearMeasurement(np.asarray(noisy, dtype=np.float64).reshape(-1), clique,
                                        stddev=float(sigma))
    return module.LinearMeasurement(np.asarray(noisy, dtype=np.float64).reshape(-1), clique,
                                    stddev=float(sigma), query=query)


def estimate(model_domain: Any, measurements: list[Measurement], iters: int, total: float,
             warm_start: Model | None = None, tol: float | None = None) -> Model:
    """Private-PGM's mirror descent on every measurement so far (warm-started), with the
    noisy total of the leaf-level 1-way measurements; stops early once the loss improves by
    less than ``tol`` (relative) over two blocks of 50 steps (mbi's own rule).

    mbi compiles one program per model structure for the steps and runs the start and end op
    by op; jitting those two as one program each (12 programs instead of 119 on the NPS-like
    sample) cost 1.3-1.5 s MORE compile CPU a run (docs/results/aim.md, dropped). Across
    processes the compiled programs come from jax's persistent cache (``mbi()``)."""
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

    mbi's own sampler's law (``MarkovRandomField.synthetic_data``, method "round") in numpy:
    attributes in the junction tree's reverse elimination order, each drawn from its
    conditional given the attributes already drawn that share a junction-tree clique with it,
    by randomized rounding (within each group of rows with the same parents, the rows' ranks in
    a random order, jittered, read through the conditional CDF). mbi's version is a Python loop
    over every parent group plus jax message passing op by op (90 s of a 516 s Adult run, 120 s
    of 224 s at 1,361,000 rows, on a loaded machine; docs/results/aim.md); this
    one is vectorized, takes the marginals from the model's potentials in numpy
    (``ModelPotentials``) and draws from its own generator (``seed``). Its law is tested
    against mbi's on every clique marginal (tests/test_aim_sampler.py). Sampling is
    post-processing of DP measurements: it costs no budget.
    """
    rng = np.random.default_rng(seed)
    potentials = ModelPotentials.of(model)
    domain = model.domain
    sizes = dict(zip(domain.attributes, domain.shape, strict=True))
    jtree, elimination = mbi().junction_tree.make_junction_tree(
        domain, [tuple(cl) for cl in model.cliques])
    cliques = [set(cl) for cl in jtree.nodes]
    order = list(elimination)[::-1]
    total = max(1, int(rows))
    data: dict[str, np.ndarray] = {}
    used: set[str] = set()
    for column in order:
        related = set().union(*[cl for cl in cliques if column in cl]) if cliques else set()
        parents = tuple(a for a in domain.attributes if a in used and a in related)
        used.add(column)
        joint = np.asarray(potentials.marginal((*parents, column)), dtype=np.float64)
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
    groups, inverse, counts = np.unique(key, return_inverse=True, return_counts=True)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    # rows by group, in a random order within each group: its position there is the rank
    perm = np.lexsort((rng.random(total), inverse))
    ranks = np.empty(total, dtype=np.int64)
    ranks[perm] = np.arange(total) - starts[inverse[perm]]
    u = (ranks + rng.random(total)) / counts[inverse]
    rows = table[groups]
    mass = rows.sum(axis=1, keepdims=True)
    cdf = np.divide(rows, mass, out=np.zeros_like(rows), where=mass != 0).cumsum(axis=1)
    # one searchsorted over every group's CDF, each shifted by 2 x its group (a CDF is in [0, 1])
    shifted = (cdf + 2.0 * np.arange(groups.size)[:, None]).reshape(-1)
    found = np.searchsorted(shifted, u + 2.0 * inverse, side="right") - inverse * values
    return np.minimum(found, values - 1)
