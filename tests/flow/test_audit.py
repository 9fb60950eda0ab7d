"""The empirical audit shows the paper mechanism's claim failing and the sound one holding."""

from __future__ import annotations

import pytest

from medrelease.evidence.audit import clopper_pearson, run_audit


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


@pytest.mark.parametrize(("mechanism", "design"), [
    ("ipa", "tipping"), ("histogram", "unique"), ("diffgen", "classification")])
def test_sound_mechanisms_stay_within_their_claim(mechanism: str, design: str) -> None:
    result = run_audit(mechanism, 1.0, runs=120, seed=7, design=design)
    assert result.design == design and result.runs_per_table == 120
    assert result.epsilon_lower_bound <= 1.0


def test_tipping_pair_sits_at_the_threshold() -> None:
    from medrelease.evidence.audit import TIPPING_VALUE, tipping_copies, tipping_tables

    without, with_target = tipping_tables("ipa", 1.0)
    copies = tipping_copies("ipa", 1.0)
    assert (without["inf"] == TIPPING_VALUE).sum() == copies
    assert (with_target["inf"] == TIPPING_VALUE).sum() == copies + 1
    assert copies > 10  # the sound mechanism's release threshold at eps = 1


def test_audit_flow_fans_runs_out_as_tasks(prefect_harness) -> None:
    from prefect.client.orchestration import get_client

    from flows.audit import audit_flow

    from ..conftest import recorded_task_runs

    state = audit_flow(mechanism="ipa-paper", epsilon=1.0, runs=60, batch_size=15, seed=2,
                       return_state=True)
    result = state.result()
    with get_client(sync_client=True) as client:
        tasks = recorded_task_runs(client, state.state_details.flow_run_id)
        artifacts = client.read_artifacts()
    assert sum(t.name.startswith("audit-batch") for t in tasks) == 8  # 2 tables x 4 batches
    assert result["exceeds_claim"] and result["hits_with"] == 30 and result["hits_without"] == 0
    assert any(a.key == "audit-ipa-paper" for a in artifacts)
