"""Issue 36, cases 14-16: the inbox's dataset is the service's, one run at a time releases an
extract, and an extract refused only for the budget waits in ``held/`` for a Retry.

Each refusal is checked where it matters: the run ends Refused, the ledger holds no new spend
and no release folder appears. In-process runs on the session's Prefect API (the served
deployments, Retry button included, are in ``tests/served/test_inbox_deployments.py``).
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pandas as pd
import pytest

from flows.arrival import arrival_release_flow
from medrelease.privacy.ledger import Ledger
from medrelease.storage.inbox import ContentClaim, InboxWatcher

from ..conftest import PAPER_TABLE_5, serve_inbox, write_paper_dataset

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture
def home(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def inbox(tmp_path: Path) -> Path:
    folder = tmp_path / "inbox"
    folder.mkdir()
    return folder


def _paper_dataset(folder: Path, name: str, lifetime_epsilon: float = 100.0) -> str:
    """Table 5's dataset under its own name and source, releasing with ipa at epsilon 1."""
    folder.mkdir(parents=True)
    config = write_paper_dataset(folder)
    text = config.read_text().replace("name: paper-example", f"name: {name}").replace(
        "privacy: {lifetime_epsilon: 100}",
        f"privacy: {{lifetime_epsilon: {lifetime_epsilon}, source: {name}}}\n"
        "mechanism: {name: ipa, params: {epsilon: 1.0}}")
    config.write_text(text)
    return str(config)


def _month(seed: int) -> str:
    """A month's extract of Table 5's schema, distinct content per seed."""
    rows = pd.concat([PAPER_TABLE_5] * 4, ignore_index=True)
    rows["Age"] = (rows["Age"] + seed) % 90
    return rows.to_csv(index=False)


def _drop(inbox: Path, name: str, text: str):
    (inbox / name).write_text(text)
    (inbox / f"{name}.done").write_text("")
    [arrival] = InboxWatcher(inbox, stable_polls=1).poll()
    return arrival


def _spends(home: Path) -> list:
    path = home / "ledger.sqlite"
    return Ledger(path).spends() if path.exists() else []


def _published(home: Path) -> list[Path]:
    return sorted((home / "releases").rglob("manifest.json")) if (home / "releases").exists() \
        else []


# -- 14: the inbox's dataset is fixed by serve ---------------------------------------------------

def test_an_arrival_run_naming_another_dataset_is_refused_and_spends_nothing(
        home: Path, inbox: Path, tmp_path: Path, monkeypatch) -> None:
    """Before: the on-arrival run released the inbox's file as whatever dataset its
    parameters named, charging another source's budget."""
    served = _paper_dataset(tmp_path / "served", "hospital-a")
    other = _paper_dataset(tmp_path / "other", "copy1")
    serve_inbox(monkeypatch, inbox, served)
    arrival = _drop(inbox, "monthly.csv", _month(1))

    state = arrival_release_flow(other, str(arrival.path), arrival.sha256, return_state=True)
    assert state.name == "Refused", state
    assert "parameter 'dataset'" in state.message and f"dataset {served!r}" in state.message
    assert "Nothing was read, moved or spent" in state.message
    assert _spends(home) == [] and _published(home) == []
    assert arrival.path.is_file()  # untouched: the served dataset's run still releases it

    released = arrival_release_flow(served, str(arrival.path), arrival.sha256)
    assert Path(released["path"]).is_dir()
    assert [s.source for s in _spends(home)] == ["hospital-a"]


def test_the_watch_inbox_flow_refuses_another_dataset_before_touching_the_inbox(
        home: Path, inbox: Path, tmp_path: Path, monkeypatch) -> None:
    """Before: the watch-inbox deployment announced the next arrival as the dataset its run
    named, and the on-arrival run charged it there."""
    from flows.watch import watch_inbox_flow

    serve_inbox(monkeypatch, inbox, _paper_dataset(tmp_path / "served", "hospital-a"))
    (inbox / "monthly.csv").write_text(_month(2))
    (inbox / "monthly.csv.done").write_text("")
    state = watch_inbox_flow(dataset="copy1", interval_s=0.1, max_seconds=0.5,
                             return_state=True)
    assert state.name == "Refused", state
    assert "parameter 'dataset'" in state.message and "copy1" in state.message
    assert (inbox / "monthly.csv").is_file()  # not claimed, not announced
    assert not (inbox / "processing").exists() or not any((inbox / "processing").iterdir())
    assert _spends(home) == []


# -- 15: one run at a time per extract -----------------------------------------------------------

def test_a_second_run_for_an_extract_another_run_holds_is_refused_and_spends_nothing(
        home: Path, inbox: Path, tmp_path: Path, monkeypatch) -> None:
    """Before: two on-arrival runs for one processing/ file both released it, both charged."""
    config = _paper_dataset(tmp_path / "served", "hospital-a")
    serve_inbox(monkeypatch, inbox, config)
    arrival = _drop(inbox, "monthly.csv", _month(3))
    first = ContentClaim.take(inbox, arrival.sha256, "run-that-is-releasing-it")

    state = arrival_release_flow(config, str(arrival.path), arrival.sha256, return_state=True)
    assert state.name == "Refused", state
    assert "being released by flow run run-that-is-releasing-it" in state.message
    assert _spends(home) == [] and _published(home) == [] and arrival.path.is_file()

    first.give_back()  # that run ended without releasing: the next one may
    assert arrival_release_flow(config, str(arrival.path), arrival.sha256)["release_id"]
    assert len(_spends(home)) == 1


def test_two_runs_at_once_for_one_extract_release_it_once(
        home: Path, inbox: Path, tmp_path: Path, monkeypatch) -> None:
    """Both runs start together (as two deliveries of one event, or a UI user's copy of the
    run, would): one releases, the other ends without a release or a spend."""
    config = _paper_dataset(tmp_path / "served", "hospital-a")
    serve_inbox(monkeypatch, inbox, config)
    arrival = _drop(inbox, "monthly.csv", _month(4))
    start = threading.Barrier(2)
    states: list = []

    def run() -> None:
        start.wait()
        states.append(arrival_release_flow(config, str(arrival.path), arrival.sha256,
                                           return_state=True))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    names = sorted(s.name for s in states)
    assert len(names) == 2 and "Completed" in names, [(s.name, s.message) for s in states]
    [other] = [s for s in states if s.name != "Completed"]
    assert other.name in ("Refused", "Duplicate"), other  # claimed by the first, or after it
    assert len(_spends(home)) == 1 and len(_published(home)) == 1
    assert [p.name for p in (inbox / "released").glob("*.csv")] == ["monthly.csv"]


# -- 16: a budget refusal holds the extract for a Retry ------------------------------------------

def _over_budget(home: Path, inbox: Path, tmp_path: Path, monkeypatch):
    """hospital-a with a cap of 1.5, of which its own table's release spent 1.0: the next
    arrival (epsilon 1.0) is refused for the budget alone."""
    from flows.release import ReleaseRequest, release_flow

    config = _paper_dataset(tmp_path / "served", "hospital-a", lifetime_epsilon=1.5)
    serve_inbox(monkeypatch, inbox, config)
    assert release_flow(ReleaseRequest(dataset=config, evaluate=False))["release_id"]
    arrival = _drop(inbox, "monthly.csv", _month(5))
    state = arrival_release_flow(config, str(arrival.path), arrival.sha256, return_state=True)
    assert state.name == "Refused" and "lifetime privacy budget" in state.message, state
    return config, arrival


def test_a_budget_refusal_holds_the_extract_and_a_retry_releases_it_once_the_cap_allows(
        home: Path, inbox: Path, tmp_path: Path, monkeypatch) -> None:
    """Before: refused for the budget, the extract went to rejected/ with an ERROR, and a
    Retry of its run ended Refused (the file was gone from processing/)."""
    config, arrival = _over_budget(home, inbox, tmp_path, monkeypatch)
    held = inbox / "held" / arrival.path.name
    assert held.is_file(), sorted(str(p.relative_to(inbox)) for p in inbox.rglob("*.csv"))
    assert list((inbox / "rejected").glob("*.csv")) == []
    reason = (inbox / "held" / f"{arrival.path.name}.reason.txt").read_text()
    assert "lifetime privacy budget" in reason and "Retry this run" in reason
    assert len(_spends(home)) == 1 and len(_published(home)) == 1

    # Retry (the same parameters) while the cap is unchanged: refused again, still held
    state = arrival_release_flow(config, str(arrival.path), arrival.sha256, return_state=True)
    assert state.name == "Refused" and held.is_file() and len(_spends(home)) == 1

    Ledger(home / "ledger.sqlite").set_cap("hospital-a", 3.0, 1e-4,
                                           "the data committee approved the monthly release")
    result = arrival_release_flow(config, str(arrival.path), arrival.sha256)
    assert Path(result["path"]).is_dir()
    assert (inbox / "released" / "monthly.csv").is_file()
    assert not any((inbox / "held").iterdir()) and not any((inbox / "processing").iterdir())
    assert len(_spends(home)) == 2 and len(_published(home)) == 2

    again = arrival_release_flow(config, str(arrival.path), arrival.sha256, return_state=True)
    assert again.name == "Duplicate" and len(_spends(home)) == 2  # a run releases once


def test_a_held_extract_dropped_again_is_released_once_the_cap_allows(
        home: Path, inbox: Path, tmp_path: Path, monkeypatch) -> None:
    """Before: the same file dropped again after the cap was raised went to duplicates/ as
    'never released twice', though it never was released."""
    config, arrival = _over_budget(home, inbox, tmp_path, monkeypatch)
    Ledger(home / "ledger.sqlite").set_cap("hospital-a", 3.0, 1e-4,
                                           "the data committee approved the monthly release")
    shutil.copy(inbox / "held" / arrival.path.name, inbox / "monthly-again.csv")
    (inbox / "monthly-again.csv.done").write_text("")
    [redropped] = InboxWatcher(inbox, stable_polls=1).poll()
    assert redropped.sha256 == arrival.sha256
    assert not list((inbox / "held").iterdir())  # the held copy stepped aside
    assert "announced for another try" in (inbox / "duplicates" /
                                           "monthly.csv.reason.txt").read_text()

    result = arrival_release_flow(config, str(redropped.path), redropped.sha256)
    assert Path(result["path"]).is_dir() and (inbox / "released" / "monthly-again.csv").is_file()
    assert len(_spends(home)) == 2

    # the old run's Retry now finds its content released: nothing more is spent
    retry = arrival_release_flow(config, str(arrival.path), arrival.sha256, return_state=True)
    assert retry.name == "Duplicate" and len(_spends(home)) == 2


def test_a_refusal_about_the_file_itself_still_rejects_it(
        home: Path, inbox: Path, tmp_path: Path, monkeypatch) -> None:
    """Only the budget and the policy hold a file: bad content is rejected as before."""
    config = _paper_dataset(tmp_path / "served", "hospital-a")
    serve_inbox(monkeypatch, inbox, config)
    arrival = _drop(inbox, "bad.csv", _month(6).replace(",M,", ",X,", 1))
    state = arrival_release_flow(config, str(arrival.path), arrival.sha256, return_state=True)
    assert state.name == "Refused" and "'Gender'" in state.message
    assert (inbox / "rejected" / "bad.csv").is_file()
    assert not (inbox / "held").exists() or not any((inbox / "held").iterdir())
    assert _spends(home) == []
