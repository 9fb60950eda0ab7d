"""The refusals before the charge, declared by stage in one module (``medrelease/refusals.py``):
the release stops at a stage's first, ``check`` lists them all, and every rule reads facts only.
"""

from __future__ import annotations

import inspect

import pytest

from medrelease import refusals
from medrelease.data.config import find_config
from medrelease.errors import ConfigError, ParameterError, PolicyError
from medrelease.mechanisms.base import ReleaseContext
from medrelease.privacy.ledger import BudgetState
from medrelease.refusals import STAGES, Facts, LedgerView, plan_for_config, refuse
from medrelease.release import lattice_size, plan_release


@pytest.fixture(scope="module")
def adult():
    return find_config("adult")


def _loosened(config, **policy):
    return config.model_copy(update={"policy": config.policy.model_copy(update=policy)})


def test_every_stage_before_the_charge_is_declared_with_its_rules() -> None:
    assert list(STAGES) == ["request", "plan", "ledger", "count", "stores"]
    for stage, rules in STAGES.items():
        assert rules, stage
        for rule in rules:  # each rule is a function of the facts alone
            assert list(inspect.signature(rule.check).parameters) == ["facts"], rule.name


def test_a_good_plan_passes_every_fact_stage(adult) -> None:
    plan = plan_for_config(adult, "ipa", {"epsilon": 1.0}, 7)
    view = LedgerView()
    assert refusals.refusals("plan", Facts(adult, plan, nodes=10)) == []
    assert refusals.refusals("ledger", Facts(adult, plan, ledger=view)) == []


def test_the_release_stops_at_the_first_refusal_and_check_sees_them_all(adult) -> None:
    """Two problems in the plan stage: the policy's epsilon cap and the lattice's size. The
    flow raises the first (the policy, in the stage's order); check gets both sentences."""
    config = _loosened(adult, max_epsilon=0.5, max_lattice_nodes=2)
    plan = plan_release("ipa", {"epsilon": 1.0}, 0, 7)
    facts = Facts(config, plan, nodes=lattice_size(config))
    with pytest.raises(PolicyError, match="per-release cap"):
        refuse("plan", facts)
    said = [str(r) for r in refusals.refusals("plan", facts)]
    assert len(said) == 2 and "per-release cap" in said[0] and "max_lattice_nodes" in said[1]
    with pytest.raises(PolicyError, match="per-release cap"):  # the plan step runs the same
        plan_for_config(config, "ipa", {"epsilon": 1.0}, 7)


def test_the_ledger_stage_reads_the_ledgers_figures_only(adult) -> None:
    kanon = plan_release("kanon", {"k": 10}, 0, 7)
    unproven = _loosened(adult, allow_unproven=True, mechanisms=[*adult.policy.mechanisms,
                                                                   "kanon"])
    with pytest.raises(PolicyError, match="voids the lifetime guarantee"):
        refuse("ledger", Facts(unproven, kanon, ledger=LedgerView()))
    void = BudgetState(adult.source_id, 0.0, 0.0, 10.0, 1e-5, void_reason="kanon before")
    refuse("ledger", Facts(unproven, kanon, ledger=LedgerView(known=True, budget=void)))
    ipa = plan_release("ipa", {"epsilon": 2.0}, 0, 7)
    spent = BudgetState(adult.source_id, 9.0, 0.0, 10.0, 1e-5)
    facts = Facts(adult, ipa, ledger=LedgerView(known=True, budget=spent))
    with pytest.raises(Exception, match="exceed the lifetime"):
        refuse("ledger", facts)
    # a scheduled run that releases only a changed extract: the budget waits for the charge
    refuse("ledger", Facts(adult, ipa, ledger=LedgerView(known=True, budget=spent),
                           budget_first=False))
    odd = adult.model_copy(update={"privacy": adult.privacy.model_copy(
        update={"lifetime_epsilon": 1e9})})
    with pytest.raises(ConfigError, match="new source"):
        refuse("ledger", Facts(odd, ipa, ledger=LedgerView()))


@pytest.mark.slow  # (reads the Adult extract)
def test_the_count_stage_asks_the_mechanisms_hooks(adult) -> None:
    """A fixed node outside the counted lattice is the mechanism's own refusal, raised in its
    own type; a key the caller looked for and did not find is refused; a key nobody could
    look for (``check``) is not."""
    from medrelease.data.aggregate import aggregate
    from medrelease.data.input_schema import validate_input
    from medrelease.storage.io import read_input

    counts = aggregate(validate_input(read_input(adult), adult).head(500), adult)
    context = ReleaseContext.from_counts(counts)
    node = {d: 99 for d in adult.dimensions}
    histogram = plan_release("histogram", {"epsilon": 1.0, "node": node}, 0, 7)
    with pytest.raises(ParameterError, match="outside"):
        refuse("count", Facts(adult, histogram, context=context))
    pseudo = plan_release("pseudonymize", {}, 0, 7)
    with pytest.raises(ParameterError, match="needs a key"):
        refuse("count", Facts(adult, pseudo, key_found=False))
    refuse("count", Facts(adult, pseudo, key_found=None))
    refuse("count", Facts(adult, pseudo, key_found=True))
