"""The inbox watcher: only complete files, once per content, claimed before announcing."""

from __future__ import annotations

from pathlib import Path

import pytest

from medrelease.storage.inbox import InboxWatcher, move_to, original_name


def test_a_file_is_announced_once_it_stops_changing(tmp_path: Path) -> None:
    watcher = InboxWatcher(tmp_path, stable_polls=2)
    extract = tmp_path / "extract.csv"
    extract.write_text("a,b\n1,2\n")
    assert watcher.poll() == []  # seen once: might still be growing
    with extract.open("a") as handle:
        handle.write("3,4\n")  # still being written
    assert watcher.poll() == []
    [arrival] = watcher.poll()  # unchanged since the last poll
    assert not extract.exists()
    assert arrival.path.parent == tmp_path / "processing"
    assert original_name(arrival.path) == "extract.csv"
    watcher.mark_announced(arrival)
    assert watcher.poll() == []


def test_done_marker_means_complete_at_once(tmp_path: Path) -> None:
    watcher = InboxWatcher(tmp_path, stable_polls=5)
    (tmp_path / "big.parquet").write_bytes(b"PAR1....")
    (tmp_path / "big.parquet.done").write_text("")
    [arrival] = watcher.poll()
    assert original_name(arrival.path) == "big.parquet"
    assert not (tmp_path / "big.parquet.done").exists()


def test_same_content_twice_goes_to_duplicates(tmp_path: Path) -> None:
    watcher = InboxWatcher(tmp_path, stable_polls=1)
    (tmp_path / "one.csv").write_text("same\n")
    [first] = watcher.poll()
    watcher.mark_announced(first)
    (tmp_path / "two.csv").write_text("same\n")
    assert watcher.poll() == []
    assert (tmp_path / "duplicates" / "two.csv").exists()
    (tmp_path / "three.csv").write_text("same\n")
    (tmp_path / "four.csv").write_text("same\n")
    assert watcher.poll() == [] and len(list((tmp_path / "duplicates").glob("*.csv"))) == 3
    reasons = sorted((tmp_path / "duplicates").glob("*.reason.txt"))
    assert len(reasons) == 3 and all("as one.csv, already announced" in r.read_text()
                                     for r in reasons)


@pytest.mark.usefixtures("prefect_harness")
def test_a_duplicate_under_a_new_name_has_a_visible_outcome(tmp_path: Path, caplog) -> None:
    """Issue 27: a repeated file dropped under a new name vanished into duplicates/ with no
    log line and no reason file."""
    from flows.watch import report_filed

    watcher = InboxWatcher(tmp_path, stable_polls=1)
    (tmp_path / "extract-2026-11.csv").write_text("same\n")
    [first] = watcher.poll()
    watcher.mark_announced(first)
    (tmp_path / "extract-2026-11-again.csv").write_text("same\n")
    assert watcher.poll() == []
    caplog.set_level("WARNING", logger="medrelease.inbox")
    report_filed(watcher)
    assert "extract-2026-11-again.csv moved to duplicates/" in caplog.text
    assert "already announced" in (tmp_path / "duplicates" /
                                   "extract-2026-11-again.csv.reason.txt").read_text()


def test_unannounced_claims_are_retried_and_others_ignored(tmp_path: Path) -> None:
    watcher = InboxWatcher(tmp_path, stable_polls=1)
    (tmp_path / "notes.txt").write_text("not an extract")
    (tmp_path / "x.csv").write_text("x\n")
    [arrival] = watcher.poll()  # claimed, but the event was never emitted (crash)
    again = InboxWatcher(tmp_path, stable_polls=1).poll()
    assert [a.path for a in again] == [arrival.path]
    assert (tmp_path / "notes.txt").exists()


def test_move_to_never_overwrites_and_writes_reason(tmp_path: Path) -> None:
    for _ in range(2):
        src = tmp_path / ("a" * 64 + "-bad.csv")
        src.write_text("x")
        target = move_to(tmp_path, src, "rejected", "column 'age': value 'x'")
    names = sorted(p.name for p in (tmp_path / "rejected").iterdir() if p.suffix == ".csv")
    assert names[0].startswith("bad-") and names[1] == "bad.csv"
    assert (target.with_name(target.name + ".reason.txt")).read_text().startswith("column 'age'")
