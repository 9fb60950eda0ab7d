"""``aim``'s numpy sampler (``pgm.sample``) draws rows with mbi's sampler's law.

A small model whose junction tree has a 3-attribute clique (a triangle of measured pairs) and a
chain beyond it; both samplers draw 20,000 rows with fixed seeds and every clique marginal of
the junction tree (and every measured one) is compared by a chi-square test of homogeneity.
The same test rejects a sampler that ignores the parents (each column from its 1-way).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from medrelease.synthetic import pgm
from medrelease.synthetic.junction_tree import make_junction_tree

from ..conftest import mbi_module

# one worker: mbi (jax) imported and the module's fit built once, not once per worker
pytestmark = pytest.mark.xdist_group("mbi")

ROWS = 20_000
SIZES = {"a": 3, "b": 4, "c": 5, "d": 2, "e": 3}
MEASURED = [("a", "b"), ("b", "c"), ("a", "c"), ("c", "d"), ("d", "e")]


def to_mbi(model: pgm.Model):
    """Our fitted model as mbi's ``MarkovRandomField`` (same potentials, marginals, total)."""
    mbi = mbi_module()
    dom = mbi.Domain(model.domain.attributes, model.domain.shape)

    def vector(tables):
        return mbi.CliqueVector(dom, list(model.cliques), {
            cl: mbi.Factor(dom.project(cl), np.asarray(t)) for cl, t in tables.items()})

    return mbi.MarkovRandomField(potentials=vector(model.potentials),
                                 marginals=vector(model.marginals), total=model.total)


@pytest.fixture(scope="module")
def model():
    mbi = mbi_module()
    rng = np.random.default_rng(5)
    domain = pgm.domain(tuple(SIZES), tuple(SIZES.values()))
    # a joint with dependence along every measured pair: rows drawn from a chain of conditionals
    codes = {"a": rng.integers(0, 3, ROWS)}
    codes["b"] = (codes["a"] + rng.integers(0, 2, ROWS)) % 4
    codes["c"] = (codes["a"] + codes["b"] + rng.integers(0, 2, ROWS)) % 5
    codes["d"] = (codes["c"] > 2).astype(np.int64) ^ (rng.random(ROWS) < 0.1)
    codes["e"] = (codes["d"] * 2 + (rng.random(ROWS) < 0.3)) % 3
    data = mbi.Dataset(codes, mbi.Domain(domain.attributes, domain.shape))
    measurements = [pgm.measurement(data.project(cl).datavector() + rng.normal(0, 5, np.prod(
        [SIZES[a] for a in cl])), cl, 5.0, None) for cl in MEASURED]
    return pgm.estimate(domain, measurements, 300, float(ROWS))


def _mbi_rows(model, seed: int) -> dict[str, np.ndarray]:
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        data = to_mbi(model).synthetic_data(rows=ROWS)
    finally:
        np.random.set_state(state)
    return {a: np.asarray(data.data[a]) for a in SIZES}


def _cliques(model) -> list[tuple[str, ...]]:
    tree = make_junction_tree(model.domain.attributes, model.domain.shape, tuple(model.cliques))
    nodes = {tuple(sorted(n)) for n in tree.nodes}
    return sorted(nodes | {tuple(sorted(c)) for c in MEASURED})


def _counts(rows: dict[str, np.ndarray], clique: tuple[str, ...]) -> np.ndarray:
    key = np.ravel_multi_index(tuple(rows[a] for a in clique), tuple(SIZES[a] for a in clique))
    return np.bincount(key, minlength=int(np.prod([SIZES[a] for a in clique])))


def _p_values(ours: dict, theirs: dict, cliques: list) -> dict[tuple[str, ...], float]:
    out = {}
    for clique in cliques:
        table = np.stack([_counts(ours, clique), _counts(theirs, clique)])
        table = table[:, table.sum(axis=0) > 0]
        out[clique] = float(chi2_contingency(table)[1])
    return out


@pytest.mark.slow
def test_the_numpy_sampler_has_mbis_law_on_every_clique_marginal(model):
    cliques = _cliques(model)
    assert any(len(c) == 3 for c in cliques)  # the triangle made a 3-attribute clique
    ours = pgm.sample(model, ROWS, seed=11)
    theirs = _mbi_rows(model, seed=12)
    assert all(ours[a].size == ROWS and ours[a].min() >= 0 and ours[a].max() < SIZES[a]
               for a in SIZES)
    p_values = _p_values(ours, theirs, cliques)
    # Bonferroni over the cliques at 1 %: a sampler with mbi's law fails this 1 % of the time
    assert min(p_values.values()) > 0.01 / len(cliques), p_values


def test_the_law_test_rejects_a_sampler_that_ignores_the_parents(model):
    ours = pgm.sample(model, ROWS, seed=11)
    rng = np.random.default_rng(3)
    independent = {a: rng.permutation(v) for a, v in ours.items()}  # 1-ways kept, joints lost
    p_values = _p_values(independent, _mbi_rows(model, seed=12), _cliques(model))
    assert min(p_values.values()) < 1e-6


def test_the_sampler_is_a_function_of_its_seed(model):
    first, again = pgm.sample(model, 1_000, seed=4), pgm.sample(model, 1_000, seed=4)
    other = pgm.sample(model, 1_000, seed=5)
    assert all(np.array_equal(first[a], again[a]) for a in SIZES)
    assert not all(np.array_equal(first[a], other[a]) for a in SIZES)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_first_attribute_is_the_models_counts_rounded(model, seed):
    """Randomized rounding: the first attribute drawn has the model's counts, each within one."""
    elimination = make_junction_tree(model.domain.attributes, model.domain.shape,
                                     tuple(model.cliques)).elimination
    first = list(elimination)[-1]
    rows = pgm.sample(model, ROWS, seed=seed)
    expected = model.marginal((first,)) * ROWS / model.total
    got = np.bincount(rows[first], minlength=SIZES[first])
    assert np.abs(got - expected).max() < 1 + 1e-9
