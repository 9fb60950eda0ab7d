"""Issue 39, item 3: nothing irreversible without a confirmation. A mechanism without a proven
DP guarantee voids its source's lifetime guarantee for good; while that guarantee holds, such a
request is refused unless it carries ``void_lifetime_guarantee: true``, before anything is read
or spent, and the release that voids says so in its own manifest and report."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from flows.release import ReleaseRequest, release_flow
from medrelease.privacy.ledger import Ledger
from medrelease.storage.links import release_link

pytestmark = pytest.mark.usefixtures("prefect_harness")

KANON = {"mechanism": "kanon", "k": 10}


@pytest.fixture
def home(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path))
    return tmp_path


def _published_files(home: Path) -> list[Path]:
    return [p for store in ("releases", "test-releases") if (home / store).exists()
            for p in (home / store).rglob("*") if p.is_file()]


def _spends(home: Path) -> list:
    ledger = home / "ledger.sqlite"
    return Ledger(ledger).spends() if ledger.is_file() else []


def test_the_form_has_the_checkbox_and_says_what_it_costs() -> None:
    field = ReleaseRequest.model_json_schema()["properties"]["void_lifetime_guarantee"]
    assert field["type"] == "boolean" and field["default"] is False
    assert "FOR GOOD" in field["description"] and "kanon" in field["description"]


def test_kanon_without_the_confirmation_is_refused_before_anything_is_read(home: Path) -> None:
    # An input file that does not exist: a refusal about it would mean the file was looked at
    # before the confirmation was asked for.
    state = release_flow(ReleaseRequest(evaluate=False, mechanism=KANON,
                                        input_path=str(home / "not-there.csv")),
                         return_state=True)
    assert state.name == "Refused", state.message
    assert "voids the lifetime guarantee of source 'nps-sample' for good" in state.message
    assert "--void-lifetime-guarantee" in state.message and "Nothing was read" in state.message
    assert _spends(home) == [] and _published_files(home) == []


def test_kanon_with_the_confirmation_publishes_and_its_own_manifest_says_void(
        home: Path, caplog) -> None:
    caplog.set_level(logging.INFO)
    state = release_flow(ReleaseRequest(evaluate=False, mechanism=KANON,
                                        void_lifetime_guarantee=True), return_state=True)
    result = state.result()
    # After Submit, the run: named by what it releases; its state message and the log line
    # that says it was published give the release's portal URL, and no line before it does
    # (a run refused or rejected later would have logged a link to nothing: issue 56).
    url = release_link("nps-sample", result["release_id"])
    flow_lines = [r.getMessage() for r in caplog.records if r.name == "prefect.flow_runs"]
    said = next(i for i, line in enumerate(flow_lines) if line.startswith("published: "))
    assert url in flow_lines[said] and not any(url in line for line in flow_lines[:said])
    assert f"release {result['release_id']} of nps-sample started" in flow_lines[2]
    assert state.message.startswith(f"Published: {url}")
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        assert client.read_flow_run(result["flow_run_id"]).name == "nps-sample · kanon"
    folder = Path(result["path"])
    lifetime = json.loads((folder / "manifest.json").read_text())["lifetime"]
    assert lifetime["void"] is True and lifetime["voided_by_this_release"] is True
    assert "kanon" in lifetime["void_reason"]
    assert "THIS RELEASE VOIDED THE LIFETIME GUARANTEE" in (folder / "report.md").read_text()
    [spend] = _spends(home)
    assert spend.status == "released" and not spend.dp
    # Once void there is nothing left to lose: no confirmation is asked, and a later release
    # does not claim to be the one that voided it.
    later = release_flow(ReleaseRequest(evaluate=False, mechanism=KANON))
    assert later["manifest"]["lifetime"]["void"] is True
    assert later["manifest"]["lifetime"]["voided_by_this_release"] is False


def test_the_epsilon_field_says_what_epsilon_means_the_cap_and_the_budget_left() -> None:
    text = ReleaseRequest.model_json_schema()["properties"]["epsilon"]["description"]
    assert "smaller = more private and more noise" in text
    assert "nps-sample: at most 5 a release; source nps-sample: " in text and " left" in text


def test_a_policy_refusal_names_the_dataset_without_a_doubled_quote() -> None:
    from medrelease.data.config import find_config
    from medrelease.errors import PolicyError
    from medrelease.refusals import plan_for_config

    with pytest.raises(PolicyError) as refused:
        plan_for_config(find_config("adult"), "kanon", {"k": 10}, None)
    assert "the policy of dataset 'adult'" in str(refused.value)
    assert "''s" not in str(refused.value)
