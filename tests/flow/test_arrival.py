"""The on-arrival flow and the inbox, as an attacker and a careless sender would use them.

A dataset given as a YAML path (the flow used to crash with "Non-relative patterns are
unsupported" and leave the file in ``processing/``), a bad extract (rejected with a value-free
reason), the same content twice (a duplicate, never released again), and a symbolic link
dropped into the inbox (rejected unread).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flows.arrival import arrival_release_flow
from medrelease.errors import InputValidationError
from medrelease.privacy.ledger import Ledger
from medrelease.storage.inbox import InboxWatcher
from medrelease.storage.io import file_sha256

from ..conftest import PAPER_TABLE_5, serve_inbox, write_paper_dataset

SECRET = "TOPSECRET_DB_PASSWORD=arrival-sentinel"


@pytest.fixture
def inbox(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MEDRELEASE_INPUT_ROOTS", raising=False)
    folder = tmp_path / "inbox"
    folder.mkdir()
    monkeypatch.setenv("MEDRELEASE_INBOX", str(folder))
    return folder


def _claim(inbox: Path, name: str, text: str):
    (inbox / name).write_text(text)
    (inbox / f"{name}.done").write_text("")
    [arrival] = InboxWatcher(inbox, stable_polls=1).poll()
    return arrival


def _table(n_copies: int = 4) -> str:
    import pandas as pd

    return pd.concat([PAPER_TABLE_5] * n_copies).to_csv(index=False)


@pytest.mark.usefixtures("prefect_harness")
def test_arrival_with_the_dataset_as_a_yaml_path_releases_then_refuses_the_duplicate(
        inbox: Path, tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "ds").mkdir()
    config = str(write_paper_dataset(tmp_path / "ds"))
    serve_inbox(monkeypatch, inbox, config)
    first = _claim(inbox, "monthly.csv", _table())
    result = arrival_release_flow(config, str(first.path), first.sha256)
    assert Path(result["path"]).is_dir() and not first.path.exists()
    assert [p.name for p in (inbox / "released").glob("*.csv")] == ["monthly.csv"]
    spends = len(Ledger(tmp_path / "home" / "ledger.sqlite").spends())

    again = _claim(inbox, "monthly-again.csv", _table())
    state = arrival_release_flow(config, str(again.path), again.sha256, return_state=True)
    assert (state.name, state.type.value) == ("Duplicate", "COMPLETED")  # not a failure
    assert "already released as" in state.message
    assert state.result()["release_id"] is None
    assert (inbox / "duplicates" / "monthly-again.csv").is_file()
    assert len(Ledger(tmp_path / "home" / "ledger.sqlite").spends()) == spends
    assert list((inbox / "processing").iterdir()) == []


@pytest.mark.usefixtures("prefect_harness")
def test_a_bad_arrival_is_rejected_with_a_value_free_reason(inbox: Path, tmp_path: Path,
                                                            monkeypatch) -> None:
    (tmp_path / "ds").mkdir()
    config = str(write_paper_dataset(tmp_path / "ds"))
    serve_inbox(monkeypatch, inbox, config)
    bad = _table().replace("M,", "XSENTINELX,", 1)
    arrival = _claim(inbox, "bad.csv", bad)
    with pytest.raises(InputValidationError, match=r"'Gender'.*not covered.*file line 2"):
        arrival_release_flow(config, str(arrival.path), arrival.sha256)
    [reason] = (inbox / "rejected").glob("*.reason.txt")
    assert "Gender" in reason.read_text() and "XSENTINELX" not in reason.read_text()
    assert list((inbox / "processing").iterdir()) == []
    assert not (tmp_path / "home" / "releases").exists()


def test_a_symlink_in_the_inbox_is_rejected_unread(inbox: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.csv"
    secret.write_text(SECRET + "\n1,2\n")
    os.symlink(secret, inbox / "extract.csv")
    assert InboxWatcher(inbox, stable_polls=1).poll() == []
    assert not (inbox / "extract.csv").exists() and secret.read_text().startswith(SECRET)
    [reason] = (inbox / "rejected").glob("*.reason.txt")
    assert "symbolic link" in reason.read_text() and SECRET not in reason.read_text()
    assert not (inbox / "processing").exists() or list((inbox / "processing").iterdir()) == []
    assert file_sha256(secret)  # the target is untouched
