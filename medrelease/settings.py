"""Where state lives by default: one data folder, overridable per environment variable.

``MEDRELEASE_HOME`` (default ``<checkout>/var``) holds ``ledger.sqlite`` and ``releases/``;
``MEDRELEASE_LEDGER`` and ``MEDRELEASE_STORE`` override the two individually.
"""

from __future__ import annotations

import os
from pathlib import Path

from medrelease.config import project_root


def data_home() -> Path:
    return Path(os.environ.get("MEDRELEASE_HOME", project_root() / "var")).resolve()


def ledger_path() -> Path:
    return Path(os.environ.get("MEDRELEASE_LEDGER", data_home() / "ledger.sqlite")).resolve()


def store_root() -> Path:
    return Path(os.environ.get("MEDRELEASE_STORE", data_home() / "releases")).resolve()


def evaluations_root() -> Path:
    """Internal evidence (it looks at raw data): kept apart from the publishable store."""
    return Path(os.environ.get("MEDRELEASE_EVALUATIONS",
                               data_home() / "evaluations")).resolve()
