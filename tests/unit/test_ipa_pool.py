"""ipa's optional '*' pool over the whole public informative domain (``pool_every_value``).

Every value of the declared domain gets a discrete Laplace draw, zero counts included, so the
pool is a pure-eps histogram: it needs no delta, values absent from the data can appear (noise
rows), and neighbouring tables move one value's count by one. Without a public domain the
option is refused before anything is drawn.
"""

from __future__ import annotations

import numpy as np
import pytest

from medrelease.data.aggregate import aggregate
from medrelease.data.lattice import NodeTable
from medrelease.errors import ParameterError
from medrelease.mechanisms.ipa import IPA, _pooled
from medrelease.plan import PublicFacts
from medrelease.release import plan_release, release_from_counts

PUBLIC = PublicFacts(public_domain=True)


def test_the_every_value_pool_spends_no_delta_and_the_budget_adds_up() -> None:
    plain = plan_release("ipa", {"epsilon": 1.0}, 1, facts=PUBLIC)
    every = plan_release("ipa", {"epsilon": 1.0, "pool_every_value": True}, 1, facts=PUBLIC)
    for plan in (plain, every):
        assert sum(s.epsilon for s in plan.budget_steps) == pytest.approx(1.0)
        assert sum(s.delta for s in plan.budget_steps) == pytest.approx(plan.params.delta)
    pool = [s for s in every.budget_steps if s.step == "suppressed cells"]
    assert pool[0].delta == 0.0 and "every value" in pool[0].description
    # the delta goes to the thresholded steps only: two of them instead of three
    assert IPA().step_delta(every.params) == pytest.approx(every.params.delta / 2)
    assert IPA().thresholds(every.params)[1] == every.params.pool_floor


def test_without_a_public_domain_the_option_is_refused() -> None:
    with pytest.raises(ParameterError, match="pool_every_value needs a public informative"):
        plan_release("ipa", {"epsilon": 1.0, "pool_every_value": True}, 1,
                     facts=PublicFacts(public_domain=False))


def test_every_domain_value_is_drawn_even_where_the_data_has_none() -> None:
    n_inf = 400
    left = NodeTable((0,), np.array([3], dtype=np.int64), np.array([50], dtype=np.int64), n_inf)
    rng = np.random.default_rng(7)
    values, true, released = _pooled(rng, n_inf, left, 0.2, 1, every_value=True)
    absent = released[true == 0]
    assert (absent > 0).sum() > 50        # noise rows for values the data never had
    assert set(values[true > 0]) == {3}
    values, true, released = _pooled(np.random.default_rng(7), n_inf, left, 0.2, 1)
    assert set(values) == {3}             # the thresholded pool draws only values present


@pytest.mark.parametrize("seed", range(5))
def test_neighbours_move_one_pooled_count_by_at_most_one(seed: int) -> None:
    n_inf = 300
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(0, 10 * n_inf, 200))
    counts = rng.integers(1, 30, keys.size)
    row = int(rng.integers(0, 10 * n_inf))
    bigger_keys, bigger_counts = keys.copy(), counts.copy()
    if row in keys:
        bigger_counts[np.searchsorted(keys, row)] += 1
    else:
        at = np.searchsorted(keys, row)
        bigger_keys, bigger_counts = np.insert(keys, at, row), np.insert(counts, at, 1)

    def released(table: NodeTable) -> np.ndarray:
        # the same seed for both: identical noise, so only the data's difference shows
        values, _, counts = _pooled(np.random.default_rng(99), n_inf, table, 0.5, 1,
                                    every_value=True)
        out = np.zeros(n_inf, dtype=np.int64)
        out[values] = counts
        return out

    diff = released(NodeTable((0,), bigger_keys, bigger_counts, n_inf)) - \
        released(NodeTable((0,), keys, counts, n_inf))
    # floor 1: a noisy count moves by one at the row's value, nowhere else
    assert np.count_nonzero(diff) <= 1 and np.abs(diff).max(initial=0) <= 1


@pytest.mark.slow
def test_the_sample_release_keeps_rare_diagnoses_with_the_every_value_pool(
        nps_config, nps_sample) -> None:
    counts = aggregate(nps_sample, nps_config)
    facts = PublicFacts.of(nps_config)
    plain = release_from_counts(counts, "ipa", {"epsilon": 1.0}, seed=3, facts=facts)
    every = release_from_counts(counts, "ipa", {"epsilon": 1.0, "pool_every_value": True},
                                seed=3, facts=facts)
    dims = list(counts.dimensions)
    star = (every.table[dims].astype(str) == "*").all(axis=1)
    plain_star = (plain.table[dims].astype(str) == "*").all(axis=1)
    assert every.table.loc[star, "diagnosis"].nunique() > \
        plain.table.loc[plain_star, "diagnosis"].nunique()
    assert every.guarantee.delta == plain.guarantee.delta
