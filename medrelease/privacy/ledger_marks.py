"""The marks an older version left on a SQLite ledger (what ``medrelease ledger migrate``
removes, ``ledger_migrate.py``): read by the ledger at every open, cheaply, to refuse such a file
with the command that migrates it. No rule of the ledger is here, and nothing is changed.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from medrelease.privacy.journal import JournalDamaged, is_chain

# Columns added after the first schema (a ledger this version creates has them from the start).
SPEND_COLUMNS = {"source": "TEXT", "test": "INTEGER NOT NULL DEFAULT 0",
                 "dp": "INTEGER NOT NULL DEFAULT 1", "privacy_unit": "TEXT"}
SOURCE_COLUMNS = {"policy": "TEXT", "owner_config": "TEXT"}


def caps_journal_for(ledger_path: Path) -> Path:
    """Where versions before the full journal kept cap changes only."""
    return ledger_path.with_name(ledger_path.name + ".caps.jsonl")


def missing_columns(conn: sqlite3.Connection) -> list[str]:
    missing = []
    for table, wanted in (("spends", SPEND_COLUMNS), ("sources", SOURCE_COLUMNS)):
        have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        if have:  # (a table that is not there yet is created with every column)
            missing += [f"{table}.{c}" for c in wanted if c not in have]
    return missing


def raw_lines(journal: Path) -> list[str]:
    if not journal.is_file():
        return []
    return [line for line in journal.read_text(encoding="utf-8").splitlines() if line.strip()]


def chained(line: str) -> bool:
    """Whether a journal line carries a chain (the journal check's own test)."""
    try:
        stored = json.loads(line)
    except ValueError:
        return True  # (a damaged line is the journal check's to name)
    return not isinstance(stored, dict) or is_chain(stored.get("chain"))


def older_version(conn: sqlite3.Connection | None, path: Path, journal: Path,
                  journal_version: int) -> str | None:
    """What marks the ledger at ``path`` as an older version's, in words (None: none). Cheap:
    the schema's columns, ``user_version``, the journal's first line, the cap journal beside a
    ledger that holds spends (beside a lost or new one, ``ledger restore`` reads it). ``conn``
    None: the file is not there yet (only the journal can carry a mark)."""
    found = []
    holds = False
    if conn is not None:
        missing = missing_columns(conn)
        if missing:
            found.append(f"its tables lack {', '.join(missing)}")
        holds = bool(conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name "
                                  "= 'spends'").fetchone()
                     and conn.execute("SELECT 1 FROM spends LIMIT 1").fetchone())
        if (holds and conn.execute("PRAGMA user_version").fetchone()[0] < journal_version
                and not journal.is_file()):
            found.append("it holds spends but was written before the journal")
    if journal.is_file():
        with journal.open(encoding="utf-8", errors="replace") as handle:
            first = next((line for line in handle if line.strip()), "")
        if first and not chained(first):
            found.append(f"its journal {journal} was begun before the hash chain")
    if holds and caps_journal_for(path).is_file():
        found.append(f"a cap journal {caps_journal_for(path)} of a version before the full "
                     "journal lies beside it")
    return "; ".join(found) or None


CAP_FIELDS = ("source", "old_epsilon", "new_epsilon", "old_delta", "new_delta", "reason",
              "changed_at")


def legacy_cap_events(path: Path) -> list[dict]:
    """The cap changes an older version journaled apart, as the journal's cap events (for a
    restore into a lost ledger whose journal held nothing); a damaged cap journal is refused."""
    caps = caps_journal_for(path)
    events = []
    try:
        for number, line in enumerate(raw_lines(caps), start=1):
            change = json.loads(line)
            if not isinstance(change, dict) or not all(f in change for f in CAP_FIELDS):
                raise ValueError(f"line {number}")
            events.append({**change, "event": "cap", "at": change["changed_at"]})
    except ValueError as exc:
        raise JournalDamaged(f"the cap journal {caps} is damaged ({exc}); restore it from "
                             "backup. Nothing was restored.") from None
    return events
