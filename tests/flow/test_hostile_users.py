"""Issue 25: the service against its own users — the ledger as the system of record, dataset
roots without shadowing, deployments that only do their job. (The cases that run one release
and assert a refusal with no spend are in the bad-input corpus.)"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from deployments.cli import app
from flows.arrival import arrival_release_flow
from flows.release import ReleaseRequest, release_flow
from medrelease.data.config import find_config
from medrelease.errors import ConfigError, MedreleaseError
from medrelease.privacy.ledger import Ledger, LedgerIntegrityError
from medrelease.storage.inbox import InboxWatcher

from ..conftest import PAPER_TABLE_5, serve_inbox, write_paper_dataset


def _unwrapped(output: str) -> str:
    return " ".join(output.split())


@pytest.fixture
def home(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MEDRELEASE_INPUT_ROOTS", raising=False)
    return tmp_path / "home"


# -- the ledger: caps journaled, restored exactly, bounded ---------------------------------------

@pytest.mark.usefixtures("prefect_harness")
def test_restore_after_set_cap_keeps_the_lowered_cap_and_its_history(home: Path,
                                                                     tmp_path: Path) -> None:
    """Before: restore gave back the config's cap of 10 and dropped the cap history."""
    (tmp_path / "ds").mkdir()
    config = str(write_paper_dataset(tmp_path / "ds"))
    release_flow(ReleaseRequest(dataset=config, evaluate=False))
    ledger_file = home / "ledger.sqlite"
    lowered = CliRunner().invoke(app, ["ledger", "set-cap", "paper-example", "--epsilon", "1.5",
                                       "--delta", "1e-5", "--reason", "lowered by the board"])
    assert lowered.exit_code == 0, lowered.output
    for suffix in ("", "-wal", "-shm"):
        Path(f"{ledger_file}{suffix}").unlink(missing_ok=True)
    restored = CliRunner().invoke(app, ["ledger", "restore"])
    assert restored.exit_code == 0, restored.output
    state = Ledger(ledger_file).state("paper-example")
    assert (state.lifetime_epsilon, state.epsilon_spent) == (1.5, pytest.approx(1.0))
    assert [c["reason"] for c in state.cap_history] == ["lowered by the board"]
    # the next release states the cap, when it changed and why (and is held to the cap)
    with pytest.raises(MedreleaseError, match="exceed the lifetime"):
        release_flow(ReleaseRequest(dataset=config, evaluate=False))
    ok = release_flow(ReleaseRequest(dataset=config, evaluate=False,
                                     mechanism={"mechanism": "ipa", "epsilon": 0.5}))
    lifetime = ok["manifest"]["lifetime"]
    assert lifetime["epsilon_cap"] == 1.5
    assert lifetime["cap_changes"][0]["reason"] == "lowered by the board"
    assert "changed from epsilon 100 to 1.5 on" in lifetime["statement"]


def test_set_cap_refuses_caps_beyond_the_product_bounds_and_empty_reasons(tmp_path: Path
                                                                          ) -> None:
    from ..served.test_ledger import _request

    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.reserve(_request("ds", 1.0))
    with pytest.raises(MedreleaseError, match="0 < epsilon <= 100"):
        ledger.set_cap("ds", 1e300, 1e-5, "raised for the new project")
    with pytest.raises(MedreleaseError, match="at least 10 characters"):
        ledger.set_cap("ds", 5.0, 1e-5, ".")
    assert ledger.state("ds").lifetime_epsilon == 10.0 and not ledger.cap_changes()
    assert '"event": "cap"' not in ledger.journal_path.read_text()  # the reservation only


def test_a_refused_or_failed_unproven_run_never_voids_the_lifetime(tmp_path: Path) -> None:
    from ..served.test_ledger import _request

    ledger = Ledger(tmp_path / "ledger.sqlite")
    failed = ledger.reserve(_request("ds", 0.0, mechanism="pseudonymize", dp=False))
    ledger.mark(failed, "failed", note="ParameterError: needs a key")
    assert not ledger.state("ds").void
    assert "together are" in ledger.state("ds").statement()


# -- dataset roots -----------------------------------------------------------------------------

def _named_dataset(root: Path, name: str = "twin") -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    path = write_paper_dataset(folder)
    spec = yaml.safe_load(path.read_text())
    spec["name"] = name
    path.rename(folder / "dataset.yaml")
    (folder / "dataset.yaml").write_text(yaml.safe_dump(spec))
    return folder / "dataset.yaml"


def test_a_dataset_name_in_two_roots_is_refused(home: Path, tmp_path: Path, monkeypatch) -> None:
    """Before: a YAML under $MEDRELEASE_HOME/datasets shadowed one under MEDRELEASE_DATASETS."""
    extra = tmp_path / "extra-root"
    monkeypatch.setenv("MEDRELEASE_DATASETS", str(extra))
    _named_dataset(extra)
    assert find_config("twin").name == "twin"
    _named_dataset(home / "datasets")
    with pytest.raises(ConfigError, match="'twin' is defined in 2 dataset folders"):
        find_config("twin")


def test_a_dataset_folder_linked_out_of_its_root_is_refused(home: Path, tmp_path: Path,
                                                            monkeypatch) -> None:
    root = tmp_path / "root"
    root.mkdir()
    monkeypatch.setenv("MEDRELEASE_DATASETS", str(root))
    outside = _named_dataset(tmp_path / "elsewhere", "linked").parent
    os.symlink(outside, root / "linked")
    with pytest.raises(ConfigError, match="symbolic link that leads out"):
        find_config("linked")


# -- the inbox and the arrival flow --------------------------------------------------------------

@pytest.fixture
def inbox(home: Path, tmp_path: Path, monkeypatch) -> Path:
    folder = tmp_path / "inbox"
    folder.mkdir()
    monkeypatch.setenv("MEDRELEASE_INBOX", str(folder))
    return folder


def test_the_inbox_does_not_follow_hard_links(inbox: Path, tmp_path: Path) -> None:
    """Before: a hard link to another hospital's file was announced and released."""
    other = tmp_path / "other-hospital"
    other.mkdir()
    theirs = other / "their-extract.csv"
    theirs.write_text(PAPER_TABLE_5.to_csv(index=False))
    os.link(theirs, inbox / "monthly.csv")
    (inbox / "monthly.csv.done").write_text("")
    assert InboxWatcher(inbox, stable_polls=1).poll() == []
    [reason] = (inbox / "rejected").glob("*.reason.txt")
    assert "hard links" in reason.read_text()
    assert theirs.is_file() and list((inbox / "processing").iterdir()) == []


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize("where", ["outside", "inbox-top", "other-processing", "relative"])
def test_the_arrival_flow_refuses_paths_outside_its_inbox_and_moves_nothing(
        inbox: Path, tmp_path: Path, where: str) -> None:
    """Before: started from the UI with any path and a wrong hash, the arrival flow moved that
    file into a rejected/ folder beside it."""
    victim_folder = {"outside": tmp_path / "elsewhere", "inbox-top": inbox,
                     "other-processing": tmp_path / "fake-inbox" / "processing",
                     "relative": tmp_path / "elsewhere"}[where]
    victim_folder.mkdir(parents=True, exist_ok=True)
    victim = victim_folder / "precious.csv"
    victim.write_text(PAPER_TABLE_5.to_csv(index=False))
    path = "processing/precious.csv" if where == "relative" else str(victim)
    state = arrival_release_flow("nps-sample", path, "0" * 64, return_state=True)
    assert state.name == "Refused" and "not an extract announced" in state.message
    assert victim.is_file() and not (victim_folder / "rejected").exists()
    assert not (victim_folder.parent / "rejected").exists()


@pytest.mark.usefixtures("prefect_harness")
def test_the_arrival_flow_refuses_a_linked_file_in_processing(inbox: Path, tmp_path: Path,
                                                              monkeypatch) -> None:
    InboxWatcher(inbox)  # makes processing/
    serve_inbox(monkeypatch, inbox, "nps-sample")
    theirs = tmp_path / "theirs.csv"
    theirs.write_text("x\n")
    os.link(theirs, inbox / "processing" / ("a" * 64 + "-theirs.csv"))
    linked = inbox / "processing" / ("a" * 64 + "-theirs.csv")
    state = arrival_release_flow("nps-sample", str(linked), "a" * 64, return_state=True)
    assert state.name == "Refused" and "one hard link" in state.message
    assert theirs.is_file()


def test_the_watcher_takes_no_folder_from_its_caller(home: Path, monkeypatch) -> None:
    """Before: the watch-inbox deployment took any folder as its inbox, created folders there
    and moved files. Its inbox is now the one the service was started with."""
    from flows.watch import watch_inbox_flow

    assert "inbox" not in watch_inbox_flow.parameters.properties
    monkeypatch.delenv("MEDRELEASE_INBOX", raising=False)
    with pytest.raises(ConfigError, match="started without an inbox"):
        watch_inbox_flow.fn(max_seconds=0.1)


def test_the_resolved_extract_hashes_every_file_and_refuses_copies(tmp_path: Path) -> None:
    """The engine value every release reads: files, hashes; identical partitions refused."""
    from medrelease.data.config import load_config
    from medrelease.data.extract import resolve_extract
    from medrelease.errors import InputValidationError

    folder = tmp_path / "ds"
    folder.mkdir()
    path = write_paper_dataset(folder)
    config = load_config(path)
    extract = resolve_extract(config)
    assert len(extract.files) == 1 and len(extract.digest) == 64
    shutil.copyfile(extract.paths[0], folder / "copy.csv")
    spec = yaml.safe_load(path.read_text())
    spec["input"]["path"] = "*.csv"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(InputValidationError, match="identical content"):
        resolve_extract(load_config(path))


def test_a_missing_ledger_with_published_releases_only_is_refused(tmp_path: Path) -> None:
    """The published manifests alone are enough to refuse a restart from zero."""
    from medrelease.privacy.ledger_backends import reconcile

    manifest = {"release_id": "20260101T000000Z-ipa-1", "source": "s", "dataset": "d",
                "mechanism": "ipa", "epsilon_spent": 1.0, "delta_spent": 0.0,
                "lifetime": {"epsilon_cap": 2.0, "delta_cap": 1e-5}}
    with pytest.raises(LedgerIntegrityError, match="is missing the spends of 1 release"):
        reconcile(tmp_path / "ledger.sqlite", [], [manifest])


@pytest.mark.usefixtures("prefect_harness")
def test_an_inbox_arrival_of_charged_content_for_another_source_is_refused(
        inbox: Path, tmp_path: Path, monkeypatch) -> None:
    """The same extract through the inbox, announced for a dataset of another source: refused
    (the content is charged to the first source), filed under rejected/ with its reason."""
    first = tmp_path / "first"
    first.mkdir()
    config = write_paper_dataset(first)
    release_flow(ReleaseRequest(dataset=str(config), evaluate=False))
    second = tmp_path / "second"
    second.mkdir()
    other = write_paper_dataset(second)
    spec = yaml.safe_load(other.read_text())
    spec["name"], spec["privacy"]["source"] = "second-hospital", "fresh-budget"
    other.write_text(yaml.safe_dump(spec))
    serve_inbox(monkeypatch, inbox, str(other))  # the inbox is the second hospital's
    shutil.copyfile(first / "table5.csv", inbox / "monthly.csv")
    (inbox / "monthly.csv.done").write_text("")
    [arrival] = InboxWatcher(inbox, stable_polls=1).poll()
    spends = len(Ledger(tmp_path / "home" / "ledger.sqlite").spends())
    state = arrival_release_flow(str(other), str(arrival.path), arrival.sha256,
                                 return_state=True)
    assert state.name == "Refused" and "already charged to source 'paper-example'" in state.message
    assert len(Ledger(tmp_path / "home" / "ledger.sqlite").spends()) == spends
    [reason] = (inbox / "rejected").glob("*.reason.txt")
    assert "already charged" in reason.read_text()


@pytest.mark.usefixtures("prefect_harness")
def test_a_refused_run_logs_one_warning_and_no_traceback(home: Path, tmp_path: Path,
                                                         caplog) -> None:
    """Issue 27: the Refused badge was right, but the run's log showed the task's PolicyError
    traceback and the engine's "exited with unexpected exception" traceback, in red."""
    import logging

    from medrelease.errors import PolicyError

    (tmp_path / "ds").mkdir()
    config = str(write_paper_dataset(tmp_path / "ds"))
    caplog.set_level(logging.INFO)
    state = release_flow(ReleaseRequest(dataset=config, evaluate=False,
                                        mechanism={"mechanism": "kanon", "k": 10}),
                         return_state=True)
    assert state.name == "Refused" and state.message.startswith("Nothing spent: ")
    assert isinstance(state.result(raise_on_failure=False), PolicyError)
    records = [r for r in caplog.records if r.name.startswith("prefect")]
    assert any("release refused, nothing spent" in r.getMessage() for r in records)
    loud = [r.getMessage()[:80] for r in records if r.levelno >= logging.ERROR or r.exc_info]
    assert not loud, f"a refusal logged as an error or with a traceback: {loud}"
    # One line: the task engine's "Task run failed with exception ..." and "Finished in state
    # Failed(...)" about the same refusal are not repeated in the run's log.
    said = [r.getMessage()[:80] for r in records if r.levelno >= logging.WARNING and (
        "release refused" in r.getMessage() or PolicyError.__name__ in r.getMessage())]
    assert len(said) == 1 and said[0].startswith("release refused"), said


@pytest.mark.usefixtures("prefect_harness")
def test_a_request_sent_as_fields_is_checked_inside_the_flow(home: Path) -> None:
    state = release_flow(request={"dataset": "nps-sample", "mechanism": "kanon",
                                  "epsilon": 1.0}, return_state=True)
    assert state.name == "Refused"
    assert "kanon takes no epsilon" in state.message and "Nothing was read" in state.message
