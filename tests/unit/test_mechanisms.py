"""Parameters, guarantees, budget steps, and the sound mechanism's threshold."""

from __future__ import annotations

import math

import numpy as np
import pytest

from medrelease.data.aggregate import aggregate
from medrelease.errors import ParameterError
from medrelease.mechanisms import MECHANISMS, get_mechanism
from medrelease.mechanisms.base import ReleaseContext
from medrelease.mechanisms.ipa import release_threshold
from medrelease.privacy.randomness import discrete_laplace_tail
from medrelease.release import release


@pytest.mark.parametrize(
    ("mechanism", "params", "message"),
    [
        ("ipa", {"epsilon": 0}, "epsilon must be a positive"),
        ("ipa", {"epsilon": -1}, "epsilon must be a positive"),
        ("ipa", {"epsilon": math.nan}, "epsilon must be a positive"),
        ("ipa", {"epsilon": 1, "eps_candidates": 0.2, "eps_cells": 0.2, "eps_ladder": 0.1,
                 "eps_suppression": 0.2}, "must add up to epsilon=1.*= 0.7"),
        ("ipa", {"epsilon": 1, "ladder_rungs": 0, "eps_ladder": 0.1}, "ladder_rungs is 0"),
        ("ipa", {"epsilon": 1, "eps_cells": 0.5}, "give all of"),
        ("ipa", {"delta": 0}, "delta must lie strictly between 0 and 1"),
        ("ipa", {"delta": 1.5}, "delta must lie strictly between 0 and 1"),
        ("ipa", {"suppression_threshold": 1}, "at least 2"),
        ("ipa", {"epsilon": 1, "bogus": 3}, "bogus"),
        ("ipa-paper", {"suppression_threshold": 1}, "scale 0 for t = 1"),
        ("ipa-paper", {"epsilon": 1, "eps_suppression": 0.1, "eps_insertion": 0.3,
                       "eps_value": 0.3, "eps_candidates": 0.5}, "must add up"),
        ("nope", {}, "unknown mechanism 'nope'"),
    ],
)
def test_invalid_parameters_are_rejected_with_reason(mechanism, params, message) -> None:
    with pytest.raises(ParameterError, match=message):
        get_mechanism(mechanism).parse_params(params)


def test_paper_defaults_and_guarantee_labels() -> None:
    paper = get_mechanism("ipa-paper")
    params = paper.parse_params({"epsilon": 2.0})
    assert (params.eps_suppression, params.eps_insertion, params.eps_value,
            params.eps_candidates) == pytest.approx((0.2, 0.6, 0.6, 0.6))
    assert params.suppression_threshold == 2
    guarantee = paper.guarantee(params)
    assert guarantee.proven is False
    assert "formal guarantee not upheld" in guarantee.label
    assert "Claimed" in guarantee.statement()
    sound = get_mechanism("ipa")
    params = sound.parse_params({"epsilon": 1.0})
    assert params.delta == pytest.approx(1e-6)  # a constant: never a function of the data
    declared = sound.parse_params({"epsilon": 1.0, "max_rows": 1_000_000})
    assert declared.delta == pytest.approx(1e-7)  # min(1e-6, 1/(10 N)), N declared publicly
    guarantee = sound.guarantee(declared)
    assert guarantee.proven and guarantee.epsilon == 1.0 and guarantee.delta == 1e-7


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_budget_steps_add_up_to_the_guarantee(name) -> None:
    mechanism = get_mechanism(name)
    if name in ("kanon", "mondrian", "pseudonymize"):  # no DP: no epsilon, no steps, no claim
        params = mechanism.parse_params({})
        assert mechanism.budget_steps(params) == []
        assert mechanism.guarantee(params).epsilon is None
        return
    params = mechanism.parse_params({"epsilon": 0.7})
    steps = mechanism.budget_steps(params)
    guarantee = mechanism.guarantee(params)
    assert math.fsum(s.epsilon for s in steps) == pytest.approx(guarantee.epsilon)
    assert math.fsum(s.delta for s in steps) == pytest.approx(guarantee.delta)
    assert all(s.epsilon > 0 for s in steps)


def test_release_threshold_bounds_the_false_release_probability() -> None:
    for eps in (0.05, 0.3, 1.0, 4.0):
        for delta in (1e-3, 1e-6, 1e-9):
            tau = release_threshold(eps, delta, 2)
            # P(count-1 cell released) = P(Z >= tau - 1) <= delta, and tau is the smallest such.
            assert discrete_laplace_tail(eps, tau - 1) <= delta
            if tau - 2 >= 1 and tau > 2:
                assert discrete_laplace_tail(eps, tau - 2) > delta
    assert release_threshold(50.0, 0.4, 7) == 7  # the minimum t still applies


@pytest.mark.slow
def test_ipa_never_releases_a_cell_under_its_threshold(nps_config, nps_sample) -> None:
    mechanism = get_mechanism("ipa")
    params = mechanism.parse_params({"epsilon": 2.0})
    tau_cells, tau_sup = mechanism.thresholds(params)
    context = ReleaseContext.from_counts(aggregate(nps_sample, nps_config))
    rng = np.random.SeedSequence(8).spawn(len(context.lattice))
    nodes = context.lattice.dfs_order()
    for table in context.lattice.iter_tables(nodes):
        cells = mechanism.materialize(context, table, rng[context.lattice.index(table.node)], params)
        released = cells.released_counts
        sup_cell = cells.suppressed_class[cells.class_of_cell]
        assert np.all((released == 0) | (released >= tau_cells) | sup_cell)
        assert np.all((released[sup_cell] == 0) | (released[sup_cell] >= tau_sup))


def test_ipa_release_cells_meet_threshold_in_table(nps_config, nps_sample) -> None:
    result = release(nps_sample, nps_config, mechanism="ipa", params={"epsilon": 3.0}, seed=4)
    tau_cells, tau_sup = get_mechanism("ipa").thresholds(
        get_mechanism("ipa").parse_params(result.params)
    )
    cell_sizes = result.table.astype(str).value_counts()
    assert cell_sizes.min() >= min(tau_cells, tau_sup)
    assert result.guarantee.proven
