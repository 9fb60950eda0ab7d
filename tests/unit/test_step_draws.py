"""The privacy map drives the noise: each declared budget step is handed to the mechanism once,
it draws with that step's numbers, and a release that strays from its declared steps stops."""

from __future__ import annotations

import dataclasses

import pytest

from medrelease.data.aggregate import aggregate
from medrelease.mechanisms.ipa import IPA
from medrelease.privacy.guarantee import BudgetStep, StepAccountingError, StepDraws
from medrelease.release import plan_release, release_from_counts

STEPS = [BudgetStep("choice", 0.1, 0.0, "toy"), BudgetStep("cells", 0.9, 1e-6, "toy")]


def test_each_declared_step_is_handed_out_once_and_all_are_accounted_for() -> None:
    draws = StepDraws(STEPS, "toy")
    assert draws.take("cells").epsilon == 0.9
    with pytest.raises(StepAccountingError, match="'cells' a second time"):
        draws.take("cells")
    with pytest.raises(StepAccountingError, match="'extra', a step its plan does not declare"):
        draws.take("extra")
    with pytest.raises(StepAccountingError, match="'choice' were neither drawn nor passed over"):
        draws.close()
    draws.pass_over("choice", "nothing left to choose from")
    assert draws.close() == {"cells": "drawn", "choice": "not drawn: nothing left to choose from"}


@pytest.mark.parametrize("mechanism, params", [("ipa", {"epsilon": 1.0}),
                                               ("ipa", {"epsilon": 1.0, "ladder_rungs": 2}),
                                               ("histogram", {"epsilon": 1.0})])
@pytest.mark.slow
def test_a_release_draws_every_declared_step_exactly_once(nps_config, nps_sample, mechanism,
                                                          params) -> None:
    counts = aggregate(nps_sample, nps_config)
    result = release_from_counts(counts, mechanism, params, seed=3)
    drawn = result.details["budget_steps_drawn"]
    assert set(drawn) == {s.step for s in result.budget_steps}
    assert all(outcome == "drawn" or outcome.startswith("not drawn: ")
               for outcome in drawn.values())
    assert drawn[result.budget_steps[0].step] == "drawn"
    if params.get("ladder_rungs", 1) == 1:  # the default: every step is drawn
        assert set(drawn.values()) == {"drawn"}


def test_the_node_choice_uses_its_declared_step_not_a_parameter() -> None:
    plan = plan_release("ipa", {"epsilon": 1.0}, n_nodes=4, seed=1)
    assert plan.selection_epsilon == pytest.approx(0.05)
    plan.budget_steps[0] = dataclasses.replace(plan.budget_steps[0], epsilon=0.02)
    assert plan.selection_epsilon == 0.02 != plan.params.eps_candidates


def test_a_declared_step_the_mechanism_never_draws_stops_the_release(nps_config, nps_sample,
                                                                     monkeypatch) -> None:
    declared = IPA.budget_steps

    def one_more(self, params):
        return [*declared(self, params), BudgetStep("forgotten", 0.0, 0.0, "ipa")]

    monkeypatch.setattr(IPA, "budget_steps", one_more)
    with pytest.raises(StepAccountingError, match="'forgotten' were neither drawn"):
        release_from_counts(aggregate(nps_sample, nps_config), "ipa", {"epsilon": 1.0}, seed=3)


def test_a_step_drawn_twice_stops_the_release(nps_config, nps_sample, monkeypatch) -> None:
    import medrelease.mechanisms.ipa as ipa

    real = ipa._pooled

    def pool_twice(*args, **kwargs):
        pool_twice.draws.take("cells")  # a second draw on the cells' budget
        return real(*args, **kwargs)

    original = IPA.materialize

    def materialize(self, context, table, seed, params, draws=None):
        pool_twice.draws = draws
        return original(self, context, table, seed, params, draws)

    monkeypatch.setattr(ipa, "_pooled", pool_twice)
    monkeypatch.setattr(IPA, "materialize", materialize)
    with pytest.raises(StepAccountingError, match="'cells' a second time"):
        release_from_counts(aggregate(nps_sample, nps_config), "ipa", {"epsilon": 1.0}, seed=3)


def test_a_guarantee_that_is_not_the_sum_of_its_steps_is_refused_at_planning(monkeypatch) -> None:
    from medrelease.errors import ParameterError

    stated = IPA.guarantee
    monkeypatch.setattr(IPA, "guarantee", lambda self, params: dataclasses.replace(
        stated(self, params), epsilon=2 * params.epsilon))
    with pytest.raises(ParameterError, match=r"steps add up to \(epsilon 1.*states \(epsilon 2"):
        plan_release("ipa", {"epsilon": 1.0}, n_nodes=4, seed=1)


def test_the_paper_mechanism_draws_every_candidate_through_the_declared_steps(
        nps_config, nps_sample, monkeypatch) -> None:
    """ipa-paper perturbs each of the 256 candidates with the plan's three perturbation steps
    (one set per candidate, as the paper does) and replays the chosen one with them; the noise
    follows the step handed out, not the parameters."""
    from collections import Counter

    import numpy as np

    from medrelease.mechanisms import get_mechanism
    from medrelease.mechanisms.base import ReleaseContext, declared_draws

    taken: list[tuple[str, float]] = []
    real_take = StepDraws.take

    def spy(self, name):
        step = real_take(self, name)
        taken.append((name, step.epsilon))
        return step

    monkeypatch.setattr(StepDraws, "take", spy)
    counts = aggregate(nps_sample.head(3000), nps_config)
    result = release_from_counts(counts, "ipa-paper", {"epsilon": 1.0}, seed=3)
    declared = {s.step: s.epsilon for s in result.budget_steps}
    assert Counter(name for name, _ in taken) == {name: 257 for name in declared}
    assert all(epsilon == declared[name] for name, epsilon in taken)
    assert set(result.details["budget_steps_drawn"].values()) == {"drawn"}

    mechanism = get_mechanism("ipa-paper")
    params = mechanism.parse_params({"epsilon": 1.0})
    context = ReleaseContext.from_counts(counts)
    table = context.lattice.bottom()

    def counterfeit_rows(counts_epsilon: float) -> float:
        steps = [dataclasses.replace(s, epsilon=counts_epsilon)
                 if s.step == "counterfeit counts" else s
                 for s in mechanism.budget_steps(params)]
        cells = mechanism.perturb_node(context, table, np.random.SeedSequence(5), params,
                                       declared_draws(mechanism, steps))
        return float(cells.class_noise.sum())

    assert counterfeit_rows(0.003) > 20 * counterfeit_rows(0.3)
