"""The budget ledger at a location, whichever back-end holds it.

``ledger.py`` holds the rules (``BudgetLedger``) and the SQLite ledger; ``ledger_pg.py`` the
PostgreSQL one, built on those rules. Opening, reconciling and restoring "the ledger at this
location" needs both, so it lives here, above them (no import circle).
"""

from __future__ import annotations

from pathlib import Path

from medrelease.privacy.ledger import (
    BudgetLedger,
    Ledger,
    Restored,
    reconcile_sqlite,
    sqlite_epsilon_left_glance,
)
from medrelease.privacy.ledger_pg import PostgresLedger
from medrelease.privacy.ledger_url import is_database_url


def open_ledger(location: str | Path) -> BudgetLedger:
    """The ledger at ``location``: a PostgreSQL URL (``MEDRELEASE_LEDGER_URL``, a password
    left out of it is taken from that variable, ``PGPASSWORD`` or ``~/.pgpass``) or a SQLite
    file path (the default)."""
    if is_database_url(location):
        return PostgresLedger(str(location))
    return Ledger(location)


def ledger_exists(location: str | Path) -> bool:
    """Whether there is a ledger to read at ``location`` (opening a missing SQLite file would
    create an empty one; a database is there once ``ledger init-db`` made its schema)."""
    if is_database_url(location):
        return True
    return Path(location).is_file()


def reconcile(location: str | Path, records: list[dict], manifests: list[dict] = ()) -> None:
    """Refuse a ledger that lacks spends the steward records or the published releases show,
    or that differs from its journal (a table dropped or edited, a spend deleted, a cap
    changed outside ``set-cap``, the journal removed).

    Called before every charge, and by ``medrelease ledger verify``. A missing ledger file is
    not created when records, releases or a journal exist: a new empty ledger would silently
    restart every source's budget from zero. ``location``: a SQLite file, or a PostgreSQL URL
    (``PostgresLedger.reconcile``: its event chain, its head as this host last saw it).
    """
    if is_database_url(location):
        open_ledger(location).reconcile(records, list(manifests))
        return
    reconcile_sqlite(Path(location), records, list(manifests))


def restore_from_records(location: str | Path, records: list[dict],
                         manifests: list[dict] = ()) -> Restored:
    """Rebuild a lost or emptied ledger (``BudgetLedger.restore``) at a path or URL."""
    return open_ledger(location).restore(records, list(manifests))


def epsilon_left_glance(location: str | Path, source: str) -> tuple[float, bool] | None:
    """(epsilon left under the cap, lifetime guarantee void) of a known source at either
    back-end, for the form's help; None when the source has no spends or the ledger cannot be
    read. A glance, not a check: the charge holds every release to the cap."""
    if not is_database_url(location):
        return sqlite_epsilon_left_glance(location, source)
    try:
        state = open_ledger(location).state(source)
    except Exception:  # a help text never fails a form: no figure instead
        return None
    return state.epsilon_left, state.void_reason is not None
