"""The zCDP filter refuses an overspend before it is made, and its charges add up."""

from __future__ import annotations

import pytest

from medrelease.privacy.zcdp import RhoFilter, RhoOverspendError


def test_charges_add_up_and_an_overspend_is_refused_before_it_counts() -> None:
    budget = RhoFilter(0.5)
    budget.charge(0.2, "round 0")
    budget.charge(0.3, "round 1")  # exactly what was left
    assert budget.used == pytest.approx(0.5) and budget.left == pytest.approx(0.0)
    with pytest.raises(RhoOverspendError, match=r"round 2 would charge rho 0\.01"):
        budget.charge(0.01, "round 2")
    assert budget.used == pytest.approx(0.5)  # the refused charge was not counted
    assert [what for what, _ in budget.charges] == ["round 0", "round 1"]


@pytest.mark.parametrize("rho", [-0.1, float("nan"), float("inf")])
def test_a_charge_that_is_not_a_rho_is_refused(rho: float) -> None:
    with pytest.raises(ValueError, match=r"must be finite and >= 0"):
        RhoFilter(1.0).charge(rho, "round 0")


def test_a_budget_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive and finite"):
        RhoFilter(0.0)
