"""The empirical audit shows the paper mechanism's claim failing and the sound one holding."""

from __future__ import annotations

import pytest

from medrelease.audit import clopper_pearson, run_audit


def test_clopper_pearson_bounds() -> None:
    low, high = clopper_pearson(0, 100, 0.975)
    assert low == 0.0 and high == pytest.approx(1 - 0.025 ** (1 / 100), rel=1e-6)
    low, high = clopper_pearson(100, 100, 0.975)
    assert high == 1.0 and low == pytest.approx(0.025 ** (1 / 100), rel=1e-6)


def test_ipa_paper_exceeds_its_claim_and_ipa_does_not() -> None:
    paper = run_audit("ipa-paper", 1.0, runs=160, seed=3)
    assert paper.exceeds_claim and paper.epsilon_lower_bound > 1.0
    assert paper.hits_with == 80 and paper.hits_without == 0  # raw value always published
    sound = run_audit("ipa", 1.0, runs=160, seed=4)
    assert sound.epsilon_lower_bound <= 1.0
