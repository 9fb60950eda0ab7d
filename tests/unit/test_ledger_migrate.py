"""``medrelease ledger migrate`` removes an older version's marks and never launders an
altered ledger: a ledger whose journal was deleted is not adopted again, a journal stripped
of its chain or rolled back is refused by the head this host saw, and a lost ledger beside an
older journal or cap journal is rebuilt by ``ledger restore`` with what they hold."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

from medrelease.privacy.ledger import Ledger, LedgerIntegrityError, SpendRequest
from medrelease.privacy.ledger_migrate import BEFORE_THE_CHAIN, migrate_sqlite


def _request(epsilon: float) -> SpendRequest:
    return SpendRequest(source="src", dataset="ds", mechanism="ipa", epsilon=epsilon,
                        delta=0.0, lifetime_epsilon=5.0, lifetime_delta=1e-6)


@pytest.fixture
def home(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path))
    return tmp_path


def _events(home: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "chain"} for line in
            (home / "ledger.sqlite.journal.jsonl").read_text().splitlines()]


def _as_an_older_version_wrote(home: Path, events: list[dict]) -> None:
    """Two lines before the chain, the rest chained from a hash of them (that version's)."""
    old = [json.dumps(e, sort_keys=True) for e in events[:2]]
    prev = hashlib.sha256((BEFORE_THE_CHAIN + "\n".join(old)).encode()).hexdigest()
    lines = list(old)
    for seq, event in enumerate(events[2:], start=3):
        digest = hashlib.sha256((prev + json.dumps(event, sort_keys=True)).encode()).hexdigest()
        lines.append(json.dumps({**event, "chain": {"seq": seq, "prev": prev, "hash": digest}},
                                sort_keys=True))
        prev = digest
    (home / "ledger.sqlite.journal.jsonl").write_text("\n".join(lines) + "\n")


def test_a_ledger_whose_journal_was_deleted_is_not_adopted_again(home: Path) -> None:
    """Deleted journal, edited spend: not an older version's ledger. With its version mark
    edited too, the head this host saw says it was journaled here: refused, nothing changed."""
    ledger = Ledger(home / "ledger.sqlite")
    ledger.reserve(_request(2.0))
    ledger.journal_path.unlink()
    with sqlite3.connect(home / "ledger.sqlite") as conn:
        conn.execute("UPDATE spends SET epsilon = 0.01")
    assert migrate_sqlite(home / "ledger.sqlite") == []
    with pytest.raises(LedgerIntegrityError, match=r"journal .* is missing"):
        Ledger(home / "ledger.sqlite").verify()
    with sqlite3.connect(home / "ledger.sqlite") as conn:
        conn.execute("PRAGMA user_version = 0")
    with pytest.raises(LedgerIntegrityError, match=r"this host saw its journal up to event 1"):
        migrate_sqlite(home / "ledger.sqlite")
    assert not ledger.journal_path.exists()
    assert (home / "ledger-head.json").read_text().count('"seq": 1') == 1


def test_a_migrate_cut_short_after_setting_the_head_runs_again(home: Path) -> None:
    """The head is set to the new chain's before the new journal is put in place: a run cut
    between the two finds the old journal and the new head, and goes on."""
    from medrelease.privacy.journal import HeadFile
    from medrelease.privacy.ledger_migrate import _new_chain

    ledger = Ledger(home / "ledger.sqlite")
    first = ledger.reserve(_request(2.0))
    ledger.mark(first, "released", release_id="r1")
    ledger.reserve(_request(1.0))
    events = _events(home)
    _as_an_older_version_wrote(home, events)
    HeadFile(home / "ledger-head.json").remember(str((home / "ledger.sqlite").resolve()),
                                                 _new_chain(events)[-1])
    [said] = migrate_sqlite(home / "ledger.sqlite")
    assert "3 event(s)" in said
    Ledger(home / "ledger.sqlite").verify()


@pytest.mark.parametrize("damage", ['{"x": [1, 2]}', '{"x": {"seq": "2", "hash": "h"}}',
                                    "\udcff not json"])
def test_a_damaged_head_file_is_refused_not_read_as_no_head(home: Path, damage: str) -> None:
    ledger = Ledger(home / "ledger.sqlite")
    ledger.reserve(_request(1.0))
    (home / "ledger-head.json").write_bytes(damage.encode("utf-8", "surrogateescape"))
    with pytest.raises(LedgerIntegrityError, match=r"head file .* is damaged"):
        ledger.reserve(_request(1.0))
    assert len(ledger.spends()) == 1  # refused before the charge


def test_a_damaged_cap_journal_is_refused_by_restore(home: Path) -> None:
    (home / "ledger.sqlite.caps.jsonl").write_text('{"source": "src"\n')
    with pytest.raises(LedgerIntegrityError, match=r"cap journal .* is damaged"):
        Ledger(home / "ledger.sqlite").restore([], [])


def test_a_journal_stripped_of_its_chain_is_refused_by_the_head(home: Path) -> None:
    """Every line's chain removed and a spend lowered in both files: it looks like a journal
    begun before the chain, but this host saw event 3, which it no longer holds."""
    ledger = Ledger(home / "ledger.sqlite")
    first = ledger.reserve(_request(2.0))
    ledger.mark(first, "released", release_id="r1")
    ledger.reserve(_request(1.0))
    events = _events(home)
    events[0]["request"]["epsilon"] = 0.25
    (home / "ledger.sqlite.journal.jsonl").write_text(
        "\n".join(json.dumps(e, sort_keys=True) for e in events) + "\n")
    with sqlite3.connect(home / "ledger.sqlite") as conn:
        conn.execute(f"UPDATE spends SET epsilon = 0.25 WHERE spend_id = '{first}'")
    with pytest.raises(LedgerIntegrityError, match="begun before the hash chain"):
        Ledger(home / "ledger.sqlite")
    with pytest.raises(LedgerIntegrityError, match="no longer holds event 3 as this host saw"):
        migrate_sqlite(home / "ledger.sqlite")
    assert "chain" not in (home / "ledger.sqlite.journal.jsonl").read_text()  # untouched


def test_a_lost_ledger_beside_an_older_journal_is_restored_after_migrate(home: Path) -> None:
    ledger = Ledger(home / "ledger.sqlite")
    first = ledger.reserve(_request(2.0))
    ledger.mark(first, "released", release_id="r1")
    ledger.set_cap("src", 4.0, 1e-6, "lowered by the board")
    _as_an_older_version_wrote(home, _events(home))
    (home / "ledger-head.json").unlink()
    (home / "ledger.sqlite").unlink()
    with pytest.raises(LedgerIntegrityError, match="begun before the hash chain"):
        Ledger(home / "ledger.sqlite")
    assert not (home / "ledger.sqlite").exists()  # the refused open left no empty ledger
    [said] = migrate_sqlite(home / "ledger.sqlite")
    assert "chained the journal's 3 event(s)" in said
    restored = Ledger(home / "ledger.sqlite").restore([], [])
    assert restored.from_journal == 1
    book = Ledger(home / "ledger.sqlite")
    book.verify()
    assert book.state("src").lifetime_epsilon == 4.0
    assert [(s.epsilon, s.status) for s in book.spends()] == [(2.0, "released")]


def test_a_lost_ledgers_cap_journal_is_applied_by_restore(home: Path) -> None:
    """A version before the full journal kept cap changes apart; a ledger of that version,
    lost, is rebuilt from the records with the cap its steward lowered, not the record's."""
    caps = home / "ledger.sqlite.caps.jsonl"
    caps.write_text(json.dumps({"source": "src", "old_epsilon": 5.0, "new_epsilon": 1.0,
                                "old_delta": 1e-6, "new_delta": 1e-6,
                                "reason": "lowered after an incident",
                                "changed_at": "2025-01-01T00:00:00+00:00"}) + "\n")
    record = {"release_id": "r1", "dataset": "ds", "ledger_spend_id": "s1",
              "status": "published", "requested_at": "2024-12-01T00:00:00+00:00",
              "ledger_charge": {"source": "src", "mechanism": "ipa", "epsilon": 0.5,
                                "delta": 0.0, "dp": True, "cap_epsilon": 5.0,
                                "cap_delta": 1e-6}}
    ledger = Ledger(home / "ledger.sqlite")  # (a cap journal beside a lost ledger: no mark)
    ledger.restore([record], [])
    assert ledger.state("src").lifetime_epsilon == 1.0
    assert not caps.exists() and caps.with_name(caps.name + ".migrated").is_file()
    Ledger(home / "ledger.sqlite").verify()
