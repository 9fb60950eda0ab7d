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
"""

from __future__ import annotations

import math
import os
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from medrelease.errors import BudgetExceededError, MedreleaseError, PolicyError

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
    updated_at   TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sources (
    source           TEXT PRIMARY KEY,
    lifetime_epsilon REAL NOT NULL,
    lifetime_delta   REAL NOT NULL,
    created_at       TEXT NOT NULL,
    void_spend       TEXT,
    void_reason      TEXT
);
CREATE TABLE IF NOT EXISTS source_inputs (
    input_key  TEXT PRIMARY KEY,
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
# Columns added after the first schema; old ledgers are migrated in place.
SPEND_COLUMNS = {"source": "TEXT", "test": "INTEGER NOT NULL DEFAULT 0",
                 "dp": "INTEGER NOT NULL DEFAULT 1"}
SPEND_FIELDS = ("spend_id", "dataset", "mechanism", "epsilon", "delta", "lifetime_epsilon",
                "lifetime_delta", "flow_run_id", "status", "release_id", "note", "created_at",
                "updated_at", "source", "test", "dp")


class LedgerSourceError(MedreleaseError):
    """A config names a different source id for an extract the ledger already knows."""


class LedgerLockedError(MedreleaseError):
    """Another process held the ledger longer than the bounded wait; nothing was spent."""


class LedgerIntegrityError(MedreleaseError):
    """The ledger is missing spends that releases on record made (lost, emptied, replaced)."""


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

    @property
    def status_text(self) -> str:
        """The status as stewards read it: 'released (test) (no DP)'."""
        return self.status + (" (test)" if self.test else "") + ("" if self.dp else " (no DP)")


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

    @property
    def dataset(self) -> str:  # older callers named the budget's owner 'dataset'
        return self.source

    @property
    def epsilon_left(self) -> float:
        return max(0.0, self.lifetime_epsilon - self.epsilon_spent)

    @property
    def delta_left(self) -> float:
        return max(0.0, self.lifetime_delta - self.delta_spent)

    @property
    def void(self) -> bool:
        return self.void_reason is not None

    def statement(self) -> str:
        """The lifetime guarantee of everything released from the source, in one sentence."""
        spent = f"epsilon {self.epsilon_spent:g} of {self.lifetime_epsilon:g} and delta " \
                f"{self.delta_spent:g} of {self.lifetime_delta:g} spent on source " \
                f"'{self.source}' so far"
        if self.void:
            return (f"Lifetime guarantee VOID: {self.void_reason}. ({spent}; the per-release "
                    "guarantee above still holds for this release alone.)")
        return (f"All releases of source '{self.source}' together are ({self.epsilon_spent:g}, "
                f"{self.delta_spent:g})-DP ({spent}).")

    def public(self) -> dict:
        """What a manifest may carry: sums of earlier releases' public parameters, the cap."""
        return {"source": self.source, "epsilon_spent": self.epsilon_spent,
                "delta_spent": self.delta_spent, "epsilon_cap": self.lifetime_epsilon,
                "delta_cap": self.lifetime_delta, "void": self.void,
                "void_reason": self.void_reason, "statement": self.statement()}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class Ledger:
    """A SQLite ledger file; safe to open from several processes at once."""

    def __init__(self, path: str | Path, timeout_s: float | None = None) -> None:
        self.path = Path(path)
        # the bounded wait for a lock held by another process (MEDRELEASE_LEDGER_TIMEOUT_S)
        self.timeout_s = timeout_s if timeout_s is not None else float(
            os.environ.get("MEDRELEASE_LEDGER_TIMEOUT_S", "30"))
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._connect() as conn:
                conn.executescript(SCHEMA)
                _migrate(conn)
        except LedgerLockedError:
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
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    def reserve(self, request: SpendRequest) -> str:
        """Reserve a spend, or refuse it (``BudgetExceededError``) if it would overspend.

        The message shows spent / requested / cap. Nothing is written when refused.
        """
        for name, value in (("epsilon", request.epsilon), ("delta", request.delta)):
            if not (math.isfinite(value) and value >= 0):
                raise BudgetExceededError(f"{name} to reserve must be a finite number >= 0")
        spend_id = uuid.uuid4().hex
        with self._transaction() as conn:
            _refuse_a_second_release_of_one_run(conn, request)
            _claim_input(conn, request)
            cap_eps, cap_delta = _source_cap(conn, request)
            eps_spent, delta_spent = _spent(conn, request.source)
            _refuse_overspend(request, eps_spent, delta_spent, cap_eps, cap_delta)
            now = _now()
            conn.execute(
                f"INSERT INTO spends ({', '.join(SPEND_FIELDS)}) "
                f"VALUES ({', '.join('?' * len(SPEND_FIELDS))})",
                (spend_id, request.dataset, request.mechanism, request.epsilon, request.delta,
                 cap_eps, cap_delta, request.flow_run_id, "reserved", None, None, now, now,
                 request.source, int(request.test), int(request.dp)))
            if not request.dp:
                # no clock or id in the reason: it is published in every later manifest
                reason = (f"a {request.mechanism} release (no proven DP guarantee) of dataset "
                          f"'{request.dataset}' was made"
                          + (" (a TEST release)" if request.test else ""))
                conn.execute("UPDATE sources SET void_spend = ?, void_reason = ? "
                             "WHERE source = ? AND void_spend IS NULL",
                             (spend_id, reason, request.source))
        return spend_id

    def mark(self, spend_id: str, status: str, release_id: str | None = None,
             note: str | None = None) -> None:
        """Move a reservation to 'released' or 'failed' (it keeps counting either way)."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}")
        with self._connect() as conn:
            cur = conn.execute(
                "UPDATE spends SET status = ?, release_id = COALESCE(?, release_id), "
                "note = COALESCE(?, note), updated_at = ? WHERE spend_id = ?",
                (status, release_id, note, _now(), spend_id),
            )
            if cur.rowcount != 1:
                raise MedreleaseError(f"no ledger entry {spend_id}")

    def spends(self, source: str | None = None) -> list[Spend]:
        """Every spend (of one source), oldest first."""
        query = f"SELECT {', '.join(SPEND_FIELDS)} FROM spends"
        args: tuple = ()
        if source:
            query += " WHERE source = ?"
            args = (source,)
        with self._connect() as conn:
            rows = conn.execute(query + " ORDER BY created_at, rowid", args).fetchall()
        return [Spend(*row[:14], bool(row[14]), bool(row[15])) for row in rows]

    def sources(self) -> list[str]:
        with self._connect() as conn:
            return [r[0] for r in conn.execute("SELECT source FROM sources ORDER BY source")]

    def state(self, source: str, lifetime_epsilon: float | None = None,
              lifetime_delta: float | None = None) -> BudgetState:
        """The source's budget; its cap from the ledger (or the given values for a new source).

        ``cap_note`` says when the given (config) values differ from the ledger's cap.
        """
        with self._connect() as conn:
            row = conn.execute("SELECT lifetime_epsilon, lifetime_delta, void_reason FROM "
                               "sources WHERE source = ?", (source,)).fetchone()
            eps_spent, delta_spent = _spent(conn, source)
            test_eps = conn.execute("SELECT COALESCE(SUM(epsilon), 0) FROM spends WHERE "
                                    "source = ? AND test = 1", (source,)).fetchone()[0]
        cap_eps, cap_delta, void = row if row else (lifetime_epsilon, lifetime_delta, None)
        if cap_eps is None or cap_delta is None:
            raise MedreleaseError(f"source {source!r} has no spends in the ledger and no cap "
                                  "was given")
        note = _cap_note(source, cap_eps, cap_delta, lifetime_epsilon, lifetime_delta) \
            if row else None
        return BudgetState(source, eps_spent, delta_spent, cap_eps, cap_delta, test_eps,
                           void, note)

    def set_cap(self, source: str, epsilon: float, delta: float, reason: str) -> None:
        """Change a source's lifetime cap: explicit, with a reason, never below what is spent."""
        if not reason.strip():
            raise MedreleaseError("a cap change needs a reason (it is kept in the ledger)")
        if not (math.isfinite(epsilon) and epsilon > 0 and math.isfinite(delta)
                and 0 <= delta < 1):
            raise MedreleaseError("the cap needs epsilon > 0 and 0 <= delta < 1")
        with self._transaction() as conn:
            row = conn.execute("SELECT lifetime_epsilon, lifetime_delta FROM sources WHERE "
                               "source = ?", (source,)).fetchone()
            if row is None:
                raise MedreleaseError(f"no source {source!r} in the ledger; known: "
                                      f"{', '.join(self._names(conn)) or 'none'}")
            eps_spent, delta_spent = _spent(conn, source)
            if epsilon < eps_spent - TOLERANCE or delta < delta_spent - 1e-15:
                raise MedreleaseError(
                    f"source {source!r} has already spent epsilon {eps_spent:g}, delta "
                    f"{delta_spent:g}: the cap cannot go below that")
            conn.execute("UPDATE sources SET lifetime_epsilon = ?, lifetime_delta = ? WHERE "
                         "source = ?", (epsilon, delta, source))
            conn.execute("INSERT INTO cap_changes (source, old_epsilon, new_epsilon, old_delta, "
                         "new_delta, reason, changed_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                         (source, row[0], epsilon, row[1], delta, reason.strip(), _now()))

    def cap_changes(self, source: str | None = None) -> list[tuple]:
        query = ("SELECT source, old_epsilon, new_epsilon, old_delta, new_delta, reason, "
                 "changed_at FROM cap_changes")
        args: tuple = ()
        if source:
            query += " WHERE source = ?"
            args = (source,)
        with self._connect() as conn:
            return conn.execute(query + " ORDER BY change_id", args).fetchall()

    @staticmethod
    def _names(conn: sqlite3.Connection) -> list[str]:
        return [r[0] for r in conn.execute("SELECT source FROM sources ORDER BY source")]


def _migrate(conn: sqlite3.Connection) -> None:
    """Bring a ledger written by an older version up to this schema (idempotent)."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(spends)")}
    for column, kind in SPEND_COLUMNS.items():
        if column not in have:
            conn.execute(f"ALTER TABLE spends ADD COLUMN {column} {kind}")
    conn.execute("UPDATE spends SET source = dataset WHERE source IS NULL")
    conn.execute(
        "INSERT OR IGNORE INTO sources (source, lifetime_epsilon, lifetime_delta, created_at) "
        "SELECT source, lifetime_epsilon, lifetime_delta, MIN(created_at) FROM spends "
        "GROUP BY source")
    conn.execute("CREATE INDEX IF NOT EXISTS spends_source ON spends (source)")


def _refuse_a_second_release_of_one_run(conn: sqlite3.Connection,
                                        request: SpendRequest) -> None:
    """A flow run releases once. Prefect's UI offers Retry on every finished run; on a run that
    already published, a retry would spend the budget again under the same run id."""
    if request.flow_run_id is None:
        return
    row = conn.execute("SELECT release_id FROM spends WHERE flow_run_id = ? AND status = "
                       "'released'", (request.flow_run_id,)).fetchone()
    if row is not None:
        raise PolicyError(
            f"this run already published release {row[0]}; retrying it would spend the budget "
            "a second time. To release again, start a new run (Run > Quick run or Custom run "
            "on the deployment). Nothing was spent.")


def _claim_input(conn: sqlite3.Connection, request: SpendRequest) -> None:
    """Tie the config's extract to its source id; refuse a second id for a known extract."""
    if request.input_key is None:
        return
    row = conn.execute("SELECT source, dataset FROM source_inputs WHERE input_key = ?",
                       (request.input_key,)).fetchone()
    if row is None:
        conn.execute("INSERT INTO source_inputs VALUES (?, ?, ?, ?)",
                     (request.input_key, request.source, request.dataset, _now()))
    elif row[0] != request.source:
        raise LedgerSourceError(
            f"dataset {request.dataset!r} names source {request.source!r}, but the ledger "
            f"already records its input file as source {row[0]!r} (first charged by dataset "
            f"{row[1]!r}). Two configs over one extract must share one budget: set "
            f"'privacy: {{source: {row[0]}}}' in the dataset config. Nothing was spent.")


def _source_cap(conn: sqlite3.Connection, request: SpendRequest) -> tuple[float, float]:
    """The source's cap; a new source's cap is fixed now, from the config."""
    row = conn.execute("SELECT lifetime_epsilon, lifetime_delta FROM sources WHERE source = ?",
                       (request.source,)).fetchone()
    if row is not None:
        return float(row[0]), float(row[1])
    conn.execute("INSERT INTO sources (source, lifetime_epsilon, lifetime_delta, created_at) "
                  "VALUES (?, ?, ?, ?)", (request.source, request.lifetime_epsilon,
                                          request.lifetime_delta, _now()))
    return request.lifetime_epsilon, request.lifetime_delta


def _spent(conn: sqlite3.Connection, source: str) -> tuple[float, float]:
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


def reconcile(ledger_path: Path, records: list[dict]) -> None:
    """Refuse a ledger that lacks spends the steward records show (it was lost or emptied).

    Called before every charge. A missing ledger file is not created when records exist: a
    new empty ledger would silently restart every source's budget from zero.
    """
    expected = {r["ledger_spend_id"]: r for r in records if r.get("ledger_spend_id")}
    if not expected:
        return
    known: set[str] = set()
    if ledger_path.is_file():
        with Ledger(ledger_path)._connect() as conn:
            tables = {r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "spends" in tables:
                known = {r[0] for r in conn.execute("SELECT spend_id FROM spends")}
    lost = [r for spend_id, r in expected.items() if spend_id not in known]
    if lost:
        examples = ", ".join(sorted(r["release_id"] for r in lost)[:3])
        state = "is missing" if not ledger_path.is_file() else "does not hold"
        raise LedgerIntegrityError(
            f"the budget ledger {ledger_path} {state} {len(lost)} spend(s) that the steward "
            f"records show (releases {examples}{' ...' if len(lost) > 3 else ''}): it was lost, "
            "emptied or replaced, and its budgets would restart from zero. Nothing was spent. "
            "Restore the ledger file from backup, or rebuild it from the records with "
            "'medrelease ledger restore'.")


def restore_from_records(ledger_path: Path, records: list[dict]) -> int:
    """Rebuild a ledger from the steward records' charges; returns how many spends it holds.

    Refuses to touch a ledger that already holds spends. Reservations of runs that crashed
    before writing a steward record cannot be recovered (the command says so).
    """
    if ledger_path.is_file() and Ledger(ledger_path).spends():
        raise MedreleaseError(f"the ledger {ledger_path} already holds spends; restore only "
                              "into a missing or empty ledger (move the old file aside first)")
    ledger = Ledger(ledger_path)
    status = {"published": "released", "failed": "failed"}
    with ledger._transaction() as conn:
        for record in sorted(records, key=lambda r: r["release_id"].removeprefix("TEST-")):
            charge = record.get("ledger_charge")
            if not charge:
                continue
            conn.execute(
                "INSERT OR IGNORE INTO sources (source, lifetime_epsilon, lifetime_delta, "
                "created_at) VALUES (?, ?, ?, ?)",
                (charge["source"], charge["cap_epsilon"], charge["cap_delta"], _now()))
            conn.execute(
                f"INSERT INTO spends ({', '.join(SPEND_FIELDS)}) "
                f"VALUES ({', '.join('?' * len(SPEND_FIELDS))})",
                (record["ledger_spend_id"], record["dataset"], charge["mechanism"],
                 charge["epsilon"], charge["delta"], charge["cap_epsilon"],
                 charge["cap_delta"], record.get("flow_run_id"),
                 status.get(record.get("status"), "reserved"), record["release_id"],
                 "restored from the steward record", _now(), _now(), charge["source"],
                 int(record.get("test_release", False)), int(charge["dp"])))
            if not charge["dp"]:
                conn.execute("UPDATE sources SET void_spend = ?, void_reason = ? WHERE source "
                             "= ? AND void_spend IS NULL",
                             (record["ledger_spend_id"], f"a {charge['mechanism']} release (no "
                              "proven DP guarantee) was made", charge["source"]))
    return len(ledger.spends())
