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

import json
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
# Columns added after the first schema; old ledgers are migrated in place.
SPEND_COLUMNS = {"source": "TEXT", "test": "INTEGER NOT NULL DEFAULT 0",
                 "dp": "INTEGER NOT NULL DEFAULT 1"}
SOURCE_COLUMNS = {"policy": "TEXT", "owner_config": "TEXT"}
# The product's bounds on a lifetime cap (a cap of 1e300 is no cap).
MAX_CAP_EPSILON = 100.0
MAX_CAP_DELTA = 1e-2
MIN_REASON_CHARS = 10
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
    content: tuple[str, ...] = ()        # every file's SHA-256 and 'rows:' + its row digest
    policy: str | None = None            # the config's policy (JSON), recorded for the source
    config_path: str | None = None       # the dataset YAML that made the request


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
        if self.cap_history:
            last = self.cap_history[-1]
            spent += (f"; the cap was changed from epsilon {last['old_epsilon']:g} to "
                      f"{last['new_epsilon']:g} on {last['changed_on']} ({last['reason']})")
        if self.void:
            return (f"Lifetime guarantee VOID: {self.void_reason}. ({spent}; each release's "
                    "own guarantee, in its manifest, still holds for that release alone.)")
        return (f"All releases of source '{self.source}' together are ({self.epsilon_spent:g}, "
                f"{self.delta_spent:g})-DP ({spent}).")

    def public(self) -> dict:
        """What a manifest may carry: sums of earlier releases' public parameters, the cap."""
        return {"source": self.source, "epsilon_spent": self.epsilon_spent,
                "delta_spent": self.delta_spent, "epsilon_cap": self.lifetime_epsilon,
                "delta_cap": self.lifetime_delta, "cap_changes": list(self.cap_history),
                "void": self.void, "void_reason": self.void_reason,
                "statement": self.statement()}


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

    @property
    def journal_path(self) -> Path:
        """The append-only journal of cap changes beside the ledger (``restore`` replays it)."""
        return self.journal_path_for(self.path)

    @staticmethod
    def journal_path_for(ledger_path: Path) -> Path:
        return ledger_path.with_name(ledger_path.name + ".caps.jsonl")

    def reserve(self, request: SpendRequest) -> str:
        """Reserve a spend, or refuse it (``BudgetExceededError``) if it would overspend.

        The message shows spent / requested / cap. Nothing is written when refused.
        """
        for name, value in (("epsilon", request.epsilon), ("delta", request.delta)):
            if not (math.isfinite(value) and value >= 0):
                raise BudgetExceededError(f"{name} to reserve must be a finite number >= 0")
        spend_id = uuid.uuid4().hex
        with self._transaction() as conn:
            _refuse_a_second_charge_of_one_run(conn, request)
            _claim_input(conn, request)
            _claim_content(conn, request)
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
        return spend_id

    def mark(self, spend_id: str, status: str, release_id: str | None = None,
             note: str | None = None) -> None:
        """Move a reservation to 'released' or 'failed' (it keeps counting either way). A
        release without a proven DP guarantee voids its source's lifetime guarantee when it
        is *published*; a refused or failed run never does (nothing of it was released)."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}")
        with self._transaction() as conn:
            cur = conn.execute(
                "UPDATE spends SET status = ?, release_id = COALESCE(?, release_id), "
                "note = COALESCE(?, note), updated_at = ? WHERE spend_id = ?",
                (status, release_id, note, _now(), spend_id),
            )
            if cur.rowcount != 1:
                raise MedreleaseError(f"no ledger entry {spend_id}")
            if status == "released":
                _void_if_unproven(conn, spend_id)

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
        history = tuple({"changed_on": changed_at[:10], "old_epsilon": old_eps,
                         "new_epsilon": new_eps, "old_delta": old_delta, "new_delta": new_delta,
                         "reason": reason}
                        for _, old_eps, new_eps, old_delta, new_delta, reason, changed_at
                        in self.cap_changes(source))
        return BudgetState(source, eps_spent, delta_spent, cap_eps, cap_delta, test_eps,
                           void, note, history)

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
        if not (math.isfinite(epsilon) and 0 < epsilon <= MAX_CAP_EPSILON
                and math.isfinite(delta) and 0 <= delta <= MAX_CAP_DELTA):
            raise MedreleaseError(
                f"the cap needs 0 < epsilon <= {MAX_CAP_EPSILON:g} and 0 <= delta <= "
                f"{MAX_CAP_DELTA:g} (the product's bounds: a larger cap protects no one)")
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
            change = {"source": source, "old_epsilon": row[0], "new_epsilon": epsilon,
                      "old_delta": row[1], "new_delta": delta, "reason": reason.strip(),
                      "changed_at": _now()}
            _insert_cap_change(conn, change)
            _append_journal(self.journal_path, change)  # before COMMIT: no change unjournaled

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
    have_sources = {row[1] for row in conn.execute("PRAGMA table_info(sources)")}
    for column, kind in SOURCE_COLUMNS.items():
        if column not in have_sources:
            conn.execute(f"ALTER TABLE sources ADD COLUMN {column} {kind}")
    conn.execute("UPDATE spends SET source = dataset WHERE source IS NULL")
    conn.execute(
        "INSERT OR IGNORE INTO sources (source, lifetime_epsilon, lifetime_delta, created_at) "
        "SELECT source, lifetime_epsilon, lifetime_delta, MIN(created_at) FROM spends "
        "GROUP BY source")
    conn.execute("CREATE INDEX IF NOT EXISTS spends_source ON spends (source)")


def _refuse_a_second_charge_of_one_run(conn: sqlite3.Connection,
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
        "deployment) after fixing the cause shown in the failed run's log; 'medrelease ledger "
        "show' lists the spend. Nothing was spent.")


def _claim_content(conn: sqlite3.Connection, request: SpendRequest) -> None:
    """Tie every file content read to the source charged; refuse a second source for it. The
    budget follows the data: a second YAML over the same extract (a copy, a new source name,
    another input path) cannot open a fresh budget. A claim is a file's byte hash or, prefixed
    ``rows:``, the digest of its parsed rows (``medrelease.data.content``): the same rows in
    another format, line ends, quoting or column order are the same content."""
    for sha256 in request.content:
        row = conn.execute("SELECT source, dataset FROM content_claims WHERE sha256 = ?",
                           (sha256,)).fetchone()
        if row is None:
            conn.execute("INSERT INTO content_claims VALUES (?, ?, ?, ?)",
                         (sha256, request.source, request.dataset, _now()))
        elif row[0] != request.source:
            same = ("the same rows, in whatever format" if sha256.startswith("rows:")
                    else f"same content, SHA-256 {sha256[:12]}...")
            raise LedgerSourceError(
                f"dataset {request.dataset!r} charges source {request.source!r}, but a file it "
                f"reads ({same}) was already charged to source "
                f"{row[0]!r} (first by dataset {row[1]!r}). One extract has one lifetime "
                f"budget, whatever config names it: release it with a config of source "
                f"{row[0]!r}. Nothing was spent.")


def _void_if_unproven(conn: sqlite3.Connection, spend_id: str) -> None:
    row = conn.execute("SELECT dp, mechanism, dataset, test, source FROM spends WHERE "
                       "spend_id = ?", (spend_id,)).fetchone()
    if row is None or row[0]:
        return
    _, mechanism, dataset, test, source = row
    # no clock or id in the reason: it is published in every later manifest
    reason = (f"a {mechanism} release (no proven DP guarantee) of dataset '{dataset}' was made"
              + (" (a TEST release)" if test else ""))
    conn.execute("UPDATE sources SET void_spend = ?, void_reason = ? WHERE source = ? AND "
                 "void_spend IS NULL", (spend_id, reason, source))


def _insert_cap_change(conn: sqlite3.Connection, change: dict) -> None:
    conn.execute("INSERT INTO cap_changes (source, old_epsilon, new_epsilon, old_delta, "
                 "new_delta, reason, changed_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                 (change["source"], change["old_epsilon"], change["new_epsilon"],
                  change["old_delta"], change["new_delta"], change["reason"],
                  change["changed_at"]))


def _append_journal(path: Path, change: dict) -> None:
    """One line per cap change, flushed to disk before the ledger commits it."""
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(change, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_journal(path: Path) -> list[dict]:
    """The cap changes journaled beside a ledger, oldest first (none if there is no journal)."""
    if not path.is_file():
        return []
    changes = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            changes.append(json.loads(line))
        except json.JSONDecodeError:
            raise LedgerIntegrityError(f"the cap journal {path} is damaged at line {number}; "
                                       "restore it from backup") from None
    return changes


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
    row = conn.execute("SELECT lifetime_epsilon, lifetime_delta, owner_config FROM sources "
                       "WHERE source = ?", (request.source,)).fetchone()
    if row is not None:
        owner = row[2]
        if request.policy and (owner is None or owner == request.config_path):
            # the source's own config may change its policy; another config never does
            conn.execute("UPDATE sources SET policy = ?, owner_config = ? WHERE source = ?",
                         (request.policy, request.config_path, request.source))
        return float(row[0]), float(row[1])
    conn.execute("INSERT INTO sources (source, lifetime_epsilon, lifetime_delta, created_at, "
                 "policy, owner_config) VALUES (?, ?, ?, ?, ?, ?)",
                 (request.source, request.lifetime_epsilon, request.lifetime_delta, _now(),
                  request.policy, request.config_path))
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


def published_charges(manifests: list[dict]) -> list[dict]:
    """Charges as the published manifests state them (source, mechanism, eps, delta, cap), in
    the steward records' shape, for releases whose steward record is gone."""
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
                "cap_delta": float(lifetime.get("delta_cap") or 0.0)}})
    return charges


def reconcile(ledger_path: Path, records: list[dict], manifests: list[dict] = ()) -> None:
    """Refuse a ledger that lacks spends the steward records or the published releases show,
    or whose caps differ from its journal (a table dropped, a file replaced).

    Called before every charge. A missing ledger file is not created when records or releases
    exist: a new empty ledger would silently restart every source's budget from zero.
    """
    known_spends, known_releases, caps = _ledger_contents(ledger_path)
    lost = [r["release_id"] for r in records
            if r.get("ledger_spend_id") and r["ledger_spend_id"] not in known_spends]
    lost += [m["release_id"] for m in manifests if m["release_id"] not in known_releases
             and m["release_id"] not in lost]
    if lost:
        examples = ", ".join(sorted(lost)[:3])
        state = "is missing" if not ledger_path.is_file() else "does not hold"
        raise LedgerIntegrityError(
            f"the budget ledger {ledger_path} {state} the spends of {len(lost)} release(s) on "
            f"record ({examples}{' ...' if len(lost) > 3 else ''}): it was lost, emptied or "
            "replaced, and its budgets would restart from zero. Nothing was spent. Restore the "
            "ledger file from backup, or rebuild it with 'medrelease ledger restore' (from the "
            "steward records, and from the published manifests where those are gone).")
    for change in _last_cap_per_source(read_journal(Ledger.journal_path_for(ledger_path))):
        have = caps.get(change["source"])
        if have is None or not (math.isclose(have[0], change["new_epsilon"])
                                and math.isclose(have[1], change["new_delta"], abs_tol=1e-18)):
            raise LedgerIntegrityError(
                f"source {change['source']!r}: the ledger's cap "
                f"{'is missing' if have is None else f'is epsilon {have[0]:g}'} but its cap "
                f"journal says epsilon {change['new_epsilon']:g} (changed "
                f"{change['changed_at'][:10]}: {change['reason']}). The ledger was altered; "
                "nothing was spent. Restore it from backup, or move it aside and run "
                "'medrelease ledger restore' (which replays the journal).")


def _ledger_contents(ledger_path: Path) -> tuple[set[str], set[str], dict[str, tuple]]:
    """(spend ids, release ids, caps per source) of a ledger file, without creating it."""
    if not ledger_path.is_file():
        return set(), set(), {}
    with Ledger(ledger_path)._connect() as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = "
                                             "'table'")}
        if "spends" not in tables:
            return set(), set(), {}
        rows = conn.execute("SELECT spend_id, release_id FROM spends").fetchall()
        caps = ({r[0]: (r[1], r[2]) for r in conn.execute(
            "SELECT source, lifetime_epsilon, lifetime_delta FROM sources")}
            if "sources" in tables else {})
    return {r[0] for r in rows}, {r[1] for r in rows if r[1]}, caps


def _last_cap_per_source(changes: list[dict]) -> list[dict]:
    last: dict[str, dict] = {}
    for change in changes:
        last[change["source"]] = change
    return list(last.values())


def restore_from_records(ledger_path: Path, records: list[dict],
                         manifests: list[dict] = ()) -> int:
    """Rebuild a ledger from the steward records' charges (and, for releases whose record is
    gone, from their published manifests), then replay the cap journal; returns how many
    spends it holds.

    Refuses to touch a ledger that already holds spends. Reservations of runs that crashed
    before writing a steward record cannot be recovered (the command says so).
    """
    if ledger_path.is_file() and Ledger(ledger_path).spends():
        raise MedreleaseError(f"the ledger {ledger_path} already holds spends; restore only "
                              "into a missing or empty ledger (move the old file aside first)")
    ledger = Ledger(ledger_path)
    on_record = {r["release_id"] for r in records}
    charges = [*records, *(m for m in published_charges(list(manifests))
                           if m["release_id"] not in on_record)]
    with ledger._transaction() as conn:
        for record in sorted(charges, key=lambda r: r["release_id"].removeprefix("TEST-")):
            if record.get("ledger_charge"):
                _restore_spend(conn, record)
        for change in read_journal(ledger.journal_path):
            conn.execute("UPDATE sources SET lifetime_epsilon = ?, lifetime_delta = ? WHERE "
                         "source = ?", (change["new_epsilon"], change["new_delta"],
                                        change["source"]))
            _insert_cap_change(conn, change)
    return len(ledger.spends())


def _restore_spend(conn: sqlite3.Connection, record: dict) -> None:
    charge = record["ledger_charge"]
    status = {"published": "released", "failed": "failed"}.get(record.get("status"), "reserved")
    note = ("restored from the published manifest" if record.get("from_manifest")
            else "restored from the steward record")
    conn.execute(
        "INSERT OR IGNORE INTO sources (source, lifetime_epsilon, lifetime_delta, created_at) "
        "VALUES (?, ?, ?, ?)", (charge["source"], charge["cap_epsilon"], charge["cap_delta"],
                                _now()))
    conn.execute(
        f"INSERT INTO spends ({', '.join(SPEND_FIELDS)}) "
        f"VALUES ({', '.join('?' * len(SPEND_FIELDS))})",
        (record["ledger_spend_id"], record["dataset"], charge["mechanism"], charge["epsilon"],
         charge["delta"], charge["cap_epsilon"], charge["cap_delta"], record.get("flow_run_id"),
         status, record["release_id"], note, _now(), _now(), charge["source"],
         int(record.get("test_release", False)), int(charge["dp"])))
    if status == "released" and not charge["dp"]:
        _void_if_unproven(conn, record["ledger_spend_id"])
