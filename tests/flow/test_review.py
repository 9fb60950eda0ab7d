"""Issue 39, item 2: review before publishing (``review: required``). The release and its
evidence are staged, the run pauses with a form (Prefect's ``pause_flow_run`` with
``wait_for_input``), and only an approval publishes; a rejection or a timeout publishes nothing,
and the spend stays counted either way. Run on Prefect's test API, answered through its API as
the UI's form answers (and through the local reviewer ``medrelease release`` uses)."""

from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
import yaml

from flows.release import ReleaseRequest, release_flow
from flows.review import ReviewDecision, set_local_reviewer
from medrelease.privacy.ledger import Ledger
from medrelease.storage.links import release_link

pytestmark = pytest.mark.usefixtures("prefect_harness")
ROOT = Path(__file__).resolve().parents[2]
ROWS = 2000


def reviewed_dataset(folder: Path, timeout_hours: float = 1.0, review: str = "required",
                     name: str = "reviewed", skip: int = 0) -> Path:
    """The NPS sample's config on ``ROWS`` of its rows (after ``skip``: another source needs
    other content), with ``review: required``."""
    source = ROOT / "datasets" / "nps-sample" / "dataset.yaml"
    spec = yaml.safe_load(source.read_text())
    for column in spec["columns"].values():
        if "taxonomy" in column:
            column["taxonomy"] = str((source.parent / column["taxonomy"]).resolve())
        if "domain" in column:  # a domain file lies beside its config
            shutil.copy(source.parent / column["domain"], folder)
    extract = folder / "extract.csv"
    pd.read_csv(source.parent / spec["input"]["path"], dtype=str).iloc[skip:skip + ROWS].to_csv(
        extract, index=False)
    spec.update(name=name, input={**spec["input"], "path": str(extract)},
                review=review, review_timeout_hours=timeout_hours)
    spec["privacy"].update(source=name, lifetime_epsilon=10.0)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    yield tmp_path / "home"
    set_local_reviewer(None)


def _request(config: Path) -> ReleaseRequest:
    return ReleaseRequest(dataset=str(config), mechanism="histogram", epsilon=0.5)


def _published(home: Path) -> list[Path]:
    return [p for p in (home / "releases").rglob("*") if p.is_file()] \
        if (home / "releases").exists() else []


def _paused_run(running, timeout_s: float = 120):
    """The run waiting for its review, once its form (schema and description) is saved."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            if running.done():
                raise AssertionError(f"the run ended without pausing: {running.result()}")
            runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(state=FlowRunFilterState(
                type=FlowRunFilterStateType(any_=[StateType.PAUSED]))))
            for run in runs:
                keyset = run.state.state_details.run_input_keyset
                try:
                    description = client.read_flow_run_input(run.id, keyset["description"])
                    return run, description
                except Exception:
                    continue
            time.sleep(0.3)
    raise AssertionError("no run paused for its review")


def test_approve_in_the_form_publishes_the_staged_release(home: Path, tmp_path: Path) -> None:
    from prefect.flow_runs import resume_flow_run

    config = reviewed_dataset(tmp_path)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(release_flow, _request(config))
        run, description = _paused_run(running)
        # Before the choice: the form says the spend stays counted; nothing is public yet,
        # the release and its evidence wait in the staging area.
        assert "stays counted" in description and "Reject" in description
        # Findable: the run is named by what it releases, and says where the release will be.
        assert run.name == "reviewed · histogram · eps 0.5"
        [staged] = list((home / "steward" / ".staging" / "reviewed").iterdir())
        assert {"data.csv", "manifest.json", "report.md"} <= {p.name for p in staged.iterdir()}
        assert _published(home) == []
        assert (home / "steward" / "reviewed" / staged.name / "evaluation").is_dir()
        [spend] = Ledger(home / "ledger.sqlite").spends()
        assert spend.status == "reserved"
        resume_flow_run(run.id, run_input={"decision": "approve", "reason": "board: fine"})
        result = running.result(timeout=120)
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        ended = client.read_flow_run(run.id).state
    assert ended.message.startswith(
        f"Published: {release_link('reviewed', staged.name)}")
    folder = Path(result["path"])
    assert folder == home / "releases" / "reviewed" / staged.name and not staged.exists()
    assert json.loads((folder / "manifest.json").read_text())["release_id"] == staged.name
    record = json.loads((home / "steward" / "reviewed" / staged.name / "record.json")
                        .read_text())
    assert record["status"] == "published" and record["review"]["decision"] == "approve"
    assert record["review"]["reason"] == "board: fine"
    [spend] = Ledger(home / "ledger.sqlite").spends()
    assert spend.status == "released" and spend.release_id == staged.name
    assert "approved at review: board: fine" in spend.note


def test_reject_publishes_nothing_and_the_spend_stays_counted(home: Path,
                                                              tmp_path: Path) -> None:
    config = reviewed_dataset(tmp_path)
    seen = []

    def reviewer(summary):  # what 'medrelease release --reject REASON' registers
        seen.append(summary)
        return ReviewDecision(decision="reject", reason="too coarse for the study")

    set_local_reviewer(reviewer)
    state = release_flow(_request(config), return_state=True)
    assert state.name == "Not published", state.message
    assert "rejected at review (too coarse for the study)" in state.message
    assert "stays counted" in state.message
    assert seen[0].dataset == "reviewed" and seen[0].released_rows > 0
    assert _published(home) == []
    assert not any((home / "steward" / ".staging" / "reviewed").iterdir())
    [spend] = Ledger(home / "ledger.sqlite").spends()
    assert spend.status == "failed" and spend.epsilon == pytest.approx(0.5)
    assert "rejected at review" in spend.note and "too coarse for the study" in spend.note
    assert Ledger(home / "ledger.sqlite").state("reviewed").epsilon_spent == pytest.approx(0.5)
    record = json.loads((home / "steward" / "reviewed" / seen[0].release_id / "record.json")
                        .read_text())
    assert record["status"] == "not published" and record["review"]["decision"] == "reject"


def test_a_review_left_open_past_its_timeout_ends_not_published(home: Path,
                                                                 tmp_path: Path) -> None:
    config = reviewed_dataset(tmp_path, timeout_hours=0.0008)  # about 3 s
    state = release_flow(_request(config), return_state=True)
    assert state.name == "Not published" and "review timed out" in state.message
    assert _published(home) == []
    [spend] = Ledger(home / "ledger.sqlite").spends()
    assert spend.status == "failed" and "review timed out" in spend.note


def test_the_cli_approves_with_a_flag(home: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from deployments.cli import app

    config = reviewed_dataset(tmp_path)
    shown = CliRunner().invoke(app, ["release", str(config), "--mechanism", "histogram",
                                     "--epsilon", "0.5", "--approve"])
    assert shown.exit_code == 0, shown.output
    [manifest] = list((home / "releases" / "reviewed").glob("*/manifest.json"))
    [spend] = Ledger(home / "ledger.sqlite").spends()
    assert spend.release_id == manifest.parent.name
    assert spend.status == "released" and "approved at review" in spend.note
    assert "--approve" in spend.note
