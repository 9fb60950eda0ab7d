"""Where state lives by default: one data folder, overridable per environment variable.

``MEDRELEASE_HOME`` (default ``<checkout>/var``) holds ``ledger.sqlite``, ``releases/`` (the
publishable store), ``test-releases/`` (fixed-seed TEST releases, never published) and
``steward/`` (steward records and evaluations, never published); ``MEDRELEASE_LEDGER``,
``MEDRELEASE_STORE``, ``MEDRELEASE_TEST_STORE`` and ``MEDRELEASE_STEWARD`` override each.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from medrelease.config import project_root

# A home that overrides everything (environment included) for the current context only: the
# publication audit runs two neighbouring worlds side by side, each with its own ledger and
# stores, without touching the process environment other runs rely on.
_ISOLATED_HOME: ContextVar[Path | None] = ContextVar("medrelease_isolated_home", default=None)


@contextmanager
def isolated_home(path: str | Path) -> Iterator[Path]:
    """Within this block (and tasks it starts on threads), all state lives under ``path``."""
    home = Path(path).resolve()
    token = _ISOLATED_HOME.set(home)
    try:
        yield home
    finally:
        _ISOLATED_HOME.reset(token)


def _under_home(variable: str, name: str) -> Path:
    isolated = _ISOLATED_HOME.get()
    if isolated is not None:
        return isolated / name
    return Path(os.environ.get(variable, data_home() / name)).resolve()


def data_home() -> Path:
    isolated = _ISOLATED_HOME.get()
    if isolated is not None:
        return isolated
    return Path(os.environ.get("MEDRELEASE_HOME", project_root() / "var")).resolve()


def ledger_path() -> Path:
    return _under_home("MEDRELEASE_LEDGER", "ledger.sqlite")


def store_root() -> Path:
    return _under_home("MEDRELEASE_STORE", "releases")


def test_store_root() -> Path:
    """TEST releases (fixed seed): a store of their own that the publish path never touches."""
    return _under_home("MEDRELEASE_TEST_STORE", "test-releases")


def steward_root() -> Path:
    """Steward records and evaluations (they look at raw data): never published."""
    return _under_home("MEDRELEASE_STEWARD", "steward")
