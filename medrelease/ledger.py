"""The privacy-budget ledger: one row per spend, in an embedded SQLite database.

Releases of one dataset compose, so every spend is recorded against the dataset's lifetime
budget. A spend is *reserved* before any noise is drawn, then marked *released* or *failed*;
all three count, because once a run may have drawn noise its budget is gone (a crashed run's
reservation therefore stays counted). The check-and-reserve happens inside one
``BEGIN IMMEDIATE`` transaction, which SQLite serializes across processes, so two runs started
at once can never overspend.
"""

from __future__ import annotations

import math
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from medrelease.errors import BudgetExceededError, MedreleaseError

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
CREATE INDEX IF NOT EXISTS spends_dataset ON spends (dataset);
"""


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


@dataclass(frozen=True)
class BudgetState:
    dataset: str
    epsilon_spent: float
    delta_spent: float
    lifetime_epsilon: float
    lifetime_delta: float

    @property
    def epsilon_left(self) -> float:
        return max(0.0, self.lifetime_epsilon - self.epsilon_spent)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class Ledger:
    """A SQLite ledger file; safe to open from several processes at once."""

    def __init__(self, path: str | Path, timeout_s: float = 60.0) -> None:
        self.path = Path(path)
        self.timeout_s = timeout_s
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._connect() as conn:
                conn.executescript(SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise MedreleaseError(f"cannot open the budget ledger at {self.path}: {exc}") from exc

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            yield conn
        finally:
            conn.close()

    def reserve(
        self,
        dataset: str,
        epsilon: float,
        delta: float,
        mechanism: str,
        lifetime_epsilon: float,
        lifetime_delta: float,
        flow_run_id: str | None = None,
    ) -> str:
        """Reserve a spend, or refuse it (``BudgetExceededError``) if it would overspend.

        The message shows spent / requested / total. Nothing is written when refused.
        """
        for name, value in (("epsilon", epsilon), ("delta", delta)):
            if not (math.isfinite(value) and value >= 0):
                raise BudgetExceededError(f"{name} to reserve must be a finite number >= 0")
        spend_id = uuid.uuid4().hex
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                eps_spent, delta_spent = conn.execute(
                    "SELECT COALESCE(SUM(epsilon), 0), COALESCE(SUM(delta), 0) FROM spends "
                    "WHERE dataset = ?",
                    (dataset,),
                ).fetchone()
                if eps_spent + epsilon > lifetime_epsilon * (1 + TOLERANCE) + TOLERANCE:
                    raise BudgetExceededError(
                        f"dataset {dataset!r}: this release would exceed the lifetime privacy "
                        f"budget — epsilon spent {eps_spent:g} + requested {epsilon:g} > total "
                        f"{lifetime_epsilon:g} (left: {max(0.0, lifetime_epsilon - eps_spent):g})"
                    )
                if delta_spent + delta > lifetime_delta * (1 + TOLERANCE) + 1e-15:
                    raise BudgetExceededError(
                        f"dataset {dataset!r}: this release would exceed the lifetime delta — "
                        f"delta spent {delta_spent:g} + requested {delta:g} > total "
                        f"{lifetime_delta:g}"
                    )
                now = _now()
                conn.execute(
                    "INSERT INTO spends VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'reserved', NULL, NULL, ?, ?)",
                    (spend_id, dataset, mechanism, epsilon, delta, lifetime_epsilon,
                     lifetime_delta, flow_run_id, now, now),
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
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

    def spends(self, dataset: str | None = None) -> list[Spend]:
        query = "SELECT * FROM spends"
        args: tuple = ()
        if dataset:
            query += " WHERE dataset = ?"
            args = (dataset,)
        with self._connect() as conn:
            rows = conn.execute(query + " ORDER BY created_at, rowid", args).fetchall()
        return [Spend(*row) for row in rows]

    def state(self, dataset: str, lifetime_epsilon: float, lifetime_delta: float) -> BudgetState:
        spends = self.spends(dataset)
        return BudgetState(
            dataset=dataset,
            epsilon_spent=math.fsum(s.epsilon for s in spends),
            delta_spent=math.fsum(s.delta for s in spends),
            lifetime_epsilon=lifetime_epsilon,
            lifetime_delta=lifetime_delta,
        )
