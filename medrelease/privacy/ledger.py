"""The privacy-budget ledger: one row per spend, per data *source*, in an embedded SQLite file.

Releases of one data source compose, whichever dataset config made them, so every spend is
recorded against its source's lifetime budget (``privacy.source`` in the config; configs that
read the same extract must name the same source — the ledger refuses a second id for an input
it already knows). The lifetime cap is fixed in the ledger at the source's first spend; editing
the YAML later does not change it, only ``set_cap`` does, with a recorded reason.

A spend is *reserved* before any noise is drawn, then marked *released* or *failed*; all three
count, because once a run may have drawn noise its budget is gone (a crashed run's reservation
stays counted). TEST spends (fixed-seed runs) count too and are marked as such. A spend whose
mechanism makes no proven DP claim voids the source's lifetime guarantee for good: later
manifests say so. The check-and-reserve happens inside one ``BEGIN IMMEDIATE`` transaction,
which SQLite serializes across processes, so two runs started at once can never overspend.

The system of record is the append-only *journal* beside the ledger
(``ledger.sqlite.journal.jsonl``): every change — a reservation with its whole request (source,
cap, content hashes, input, policy, owner config, privacy unit), its outcome, a cap change — is
appended and fsynced there *before* its SQLite transaction commits. The SQLite file is an index
of the journal: every charge (and ``medrelease ledger verify``) replays the journal and refuses
a ledger that differs from it (``LedgerIntegrityError``: a table dropped or edited, a failed
spend deleted, a cap changed outside ``set-cap``, the journal removed).

The journal is a hash chain, as the PostgreSQL ledger's is (issue 56, hole 8): each line carries
``chain: {seq, prev, hash}``, its hash taken over the line before's and its own event, and the
newest line this host wrote is kept apart (``ledger-head.json`` in the data home). So the same
edit made to the ledger and to its journal is caught: an edited line no longer matches its
hash, a chain recomputed after it no longer holds the head, and the newest lines removed with
their rows leave the head behind. The journal is one interface for both back-ends
(``journal.EventJournal``: append, read, the chain and its head), SQLite's ``FileJournal`` and
PostgreSQL's ``TableJournal`` differing only in storage; the replay into the ledger's state and
its comparison with the tables are here (``BudgetLedger``). A ledger or journal written by an
older version is refused until ``medrelease ledger migrate`` (``ledger_migrate.py``).

``verify`` also holds every release on record to its charge: the spend named by a steward
record, or charged for a published manifest, must say what they say (source, mechanism,
epsilon, delta, DP, TEST), so a spend edited in both files is caught by the releases that
state it. ``restore`` rebuilds the
ledger by replaying the journal, then adds the releases that steward records or published
manifests show and the journal lacks (journaling them too).

That is the SQLite back-end (``Ledger``), the default. ``MEDRELEASE_LEDGER_URL`` selects the
PostgreSQL one (``ledger_pg.PostgresLedger``: one ledger for several hosts, append-only for the
service); both run the rules here (``BudgetLedger``), and ``ledger_backends.open_ledger`` opens either.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from medrelease.errors import BudgetExceededError, ConfigError, MedreleaseError, PolicyError
from medrelease.privacy.journal import (
    HEAD_FILE,
    EventJournal,
    FileJournal,
    HeadFile,
    JournalDamaged,
    JournalHead,
    LedgerIntegrityError,
    Link,
    chain_problems,
    lost_head,
)
from medrelease.privacy.ledger_marks import caps_journal_for, legacy_cap_events, older_version

STATUSES = ("reserved", "released", "failed")
TOLERANCE = 1e-9

SCHEMA = """
CREATE TABLE IF NOT EXISTS spends (
    spend_id     TEXT PRIMARY KEY,
    dataset      TEXT NOT NULL,
    mechanism    TEXT NOT NULL,
    epsilon      REAL NOT NULL CHECK (epsilon >= 0),
    delta        REAL NOT NULL CHECK (delta >= 0),
    lifetime_epsilon REAL NOT NULL,
    lifetime_delta   REAL NOT NULL,
    flow_run_id  TEXT,
    status       TEXT NOT NULL CHECK (status IN ('reserved', 'released', 'failed')),
    release_id   TEXT,
    note         TEXT,
    created_at   TEXT NOT NULL,
    updated_at   TEXT NOT NULL,
    source       TEXT,
    test         INTEGER NOT NULL DEFAULT 0,
    dp           INTEGER NOT NULL DEFAULT 1,
    privacy_unit TEXT
);
CREATE TABLE IF NOT EXISTS sources (
    source           TEXT PRIMARY KEY,
    lifetime_epsilon REAL NOT NULL,
    lifetime_delta   REAL NOT NULL,
    created_at       TEXT NOT NULL,
    void_spend       TEXT,
    void_reason      TEXT,
    policy           TEXT,
    owner_config     TEXT
);
CREATE TABLE IF NOT EXISTS source_inputs (
    input_key  TEXT PRIMARY KEY,
    source     TEXT NOT NULL,
    dataset    TEXT NOT NULL,
    first_seen TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS content_claims (
    sha256     TEXT PRIMARY KEY,
    source     TEXT NOT NULL,
    dataset    TEXT NOT NULL,
    first_seen TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS cap_changes (
    change_id   INTEGER PRIMARY KEY AUTOINCREMENT,
    source      TEXT NOT NULL,
    old_epsilon REAL NOT NULL,
    new_epsilon REAL NOT NULL,
    old_delta   REAL NOT NULL,
    new_delta   REAL NOT NULL,
    reason      TEXT NOT NULL,
    changed_at  TEXT NOT NULL
);
"""
INDEX = "CREATE INDEX IF NOT EXISTS spends_source ON spends (source)"
# The product's bounds on a lifetime cap (a cap of 1e300 is no cap).
MAX_CAP_EPSILON = 100.0
MAX_CAP_DELTA = 1e-2
MIN_REASON_CHARS = 10
SPEND_FIELDS = ("spend_id", "dataset", "mechanism", "epsilon", "delta", "lifetime_epsilon",
                "lifetime_delta", "flow_run_id", "status", "release_id", "note", "created_at",
                "updated_at", "source", "test", "dp", "privacy_unit")
# What a reservation fixes (an append-only ledger appends status, release and note later).
RESERVATION_FIELDS = tuple(f for f in SPEND_FIELDS
                           if f not in ("status", "release_id", "note", "updated_at"))
# PRAGMA user_version of a ledger whose every change is in its journal (0 with rows: a ledger
# written before the journal, refused until ``medrelease ledger migrate``).
JOURNAL_VERSION = 1


class LedgerSourceError(MedreleaseError):
    """A config names a different source id for an extract the ledger already knows."""


class LedgerLockedError(MedreleaseError):
    """Another process held the ledger longer than the bounded wait; nothing was spent."""


@dataclass(frozen=True)
class Spend:
    spend_id: str
    dataset: str
    mechanism: str
    epsilon: float
    delta: float
    lifetime_epsilon: float
    lifetime_delta: float
    flow_run_id: str | None
    status: str
    release_id: str | None
    note: str | None
    created_at: str
    updated_at: str
    source: str
    test: bool
    dp: bool
    privacy_unit: str | None = None  # the guarantee's neighbouring relation (None: older spend)

    @classmethod
    def from_columns(cls, row: Mapping[str, Any]) -> Spend:
        """A spend from its ledger row by column name (``SPEND_FIELDS``); the flags stored as
        integers (SQLite) or booleans come back as booleans."""
        return cls(**{**{name: row[name] for name in SPEND_FIELDS},
                      "test": bool(row["test"]), "dp": bool(row["dp"])})

    @property
    def status_text(self) -> str:
        """The status as stewards read it: 'released (test) (no DP)'."""
        return self.status + (" (test)" if self.test else "") + ("" if self.dp else " (no DP)")


class CapChange(NamedTuple):
    """One recorded change of a source's lifetime cap (``set-cap``), oldest first. A named
    tuple: older callers index it (``change[1:3]`` is the old and new epsilon)."""

    source: str
    old_epsilon: float
    new_epsilon: float
    old_delta: float
    new_delta: float
    reason: str
    changed_at: str

    def public(self) -> dict:
        """As a manifest states it: the day, both caps and the reason (no clock time)."""
        return {"changed_on": self.changed_at[:10], "old_epsilon": self.old_epsilon,
                "new_epsilon": self.new_epsilon, "old_delta": self.old_delta,
                "new_delta": self.new_delta, "reason": self.reason}


CAP_CHANGE_FIELDS = CapChange._fields


@dataclass(frozen=True)
class SpendRequest:
    """One release's charge. ``lifetime_*`` are the config's values: they fix the source's cap
    at its first spend only. ``dp`` says the mechanism's guarantee is a proven DP claim."""

    source: str
    dataset: str
    mechanism: str
    epsilon: float
    delta: float
    lifetime_epsilon: float
    lifetime_delta: float
    dp: bool = True
    test: bool = False
    input_key: str | None = None
    flow_run_id: str | None = None
    content: tuple[str, ...] = ()        # every file's SHA-256 and 'rows:' + its row digest
    policy: str | None = None            # the config's policy (JSON), recorded for the source
    config_path: str | None = None       # the dataset YAML that made the request
    privacy_unit: str | None = None      # the guarantee's neighbouring relation, in words


def request_record(request: SpendRequest) -> dict:
    """A request as the journal (and the steward record) keeps it: plain JSON values."""
    return {**asdict(request), "content": list(request.content)}


def request_from_record(record: dict) -> SpendRequest:
    """The request a journal line or steward record kept (fields it lacks take their default;
    fields this version does not know are left out)."""
    known = {f.name for f in fields(SpendRequest)}
    values = {k: v for k, v in record.items() if k in known}
    values["content"] = tuple(values.get("content") or ())
    return SpendRequest(**values)


@dataclass(frozen=True)
class UnitSpent:
    """What a source spent under one neighbouring relation (its spends with a charge)."""

    neighbouring: str | None  # None: spends made before the ledger recorded the unit
    epsilon: float
    delta: float
    spends: int

    @property
    def label(self) -> str:
        return self.neighbouring or "a unit not recorded (spent before units were recorded)"


@dataclass(frozen=True)
class BudgetState:
    """A source's budget as the ledger holds it (spends of every status, test ones included)."""

    source: str
    epsilon_spent: float
    delta_spent: float
    lifetime_epsilon: float
    lifetime_delta: float
    test_epsilon_spent: float = 0.0
    void_reason: str | None = None
    cap_note: str | None = None
    cap_history: tuple[dict, ...] = ()
    units: tuple[UnitSpent, ...] = ()  # the privacy units the spends were made under

    @property
    def epsilon_left(self) -> float:
        return max(0.0, self.lifetime_epsilon - self.epsilon_spent)

    @property
    def delta_left(self) -> float:
        return max(0.0, self.lifetime_delta - self.delta_spent)

    @property
    def void(self) -> bool:
        return self.void_reason is not None

    @property
    def mixed_units(self) -> bool:
        """Spends under more than one neighbouring relation (a row and a patient): their sum
        is one guarantee for neither."""
        return len(self.units) > 1

    def units_note(self) -> str | None:
        """The mixing note, in words (docs/PRIVACY.md, "Units and the lifetime budget")."""
        if not self.mixed_units:
            return None
        parts = "; ".join(f"under {u.label}: epsilon {u.epsilon:g}, delta {u.delta:g} "
                          f"({u.spends} spend{'s' if u.spends != 1 else ''})" for u in self.units)
        return (f"MIXED PRIVACY UNITS: the releases of source '{self.source}' were made under "
                f"different neighbouring relations ({parts}), so their sum is a guarantee under "
                "neither relation as it stands: for one row, each patient-level release counts "
                "up to twice (a change within one patient's rows is protected at 2 epsilon and "
                "(1 + e^epsilon) delta); for one patient with k rows, each row-level release "
                "counts about k times its epsilon (group privacy). Each release's manifest "
                "states its own unit.")

    def statement(self) -> str:
        """The lifetime guarantee of everything released from the source, in one sentence."""
        spent = f"epsilon {self.epsilon_spent:g} of {self.lifetime_epsilon:g} and delta " \
                f"{self.delta_spent:g} of {self.lifetime_delta:g} spent on source " \
                f"'{self.source}' so far"
        if self.cap_history:
            last = self.cap_history[-1]
            spent += (f"; the cap was changed from epsilon {last['old_epsilon']:g} to "
                      f"{last['new_epsilon']:g} on {last['changed_on']} ({last['reason']})")
        mixing = f" {self.units_note()}" if self.mixed_units else ""
        if self.void:
            return (f"Lifetime guarantee VOID: {self.void_reason}. ({spent}; each release's "
                    f"own guarantee, in its manifest, still holds for that release alone.)"
                    + mixing)
        if self.mixed_units:
            return f"Releases of source '{self.source}' together: {spent}." + mixing
        return (f"All releases of source '{self.source}' together are ({self.epsilon_spent:g}, "
                f"{self.delta_spent:g})-DP ({spent}).")

    def public(self) -> dict:
        """What a manifest may carry: sums of earlier releases' public parameters, the cap."""
        return {"source": self.source, "epsilon_spent": self.epsilon_spent,
                "delta_spent": self.delta_spent, "epsilon_cap": self.lifetime_epsilon,
                "delta_cap": self.lifetime_delta, "cap_changes": list(self.cap_history),
                "void": self.void, "void_reason": self.void_reason,
                "privacy_units": [{"neighbouring": u.neighbouring, "epsilon_spent": u.epsilon,
                                   "delta_spent": u.delta} for u in self.units],
                "mixed_units": self.mixed_units,
                "statement": self.statement()}


@dataclass(frozen=True)
class Charge:
    """A reservation in the ledger, the source's budget as it stands once the release is
    published, and the request as journaled (the steward record keeps it, to restore)."""

    spend_id: str
    lifetime: BudgetState
    request: dict | None = None
    voids_lifetime: bool = False  # this release, once published, voids its source's guarantee

    def public_lifetime(self) -> dict:
        """The lifetime as the release's own manifest states it: void from this release on
        when this release is the one that voids it, and saying so."""
        return {**self.lifetime.public(), "voided_by_this_release": self.voids_lifetime}


# Within one journaled change every timestamp is the change's own (its journal line's ``at``),
# so that replaying the journal rebuilds the ledger byte for byte.
_CLOCK: ContextVar[str | None] = ContextVar("medrelease_ledger_clock", default=None)


def _now() -> str:
    return _CLOCK.get() or datetime.now(UTC).isoformat(timespec="seconds")


@contextmanager
def _clock_at(at: str) -> Iterator[str]:
    token = _CLOCK.set(at)
    try:
        yield at
    finally:
        _CLOCK.reset(token)


class LedgerConnection(Protocol):
    """What the ledger's queries need of a connection: ``execute`` with ``?`` placeholders,
    returning a cursor (``fetchone``/``fetchall``/``rowcount``). A ``sqlite3.Connection`` is
    one; the PostgreSQL back-end wraps psycopg's."""

    def execute(self, sql: str, parameters: Any = ..., /) -> Any: ...


class BudgetLedger:
    """What every ledger back-end does alike: the rules of a charge (the cap, the claims, one
    charge per run, the void), the budget state, the restore, and the journal's check — its
    chain, the head this host saw, the tables against its replay. A back-end says how it
    connects and holds the write lock (``_connect``, ``_transaction``, which calls
    ``_committed`` after its commit) and where its journal is (``journal``, an
    ``EventJournal``)."""

    location: str  # what stewards see: a file path, or a URL without its password
    journal: EventJournal
    heads: HeadFile
    head_key: str  # how the head file names this ledger
    # what an altered ledger means and what to do, in the back-end's words
    altered: str = ("The ledger was altered outside medrelease (a table dropped, a row "
                    "edited or deleted), or its journal was")
    remedy: str = ("Restore both from backup, or move the ledger aside and run 'medrelease "
                   "ledger restore' (it replays the journal).")
    head_cause: str = ("the newest changes were removed, the journal was rewritten, or the "
                       "ledger and its journal were replaced by an older copy")
    head_remedy: str = "Restore both from backup, or rebuild with 'medrelease ledger restore'."
    head_first: bool = False  # the head checked before the tables (PostgreSQL's order)
    _head: JournalHead | None = None  # the event this process journaled last

    def _connect(self) -> Any:  # a context manager yielding a LedgerConnection
        raise NotImplementedError

    def _transaction(self) -> Any:  # the same, holding the ledger's write lock
        raise NotImplementedError

    def _committed(self) -> None:
        """After a commit: this host has now seen the event it journaled."""
        if self._head is not None:
            self.heads.remember(self.head_key, self._head)

    def _journal(self, conn: LedgerConnection, event: dict) -> None:
        """A change's event, appended before the change commits (no change unjournaled)."""
        self._head = self.journal.append(conn, event)

    def _apply_and_journal(self, conn: LedgerConnection, event: dict) -> None:
        """A change made by a restore: applied with the code that makes it, then journaled
        (before the restore commits, as every change)."""
        _apply_event(conn, event)
        self._journal(conn, event)

    def _chained(self, links: list[Link]) -> list[Link]:
        problems = chain_problems(links)
        if problems:
            raise LedgerIntegrityError(self._chain_refusal(problems))
        return links

    def _chain_refusal(self, problems: list[str]) -> str:
        raise NotImplementedError

    def _verify_locked(self, conn: LedgerConnection) -> None:
        """The chain runs unbroken, still holds the newest event this host saw, and the tables
        equal its replay (``LedgerIntegrityError`` naming what differs)."""
        links = self._chained(self.journal.links(conn))
        if self.head_first:
            self._refuse_a_lost_head(links)
        expected = _replayed([link.event for link in links], self._replay_where)
        try:
            problems = _differences(conn, expected, self._live_columns(conn))
        finally:
            expected.close()
        if problems and not self.journal.exists(conn):
            raise LedgerIntegrityError(
                f"the budget ledger {self.location} holds spends and sources, but its "
                f"{self.journal.where}, the system of record, is missing (deleted or moved): "
                f"nothing in the ledger can be trusted ({_listed(problems)}). Nothing was "
                "spent. Put the journal back from backup; without one, move the ledger aside "
                "and run 'medrelease ledger restore' (it rebuilds from the steward records and "
                "published manifests).")
        if problems:
            raise LedgerIntegrityError(
                f"the budget ledger {self.location} does not match its {self.journal.where}, "
                f"the system of record ({len(problems)} difference"
                f"{'s' if len(problems) != 1 else ''}: {_listed(problems)}). {self.altered}; "
                f"nothing was spent. {self.remedy}")
        if not self.head_first:  # (the newest events removed with their rows agree with
            self._refuse_a_lost_head(links)  # each other: the head catches them)

    def _refuse_a_lost_head(self, links: list[Link]) -> None:
        lost = lost_head(self.heads, self.head_key, links)
        if lost is not None:
            raise LedgerIntegrityError(
                f"the budget ledger {self.location} no longer holds event {lost.seq} of its "
                f"journal as this host saw it ({self.heads.path}): {self.head_cause}; their "
                f"budget would be spent again. Nothing was spent. {self.head_remedy}")

    @property
    def _replay_where(self) -> str:
        """How a replay's refusal names the journal."""
        return self.location

    def _live_columns(self, conn: LedgerConnection) -> Mapping[str, set[str]] | None:
        """The compared tables (or views) and their columns (None: read from SQLite's)."""
        return None

    def _replay_for_restore(self, conn: LedgerConnection) -> bool:
        """The back-end's own journal replayed into an empty ledger (whether it held any)."""
        raise NotImplementedError

    def _restore_caps_kept_apart(self, conn: LedgerConnection) -> None:
        """Cap changes an older version kept apart from its journal (SQLite's only)."""

    def reconcile(self, records: list[dict], manifests: list[dict] = ()) -> None:
        raise NotImplementedError

    def forget_head(self) -> None:
        """Forget the newest event this host saw (after a deliberate new start: ``ledger
        init``, ``ledger restore``): it belongs to the journal that was there before."""
        self.heads.forget(self.head_key)

    def verify(self) -> None:
        """Refuse (``LedgerIntegrityError``) a ledger that differs from its journal. Holds the
        write lock: a change is journaled just before it commits, and must not be caught
        between the two."""
        with self._transaction() as conn:
            self._verify_locked(conn)

    def reserve(self, request: SpendRequest) -> str:
        """Reserve a spend, or refuse it (``BudgetExceededError``) if it would overspend.

        The message shows spent / requested / cap. Nothing is written when refused. The ledger
        is checked against its journal first, and the reservation journaled before it commits.
        """
        for name, value in (("epsilon", request.epsilon), ("delta", request.delta)):
            if not (math.isfinite(value) and value >= 0):
                raise BudgetExceededError(f"{name} to reserve must be a finite number >= 0")
        spend_id = uuid.uuid4().hex
        with self._transaction() as conn, _clock_at(_now()) as now:
            self._verify_locked(conn)
            _refuse_a_second_charge_of_one_run(conn, request)
            _apply_reservation(conn, spend_id, request, enforce=True)
            self._journal(conn, {"event": "reserve", "at": now, "spend_id": spend_id,
                                 "request": request_record(request)})
        return spend_id

    def mark(self, spend_id: str, status: str, release_id: str | None = None,
             note: str | None = None) -> None:
        """Move a reservation to 'released' or 'failed' (it keeps counting either way). A
        release without a proven DP guarantee voids its source's lifetime guarantee when it
        is *published*; a refused or failed run never does (nothing of it was released).
        The outcome is journaled before it commits."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}")
        with self._transaction() as conn, _clock_at(_now()) as now:
            _apply_outcome(conn, spend_id, status, release_id, note)
            self._journal(conn, {"event": "outcome", "at": now, "spend_id": spend_id,
                                 "status": status, "release_id": release_id, "note": note})

    def spends(self, source: str | None = None) -> list[Spend]:
        """Every spend (of one source), oldest first."""
        query = f"SELECT {', '.join(SPEND_FIELDS)} FROM spends"
        args: tuple = ()
        if source:
            query += " WHERE source = ?"
            args = (source,)
        with self._connect() as conn:
            rows = conn.execute(query + " ORDER BY created_at, rowid", args).fetchall()
        return [Spend.from_columns(dict(zip(SPEND_FIELDS, row, strict=True))) for row in rows]

    def holds_spends(self) -> bool:
        with self._connect() as conn:
            return conn.execute("SELECT 1 FROM spends LIMIT 1").fetchone() is not None

    def sources(self) -> list[str]:
        with self._connect() as conn:
            return _source_names(conn)

    def knows_source(self, source: str) -> bool:
        """Whether the source's cap is already fixed (by its first spend)."""
        with self._connect() as conn:
            return _source_known(conn, source)

    def state(self, source: str, lifetime_epsilon: float | None = None,
              lifetime_delta: float | None = None,
              publishing: str | None = None) -> BudgetState:
        """The source's budget; its cap from the ledger (or the given values for a new source).

        ``cap_note`` says when the given (config) values differ from the ledger's cap.
        ``publishing``: the spend of a release about to be published, whose manifest states
        this budget — if its mechanism makes no proven DP claim, the lifetime is void from that
        release on, and the release itself says so.
        """
        with self._connect() as conn:
            row = conn.execute("SELECT lifetime_epsilon, lifetime_delta, void_reason FROM "
                               "sources WHERE source = ?", (source,)).fetchone()
            eps_spent, delta_spent = _spent(conn, source)
            test_eps = conn.execute("SELECT COALESCE(SUM(epsilon), 0) FROM spends WHERE "
                                    "source = ? AND test = 1", (source,)).fetchone()[0]
            units = _units_spent(conn, source)
            pending = _void_reason_of(conn, publishing) if publishing else None
        cap_eps, cap_delta, void = row if row else (lifetime_epsilon, lifetime_delta, None)
        if cap_eps is None or cap_delta is None:
            raise MedreleaseError(f"source {source!r} has no spends in the ledger and no cap "
                                  "was given")
        if void is None and pending is not None:
            void = pending
        note = _cap_note(source, cap_eps, cap_delta, lifetime_epsilon, lifetime_delta) \
            if row else None
        history = tuple(change.public() for change in self.cap_changes(source))
        return BudgetState(source, eps_spent, delta_spent, float(cap_eps), float(cap_delta),
                           float(test_eps), void, note, history, units)

    def source_policy(self, source: str) -> tuple[str | None, str | None]:
        """(policy JSON, owner config path) recorded for a source at its spends, if any."""
        with self._connect() as conn:
            row = conn.execute("SELECT policy, owner_config FROM sources WHERE source = ?",
                               (source,)).fetchone()
        return (row[0], row[1]) if row else (None, None)

    def set_cap(self, source: str, epsilon: float, delta: float, reason: str) -> None:
        """Change a source's lifetime cap: explicit, with a reason, never below what is spent."""
        if len(reason.strip()) < MIN_REASON_CHARS:
            raise MedreleaseError(
                f"a cap change needs a reason of at least {MIN_REASON_CHARS} characters (it is "
                "kept in the ledger and stated in every later manifest)")
        problem = cap_bounds_problem(epsilon, delta)
        if problem:
            raise MedreleaseError(f"the cap needs {problem}")
        with self._transaction() as conn, _clock_at(_now()) as now:
            self._verify_locked(conn)
            row = conn.execute("SELECT lifetime_epsilon, lifetime_delta FROM sources WHERE "
                               "source = ?", (source,)).fetchone()
            if row is None:
                raise MedreleaseError(f"no source {source!r} in the ledger; known: "
                                      f"{', '.join(_source_names(conn)) or 'none'}")
            eps_spent, delta_spent = _spent(conn, source)
            if epsilon < eps_spent - TOLERANCE or delta < delta_spent - 1e-15:
                raise MedreleaseError(
                    f"source {source!r} has already spent epsilon {eps_spent:g}, delta "
                    f"{delta_spent:g}: the cap cannot go below that")
            self._apply_and_journal(conn, {
                "event": "cap", "at": now, "source": source, "old_epsilon": float(row[0]),
                "new_epsilon": epsilon, "old_delta": float(row[1]), "new_delta": delta,
                "reason": reason.strip(), "changed_at": now})

    def cap_changes(self, source: str | None = None) -> list[CapChange]:
        """Every recorded cap change (of one source), oldest first."""
        query = f"SELECT {', '.join(CAP_CHANGE_FIELDS)} FROM cap_changes"
        args: tuple = ()
        if source:
            query += " WHERE source = ?"
            args = (source,)
        with self._connect() as conn:
            return [CapChange(*row) for row in conn.execute(query + " ORDER BY change_id",
                                                             args).fetchall()]

    def restore(self, records: list[dict], manifests: list[dict] = ()) -> Restored:
        """Rebuild a lost or emptied ledger. First its journal, the system of record, is
        replayed: every spend with its source's cap, policy and owner config, its content and
        input claims, every outcome (a failed run's spend included) and every cap change. Then
        the releases the steward records — or, where those are gone, the published manifests
        — show and the journal lacks (a journal lost too, or older than the release) are added
        from what they state (a manifest carries no content hash: such a release's content
        claim is lost), and journaled as they are added.

        Refuses to touch a ledger that already holds spends. Reservations of runs that crashed
        before writing a steward record are recoverable from the journal only.
        """
        if self.holds_spends():
            raise MedreleaseError(f"the ledger {self.location} already holds spends; restore "
                                  "only into a missing or empty ledger (move the old file "
                                  "aside first)")
        with self._transaction() as conn:
            replayed = self._replay_for_restore(conn)
            from_journal = conn.execute("SELECT COUNT(*) FROM spends").fetchone()[0]
            added = _releases_the_journal_lacks(conn, records, manifests)
            new_sources: dict[str, dict] = {}
            for record in added:
                source = record["ledger_charge"]["source"]
                if source in new_sources or not _source_known(conn, source):
                    new_sources[source] = record  # the latest release on record of the source
                for event in _events_from_record(record):
                    self._apply_and_journal(conn, event)
            if not replayed:
                self._restore_caps_kept_apart(conn)
            for source, record in new_sources.items():
                _restore_the_cap_on_record(conn, self, source, record)
        from_manifests = sum(1 for r in added if r.get("from_manifest"))
        return Restored(int(from_journal), len(added) - from_manifests, from_manifests)

class Ledger(BudgetLedger):
    """A SQLite ledger file (the default); safe to open from several processes at once. Its
    journal is a file beside it (``FileJournal``)."""

    def __init__(self, path: str | Path, timeout_s: float | None = None,
                 head_file: Path | None = None) -> None:
        self.path = Path(path)
        self.location = str(self.path)
        # the bounded wait for a lock held by another process (MEDRELEASE_LEDGER_TIMEOUT_S)
        self.timeout_s = timeout_s if timeout_s is not None else float(
            os.environ.get("MEDRELEASE_LEDGER_TIMEOUT_S", "30"))
        self.journal = FileJournal(self.journal_path_for(self.path))
        self.heads, self.head_key = sqlite_heads(self.path, head_file)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not self.path.is_file():  # (refused before the file exists: none left behind)
                _refuse_an_older_ledger(None, self.path)
            with self._connect() as conn:
                _refuse_an_older_ledger(conn, self.path)
                conn.executescript(SCHEMA)
                conn.execute(INDEX)
                if conn.execute("PRAGMA user_version").fetchone()[0] < JOURNAL_VERSION:
                    conn.execute(f"PRAGMA user_version = {JOURNAL_VERSION}")  # a new ledger
        except (LedgerLockedError, LedgerIntegrityError):
            raise
        except (OSError, sqlite3.Error) as exc:
            raise MedreleaseError(f"cannot open the budget ledger at {self.path}: "
                                  f"{type(exc).__name__}: {exc}") from None

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """A connection that waits at most ``timeout_s`` for a lock, then says so plainly."""
        conn = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            yield conn
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise LedgerLockedError(
                    f"the budget ledger {self.path} stayed locked by another process for "
                    f"{self.timeout_s:g} s (a release in progress, or a tool holding it open); "
                    "nothing was spent — try again later") from None
            raise
        finally:
            conn.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            self._head = None
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        self._committed()

    def _chain_refusal(self, problems: list[str]) -> str:
        return (f"the ledger journal {self.journal.path}, the system of record, was altered: "
                f"{_listed(problems)}. Its lines are hash-chained: an edit, even one made to "
                "the ledger as well, breaks the chain. Nothing was spent. Restore the ledger "
                "and its journal from backup.")

    @property
    def _replay_where(self) -> str:
        return str(self.journal.path)

    def _replay_for_restore(self, conn: LedgerConnection) -> bool:
        events = [link.event for link in self._chained(self.journal.links(conn))]
        self.forget_head()  # the journal replayed may be older than the head, or new
        for table in _tables(conn):  # what an emptied ledger kept is rebuilt from the journal
            conn.execute(f'DELETE FROM "{table}"')
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_sequence'").fetchone():
            conn.execute("DELETE FROM sqlite_sequence")
        _replay_events(conn, events, self._replay_where)
        return bool(events)

    def _restore_caps_kept_apart(self, conn: LedgerConnection) -> None:
        """A lost ledger of a version before the full journal: the cap changes its cap journal
        kept, for the sources the records brought back (the file is moved aside after)."""
        for event in legacy_cap_events(self.path):
            if _source_known(conn, event["source"]):
                self._apply_and_journal(conn, event)

    def restore(self, records: list[dict], manifests: list[dict] = ()) -> Restored:
        restored = super().restore(records, manifests)
        caps = caps_journal_for(self.path)
        if caps.is_file():  # read (or superseded by the journal): not read again
            caps.replace(caps.with_name(caps.name + ".migrated"))
        return restored

    def reconcile(self, records: list[dict], manifests: list[dict] = ()) -> None:
        reconcile_sqlite(self.path, records, manifests)

    @property
    def journal_path(self) -> Path:
        """The append-only journal beside the ledger: the system of record it is checked
        against, and what ``restore`` replays."""
        return self.journal.path

    @staticmethod
    def journal_path_for(ledger_path: Path) -> Path:
        return ledger_path.with_name(ledger_path.name + ".journal.jsonl")


def _listed(problems: list[str]) -> str:
    return "; ".join(problems[:MAX_LISTED]) + (
        f"; and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else "")


def _refuse_an_older_ledger(conn: sqlite3.Connection | None, path: Path) -> None:
    """A ledger or journal an older version wrote is refused until ``medrelease ledger
    migrate`` (``ledger_migrate.older_version``: what it finds, from the file's own marks)."""
    found = older_version(conn, path, Ledger.journal_path_for(path), JOURNAL_VERSION)
    if found:
        raise LedgerIntegrityError(
            f"the budget ledger {path} was written by an older version of medrelease ({found})."
            " Run 'medrelease ledger migrate' once: it checks the ledger against its journal "
            "and keeps the old files beside it. Nothing was spent.")


def _source_names(conn: LedgerConnection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT source FROM sources ORDER BY source").fetchall()]



def cap_bounds_problem(epsilon: float, delta: float) -> str | None:
    """What is wrong with a lifetime cap, against the product's bounds (None: within them).
    One rule for a source's first cap (from its YAML) and for ``set-cap``."""
    if (math.isfinite(epsilon) and 0 < epsilon <= MAX_CAP_EPSILON
            and math.isfinite(delta) and 0 <= delta <= MAX_CAP_DELTA):
        return None
    return (f"0 < epsilon <= {MAX_CAP_EPSILON:g} and 0 <= delta <= {MAX_CAP_DELTA:g} (the "
            "product's bounds: a larger cap protects no one)")


def _refuse_a_second_charge_of_one_run(conn: LedgerConnection,
                                       request: SpendRequest) -> None:
    """A flow run charges once. Prefect's UI offers Retry on every finished run: on a run that
    published, a retry would spend the budget again; on a run that failed after its charge,
    its reservation stays counted (noise may have been drawn, artifacts shown), and a retry
    would charge a second time for one run."""
    if request.flow_run_id is None:
        return
    row = conn.execute("SELECT spend_id, status, release_id FROM spends WHERE flow_run_id = ? "
                       "ORDER BY created_at LIMIT 1", (request.flow_run_id,)).fetchone()
    if row is None:
        return
    spend_id, status, release_id = row
    if status == "released":
        raise PolicyError(
            f"this run already published release {release_id}; retrying it would spend the "
            "budget a second time. To release again, start a new run (Run > Quick run or "
            "Custom run on the deployment). Nothing was spent.")
    raise PolicyError(
        f"this run was already charged (ledger spend {spend_id}, now '{status}'): its budget "
        "stays counted because noise may have been drawn before it stopped, and a retry would "
        "charge it a second time. Start a new run (Run > Quick run or Custom run on the "
        "deployment) after fixing the cause shown in the failed run's log; 'medrelease ledger' "
        "lists the spend. Nothing was spent.")


def _claim_content(conn: LedgerConnection, request: SpendRequest) -> None:
    """Tie every file content read to the source charged; refuse a second source for it. The
    budget follows the data: a second YAML over the same extract (a copy, a new source name,
    another input path) cannot open a fresh budget. A claim is a file's byte hash or, prefixed
    ``rows:``, the digest of its parsed rows (``medrelease.data.content``): the same rows in
    another format, line ends, quoting or column order are the same content."""
    for sha256 in request.content:
        row = conn.execute("SELECT source, dataset FROM content_claims WHERE sha256 = ?",
                           (sha256,)).fetchone()
        if row is None:
            conn.execute("INSERT INTO content_claims (sha256, source, dataset, first_seen) "
                         "VALUES (?, ?, ?, ?)", (sha256, request.source, request.dataset, _now()))
        elif row[0] != request.source:
            same = ("the same rows, in whatever format" if sha256.startswith("rows:")
                    else f"same content, SHA-256 {sha256[:12]}...")
            raise LedgerSourceError(
                f"dataset {request.dataset!r} charges source {request.source!r}, but a file it "
                f"reads ({same}) was already charged to source "
                f"{row[0]!r} (first by dataset {row[1]!r}). One extract has one lifetime "
                f"budget, whatever config names it: release it with a config of source "
                f"{row[0]!r}. Nothing was spent.")


def _apply_reservation(conn: LedgerConnection, spend_id: str, request: SpendRequest,
                       enforce: bool) -> None:
    """A reservation's rows: the claims on its content and input, its source (a new source's
    cap fixed now, its policy and owner config), the spend. ``enforce``: refuse what would
    break a rule (a new source's cap beyond the bounds, an overspend); a replay of the journal
    does not — what the journal holds happened."""
    if enforce and not _source_known(conn, request.source):
        _refuse_first_cap_out_of_bounds(request)
    _claim_input(conn, request)
    _claim_content(conn, request)
    cap_eps, cap_delta = _source_cap(conn, request)
    if enforce:
        eps_spent, delta_spent = _spent(conn, request.source)
        _refuse_overspend(request, eps_spent, delta_spent, cap_eps, cap_delta)
    now = _now()
    if _append_only(conn):  # the status is appended as outcomes; the view says 'reserved'
        conn.execute(
            f"INSERT INTO spend_reservations ({', '.join(RESERVATION_FIELDS)}) "
            f"VALUES ({', '.join('?' * len(RESERVATION_FIELDS))})",
            (spend_id, request.dataset, request.mechanism, request.epsilon, request.delta,
             cap_eps, cap_delta, request.flow_run_id, now, request.source, bool(request.test),
             bool(request.dp), request.privacy_unit))
        return
    conn.execute(
        f"INSERT INTO spends ({', '.join(SPEND_FIELDS)}) "
        f"VALUES ({', '.join('?' * len(SPEND_FIELDS))})",
        (spend_id, request.dataset, request.mechanism, request.epsilon, request.delta,
         cap_eps, cap_delta, request.flow_run_id, "reserved", None, None, now, now,
         request.source, int(request.test), int(request.dp), request.privacy_unit))


def _append_only(conn: LedgerConnection) -> bool:
    """Whether the connection's ledger records every change as inserted rows (PostgreSQL:
    its service role may not UPDATE or DELETE) rather than updating rows in place (SQLite)."""
    return bool(getattr(conn, "append_only", False))


def _source_known(conn: LedgerConnection, source: str) -> bool:
    return conn.execute("SELECT 1 FROM sources WHERE source = ?", (source,)).fetchone() is not None


def _refuse_first_cap_out_of_bounds(request: SpendRequest) -> None:
    """A new source's cap comes from its YAML: held to the bounds ``set-cap`` enforces."""
    problem = cap_bounds_problem(request.lifetime_epsilon, request.lifetime_delta)
    if problem:
        raise ConfigError(
            f"dataset {request.dataset!r} would open source {request.source!r} with lifetime "
            f"epsilon {request.lifetime_epsilon:g}, delta {request.lifetime_delta:g} "
            f"(privacy.lifetime_epsilon / lifetime_delta): a source's cap needs {problem}. "
            "Nothing was spent.")


def _apply_outcome(conn: LedgerConnection, spend_id: str, status: str,
                   release_id: str | None, note: str | None) -> None:
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}")
    if _append_only(conn):
        if conn.execute("SELECT 1 FROM spend_reservations WHERE spend_id = ?",
                        (spend_id,)).fetchone() is None:
            raise MedreleaseError(f"no ledger entry {spend_id}")
        void = _void_reason_of(conn, spend_id) if status == "released" else None
        conn.execute("INSERT INTO spend_outcomes (spend_id, status, release_id, note, at, "
                     "void_reason) VALUES (?, ?, ?, ?, ?, ?)",
                     (spend_id, status, release_id, note, _now(), void))
        return
    cur = conn.execute(
        "UPDATE spends SET status = ?, release_id = COALESCE(?, release_id), "
        "note = COALESCE(?, note), updated_at = ? WHERE spend_id = ?",
        (status, release_id, note, _now(), spend_id),
    )
    if cur.rowcount != 1:
        raise MedreleaseError(f"no ledger entry {spend_id}")
    if status == "released":
        _void_if_unproven(conn, spend_id)


def _void_reason_of(conn: LedgerConnection, spend_id: str) -> str | None:
    """Why the spend voids its source's lifetime guarantee once published (None: it does not,
    its mechanism's guarantee is proven)."""
    row = conn.execute("SELECT dp, mechanism, dataset, test FROM spends WHERE spend_id = ?",
                       (spend_id,)).fetchone()
    if row is None or row[0]:
        return None
    _, mechanism, dataset, test = row
    # no clock or id in the reason: it is published in every later manifest
    return (f"a {mechanism} release (no proven DP guarantee) of dataset '{dataset}' was made"
            + (" (a TEST release)" if test else ""))


def _void_if_unproven(conn: sqlite3.Connection, spend_id: str) -> None:
    reason = _void_reason_of(conn, spend_id)
    if reason is None:
        return
    conn.execute("UPDATE sources SET void_spend = ?, void_reason = ? WHERE source = (SELECT "
                 "source FROM spends WHERE spend_id = ?) AND void_spend IS NULL",
                 (spend_id, reason, spend_id))


def _apply_cap_change(conn: LedgerConnection, change: dict) -> None:
    if _append_only(conn):  # the database's own function applies and journals it
        raise MedreleaseError("a PostgreSQL ledger changes a cap only through its "
                              "medrelease_set_cap function")
    cur = conn.execute("UPDATE sources SET lifetime_epsilon = ?, lifetime_delta = ? WHERE "
                       "source = ?", (change["new_epsilon"], change["new_delta"],
                                      change["source"]))
    if cur.rowcount != 1:
        raise MedreleaseError(f"no source {change['source']!r} to change the cap of")
    _insert_cap_change(conn, change)


def _insert_cap_change(conn: sqlite3.Connection, change: dict) -> None:
    conn.execute("INSERT INTO cap_changes (source, old_epsilon, new_epsilon, old_delta, "
                 "new_delta, reason, changed_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                 (change["source"], change["old_epsilon"], change["new_epsilon"],
                  change["old_delta"], change["new_delta"], change["reason"],
                  change["changed_at"]))


def _units_spent(conn: LedgerConnection, source: str) -> tuple[UnitSpent, ...]:
    """Per neighbouring relation, what the source's charged spends add up to (first used
    first)."""
    rows = conn.execute("SELECT privacy_unit, SUM(epsilon), SUM(delta), COUNT(*) FROM spends "
                        "WHERE source = ? AND (epsilon > 0 OR delta > 0) GROUP BY privacy_unit "
                        "ORDER BY MIN(rowid)", (source,)).fetchall()
    return tuple(UnitSpent(unit, float(eps), float(delta), int(n)) for unit, eps, delta, n in rows)


def sqlite_heads(ledger_path: Path, head_file: Path | None = None) -> tuple[HeadFile, str]:
    """This host's head file for a SQLite ledger, and the key it names the ledger by (its real
    path): the ledger's and ``ledger migrate``'s."""
    return (HeadFile(head_file if head_file is not None else sqlite_head_file(ledger_path)),
            str(ledger_path.resolve()))


def sqlite_head_file(ledger_path: Path) -> Path:
    """Where this host keeps the newest journal line it saw: ``ledger-head.json`` in the data
    home (the PostgreSQL ledger's file too), or beside a ledger kept outside the home."""
    from medrelease.settings import data_home

    home = data_home()
    real = Path(os.path.realpath(ledger_path))
    return home / HEAD_FILE if real.is_relative_to(home) else real.parent / HEAD_FILE


def _claim_input(conn: LedgerConnection, request: SpendRequest) -> None:
    """Tie the config's extract to its source id; refuse a second id for a known extract."""
    if request.input_key is None:
        return
    row = conn.execute("SELECT source, dataset FROM source_inputs WHERE input_key = ?",
                       (request.input_key,)).fetchone()
    if row is None:
        conn.execute("INSERT INTO source_inputs (input_key, source, dataset, first_seen) "
                     "VALUES (?, ?, ?, ?)", (request.input_key, request.source, request.dataset,
                                             _now()))
    elif row[0] != request.source:
        raise LedgerSourceError(
            f"dataset {request.dataset!r} names source {request.source!r}, but the ledger "
            f"already records its input file as source {row[0]!r} (first charged by dataset "
            f"{row[1]!r}). Two configs over one extract must share one budget: set "
            f"'privacy: {{source: {row[0]}}}' in the dataset config. Nothing was spent.")


def _source_cap(conn: LedgerConnection, request: SpendRequest) -> tuple[float, float]:
    """The source's cap; a new source's cap is fixed now, from the config."""
    row = conn.execute("SELECT lifetime_epsilon, lifetime_delta, owner_config FROM sources "
                       "WHERE source = ?", (request.source,)).fetchone()
    if row is not None:
        owner = row[2]
        if request.policy and (owner is None or owner == request.config_path):
            # the source's own config may change its policy; another config never does
            _record_policy(conn, request)
        return float(row[0]), float(row[1])
    if _append_only(conn):  # the cap as fixed now, its policy an appended row of its own
        conn.execute("INSERT INTO source_caps (source, lifetime_epsilon, lifetime_delta, "
                     "created_at) VALUES (?, ?, ?, ?)",
                     (request.source, request.lifetime_epsilon, request.lifetime_delta, _now()))
        _record_policy(conn, request)
        return request.lifetime_epsilon, request.lifetime_delta
    conn.execute("INSERT INTO sources (source, lifetime_epsilon, lifetime_delta, created_at, "
                 "policy, owner_config) VALUES (?, ?, ?, ?, ?, ?)",
                 (request.source, request.lifetime_epsilon, request.lifetime_delta, _now(),
                  request.policy, request.config_path))
    return request.lifetime_epsilon, request.lifetime_delta


def _record_policy(conn: LedgerConnection, request: SpendRequest) -> None:
    if _append_only(conn):
        conn.execute("INSERT INTO source_policies (source, policy, owner_config) VALUES "
                     "(?, ?, ?)", (request.source, request.policy, request.config_path))
    else:
        conn.execute("UPDATE sources SET policy = ?, owner_config = ? WHERE source = ?",
                     (request.policy, request.config_path, request.source))


def sqlite_epsilon_left_glance(path: str | Path, source: str) -> tuple[float, bool] | None:
    """(epsilon left under the cap, lifetime guarantee void) of a known source, read without
    opening the ledger for writing (the form's help reads it when its schema is built); None
    for a source with no spends or a ledger that cannot be read. A glance, not a check: the
    charge holds every release to the cap."""
    try:
        conn = sqlite3.connect(f"file:{Path(path)}?mode=ro", uri=True, timeout=1)
    except sqlite3.Error:
        return None
    try:
        row = conn.execute("SELECT lifetime_epsilon, void_reason FROM sources WHERE source = ?",
                           (source,)).fetchone()
        if row is None:
            return None
        return max(0.0, float(row[0]) - _spent(conn, source)[0]), row[1] is not None
    except sqlite3.Error:
        return None
    finally:
        conn.close()


def _spent(conn: LedgerConnection, source: str) -> tuple[float, float]:
    eps, delta = conn.execute("SELECT COALESCE(SUM(epsilon), 0), COALESCE(SUM(delta), 0) FROM "
                              "spends WHERE source = ?", (source,)).fetchone()
    return float(eps), float(delta)


def _cap_note(source: str, cap_eps: float, cap_delta: float, config_eps: float | None,
              config_delta: float | None) -> str | None:
    if config_eps is None or (math.isclose(config_eps, cap_eps)
                              and math.isclose(config_delta or 0.0, cap_delta, abs_tol=1e-18)):
        return None
    return (f"the dataset config says lifetime epsilon {config_eps:g} / delta "
            f"{config_delta:g}, but the ledger fixed source {source!r}'s cap at {cap_eps:g} / "
            f"{cap_delta:g} at its first spend; the ledger's cap applies (change it with "
            f"'medrelease ledger set-cap {source} --epsilon E --delta D --reason ...')")


def _refuse_overspend(request: SpendRequest, eps_spent: float, delta_spent: float,
                      cap_eps: float, cap_delta: float) -> None:
    if eps_spent + request.epsilon > cap_eps * (1 + TOLERANCE) + TOLERANCE:
        raise BudgetExceededError(
            f"source {request.source!r}: this release would exceed the lifetime privacy budget "
            f"— epsilon spent {eps_spent:g} + requested {request.epsilon:g} > total "
            f"{cap_eps:g} (left: {max(0.0, cap_eps - eps_spent):g})")
    if delta_spent + request.delta > cap_delta * (1 + TOLERANCE) + 1e-15:
        raise BudgetExceededError(
            f"source {request.source!r}: this release would exceed the lifetime delta — delta "
            f"spent {delta_spent:g} + requested {request.delta:g} > total {cap_delta:g}")


def refuse_overspend(request: SpendRequest, state: BudgetState) -> None:
    """The charge's overspend rule against a budget read beforehand (``BudgetLedger.state``),
    so that a release over its source's cap is refused before its input is read (issue 56).
    A pre-check only: ``reserve`` applies the same rule again, inside its transaction."""
    _refuse_overspend(request, state.epsilon_spent, state.delta_spent, state.lifetime_epsilon,
                      state.lifetime_delta)


# -- the journal: replayed, compared, restored ---------------------------------------------------

MAX_LISTED = 4  # differences named in one message


def _tables(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                       "AND name NOT LIKE 'sqlite_%' ORDER BY name")]


def _columns(conn: sqlite3.Connection, table: str) -> list[tuple[str, int]]:
    """(name, position in the primary key, 0 if none) of a table's columns."""
    return [(r[1], r[5]) for r in conn.execute(f'PRAGMA table_info("{table}")')]


def _holds_rows(conn: sqlite3.Connection) -> bool:
    return any(conn.execute(f'SELECT 1 FROM "{t}" LIMIT 1').fetchone() for t in _tables(conn))


def _snapshot(conn: sqlite3.Connection) -> dict[str, list[dict]]:
    """Every row of every ledger table (an older ledger's state, journaled when adopted)."""
    snapshot = {}
    for table in _tables(conn):
        names = [name for name, _ in _columns(conn, table)]
        quoted = ", ".join(f'"{n}"' for n in names)
        snapshot[table] = [dict(zip(names, row, strict=True))
                           for row in conn.execute(f'SELECT {quoted} FROM "{table}"')]
    return snapshot


def _load_snapshot(conn: sqlite3.Connection, tables: dict[str, list[dict]]) -> None:
    known = set(_tables(conn))
    for table, rows in tables.items():
        if table not in known:
            raise LedgerIntegrityError(f"the journal's snapshot names an unknown table {table!r}")
        columns = {name for name, _ in _columns(conn, table)}
        for row in rows:
            if not set(row) <= columns:
                raise LedgerIntegrityError(f"the journal's snapshot of table {table} has "
                                           "unknown columns")
            names = list(row)
            quoted = ", ".join(f'"{n}"' for n in names)
            conn.execute(f'INSERT INTO "{table}" ({quoted}) VALUES '
                         f"({', '.join('?' * len(names))})", [row[n] for n in names])


def _apply_event(conn: LedgerConnection, event: dict) -> None:
    """Apply one journaled change with the code that made it (and its own timestamps)."""
    kind = event.get("event")
    if kind == "reserve":
        with _clock_at(event["at"]):
            _apply_reservation(conn, event["spend_id"], request_from_record(event["request"]),
                               enforce=False)
    elif kind == "outcome":
        with _clock_at(event["at"]):
            _apply_outcome(conn, event["spend_id"], event["status"], event.get("release_id"),
                           event.get("note"))
    elif kind == "cap":
        _apply_cap_change(conn, event)
    elif kind == "adopt":
        _load_snapshot(conn, event["tables"])
    else:
        raise LedgerIntegrityError(f"unknown journal event {kind!r}")


def _replay_events(conn: LedgerConnection, events: list[dict], journal: str) -> None:
    """``journal``: how messages name it (a path, or a location and its table)."""
    for number, event in enumerate(events, start=1):
        try:
            _apply_event(conn, event)
        except (MedreleaseError, sqlite3.Error, KeyError, TypeError, ValueError) as exc:
            raise LedgerIntegrityError(
                f"the ledger journal {journal} cannot be replayed at its entry {number} "
                f"({type(exc).__name__}): it was edited or damaged; restore it from backup. "
                "Nothing was spent.") from None


def _replayed(events: list[dict], journal: str) -> sqlite3.Connection:
    """A ledger rebuilt in memory from the journal: what the ledger file must hold."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        conn.executescript(SCHEMA)
        conn.execute("BEGIN")
        _replay_events(conn, events, journal)
        conn.execute("COMMIT")
    except BaseException:
        conn.close()
        raise
    return conn


def _differences(live: LedgerConnection, expected: sqlite3.Connection,
                 live_columns: Mapping[str, set[str]] | None = None) -> list[str]:
    """What the ledger holds that its journal does not, and the other way round. ``live``: a
    SQLite ledger, or another back-end whose tables or views of the same names and columns
    (``live_columns``) show its current state."""
    problems: list[str] = []
    if live_columns is None:
        live_columns = {t: {name for name, _ in _columns(live, t)} for t in _tables(live)}
    for table in _tables(expected):
        columns = _columns(expected, table)
        names = [name for name, _ in columns]
        keys = [name for name, pk in sorted(columns, key=lambda c: c[1]) if pk] or names
        if table not in live_columns:
            problems.append(f"table {table} is missing")
            continue
        lacking = [n for n in names if n not in live_columns[table]]
        if lacking:
            problems.append(f"table {table} lacks column(s) {', '.join(lacking)}")
            continue
        want, have = (_rows_by_key(c, table, names, keys) for c in (expected, live))
        for key in sorted(want.keys() - have.keys(), key=repr):
            problems.append(f"{_describe(table, want[key])} is in the journal but missing "
                            f"from the ledger{_what_the_journal_says(expected, table, want[key])}")
        for key in sorted(have.keys() - want.keys(), key=repr):
            problems.append(f"{_describe(table, have[key])} is in the ledger but not in its "
                            "journal")
        for key in sorted(want.keys() & have.keys(), key=repr):
            changed = [n for n in names if want[key][n] != have[key][n]]
            if changed:
                problems.append(f"{_describe(table, want[key])} differs from the journal in "
                                f"{', '.join(changed)}"
                                f"{_what_the_journal_says(expected, table, want[key], have[key])}")
    return problems


def _rows_by_key(conn: LedgerConnection, table: str, names: list[str],
                 keys: list[str]) -> dict[tuple, dict]:
    quoted = ", ".join(f'"{n}"' for n in names)
    rows = (dict(zip(names, row, strict=True))
            for row in conn.execute(f'SELECT {quoted} FROM "{table}"'))
    return {tuple(row[k] for k in keys): row for row in rows}


def _describe(table: str, row: dict) -> str:
    """A ledger row in words: ids, sources and hash prefixes, never a path or a data value."""
    if table == "spends":
        return (f"spend {row['spend_id']} of source {row['source']!r} ({row['status']}, "
                f"epsilon {row['epsilon']:g})")
    if table == "sources":
        return f"source {row['source']!r}"
    if table == "content_claims":
        return f"the claim of source {row['source']!r} on content {str(row['sha256'])[:12]}..."
    if table == "source_inputs":
        return f"the claim of source {row['source']!r} on an input file"
    if table == "cap_changes":
        return f"cap change {row['change_id']} of source {row['source']!r}"
    return f"a row of table {table}" + (f" (source {row['source']!r})" if "source" in row else "")


def _what_the_journal_says(expected: sqlite3.Connection, table: str, want: dict,
                           have: dict | None = None) -> str:
    """For a source: the cap (and its last change) and the void its journal holds."""
    if table != "sources":
        return ""
    says = []
    if have is None or (want["lifetime_epsilon"], want["lifetime_delta"]) != (
            have["lifetime_epsilon"], have["lifetime_delta"]):
        last = expected.execute("SELECT reason, changed_at FROM cap_changes WHERE source = ? "
                                "ORDER BY change_id DESC LIMIT 1", (want["source"],)).fetchone()
        says.append((f"the ledger's cap is epsilon {have['lifetime_epsilon']:g}, delta "
                     f"{have['lifetime_delta']:g}, but " if have else "")
                    + f"its journal says epsilon {want['lifetime_epsilon']:g}, delta "
                    + f"{want['lifetime_delta']:g}"
                    + (f" (changed {last[1][:10]}: {last[0]})" if last
                       else " (fixed at its first spend)"))
    if want["void_reason"] and (have is None or not have["void_reason"]):
        says.append(f"its journal says its lifetime guarantee is VOID ({want['void_reason']})")
    return f" ({'; '.join(says)})" if says else ""


def published_charges(manifests: list[dict]) -> list[dict]:
    """Charges as the published manifests state them (source, mechanism, eps, delta, cap,
    unit), in the steward records' shape, for releases whose steward record is gone."""
    charges = []
    for manifest in manifests:
        lifetime = manifest.get("lifetime") or {}
        guarantee = manifest.get("guarantee") or {}
        charges.append({
            "release_id": manifest["release_id"], "dataset": manifest.get("dataset", ""),
            "ledger_spend_id": f"manifest-{manifest['release_id']}", "status": "published",
            "test_release": bool(manifest.get("test_release")), "from_manifest": True,
            "ledger_charge": {
                "source": manifest.get("source") or manifest.get("dataset", ""),
                "mechanism": manifest.get("mechanism", "?"),
                "epsilon": float(manifest.get("epsilon_spent") or 0.0),
                "delta": float(manifest.get("delta_spent") or 0.0),
                "dp": bool(guarantee.get("proven", True)),
                "cap_epsilon": float(lifetime.get("epsilon_cap") or 0.0),
                "cap_delta": float(lifetime.get("delta_cap") or 0.0),
                "privacy_unit": guarantee.get("neighbouring")}})
    return charges


def reconcile_sqlite(ledger_path: Path, records: list[dict], manifests: list[dict] = ()) -> None:
    """``ledger_backends.reconcile`` for a SQLite ledger file: refuse a file that lacks a
    release on record or differs from its journal, and a missing file whose journal holds
    changes (a new empty ledger would restart every budget from zero)."""
    refuse_releases_not_in_settled(str(ledger_path), "is missing" if not ledger_path.is_file()
                                   else "does not hold", lambda: _ledger_contents(ledger_path),
                                   records, list(manifests))
    if ledger_path.is_file():
        ledger = Ledger(ledger_path)
        ledger.verify()
        refuse_charges_unlike_releases(str(ledger_path), ledger.spends(), records,
                                       list(manifests))
        return
    journal = FileJournal(Ledger.journal_path_for(ledger_path))
    try:
        events = len(journal.links())
    except JournalDamaged:
        events = -1
    if events:
        held = f"{events} change(s)" if events > 0 else "changes (damaged)"
        raise LedgerIntegrityError(
            f"the budget ledger {ledger_path} is missing, but its {journal.where} holds "
            f"{held}: a new empty ledger would restart their "
            "budgets from zero. Nothing was spent. Rebuild it with 'medrelease ledger restore' "
            "(it replays the journal).")


# A manifest another host published a moment ago names a release id the ledger takes only
# when that host's run finalizes its spend, and its steward record is on that host: the check
# reads the ledger again, at most this many times this far apart, before it refuses for it.
MANIFEST_SETTLE_TRIES, MANIFEST_SETTLE_S = 3, 1.0


def releases_not_in(known_spends: set[str], known_releases: set[str], records: list[dict],
                    manifests: list[dict]) -> tuple[list[str], list[str]]:
    """(releases on record whose spend the ledger lacks, published releases it lacks)."""
    lost = [r["release_id"] for r in records
            if r.get("ledger_spend_id") and r["ledger_spend_id"] not in known_spends]
    # a manifest counts by its release id, which the ledger takes only when the run finalizes
    # its spend, after publishing: a release published a moment ago is accounted for by its
    # steward record's spend (written before the manifest, read after it)
    charged = {r["release_id"] for r in records if r.get("ledger_spend_id") in known_spends}
    published = [m["release_id"] for m in manifests if m["release_id"] not in known_releases
                 and m["release_id"] not in charged and m["release_id"] not in lost]
    return lost, published


def refuse_releases_not_in_settled(location: str, state: str,
                                   contents: Callable[[], tuple[set[str], set[str]]],
                                   records: list[dict], manifests: list[dict]) -> None:
    """``refuse_releases_not_in`` on the ledger's ``contents`` (spend ids, release ids), read
    again while the only releases it lacks are published ones (another host's, between its
    publication and its finalized spend: the two-hosts test was refused so): a spend on
    record that is missing, or a manifest still missing after the last read, is refused."""
    for attempt in range(MANIFEST_SETTLE_TRIES):
        known_spends, known_releases = contents()
        lost, published = releases_not_in(known_spends, known_releases, records, manifests)
        if lost or not published or attempt == MANIFEST_SETTLE_TRIES - 1:
            break
        time.sleep(MANIFEST_SETTLE_S)
    refuse_releases_not_in(location, state, known_spends, known_releases, records, manifests)


def refuse_releases_not_in(location: str, state: str, known_spends: set[str],
                           known_releases: set[str], records: list[dict],
                           manifests: list[dict]) -> None:
    """Refuse a ledger (``LedgerIntegrityError``) that lacks the spend of a release the
    steward records or the published manifests show."""
    lost, published = releases_not_in(known_spends, known_releases, records, manifests)
    lost += published
    if lost:
        examples = ", ".join(sorted(lost)[:3])
        raise LedgerIntegrityError(
            f"the budget ledger {location} {state} the spends of {len(lost)} release(s) on "
            f"record ({examples}{' ...' if len(lost) > 3 else ''}): it was lost, emptied or "
            "replaced, and its budgets would restart from zero. Nothing was spent. Restore the "
            "ledger from backup, or rebuild it with 'medrelease ledger restore' (from its "
            "journal, the steward records, and the published manifests where those are gone).")


def _facts_of_record(record: dict) -> dict[str, Any]:
    charge = record.get("ledger_charge") or {}
    return {"source": charge.get("source"), "mechanism": charge.get("mechanism"),
            "epsilon": charge.get("epsilon"), "delta": charge.get("delta"),
            "DP": charge.get("dp"), "TEST": record.get("test_release")}


def _facts_of_manifest(manifest: dict) -> dict[str, Any]:
    return {"source": manifest.get("source"), "mechanism": manifest.get("mechanism"),
            "epsilon": manifest.get("epsilon_spent"), "delta": manifest.get("delta_spent"),
            "DP": (manifest.get("guarantee") or {}).get("proven"),
            "TEST": manifest.get("test_release")}


def _facts_of_spend(spend: Spend) -> dict[str, Any]:
    return {"source": spend.source, "mechanism": spend.mechanism, "epsilon": spend.epsilon,
            "delta": spend.delta, "DP": spend.dp, "TEST": spend.test}


def _unlike(stated: dict[str, Any], charged: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(fact, as the release states it, as the ledger holds it) where the two differ; a fact
    an older record or manifest does not state is not compared."""
    differ = []
    for name, said in stated.items():
        held = charged[name]
        if said is None:
            continue
        if isinstance(held, bool):
            same = bool(said) == held
        elif isinstance(held, float):
            same = isinstance(said, int | float) and not isinstance(said, bool) and \
                math.isclose(float(said), held, rel_tol=1e-9, abs_tol=1e-15)
        else:
            same = said == held
        if not same:
            differ.append((name, said, held))
    return differ


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:g}" if isinstance(value, float) else repr(value) if isinstance(
        value, str) else str(value)


def refuse_charges_unlike_releases(location: str, spends: list[Spend], records: list[dict],
                                   manifests: list[dict]) -> None:
    """Refuse (``LedgerIntegrityError``) a ledger whose spend of a release on record says
    otherwise than the release: its steward record's charge, or its published manifest
    (source, mechanism, epsilon, delta, DP, TEST). The ledger and its journal edited together
    agree with each other; the releases, kept elsewhere, still say what was charged."""
    by_spend = {s.spend_id: s for s in spends}
    by_release = {s.release_id: s for s in spends if s.release_id}
    of_record = {r["release_id"]: by_spend[r["ledger_spend_id"]] for r in records
                 if r.get("ledger_spend_id") in by_spend}
    problems = []
    stated = [(r["release_id"], "steward record", _facts_of_record(r),
               by_spend.get(r.get("ledger_spend_id"))) for r in records
              if r.get("ledger_charge")]
    stated += [(m["release_id"], "manifest", _facts_of_manifest(m),
                by_release.get(m["release_id"]) or of_record.get(m["release_id"]))
               for m in manifests if m.get("release_id")]
    for release_id, where, facts, spend in stated:
        if spend is None:
            continue  # a release without its spend: refuse_releases_not_in says so
        differ = _unlike(facts, _facts_of_spend(spend))
        if differ:
            said = ", ".join(f"{name} {_shown(value)}" for name, value, _ in differ)
            held = ", ".join(f"{name} {_shown(value)}" for name, _, value in differ)
            problems.append(f"release {release_id}: its {where} says {said}; the ledger's "
                            f"spend {spend.spend_id} says {held}")
    if problems:
        listed = "; ".join(problems[:MAX_LISTED]) + (
            f"; and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else "")
        raise LedgerIntegrityError(
            f"the budget ledger {location} does not match the releases on record "
            f"({len(problems)} difference{'s' if len(problems) != 1 else ''}: {listed}). A "
            "spend was edited in the ledger (and its journal) after its release; nothing was "
            "spent. Restore the ledger and its journal from backup, or move them aside and "
            "run 'medrelease ledger restore' (it rebuilds from the steward records and the "
            "published manifests).")


def _ledger_contents(ledger_path: Path) -> tuple[set[str], set[str]]:
    """(spend ids, release ids) of a ledger file, without creating it."""
    if not ledger_path.is_file():
        return set(), set()
    with Ledger(ledger_path)._connect() as conn:
        rows = conn.execute("SELECT spend_id, release_id FROM spends").fetchall()
    return {r[0] for r in rows}, {r[1] for r in rows if r[1]}


@dataclass(frozen=True)
class Restored:
    """What ``restore_from_records`` rebuilt, by where each spend came from."""

    from_journal: int
    from_records: int
    from_manifests: int

    @property
    def spends(self) -> int:
        return self.from_journal + self.from_records + self.from_manifests


def _releases_the_journal_lacks(conn: LedgerConnection, records: list[dict],
                                manifests: list[dict]) -> list[dict]:
    """Steward records (and manifests of releases without one) whose spend is not in the
    ledger, in release order."""
    spends = {r[0] for r in conn.execute("SELECT spend_id FROM spends")}
    releases = {r[0] for r in conn.execute("SELECT release_id FROM spends WHERE release_id "
                                           "IS NOT NULL")}
    on_record = {r["release_id"] for r in records}
    lacking = [r for r in records if r.get("ledger_charge")
               and r.get("ledger_spend_id") not in spends and r["release_id"] not in releases]
    lacking += [m for m in published_charges(list(manifests))
                if m["release_id"] not in on_record and m["release_id"] not in releases]
    return sorted(lacking, key=lambda r: r["release_id"].removeprefix("TEST-"))


def _events_from_record(record: dict) -> list[dict]:
    """A release on record as the journal's reservation and outcome. Its request is the one
    the record kept (records of older versions: rebuilt from the charge, the config and the
    input hash); the source's cap is the one the record says was in force."""
    charge = record["ledger_charge"]
    from_manifest = bool(record.get("from_manifest"))
    config = record.get("dataset_config") or {}
    if charge.get("request"):
        request = request_from_record(charge["request"])
    else:
        request = SpendRequest(
            source=charge["source"], dataset=record.get("dataset", ""),
            mechanism=charge["mechanism"], epsilon=float(charge["epsilon"]),
            delta=float(charge["delta"]), lifetime_epsilon=0.0, lifetime_delta=0.0,
            dp=bool(charge["dp"]), test=bool(record.get("test_release")),
            flow_run_id=record.get("flow_run_id"),
            content=(record["input_sha256"],) if record.get("input_sha256") else (),
            policy=json.dumps(config["policy"]) if config.get("policy") is not None else None,
            config_path=config.get("config_file") or None,
            privacy_unit=charge.get("privacy_unit"))
    request = SpendRequest(**{**asdict(request), "lifetime_epsilon": float(charge["cap_epsilon"]),
                              "lifetime_delta": float(charge["cap_delta"])})
    at = record.get("requested_at") or _now()
    status = {"published": "released", "failed": "failed",  # not published: rejected at review
              "not published": "failed"}.get(record.get("status"), "reserved")
    note = ("restored from the published manifest" if from_manifest
            else "restored from the steward record")
    return [{"event": "reserve", "at": at, "spend_id": record["ledger_spend_id"],
             "request": request_record(request)},
            {"event": "outcome", "at": record.get("published_at") or at,
             "spend_id": record["ledger_spend_id"], "status": status,
             "release_id": record["release_id"], "note": note}]


def _restore_the_cap_on_record(conn: LedgerConnection, ledger: BudgetLedger, source: str,
                               latest: dict) -> None:
    """A source known only from records and manifests: the cap its latest release states
    (a later change, journaled only, is lost with the journal), as a recorded cap change."""
    charge = latest["ledger_charge"]
    row = conn.execute("SELECT lifetime_epsilon, lifetime_delta FROM sources WHERE source = ?",
                       (source,)).fetchone()
    if row is None or (row[0], row[1]) == (charge["cap_epsilon"], charge["cap_delta"]):
        return
    if conn.execute("SELECT 1 FROM cap_changes WHERE source = ?", (source,)).fetchone():
        return  # the cap journal of an older version said it
    now = _now()
    ledger._apply_and_journal(conn, {
        "event": "cap", "at": now, "source": source, "old_epsilon": row[0],
        "new_epsilon": float(charge["cap_epsilon"]), "old_delta": row[1],
        "new_delta": float(charge["cap_delta"]), "changed_at": now,
        "reason": f"restored: the cap stated by release {latest['release_id']}, the latest "
                  "on record (the journal was lost)"})
