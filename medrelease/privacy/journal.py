"""The ledger's system of record: one event journal, hash-chained, with the head each host saw.

Every change to a budget ledger — a reservation with its whole request, its outcome, a cap
change, an adopted snapshot — is an *event*, appended to the journal before the change commits
(the caller holds the ledger's write lock, so the chain has one writer). Event ``n`` carries
``hash = sha256(prev + text)``, where ``prev`` is event ``n - 1``'s hash (the genesis, 64
zeros, for the first) and ``text`` the event as sorted JSON. The newest event a host saw is kept
apart in ``ledger-head.json`` (``HeadFile``), so that removing the newest events, or replacing
the journal by an older copy, is caught even when the tables agree with it.

``EventJournal`` is the interface both back-ends implement, differing only in storage:
``FileJournal`` (a JSON-lines file beside a SQLite ledger, fsynced per event) and
``TableJournal`` (rows of ``ledger_events`` in the PostgreSQL schema). Reading, checking the
chain (``chain_problems``) and the head are the same code for both; replaying the events into
the ledger's state, and comparing it with the tables, is the ledger's (``BudgetLedger``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from medrelease.errors import MedreleaseError

GENESIS_HASH = "0" * 64
HEAD_FILE = "ledger-head.json"


class LedgerIntegrityError(MedreleaseError):
    """The ledger differs from its journal, or lacks spends that releases on record made (a
    table dropped or edited, rows deleted, the file or its journal lost or replaced)."""


class JournalDamaged(LedgerIntegrityError):
    """A journal or head file that cannot be read at all (a line that is not JSON)."""


RESTORE_FROM_BACKUP = "restore it from backup. Nothing was spent."


@dataclass(frozen=True)
class JournalHead:
    """An event as the chain names it: its number (1 = the first event) and its hash."""

    seq: int
    hash: str


@dataclass(frozen=True)
class Link:
    """One stored event with its place in the chain, as the storage holds them."""

    seq: int | None   # None: stored without a chain (added by hand, or by a pre-chain version)
    prev: str
    hash: str
    text: str         # what the hash covers: the event as sorted JSON
    event: dict
    where: str        # how a message names it: "line 12", "event 12"


def is_chain(chain: Any) -> bool:
    """Whether a stored line carries a chain (an object with an integer ``seq``)."""
    return isinstance(chain, dict) and type(chain.get("seq")) is int


def event_text(event: dict) -> str:
    """An event as its hash covers it: sorted JSON, without a stored chain."""
    return json.dumps({k: v for k, v in event.items() if k != "chain"}, sort_keys=True)


def chain_hash(prev: str, text: str) -> str:
    return hashlib.sha256((prev + text).encode("utf-8")).hexdigest()


def chain_problems(links: list[Link]) -> list[str]:
    """Where the chain breaks: an event without its hash, events missing or added, an event
    that does not follow the one before, an event edited (its hash no longer matches it)."""
    problems: list[str] = []
    prev, expected = GENESIS_HASH, 1
    for link in links:
        if link.seq is None:
            problems.append(f"{link.where} carries no hash " + (
                "(added after the chain began)" if expected > 1 else
                "(written by a version before the chain: 'medrelease ledger migrate')"))
            continue
        if link.seq != expected:
            problems.append(f"events {expected}..{link.seq - 1} are missing"
                            if link.seq > expected else
                            f"event {link.seq} follows event {expected - 1} (events added)")
        elif link.prev != prev:
            problems.append(f"event {link.seq} does not follow event {link.seq - 1}")
        if chain_hash(link.prev, link.text) != link.hash:
            problems.append(f"event {link.seq} was edited (its hash does not match it)")
        prev, expected = link.hash, link.seq + 1
    return problems


def next_link(last: JournalHead | None, event: dict) -> tuple[JournalHead, str, str]:
    """(the new event's head, the hash it follows, its text)."""
    seq, prev = (last.seq + 1, last.hash) if last else (1, GENESIS_HASH)
    text = event_text(event)
    return JournalHead(seq, chain_hash(prev, text)), prev, text


class EventJournal(Protocol):
    """Where a ledger's events are kept. ``append`` runs inside the ledger's write
    transaction, before it commits; ``links`` reads every stored event in order."""

    where: str  # how messages name the journal

    def links(self, conn: Any) -> list[Link]: ...

    def append(self, conn: Any, event: dict) -> JournalHead: ...

    def exists(self, conn: Any) -> bool: ...


@dataclass(frozen=True)
class FileJournal:
    """A SQLite ledger's journal: one JSON line per event (``chain: {seq, prev, hash}`` inside
    it), appended and fsynced before the ledger commits."""

    path: Path

    @property
    def where(self) -> str:
        return f"journal {self.path}"

    def exists(self, conn: Any = None) -> bool:
        return self.path.is_file()

    def links(self, conn: Any = None) -> list[Link]:
        if not self.path.is_file():
            return []
        try:
            text = self.path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise JournalDamaged(f"the ledger journal {self.path} is damaged (not UTF-8 text); "
                                 f"{RESTORE_FROM_BACKUP}") from None
        out = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                stored = json.loads(line)
            except json.JSONDecodeError:
                stored = None
            if not isinstance(stored, dict):
                raise JournalDamaged(f"the ledger journal {self.path} is damaged at line "
                                     f"{number}; {RESTORE_FROM_BACKUP}")
            chain = stored.get("chain")
            event = {k: v for k, v in stored.items() if k != "chain"}
            if not is_chain(chain):
                out.append(Link(None, "", "", event_text(event), event, f"line {number}"))
                continue
            out.append(Link(chain["seq"], str(chain.get("prev")), str(chain.get("hash")),
                            event_text(event), event, f"line {number}"))
        return out

    def last(self) -> JournalHead | None:
        """The newest event's head, read from the file's end (a journal grows for years)."""
        if not self.path.is_file():
            return None
        with self.path.open("rb") as handle:
            end = handle.seek(0, os.SEEK_END)
            tail, start = b"", end
            while start > 0 and tail.strip().count(b"\n") < 1:
                start = max(0, start - (1 << 16))
                handle.seek(start)
                tail = handle.read(end - start)
        lines = [line for line in tail.decode("utf-8", "replace").splitlines() if line.strip()]
        if not lines:
            return None
        try:
            chain = json.loads(lines[-1]).get("chain")
        except (json.JSONDecodeError, AttributeError):
            chain = None
        if not (isinstance(chain, dict) and isinstance(chain.get("seq"), int)):
            raise JournalDamaged(f"the last line of the ledger journal {self.path} is damaged "
                                 f"or carries no hash (a write cut short, or an edit); "
                                 f"{RESTORE_FROM_BACKUP}")
        return JournalHead(chain["seq"], str(chain.get("hash")))

    def append(self, conn: Any, event: dict) -> JournalHead:
        head, prev, _ = next_link(self.last(), event)
        line = json.dumps({**event, "chain": {"seq": head.seq, "prev": prev,
                                              "hash": head.hash}}, sort_keys=True)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        return head

    def write(self, events: list[dict]) -> JournalHead | None:
        """A new journal of ``events``, chained from the genesis (``ledger migrate``)."""
        fresh = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        head = None
        with fresh.open("w", encoding="utf-8") as handle:
            for event in events:
                head, prev, _ = next_link(head, event)
                handle.write(json.dumps({**event, "chain": {"seq": head.seq, "prev": prev,
                                                            "hash": head.hash}},
                                        sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        fresh.replace(self.path)
        return head


@dataclass(frozen=True)
class TableJournal:
    """A PostgreSQL ledger's journal: rows of ``ledger_events`` (seq, at, kind, body,
    prev_hash, hash), inserted in the write transaction."""

    where: str = "journal (table ledger_events)"

    def exists(self, conn: Any = None) -> bool:
        return True

    def links(self, conn: Any) -> list[Link]:
        rows = conn.execute("SELECT seq, body, prev_hash, hash FROM ledger_events "
                            "ORDER BY seq").fetchall()
        return [Link(seq, prev, digest, body, _parsed(body), f"event {seq}")
                for seq, body, prev, digest in rows]

    def last(self, conn: Any) -> JournalHead | None:
        row = conn.execute("SELECT seq, hash FROM ledger_events ORDER BY seq DESC "
                           "LIMIT 1").fetchone()
        return JournalHead(row[0], row[1]) if row else None

    def append(self, conn: Any, event: dict) -> JournalHead:
        head, prev, text = next_link(self.last(conn), event)
        conn.execute("INSERT INTO ledger_events (seq, at, kind, body, prev_hash, hash) VALUES "
                     "(?, ?, ?, ?, ?, ?)", (head.seq, event["at"], event["event"], text, prev,
                                            head.hash))
        return head


def _parsed(body: str) -> dict:
    """A stored event (not JSON: ``{}``, and its hash no longer matches it: "edited")."""
    try:
        event = json.loads(body)
    except json.JSONDecodeError:
        return {}
    return event if isinstance(event, dict) else {}


@dataclass(frozen=True)
class HeadFile:
    """The newest event each ledger's journal showed this host (a JSON object by ledger)."""

    path: Path

    def read(self) -> dict[str, dict]:
        """Every ledger's head; a file or an entry that is not one (an object of an integer
        ``seq`` and a text ``hash``) is refused, never read as "no head"."""
        if not self.path.is_file():
            return {}
        try:
            heads = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # (JSON and UTF-8 errors are ValueErrors)
            heads = None
        if not isinstance(heads, dict) or not all(
                isinstance(h, dict) and type(h.get("seq")) is int and isinstance(h.get("hash"), str)
                for h in heads.values()):
            raise JournalDamaged(f"the ledger head file {self.path} is damaged; "
                                 f"{RESTORE_FROM_BACKUP}")
        return heads

    def get(self, key: str) -> JournalHead | None:
        head = self.read().get(key)
        return JournalHead(head["seq"], head["hash"]) if head is not None else None

    def remember(self, key: str, head: JournalHead) -> None:
        with self._locked():
            heads = self.read()
            if heads.get(key, {}).get("seq", 0) > head.seq:
                return  # another process of this host saw a newer event already
            heads[key] = {"seq": head.seq, "hash": head.hash}
            self._write(heads)

    def forget(self, key: str) -> None:
        with self._locked():
            heads = self.read()
            if heads.pop(key, None) is not None:
                self._write(heads)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """One read-modify-write at a time on this host (the file holds every ledger's head:
        two writers from stale reads would lose one's update)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(f".{self.path.name}.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _write(self, heads: dict) -> None:
        fresh = self.path.with_name(f".{self.path.name}.{os.getpid()}.{uuid.uuid4().hex[:6]}")
        try:
            fresh.write_text(json.dumps(heads, sort_keys=True, indent=1), encoding="utf-8")
            fresh.replace(self.path)
        finally:
            fresh.unlink(missing_ok=True)


def lost_head(heads: HeadFile, key: str, links: list[Link]) -> JournalHead | None:
    """The head this host saw, when the journal no longer holds it as it was."""
    head = heads.get(key)
    if head is None:
        return None
    held = {link.seq: link.hash for link in links}
    return None if held.get(head.seq) == head.hash else head
