"""The privacy unit's bound stated where it biases (issue 54): a small declared budget step
publishes a DP count of the rows the bound removed, drawn once as declared, and every
interval statement says it is about the bounded table."""

from __future__ import annotations

import math

import numpy as np
import pytest

from medrelease.data.aggregate import aggregate
from medrelease.data.config import config_from_dict
from medrelease.data.nps import generate_nps
from medrelease.data.units import UNIT_CUT_CAP, UnitBound, bound_frame, bounded_weights
from medrelease.mechanisms.base import ReleaseContext
from medrelease.plan import PublicFacts
from medrelease.privacy.guarantee import StepAccountingError, StepDraws
from medrelease.privacy.unit_cut import UNIT_CUT_SHARE, UNIT_CUT_STEP, draw_unit_cut
from medrelease.release import (
    draw_release_steps,
    fixed_index,
    materialize_table,
    plan_release,
)


@pytest.fixture(scope="module")
def unit_config(nps_config):
    raw = nps_config.model_dump(exclude={"base_dir", "config_file"})
    raw["columns"]["patient_id"] = {"role": "identifier"}
    raw["privacy"] = {**raw["privacy"], "unit": "patient_id", "max_rows_per_unit": 1,
                      "unit_noun": "patient", "row_noun": "admission"}
    return config_from_dict(raw, nps_config.base_dir)


@pytest.mark.parametrize("mechanism", ["ipa", "histogram", "diffgen", "aim"])
def test_each_dp_mechanism_declares_the_cut_step_and_still_adds_up(unit_config, nps_config,
                                                                    mechanism) -> None:
    facts = PublicFacts.of(unit_config)
    plan = plan_release(mechanism, {"epsilon": 1.0}, 0, 1, facts)
    steps = {s.step: s for s in plan.budget_steps}
    assert steps[UNIT_CUT_STEP].epsilon == pytest.approx(UNIT_CUT_SHARE)
    assert steps[UNIT_CUT_STEP].delta == 0
    assert math.fsum(s.epsilon for s in plan.budget_steps) == pytest.approx(1.0)
    assert sum(s.delta for s in plan.budget_steps) == pytest.approx(plan.guarantee.delta or 0)
    without = plan_release(mechanism, {"epsilon": 1.0}, 0, 1, PublicFacts.of(nps_config))
    assert UNIT_CUT_STEP not in {s.step for s in without.budget_steps}


def test_the_count_moves_by_at_most_the_cap_for_one_patient_and_not_without_it() -> None:
    """Neighbours differ in one patient with many admissions: the capped count moves by at
    most UNIT_CUT_CAP (its sensitivity), the uncapped count of removed rows by far more."""
    rng = np.random.default_rng(3)
    moved = []
    for seed in range(20):
        table = generate_nps(300, seed=seed, repeat_admissions=True)
        codes = table["patient_id"].to_numpy()
        weights = np.ones(codes.size, dtype=np.int64)
        _, base = bounded_weights(codes, weights, 1, rng)
        extra = np.r_[codes, np.full(3 + seed, codes.max() + 1)]
        _, more = bounded_weights(extra, np.ones(extra.size, dtype=np.int64), 1, rng)
        assert 0 <= more.rows_cut_capped - base.rows_cut_capped <= UNIT_CUT_CAP
        moved.append((more.rows_before - more.rows_after) - (base.rows_before - base.rows_after))
    assert max(moved) > 4 * UNIT_CUT_CAP


def test_the_step_is_drawn_once_at_its_declared_epsilon_over_the_cap(unit_config) -> None:
    """The noise of the published count has the law of discrete Laplace(eps_step / cap): its
    mean |noise| over many draws matches that law's and not eps_step's (a count drawn at the
    step's epsilon, ignoring the cap, is 4 times less noisy and fails)."""
    plan = plan_release("histogram", {"epsilon": 1.0}, 0, 1, PublicFacts.of(unit_config))
    table = generate_nps(2000, seed=4, repeat_admissions=True).astype(str)
    _, report = bound_frame(table, plan.unit)
    noise = []
    for seed in range(600):
        unit = UnitBound("patient_id", 1, np.random.SeedSequence(seed), "patient", "admission")
        draws = StepDraws(plan.budget_steps, "histogram")
        cut = draw_unit_cut(draws, unit, report)
        assert draws.outcome == {UNIT_CUT_STEP: "drawn"}
        with pytest.raises(StepAccountingError, match="second time"):
            draws.take(UNIT_CUT_STEP)
        noise.append(cut["released"] - report.rows_cut_capped)
    a = math.exp(-UNIT_CUT_SHARE / UNIT_CUT_CAP)
    expected = 2 * a / (1 - a * a)
    spread = np.std(np.abs(noise)) / math.sqrt(len(noise))
    assert abs(np.mean(np.abs(noise)) - expected) < 5 * spread
    step_only = 2 * math.exp(-UNIT_CUT_SHARE) / (1 - math.exp(-2 * UNIT_CUT_SHARE))
    assert np.mean(np.abs(noise)) > 2 * step_only


def test_a_release_draws_the_cut_and_says_what_its_intervals_are_about(unit_config) -> None:
    frame = generate_nps(6000, seed=6, repeat_admissions=True).astype(str)
    plan = plan_release("histogram", {"epsilon": 1.0, "auto_cells": 5000}, 0, 9,
                        PublicFacts.of(unit_config))
    bounded, report = bound_frame(frame, plan.unit)
    counts = aggregate(bounded, unit_config)
    assert report.rows_cut_capped > 1000  # repeat admissions at m = 1
    from dataclasses import replace

    context = ReleaseContext.from_counts(replace(counts, unit_bound=report))
    plan = plan_release("histogram", {"epsilon": 1.0, "auto_cells": 5000},
                        len(context.lattice), 9, PublicFacts.of(unit_config))
    index = fixed_index(context, plan)
    _, drawn, cut = draw_release_steps(context, plan, index)
    assert drawn[UNIT_CUT_STEP] == "drawn" and set(drawn.values()) == {"drawn"}
    assert cut["lower"] <= cut["released"] <= cut["upper"] and cut["epsilon"] == 0.02
    chosen = materialize_table(context, plan, index)
    about = chosen.error_bars["about"]
    assert "cut to at most 1 admission" in about and "not the whole input" in about
    assert about in chosen.error_bars["statement"]
    assert chosen.details["unit_cut"]["statement"].startswith("The privacy unit's bound cut")
    # without the report nothing is drawn on a guess: the step is passed over (still charged)
    _, drawn, cut = draw_release_steps(ReleaseContext.from_counts(counts), plan, index)
    assert cut is None and drawn[UNIT_CUT_STEP].startswith("not drawn: the unit bound's report")


def test_the_report_states_the_cut() -> None:
    from medrelease.privacy.publication import how_to_use

    manifest = {"files": ["data.csv"], "mechanism_details": {"unit_cut": {
        "statement": "The privacy unit's bound cut each patient to at most 1 admission."}},
        "error_bars": {"about": "Every interval is about the table after the bound.",
                       "intervals": {"rows": {}, "about": "Every interval is about the table "
                                     "after the bound.", "example": {"what": ""}}}}
    text = "\n".join(how_to_use(manifest))
    assert "bound cut each patient" in text and "after the bound" in text
