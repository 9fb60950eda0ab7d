"""Where state lives by default: one data folder, overridable per environment variable.

``MEDRELEASE_HOME`` (default ``<checkout>/var``) holds ``ledger.sqlite``, ``releases/`` (the
publishable store), ``test-releases/`` (fixed-seed TEST releases, never published) and
``steward/`` (steward records and evaluations, never published); ``MEDRELEASE_LEDGER``,
``MEDRELEASE_STORE``, ``MEDRELEASE_TEST_STORE`` and ``MEDRELEASE_STEWARD`` override each;
``MEDRELEASE_LEDGER_URL=postgresql://...`` puts the ledger in a database instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path


def project_root() -> Path:
    """The checkout this package runs from (datasets/ and taxonomies/ live there)."""
    return Path(__file__).resolve().parent.parent

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
    """The SQLite ledger file (the default back-end)."""
    return _under_home("MEDRELEASE_LEDGER", "ledger.sqlite")


def ledger_location() -> str:
    """Where the budget ledger is: ``MEDRELEASE_LEDGER_URL`` (a PostgreSQL database shared by
    every host), shown without its password — runs carry this form, and Prefect stores what
    they carry; the ledger takes the password back from the variable — or the SQLite file
    ``ledger_path()``. An isolated home (the publication audit's worlds) always has its own
    SQLite ledger."""
    url = os.environ.get("MEDRELEASE_LEDGER_URL", "").strip()
    if url and _ISOLATED_HOME.get() is None:
        from medrelease.privacy.ledger_url import redacted

        return redacted(url)
    return str(ledger_path())


def store_root() -> Path:
    return _under_home("MEDRELEASE_STORE", "releases")


def test_store_root() -> Path:
    """TEST releases (fixed seed): a store of their own that the publish path never touches."""
    return _under_home("MEDRELEASE_TEST_STORE", "test-releases")


def steward_root() -> Path:
    """Steward records and evaluations (they look at raw data): never published."""
    return _under_home("MEDRELEASE_STEWARD", "steward")


def staging_root() -> Path:
    """Releases waiting for a steward's review (``review: required``), one folder each under
    ``<dataset>/<release_id>``: on the steward side, never in a release store, so nothing of
    them is public until approved (``.staging`` cannot be a dataset name)."""
    return steward_root() / ".staging"  # storage.links.STAGING: the portal shows it there


def _env_paths(variable: str) -> list[Path]:
    return [Path(p).resolve() for p in os.environ.get(variable, "").split(os.pathsep) if p]


def dataset_roots() -> list[Path]:
    """Folders a dataset config may be read from: the project's ``datasets/``, the data home's
    ``datasets/`` and ``MEDRELEASE_DATASETS`` (set by whoever deploys, never by a form)."""
    return [project_root() / "datasets", data_home() / "datasets",
            *_env_paths("MEDRELEASE_DATASETS")]


def extra_input_roots() -> list[Path]:
    """Folders beyond a dataset's own declared ones that extracts may come from: the inbox the
    service watches (``MEDRELEASE_INBOX``) and ``MEDRELEASE_INPUT_ROOTS``; both are set by
    whoever deploys, never by a form."""
    return [*_env_paths("MEDRELEASE_INBOX"), *_env_paths("MEDRELEASE_INPUT_ROOTS")]


def inbox_roots() -> list[Path]:
    """The inboxes the service watches (``MEDRELEASE_INBOX``, set by ``serve --inbox``)."""
    return _env_paths("MEDRELEASE_INBOX")


def inbox_bindings() -> dict[str, str] | None:
    """Each served inbox (its real path) and the dataset its extracts belong to
    (``MEDRELEASE_INBOX_DATASETS``, a JSON object set by ``serve --inbox DIR --dataset NAME``);
    ``None`` when the variable is malformed, so that the caller refuses rather than guesses."""
    import json

    text = os.environ.get("MEDRELEASE_INBOX_DATASETS", "").strip()
    if not text:
        return {}
    try:
        bindings = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(bindings, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v for k, v in bindings.items()):
        return None
    return {os.path.realpath(k): v for k, v in bindings.items()}


def snapshot_root() -> Path:
    """Private copies of the extracts a release is reading (``medrelease.data.extract``): the
    bytes hashed at resolution are the bytes read, whatever happens to the input folder during
    the run. Steward-only (they are raw data); each run removes its own."""
    return steward_root() / "snapshots"


def steward_log_dir() -> Path:
    """Steward-only logs: validation details with the raw values, never sent to Prefect."""
    return steward_root() / "logs"
