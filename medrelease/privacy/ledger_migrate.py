"""``medrelease ledger migrate``: a SQLite ledger an older version wrote, brought to this one once.

Older versions left marks this version no longer reads at every open; the ledger refuses a file
that carries one (``older_version``, from the file's own marks, before anything is spent) and
this migration removes it, checking first that nothing was altered:

- **columns added after the first schema** (a spend's source, TEST and DP flags and privacy
  unit; a source's policy and owner config): added (a spend's source is its dataset's);
- **a ledger written before the journal** (``user_version`` 0, rows, no journal): its rows,
  checked against the caps its cap journal last recorded, become the journal's first event (an
  ``adopt`` snapshot, replayed like any event);
- **a journal written before the hash chain** (leading lines without one; a later version
  anchored its first chained line to a hash of them): the anchor and the chain checked, the
  events replayed and compared with the ledger, then the journal written again, chained from
  its first event (the old file kept beside it, ``.pre-chain-<time>``);
- **the cap journal of a version before the full journal** (``.caps.jsonl``): read when that
  version's ledger is adopted (its last caps must be the ledger's), then moved aside
  (``.caps.jsonl.migrated``).

Nothing is done to a ledger that carries none of the marks (a migrated one, or one whose
journal was deleted: that is refused by the ledger's check, never adopted again). The head this
host saw is checked before a journal is chained anew, then reset. A ledger lost beside a
journal begun before the chain has the journal chained, so that ``ledger restore`` replays it;
a cap journal beside a lost ledger is applied by ``restore`` itself.
"""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from medrelease.errors import MedreleaseError
from medrelease.privacy.journal import FileJournal, HeadFile, JournalHead, chain_hash, next_link
from medrelease.privacy.ledger import (
    INDEX,
    JOURNAL_VERSION,
    SCHEMA,
    Ledger,
    LedgerIntegrityError,
    LedgerLockedError,
    _differences,
    _holds_rows,
    _listed,
    _now,
    _replayed,
    _snapshot,
    sqlite_heads,
)
from medrelease.privacy.ledger_marks import (
    SOURCE_COLUMNS,
    SPEND_COLUMNS,
    caps_journal_for,
    chained,
    missing_columns,
    older_version,
    raw_lines,
)

# What the first chained line of a journal begun before the chain followed: a hash of every
# line written before it.
BEFORE_THE_CHAIN = "medrelease journal lines written before the chain\n"


@dataclass(frozen=True)
class Rechain:
    """A pre-chain journal, checked: its events, the new chain's last head, and the old text
    (kept beside it)."""

    events: list[dict]
    head: JournalHead | None
    old_text: str


def migrate_sqlite(path: str | Path) -> list[str]:
    """Migrate the SQLite ledger at ``path`` in place; what was done, in sentences (none: it
    carries no older version's mark). A ledger file that is gone, beside a journal begun
    before the chain, has that journal chained (checked the same way) so that ``ledger
    restore`` can replay it. Refuses (``LedgerIntegrityError``) a journal whose chain or
    anchor is broken, that no longer holds the newest event this host saw, or whose replay
    differs from the ledger's tables, and a ledger this host saw journaled that claims to be
    older; nothing is changed then.

    Order, so that a run cut short at any point can run again: the ledger's transaction
    (columns; an adopted ledger's source rows) commits first, with its version mark left for
    last; then this host's head is set to the new chain's (which a re-run accepts as well as the
    old one's), the old journal copied aside, and the new journal put in place by one rename."""
    path = Path(path)
    journal = FileJournal(Ledger.journal_path_for(path))
    heads, key = sqlite_heads(path)
    try:
        if not path.is_file():
            lines = raw_lines(journal.path)
            if not (lines and not chained(lines[0])):
                raise MedreleaseError(
                    f"there is no SQLite ledger at {path} to migrate" + (
                        " (the cap journal beside it is read by 'medrelease ledger restore')"
                        if caps_journal_for(path).is_file() else ""))
            return _put_in_place(journal, _checked_rechain(None, journal, lines, heads, key),
                                 heads, key)
        return _migrate_file(path, journal, heads, key)
    except sqlite3.OperationalError as exc:
        raise LedgerLockedError(f"the budget ledger {path} could not be migrated: {exc} (a "
                                "release in progress?); run it again") from None
    except (sqlite3.DatabaseError, OSError) as exc:
        raise LedgerIntegrityError(f"the budget ledger {path} or its journal could not be "
                                   f"migrated ({type(exc).__name__}: {exc}); restore them from "
                                   "backup, or run it again") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LedgerIntegrityError(
            f"the ledger journal or cap journal beside {path} is damaged "
            f"({type(exc).__name__}); nothing was migrated. Restore it from backup.") from None


def _migrate_file(path: Path, journal: FileJournal, heads: HeadFile, key: str) -> list[str]:
    done: list[str] = []
    rechain = adopted = None
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:
        if not older_version(conn, path, journal.path, JOURNAL_VERSION):
            return []
        missing = missing_columns(conn)
        unjournaled = (conn.execute("PRAGMA user_version").fetchone()[0] < JOURNAL_VERSION
                       and not journal.path.is_file())
        if unjournaled and heads.get(key) is not None:
            raise LedgerIntegrityError(
                f"the budget ledger {path} says it was written before the journal, but this "
                f"host saw its journal up to event {heads.get(key).seq} ({heads.path}): its "
                "journal was deleted and its version mark edited. Nothing was migrated. Put "
                "the journal back from backup; without one, move the ledger aside and run "
                "'medrelease ledger restore'.")
        conn.executescript(SCHEMA)  # tables an older version did not have yet
        conn.execute("BEGIN IMMEDIATE")
        try:
            done += _add_columns(conn, missing)
            conn.execute(INDEX)
            lines = raw_lines(journal.path)
            if lines and not chained(lines[0]):
                rechain = _checked_rechain(conn, journal, lines, heads, key)
            elif unjournaled and _holds_rows(conn):
                adopted = _adopted(conn, path)
            else:
                conn.execute(f"PRAGMA user_version = {JOURNAL_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        if rechain is not None:
            done += _put_in_place(journal, rechain, heads, key)
            conn.execute(f"PRAGMA user_version = {JOURNAL_VERSION}")
        elif adopted is not None:
            journal.write([adopted])  # (a cut before this: still unjournaled, run it again)
            conn.execute(f"PRAGMA user_version = {JOURNAL_VERSION}")
            spends = len(adopted["tables"].get("spends", []))
            done.append(f"journaled the ledger's {spends} spend(s) as its first event (it was "
                        "written before the journal)")
    finally:
        conn.close()
    caps = caps_journal_for(path)
    if caps.is_file():
        caps.replace(caps.with_name(caps.name + ".migrated"))
        done.append(f"the cap journal was moved aside to {caps.name}.migrated")
    return done


def _add_columns(conn: sqlite3.Connection, missing: list[str]) -> list[str]:
    for entry in missing:
        table, column = entry.split(".")
        kind = (SPEND_COLUMNS if table == "spends" else SOURCE_COLUMNS)[column]
        conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
    if "spends.source" in missing:
        conn.execute("UPDATE spends SET source = dataset WHERE source IS NULL")
    return [f"added the column(s) {', '.join(missing)}"] if missing else []


def _adopted(conn: sqlite3.Connection, path: Path) -> dict:
    """A ledger written before the journal: a source row per source, the caps checked against
    the cap journal; its every row, the journal's first event (written after the commit)."""
    conn.execute("UPDATE spends SET source = dataset WHERE source IS NULL")
    conn.execute("INSERT OR IGNORE INTO sources (source, lifetime_epsilon, lifetime_delta, "
                 "created_at) SELECT source, lifetime_epsilon, lifetime_delta, "
                 "MIN(created_at) FROM spends GROUP BY source")
    _refuse_caps_unlike_caps_journal(conn, path)  # (a later version's caps are its journal's)
    return {"event": "adopt", "at": _now(), "tables": _snapshot(conn)}


def _new_chain(events: list[dict]) -> list[JournalHead]:
    """The heads the chain from the first event gives (deterministic: a re-run finds them)."""
    heads, last = [], None
    for event in events:
        last, _, _ = next_link(last, event)
        heads.append(last)
    return heads


def _checked_rechain(conn: sqlite3.Connection | None, journal: FileJournal, lines: list[str],
                     heads: HeadFile, key: str) -> Rechain:
    """A journal begun before the chain: its anchor and chain as the version that wrote them
    checked them; the newest event this host saw still in it (by the old chain's hash, or by
    the new chain's when a run was cut short after setting it); its replay equal to the
    ledger (``conn`` None: the ledger is gone, ``ledger restore`` replays it next)."""
    before = 0
    while before < len(lines) and not chained(lines[before]):
        before += 1
    prev = hashlib.sha256((BEFORE_THE_CHAIN + "\n".join(lines[:before])).encode("utf-8")
                          ).hexdigest()
    events, problems, hashes = [], [], {}
    for number, line in enumerate(lines, start=1):
        stored = json.loads(line)
        event = {k: v for k, v in stored.items() if k != "chain"}
        events.append(event)
        if number <= before:
            continue
        chain = stored.get("chain") or {}
        if chain.get("seq") != number or chain.get("prev") != prev or chain_hash(
                str(chain.get("prev")), json.dumps(event, sort_keys=True)) != chain.get("hash"):
            problems.append(f"event {number} does not follow "
                            + ("the lines written before the chain (one of them was edited, "
                               "added or removed)" if number == before + 1 else
                               f"event {number - 1}, or was edited"))
        prev = hashes[number] = str(chain.get("hash"))
    if problems:
        raise LedgerIntegrityError(
            f"the ledger journal {journal.path} was altered: {_listed(problems)}. Nothing was "
            "migrated. Restore the ledger and its journal from backup.")
    fresh = _new_chain(events)
    seen = heads.get(key)
    if seen is not None and hashes.get(seen.seq) != seen.hash and not (
            0 < seen.seq <= len(fresh) and fresh[seen.seq - 1].hash == seen.hash):
        raise LedgerIntegrityError(
            f"the ledger journal {journal.path} no longer holds event {seen.seq} as this host "
            f"saw it ({heads.path}): the newest changes were removed, or the ledger and its "
            "journal were replaced by an older copy. Nothing was migrated. Restore both from "
            "backup.")
    if conn is not None:
        expected = _replayed(events, str(journal.path))
        try:
            differences = _differences(conn, expected)
        finally:
            expected.close()
        if differences:
            raise LedgerIntegrityError(
                f"the budget ledger does not match its {journal.where} "
                f"({_listed(differences)}). Nothing was migrated. Restore both from backup.")
    return Rechain(events, fresh[-1] if fresh else None,
                   journal.path.read_text(encoding="utf-8"))


def _put_in_place(journal: FileJournal, rechain: Rechain, heads: HeadFile,
                  key: str) -> list[str]:
    """This host's head set to the new chain's first, the old journal kept beside, then the
    new journal in one rename."""
    if rechain.head is not None:
        heads.remember(key, rechain.head)
    kept = journal.path.with_name(f"{journal.path.name}.pre-chain-{_now()[:19].replace(':', '')}")
    kept.write_text(rechain.old_text, encoding="utf-8")
    journal.write(rechain.events)
    return [f"chained the journal's {len(rechain.events)} event(s) from the first (the journal "
            f"as it was is kept in {kept.name})"]


def _refuse_caps_unlike_caps_journal(conn: sqlite3.Connection, path: Path) -> None:
    """An older ledger is adopted only if its caps are those its cap journal last recorded."""
    last: dict[str, dict] = {}
    for line in raw_lines(caps_journal_for(path)):
        change = json.loads(line)
        last[change["source"]] = change
    for source, change in last.items():
        have = conn.execute("SELECT lifetime_epsilon, lifetime_delta FROM sources WHERE "
                            "source = ?", (source,)).fetchone()
        if have is None or not (math.isclose(have[0], change["new_epsilon"]) and math.isclose(
                have[1], change["new_delta"], abs_tol=1e-18)):
            raise LedgerIntegrityError(
                f"source {source!r}: the ledger's cap "
                f"{'is missing' if have is None else f'is epsilon {have[0]:g}'} but its cap "
                f"journal says epsilon {change['new_epsilon']:g} (changed "
                f"{change['changed_at'][:10]}: {change['reason']}). The ledger was altered; "
                "nothing was migrated. Restore it from backup.")
