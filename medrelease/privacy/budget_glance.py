"""Every source's budget at a glance, for the forms' help texts (issue 56).

The release form's epsilon help and the cap form's source help say, per source, its cap, what
it spent and what is left. ``medrelease serve`` rebuilds those texts every few seconds
(``flows/forms.py``), so reading them must not write: a SQLite ledger is opened read-only
(``Ledger()`` would create its schema, adopt an unjournaled ledger and touch the head file),
a PostgreSQL one through its service role, read only. A glance, never a check: every charge
and every cap change applies the ledger's own rules, atomically.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from medrelease.privacy.ledger_url import is_database_url


@dataclass(frozen=True)
class SourceBudget:
    """One source's cap and spend as the ledger holds them (test spends included, as the cap
    counts them)."""

    source: str
    lifetime_epsilon: float
    lifetime_delta: float
    epsilon_spent: float
    delta_spent: float
    void: bool

    @property
    def epsilon_left(self) -> float:
        return max(0.0, self.lifetime_epsilon - self.epsilon_spent)

    def words(self) -> str:
        """'cap epsilon 1 / delta 1e-05, spent 1, left 0' (or the guarantee VOID)."""
        left = ("lifetime guarantee VOID, room under the cap " if self.void else "left ") \
            + f"{self.epsilon_left:g}"
        return (f"cap epsilon {self.lifetime_epsilon:g} / delta {self.lifetime_delta:g}, "
                f"spent {self.epsilon_spent:g}, {left}")


_SQLITE_BUDGETS = """
SELECT s.source, s.lifetime_epsilon, s.lifetime_delta, s.void_reason IS NOT NULL,
       COALESCE(SUM(p.epsilon), 0), COALESCE(SUM(p.delta), 0)
FROM sources s LEFT JOIN spends p ON p.source = s.source
GROUP BY s.source ORDER BY s.source
"""


def source_budgets(location: str | Path) -> list[SourceBudget] | None:
    """Every source the ledger knows, by name: its cap and spend. ``[]``: no ledger
    yet (nothing spent anywhere); None: a ledger that cannot be read now (the help then says
    nothing rather than a wrong figure)."""
    if is_database_url(location):
        return _database_budgets(str(location))
    path = Path(location)
    if not path.is_file():
        return []
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)
    except sqlite3.Error:
        return None
    try:
        rows = conn.execute(_SQLITE_BUDGETS).fetchall()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    return [SourceBudget(str(r[0]), float(r[1]), float(r[2]), float(r[4]), float(r[5]),
                         bool(r[3])) for r in rows]


def _database_budgets(url: str) -> list[SourceBudget] | None:
    from medrelease.privacy.ledger_backends import open_ledger

    try:
        book = open_ledger(url)
        states = [book.state(source) for source in book.sources()]
    except Exception:  # a help text never fails a form: no figure instead
        return None
    return [SourceBudget(s.source, s.lifetime_epsilon, s.lifetime_delta, s.epsilon_spent,
                         s.delta_spent, s.void) for s in states]
