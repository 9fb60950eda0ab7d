"""The budget ledger on PostgreSQL: one ledger for every host that releases, append-only for the
service that charges it.

Selected by ``MEDRELEASE_LEDGER_URL=postgresql://...`` (SQLite stays the default). The rules are
the SQLite ledger's, run by the same code (``medrelease.privacy.ledger``): a reservation is
checked against the source's cap and journaled inside one transaction that holds the ledger's
advisory lock, so reservations from any number of hosts are serialized — one lock for the whole
ledger, not one per source, because the journal is one hash chain and content claims span
sources (a reservation takes milliseconds; a release's minutes of work are outside it).

What differs is how a change is kept. Every change is an *inserted row*: a reservation, an
outcome (status, release, note — the current status is the latest, shown by the ``spends``
view), a source's first cap, a policy, a content or input claim, a cap change; the ``sources``
view shows a source's current cap, policy and void. Beside them, ``ledger_events`` is the
journal: every change as the JSON line the SQLite journal would hold, each row hashed with the
one before it (a hash chain). ``medrelease ledger init-db`` (``init_db``) creates an *owner*
role that owns the schema and a *service* role that may only SELECT and INSERT: the database
itself refuses its UPDATE, DELETE, TRUNCATE and DDL. A cap changes only through the
``medrelease_set_cap`` function, which checks the change and journals it in the same
transaction.

An owner (or superuser) can still edit or delete rows. ``verify`` (before every charge, and
``medrelease ledger verify``) finds it: the chain must run 1..N with every hash matching, the
tables must equal a replay of the chain, and the chain must still hold the newest event this
host saw (kept in ``ledger-head.json`` under ``MEDRELEASE_HOME``), so that removing the newest
events with their rows is caught too.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from medrelease.errors import MedreleaseError
from medrelease.privacy.journal import GENESIS_HASH, HEAD_FILE, HeadFile, TableJournal
from medrelease.privacy.ledger import (
    MAX_CAP_DELTA,
    MAX_CAP_EPSILON,
    MAX_LISTED,
    MIN_REASON_CHARS,
    TOLERANCE,
    BudgetLedger,
    LedgerConnection,
    LedgerIntegrityError,
    LedgerLockedError,
    refuse_releases_not_in_settled,
)
from medrelease.privacy.ledger_url import redacted, scrubbed, with_user_and_database

SCHEMA_NAME = "medrelease"
OWNER_ROLE = "medrelease_owner"
SERVICE_ROLE = "medrelease_service"
# pg_advisory_xact_lock key of the ledger's write lock ("medrelease" in ASCII, as a bigint)
LOCK_KEY = 0x6D6564_72656C65

# Migration 2 (issue 56, holes 5 and 7): the product's bounds held by the database itself, so
# that a row the service role appends can never hold what the Python checks refuse. A plain
# ``CHECK (epsilon >= 0)`` accepts NaN (PostgreSQL orders NaN above every number), so every
# bound has an upper end as well (NaN and +Infinity fail ``<= 100``, -Infinity fails ``>= 0``)
# and says ``<> 'NaN'`` outright. A journal event's body must be a JSON object of its kind whose
# numbers are numbers within the same bounds (NaN and Infinity are not JSON): the replay of
# the journal never meets a value the tables could not hold. ``ALTER TABLE ... ADD
# CONSTRAINT`` checks the rows already there: a database holding a row that breaks a bound is
# not migrated (``migrate`` says why; nothing is changed).
_EPSILON = f"BETWEEN 0 AND {MAX_CAP_EPSILON}"
_DELTA = f"BETWEEN 0 AND {MAX_CAP_DELTA}"


def _bounded(*columns_and_bounds: tuple[str, str]) -> str:
    return " AND ".join(f"{column} <> 'NaN' AND {column} {bound}"
                        for column, bound in columns_and_bounds)


_BOUNDS_SQL = f"""
ALTER TABLE spend_reservations
    ADD CONSTRAINT spend_reservations_spend_bounds
        CHECK ({_bounded(("epsilon", _EPSILON), ("delta", _DELTA))}),
    ADD CONSTRAINT spend_reservations_cap_bounds
        CHECK ({_bounded(("lifetime_epsilon", _EPSILON), ("lifetime_delta", _DELTA))});
ALTER TABLE source_caps
    ADD CONSTRAINT source_caps_bounds
        CHECK ({_bounded(("lifetime_epsilon", _EPSILON), ("lifetime_delta", _DELTA))}
               AND lifetime_epsilon > 0);
ALTER TABLE cap_changes
    ADD CONSTRAINT cap_changes_bounds
        CHECK ({_bounded(("old_epsilon", _EPSILON), ("old_delta", _DELTA),
                         ("new_epsilon", _EPSILON), ("new_delta", _DELTA))}
               AND new_epsilon > 0);

-- What is wrong with a journal event (NULL: nothing). IMMUTABLE: a CHECK constraint calls it.
CREATE FUNCTION medrelease_event_problem(p_kind text, p_body text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    event jsonb;
    request jsonb;
BEGIN
    BEGIN
        event := p_body::jsonb;
    EXCEPTION WHEN others THEN
        RETURN 'its body is not JSON (NaN and Infinity are not numbers there)';
    END;
    IF jsonb_typeof(event) IS DISTINCT FROM 'object'
            OR event->>'event' IS DISTINCT FROM p_kind THEN
        RETURN 'its body is not a ' || p_kind || ' event';
    END IF;
    IF p_kind = 'reserve' THEN
        request := event->'request';
        IF jsonb_typeof(request) IS DISTINCT FROM 'object'
                OR jsonb_typeof(request->'epsilon') IS DISTINCT FROM 'number'
                OR jsonb_typeof(request->'delta') IS DISTINCT FROM 'number'
                OR jsonb_typeof(request->'lifetime_epsilon') IS DISTINCT FROM 'number'
                OR jsonb_typeof(request->'lifetime_delta') IS DISTINCT FROM 'number'
                OR NOT (request->>'epsilon')::numeric {_EPSILON}
                OR NOT (request->>'delta')::numeric {_DELTA}
                OR NOT (request->>'lifetime_epsilon')::numeric > 0
                OR NOT (request->>'lifetime_delta')::numeric >= 0 THEN
            RETURN 'its request''s epsilon, delta and cap are not numbers within the bounds';
        END IF;
    ELSIF p_kind = 'outcome' THEN
        IF event->>'status' IS NULL
                OR event->>'status' NOT IN ('reserved', 'released', 'failed') THEN
            RETURN 'its status is not reserved, released or failed';
        END IF;
    ELSIF p_kind = 'cap' THEN
        IF jsonb_typeof(event->'new_epsilon') IS DISTINCT FROM 'number'
                OR jsonb_typeof(event->'new_delta') IS DISTINCT FROM 'number'
                OR NOT (event->>'new_epsilon')::numeric {_EPSILON}
                OR NOT (event->>'new_epsilon')::numeric > 0
                OR NOT (event->>'new_delta')::numeric {_DELTA} THEN
            RETURN 'its new cap is not within the bounds';
        END IF;
    END IF;
    RETURN NULL;
END $$;
ALTER TABLE ledger_events
    ADD CONSTRAINT ledger_events_body_bounds
        CHECK (medrelease_event_problem(kind, body) IS NULL);
"""

# The versioned schema: applied in order by ``init_db`` (as the owner role), recorded in
# ``schema_migrations``. A service refuses a database whose version is not its own.
MIGRATIONS: tuple[tuple[int, str, str], ...] = ((1, "append-only ledger", f"""
CREATE SEQUENCE ledger_order;
CREATE TABLE ledger_events (
    seq         BIGINT PRIMARY KEY CHECK (seq > 0),
    at          TEXT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('reserve', 'outcome', 'cap')),
    body        TEXT NOT NULL,
    prev_hash   TEXT NOT NULL,
    hash        TEXT NOT NULL UNIQUE,
    recorded_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    recorded_by TEXT NOT NULL DEFAULT current_user
);
CREATE TABLE source_caps (
    source           TEXT PRIMARY KEY,
    lifetime_epsilon DOUBLE PRECISION NOT NULL,
    lifetime_delta   DOUBLE PRECISION NOT NULL,
    created_at       TEXT NOT NULL,
    seq              BIGINT NOT NULL DEFAULT nextval('ledger_order')
);
CREATE TABLE source_policies (
    seq          BIGINT PRIMARY KEY DEFAULT nextval('ledger_order'),
    source       TEXT NOT NULL REFERENCES source_caps,
    policy       TEXT,
    owner_config TEXT
);
CREATE TABLE spend_reservations (
    spend_id         TEXT PRIMARY KEY,
    dataset          TEXT NOT NULL,
    mechanism        TEXT NOT NULL,
    epsilon          DOUBLE PRECISION NOT NULL CHECK (epsilon >= 0),
    delta            DOUBLE PRECISION NOT NULL CHECK (delta >= 0),
    lifetime_epsilon DOUBLE PRECISION NOT NULL,
    lifetime_delta   DOUBLE PRECISION NOT NULL,
    flow_run_id      TEXT,
    created_at       TEXT NOT NULL,
    source           TEXT NOT NULL REFERENCES source_caps,
    test             BOOLEAN NOT NULL,
    dp               BOOLEAN NOT NULL,
    privacy_unit     TEXT,
    seq              BIGINT NOT NULL UNIQUE DEFAULT nextval('ledger_order')
);
CREATE INDEX spend_reservations_source ON spend_reservations (source);
CREATE INDEX spend_reservations_run ON spend_reservations (flow_run_id);
CREATE TABLE spend_outcomes (
    seq         BIGINT PRIMARY KEY DEFAULT nextval('ledger_order'),
    spend_id    TEXT NOT NULL REFERENCES spend_reservations,
    status      TEXT NOT NULL CHECK (status IN ('reserved', 'released', 'failed')),
    release_id  TEXT,
    note        TEXT,
    at          TEXT NOT NULL,
    void_reason TEXT
);
CREATE INDEX spend_outcomes_spend ON spend_outcomes (spend_id);
-- one release id is published once, whichever host publishes it
CREATE UNIQUE INDEX spend_outcomes_release ON spend_outcomes (release_id)
    WHERE status = 'released';
CREATE TABLE content_claims (
    sha256     TEXT PRIMARY KEY,
    source     TEXT NOT NULL,
    dataset    TEXT NOT NULL,
    first_seen TEXT NOT NULL,
    seq        BIGINT NOT NULL DEFAULT nextval('ledger_order')
);
CREATE TABLE source_inputs (
    input_key  TEXT PRIMARY KEY,
    source     TEXT NOT NULL,
    dataset    TEXT NOT NULL,
    first_seen TEXT NOT NULL,
    seq        BIGINT NOT NULL DEFAULT nextval('ledger_order')
);
CREATE TABLE cap_changes (
    change_id   BIGINT PRIMARY KEY,
    source      TEXT NOT NULL REFERENCES source_caps,
    old_epsilon DOUBLE PRECISION NOT NULL,
    new_epsilon DOUBLE PRECISION NOT NULL,
    old_delta   DOUBLE PRECISION NOT NULL,
    new_delta   DOUBLE PRECISION NOT NULL,
    reason      TEXT NOT NULL,
    changed_at  TEXT NOT NULL
);

-- The current state, as the SQLite ledger's tables of the same names hold it.
CREATE VIEW spends AS
SELECT r.spend_id, r.dataset, r.mechanism, r.epsilon, r.delta, r.lifetime_epsilon,
       r.lifetime_delta, r.flow_run_id, COALESCE(latest.status, 'reserved') AS status,
       (SELECT o.release_id FROM spend_outcomes o WHERE o.spend_id = r.spend_id
          AND o.release_id IS NOT NULL ORDER BY o.seq DESC LIMIT 1) AS release_id,
       (SELECT o.note FROM spend_outcomes o WHERE o.spend_id = r.spend_id
          AND o.note IS NOT NULL ORDER BY o.seq DESC LIMIT 1) AS note,
       r.created_at, COALESCE(latest.at, r.created_at) AS updated_at, r.source,
       r.test::int AS test, r.dp::int AS dp, r.privacy_unit, r.seq AS rowid
FROM spend_reservations r
LEFT JOIN LATERAL (SELECT o.status, o.at FROM spend_outcomes o WHERE o.spend_id = r.spend_id
                   ORDER BY o.seq DESC LIMIT 1) latest ON true;

CREATE VIEW sources AS
SELECT s.source,
       COALESCE((SELECT c.new_epsilon FROM cap_changes c WHERE c.source = s.source
                 ORDER BY c.change_id DESC LIMIT 1), s.lifetime_epsilon) AS lifetime_epsilon,
       COALESCE((SELECT c.new_delta FROM cap_changes c WHERE c.source = s.source
                 ORDER BY c.change_id DESC LIMIT 1), s.lifetime_delta) AS lifetime_delta,
       s.created_at, v.spend_id AS void_spend, v.void_reason, p.policy, p.owner_config
FROM source_caps s
LEFT JOIN LATERAL (SELECT o.spend_id, o.void_reason FROM spend_outcomes o
                   JOIN spend_reservations r ON r.spend_id = o.spend_id
                   WHERE r.source = s.source AND o.void_reason IS NOT NULL
                   ORDER BY o.seq LIMIT 1) v ON true
LEFT JOIN LATERAL (SELECT p.policy, p.owner_config FROM source_policies p
                   WHERE p.source = s.source ORDER BY p.seq DESC LIMIT 1) p ON true;

-- The one way to change a cap: checked, applied and journaled in one transaction, under the
-- ledger's lock. SECURITY DEFINER: it runs as the owner, the service may only EXECUTE it.
CREATE FUNCTION medrelease_set_cap(
    p_source text, p_epsilon double precision, p_delta double precision, p_reason text,
    p_at text DEFAULT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS') || '+00:00')
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = {SCHEMA_NAME}, pg_temp AS $$
DECLARE
    cap record;
    spent record;
    last record;
    body text;
    prev text;
BEGIN
    PERFORM pg_advisory_xact_lock({LOCK_KEY});
    IF length(btrim(p_reason)) < {MIN_REASON_CHARS} THEN
        RAISE EXCEPTION 'a cap change needs a reason of at least {MIN_REASON_CHARS} characters';
    END IF;
    IF NOT (p_epsilon > 0 AND p_epsilon <= {MAX_CAP_EPSILON} AND p_delta >= 0
            AND p_delta <= {MAX_CAP_DELTA}) THEN
        RAISE EXCEPTION 'the cap needs 0 < epsilon <= {MAX_CAP_EPSILON:g} and '
                        '0 <= delta <= {MAX_CAP_DELTA:g}';
    END IF;
    SELECT lifetime_epsilon, lifetime_delta INTO cap FROM sources WHERE source = p_source;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no source % in the ledger', p_source;
    END IF;
    SELECT COALESCE(SUM(epsilon), 0) AS eps, COALESCE(SUM(delta), 0) AS delta INTO spent
        FROM spend_reservations WHERE source = p_source;
    IF p_epsilon < spent.eps - {TOLERANCE} OR p_delta < spent.delta - 1e-15 THEN
        RAISE EXCEPTION 'source % has already spent epsilon %, delta %: the cap cannot go '
                        'below that', p_source, spent.eps, spent.delta;
    END IF;
    INSERT INTO cap_changes (change_id, source, old_epsilon, new_epsilon, old_delta, new_delta,
                             reason, changed_at)
    VALUES ((SELECT COALESCE(MAX(change_id), 0) + 1 FROM cap_changes), p_source,
            cap.lifetime_epsilon, p_epsilon, cap.lifetime_delta, p_delta, btrim(p_reason), p_at);
    body := jsonb_build_object('event', 'cap', 'at', p_at, 'source', p_source,
                               'old_epsilon', cap.lifetime_epsilon, 'new_epsilon', p_epsilon,
                               'old_delta', cap.lifetime_delta, 'new_delta', p_delta,
                               'reason', btrim(p_reason), 'changed_at', p_at)::text;
    SELECT seq, hash INTO last FROM ledger_events ORDER BY seq DESC LIMIT 1;
    prev := COALESCE(last.hash, '{GENESIS_HASH}');
    INSERT INTO ledger_events (seq, at, kind, body, prev_hash, hash)
    VALUES (COALESCE(last.seq, 0) + 1, p_at, 'cap', body, prev,
            encode(sha256(convert_to(prev || body, 'UTF8')), 'hex'));
END $$;

-- A cap event journaled by anyone but the owner (i.e. not through medrelease_set_cap) is
-- refused: the service may append reservations and outcomes only.
CREATE FUNCTION medrelease_guard_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.kind = 'cap' AND current_user <> (SELECT tableowner FROM pg_tables
            WHERE schemaname = TG_TABLE_SCHEMA AND tablename = TG_TABLE_NAME) THEN
        RAISE EXCEPTION 'a cap change is journaled only by medrelease_set_cap';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER ledger_events_guard BEFORE INSERT ON ledger_events
    FOR EACH ROW EXECUTE FUNCTION medrelease_guard_event();
"""), (2, "bounds as constraints", _BOUNDS_SQL))
SCHEMA_VERSION = MIGRATIONS[-1][0]
# What the service may do, per object (init_db grants exactly this, nothing else).
SERVICE_INSERTS = ("ledger_events", "source_caps", "source_policies", "spend_reservations",
                   "spend_outcomes", "content_claims", "source_inputs")
SERVICE_READS = ("cap_changes", "spends", "sources", "schema_migrations")
# The ledger tables a verify compares with the replayed journal (views where the state is
# derived), with the SQLite ledger's table names.
COMPARED = ("spends", "sources", "source_inputs", "content_claims", "cap_changes")


def _full_url(location: str) -> str:
    """A redacted location gets its password back from ``MEDRELEASE_LEDGER_URL`` when that
    names the same database (tasks are handed the redacted form: Prefect stores parameters)."""
    configured = os.environ.get("MEDRELEASE_LEDGER_URL", "")
    if configured and redacted(configured) == location:
        return configured
    return location


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:  # pragma: no cover - psycopg is a dependency
        raise MedreleaseError("a PostgreSQL ledger (MEDRELEASE_LEDGER_URL) needs psycopg 3: "
                              "pip install 'psycopg[binary]'") from None
    return psycopg


class _PgConnection:
    """A psycopg connection as the ledger's shared queries use it: ``?`` placeholders, and
    ``append_only`` set, so that every change is written as inserted rows."""

    append_only = True

    def __init__(self, conn: Any) -> None:
        self.raw = conn

    def execute(self, sql: str, parameters: Any = ()) -> Any:
        return self.raw.execute(sql.replace("?", "%s"), tuple(parameters))


class PostgresLedger(BudgetLedger):
    """The ledger in a PostgreSQL database made by ``init_db`` (its schema at
    ``SCHEMA_VERSION``); safe to use from any number of processes and hosts at once."""

    altered = "Rows were deleted or edited by a role allowed to (the owner, a superuser)"
    remedy = ("Restore the database from backup, or rebuild it into a new database with "
              "'medrelease ledger restore'.")
    head_cause = "the newest changes were removed, or the database was replaced by an older copy"
    head_remedy = remedy
    head_first = True

    def __init__(self, url: str, head_file: Path | None = None,
                 timeout_s: float | None = None) -> None:
        self.url = _full_url(url)
        self.location = redacted(self.url)
        self.journal = TableJournal()
        self.heads = HeadFile(head_file if head_file is not None else _default_head_file())
        self.head_key = self.location
        self.timeout_s = timeout_s if timeout_s is not None else float(
            os.environ.get("MEDRELEASE_LEDGER_TIMEOUT_S", "30"))
        self._import: list[dict] = []  # journal events a restore replays (from SQLite)
        self._raw: Any = None  # one connection per ledger object, reused (connecting costs)
        self._columns: dict[str, set[str]] | None = None
        with self._connect() as conn:
            _refuse_unmigrated(conn, self.location)

    def close(self) -> None:
        if self._raw is not None:
            self._raw.close()
            self._raw = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def _connection(self) -> Any:
        psycopg = _psycopg()
        if self._raw is not None and not self._raw.closed and not self._raw.broken:
            return self._raw
        try:
            self._raw = psycopg.connect(self.url, autocommit=True, connect_timeout=10,
                                        options=f"-c search_path={SCHEMA_NAME}")
        except psycopg.Error as exc:
            raise MedreleaseError(f"cannot connect to the budget ledger {self.location}: "
                                  f"{type(exc).__name__}: {_first_line(exc, self.url)}") from None
        return self._raw

    @contextmanager
    def _connect(self) -> Iterator[_PgConnection]:
        psycopg = _psycopg()
        raw = self._connection()
        try:
            yield _PgConnection(raw)
        except psycopg.errors.LockNotAvailable:
            raise LedgerLockedError(
                f"the budget ledger {self.location} stayed locked by another release for "
                f"{self.timeout_s:g} s; nothing was spent — try again later") from None
        except psycopg.errors.InsufficientPrivilege as exc:
            raise MedreleaseError(f"the budget ledger {self.location} refused the change: "
                                  f"{_first_line(exc, self.url)}") from None
        except psycopg.OperationalError as exc:  # the server went away: reconnect next time
            self.close()
            raise MedreleaseError(f"the budget ledger {self.location} is unreachable "
                                  f"({_first_line(exc, self.url)})") from None

    @contextmanager
    def _transaction(self) -> Iterator[_PgConnection]:
        """One transaction holding the ledger's write lock (waits at most ``timeout_s``)."""
        with self._connect() as conn, conn.raw.transaction():
            conn.execute(f"SET LOCAL lock_timeout = '{int(self.timeout_s * 1000)}ms'")
            conn.execute("SELECT pg_advisory_xact_lock(?)", (LOCK_KEY,))
            self._head = None
            yield conn
        self._committed()

    # -- the journal (``TableJournal``); a cap change journals itself in the database ---------

    def _apply_and_journal(self, conn: LedgerConnection, event: dict) -> None:
        if event.get("event", "cap") != "cap":
            super()._apply_and_journal(conn, event)
            return
        psycopg = _psycopg()
        try:
            with conn.raw.transaction():  # a savepoint: the refusal leaves the rest intact
                conn.execute("SELECT medrelease_set_cap(?, ?, ?, ?, ?)",
                             (event["source"], float(event["new_epsilon"]),
                              float(event["new_delta"]), event["reason"], event["at"]))
        except psycopg.errors.RaiseException as exc:
            raise MedreleaseError(_first_line(exc, self.url)) from None
        self._head = self.journal.last(conn)

    def _chain_refusal(self, problems: list[str]) -> str:
        return (f"the budget ledger {self.location}: its journal (table ledger_events) was "
                f"altered: {'; '.join(problems[:MAX_LISTED])}. {self.altered}; nothing was "
                f"spent. {self.remedy}")

    @property
    def _replay_where(self) -> str:
        return f"{self.location} (table ledger_events)"

    def _live_columns(self, conn: LedgerConnection) -> dict[str, set[str]]:
        if self._columns is None:  # fixed by the schema version
            self._columns = _columns_of(conn)
        return self._columns

    # -- restore and reconcile ---------------------------------------------------------------

    def restore(self, records: list[dict], manifests: list[dict] = (),
                from_journal: list[dict] | None = None) -> Any:
        """``BudgetLedger.restore`` into a new database (its journal empty): replays a SQLite
        ledger's journal first when given (moving from SQLite to PostgreSQL), then adds the
        releases on record that it lacks. The head this host saw is reset to the new chain's."""
        with self._connect() as conn:
            if conn.execute("SELECT 1 FROM ledger_events LIMIT 1").fetchone():
                raise MedreleaseError(
                    f"the ledger {self.location} already holds journal events; restore only "
                    "into a new database made by 'medrelease ledger init-db'")
        self.forget_head()
        self._import = list(from_journal or [])
        try:
            return super().restore(records, manifests)
        finally:
            self._import = []

    def _replay_for_restore(self, conn: LedgerConnection) -> bool:
        for number, event in enumerate(self._import, start=1):
            if event.get("event") == "adopt":
                raise MedreleaseError(
                    "the SQLite journal starts with an adopted snapshot of an older ledger; "
                    "restore it into a SQLite ledger first, or restore from the steward records "
                    "only")
            try:
                self._apply_and_journal(conn, event)
            except (MedreleaseError, KeyError, TypeError, ValueError) as exc:
                raise LedgerIntegrityError(
                    f"the journal being restored cannot be replayed at its entry {number} "
                    f"({type(exc).__name__}); nothing was restored") from None
        return bool(self._import)

    def reconcile(self, records: list[dict], manifests: list[dict] = ()) -> None:
        """Refuse a ledger that lacks a release on record, or whose journal, head or tables
        were altered (``verify``)."""
        def contents() -> tuple[set[str], set[str]]:
            with self._connect() as conn:
                rows = conn.execute("SELECT spend_id, release_id FROM spends").fetchall()
            return {r[0] for r in rows}, {r[1] for r in rows if r[1]}

        refuse_releases_not_in_settled(self.location, "does not hold", contents, records,
                                       list(manifests))
        self.verify()


def _default_head_file() -> Path:
    from medrelease.settings import data_home

    return data_home() / HEAD_FILE


def _first_line(exc: BaseException, url: str = "") -> str:
    """The driver's message, first line, with the URL's secrets cut out (libpq may quote a
    value it could not decode, a password included)."""
    return scrubbed((str(exc).strip().splitlines() or [type(exc).__name__])[0], url)


def _columns_of(conn: LedgerConnection) -> dict[str, set[str]]:
    """The compared tables and views of the ledger schema, with their columns."""
    columns: dict[str, set[str]] = {}
    for table, column in conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns WHERE "
            "table_schema = ?", (SCHEMA_NAME,)).fetchall():
        if table in COMPARED:
            columns.setdefault(table, set()).add(column)
    return columns


def _schema_version(conn: _PgConnection) -> int | None:
    """The schema's version (None: no ledger schema in this database)."""
    exists = conn.execute("SELECT to_regclass(?)", (f"{SCHEMA_NAME}.schema_migrations",)
                          ).fetchone()[0]
    if exists is None:
        return None
    return conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()[0]


def _refuse_unmigrated(conn: _PgConnection, location: str) -> None:
    version = _schema_version(conn)
    if version == SCHEMA_VERSION:
        return
    if version is None:
        raise MedreleaseError(
            f"the database {location} holds no budget ledger (schema '{SCHEMA_NAME}'): a "
            "database administrator creates it once with 'medrelease ledger init-db "
            "--admin-url postgresql://ADMIN@HOST/DB' (docs/OPERATIONS.md)")
    newer = version > SCHEMA_VERSION
    raise MedreleaseError(
        f"the budget ledger {location} is at schema version {version}, this medrelease "
        f"expects {SCHEMA_VERSION}: "
        + ("upgrade medrelease on this host" if newer else
           "a database administrator migrates it with 'medrelease ledger init-db "
           "--admin-url ...' (it applies the missing versions)"))


def migrate(conn: _PgConnection) -> list[int]:
    """Apply the migrations the schema lacks, in order, each recorded (run as the owner)."""
    conn.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
                 "name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())")
    have = {r[0] for r in conn.execute("SELECT version FROM schema_migrations").fetchall()}
    applied = []
    psycopg = _psycopg()
    for version, name, sql in MIGRATIONS:
        if version in have:
            continue
        try:
            conn.raw.execute(sql)
        except psycopg.errors.CheckViolation as exc:
            raise MedreleaseError(
                f"migration {version} ({name}) cannot be applied: {_first_line(exc)}. The "
                "ledger holds a row that breaks the product's bounds (NaN, infinite or negative "
                f"epsilon or delta, a cap outside 0 < epsilon <= {MAX_CAP_EPSILON:g} and "
                f"0 <= delta <= {MAX_CAP_DELTA:g}, or a journal event that is not JSON): it "
                "was appended while the database allowed it, and replaying it fails already. "
                "Restore the database from a backup taken before it, or rebuild the ledger "
                "into a new database ('medrelease ledger restore'), then run init-db again. "
                "Nothing was changed.") from None
        conn.execute("INSERT INTO schema_migrations (version, name) VALUES (?, ?)",
                     (version, name))
        applied.append(version)
    return applied


def init_db(admin_url: str, owner: str = OWNER_ROLE, service: str = SERVICE_ROLE,
            service_password: str | None = None) -> tuple[str, list[int]]:
    """Create (or migrate) the ledger in the database of ``admin_url`` (a role that may create
    roles and schemas): an owner role (NOLOGIN) owning schema ``medrelease`` and everything in
    it, and a service role (LOGIN) that may SELECT and INSERT only, and EXECUTE
    ``medrelease_set_cap``. Idempotent: run again after an upgrade, it applies the missing
    migrations and re-states the grants. Returns (the service's URL, migrations applied)."""
    psycopg = _psycopg()
    from psycopg import sql

    for role in (owner, service):
        if not role.replace("_", "").isalnum():
            raise MedreleaseError(f"role name {role!r}: letters, digits and '_' only")
    try:
        raw = psycopg.connect(admin_url, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        raise MedreleaseError(f"cannot connect with --admin-url {redacted(admin_url)}: "
                              f"{_first_line(exc, admin_url)}") from None
    with raw:
        conn = _PgConnection(raw)
        existing = {r[0] for r in conn.execute("SELECT rolname FROM pg_roles WHERE rolname IN "
                                               "(?, ?)", (owner, service)).fetchall()}
        if owner not in existing:
            raw.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(owner)))
        if service not in existing:
            raw.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(service)))
        if service_password:
            raw.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                sql.Identifier(service), sql.Literal(service_password)))
        with raw.transaction():
            raw.execute(sql.SQL("GRANT {} TO CURRENT_USER").format(sql.Identifier(owner)))
            raw.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {} AUTHORIZATION {}").format(
                sql.Identifier(SCHEMA_NAME), sql.Identifier(owner)))
            raw.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(owner)))
            raw.execute(sql.SQL("SET LOCAL search_path = {}").format(sql.Identifier(SCHEMA_NAME)))
            conn.execute("SELECT pg_advisory_xact_lock(?)", (LOCK_KEY,))
            applied = migrate(conn)
            _grant_service(raw, service)
        raw.execute(sql.SQL("ALTER ROLE {} SET search_path = {}").format(
            sql.Identifier(service), sql.Identifier(SCHEMA_NAME)))
        database = raw.info.dbname
    return with_user_and_database(admin_url, service, database), applied


def _grant_service(raw: Any, service: str) -> None:
    """The service's rights, stated whole: INSERT and SELECT where it appends, SELECT where it
    reads, EXECUTE on the cap function; no UPDATE, DELETE, TRUNCATE, REFERENCES or DDL."""
    from psycopg import sql

    role = sql.Identifier(service)
    schema = sql.Identifier(SCHEMA_NAME)
    raw.execute(sql.SQL("REVOKE ALL ON ALL TABLES IN SCHEMA {} FROM PUBLIC, {}").format(
        schema, role))
    raw.execute(sql.SQL("REVOKE ALL ON SCHEMA {} FROM PUBLIC").format(schema))
    raw.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema, role))
    for table in SERVICE_INSERTS:
        raw.execute(sql.SQL("GRANT SELECT, INSERT ON {} TO {}").format(sql.Identifier(table),
                                                                       role))
    for table in SERVICE_READS:
        raw.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(sql.Identifier(table), role))
    raw.execute(sql.SQL("GRANT USAGE ON SEQUENCE ledger_order TO {}").format(role))
    for function in ("medrelease_set_cap(text, double precision, double precision, text, text)",
                     "medrelease_guard_event()", "medrelease_event_problem(text, text)"):
        if raw.execute("SELECT to_regprocedure(%s)", (function,)).fetchone()[0] is not None:
            raw.execute(sql.SQL(f"REVOKE ALL ON FUNCTION {function} FROM PUBLIC"))
    if raw.execute("SELECT to_regprocedure('medrelease_event_problem(text, text)')"
                   ).fetchone()[0] is not None:  # the journal's CHECK calls it as the inserter
        raw.execute(sql.SQL("GRANT EXECUTE ON FUNCTION medrelease_event_problem(text, text) "
                            "TO {}").format(role))
    raw.execute(sql.SQL("GRANT EXECUTE ON FUNCTION medrelease_set_cap(text, double precision, "
                        "double precision, text, text) TO {}").format(role))
