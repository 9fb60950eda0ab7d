"""One event journal for both ledger back-ends (``medrelease/privacy/journal.py``): the same
events give the same chain whether they are lines of a file (SQLite's) or rows of
``ledger_events`` (PostgreSQL's; here in an in-memory SQLite table of the same shape), and one
check finds an edit, a gap, an unchained line and a lost head in either."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from medrelease.privacy.journal import (
    GENESIS_HASH,
    FileJournal,
    HeadFile,
    TableJournal,
    chain_hash,
    chain_problems,
    event_text,
    lost_head,
)

EVENTS = [{"event": "reserve", "at": f"2026-11-29T12:00:0{i}", "spend_id": f"s{i}",
           "request": {"epsilon": 0.5 * (i + 1)}} for i in range(4)]


def _table() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE ledger_events (seq INTEGER PRIMARY KEY, at TEXT, kind TEXT, "
                 "body TEXT, prev_hash TEXT, hash TEXT)")
    return conn


def test_both_storages_chain_the_same_events_alike(tmp_path: Path) -> None:
    file, table, conn = FileJournal(tmp_path / "j.jsonl"), TableJournal(), _table()
    heads = [(file.append(None, e), table.append(conn, e)) for e in EVENTS]
    assert all(a == b for a, b in heads)
    assert heads[0][0].hash == chain_hash(GENESIS_HASH, event_text(EVENTS[0]))
    for links in (file.links(), table.links(conn)):
        assert [link.event for link in links] == EVENTS
        assert chain_problems(links) == []
    assert file.last() == table.last(conn) == heads[-1][0]


def test_one_check_finds_an_edit_a_gap_and_an_unchained_line(tmp_path: Path) -> None:
    file = FileJournal(tmp_path / "j.jsonl")
    for event in EVENTS:
        file.append(None, event)
    lines = file.path.read_text().splitlines()
    edited = json.loads(lines[1])
    edited["request"]["epsilon"] = 9.0
    file.path.write_text("\n".join([lines[0], json.dumps(edited), *lines[2:]]) + "\n")
    assert chain_problems(file.links()) == ["event 2 was edited (its hash does not match it)"]
    file.path.write_text("\n".join([lines[0], *lines[2:]]) + "\n")
    assert chain_problems(file.links()) == ["events 2..2 are missing"]
    unchained = json.dumps({k: v for k, v in json.loads(lines[3]).items() if k != "chain"})
    file.path.write_text("\n".join([*lines[:3], unchained]) + "\n")
    assert chain_problems(file.links())[0].startswith("line 4 carries no hash")

    conn = _table()
    table = TableJournal()
    for event in EVENTS:
        table.append(conn, event)
    conn.execute("UPDATE ledger_events SET body = replace(body, '1.0', '9.0') WHERE seq = 2")
    assert chain_problems(table.links(conn)) == ["event 2 was edited (its hash does not "
                                                 "match it)"]


def test_the_head_this_host_saw_catches_the_newest_events_removed(tmp_path: Path) -> None:
    file, heads = FileJournal(tmp_path / "j.jsonl"), HeadFile(tmp_path / "ledger-head.json")
    for event in EVENTS:
        heads.remember("ledger", file.append(None, event))
    assert lost_head(heads, "ledger", file.links()) is None
    lines = file.path.read_text().splitlines()
    file.path.write_text("\n".join(lines[:2]) + "\n")  # a whole chain, two events shorter
    assert chain_problems(file.links()) == []
    assert lost_head(heads, "ledger", file.links()).seq == 4
    heads.forget("ledger")
    assert lost_head(heads, "ledger", file.links()) is None
