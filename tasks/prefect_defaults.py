"""Prefect settings this project needs on any machine, applied before Prefect is imported.

Prefect reads its settings from the environment when it is imported, so these are set as
environment defaults (an explicit value always wins) by ``flows``, ``tasks``, the CLI and the
test suite. ``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS``: a new Prefect database is
migrated while the ephemeral API starts; that took 12 s on a quiet 2-core machine and over
Prefect's default 20 s on a loaded one, so the first run failed. ``scripts/dev.sh`` also
migrates the database before the first flow.
"""

from __future__ import annotations

import os
from typing import Any

DEFAULTS = {
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "600",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "GX_ANALYTICS_ENABLED": "false",
}


def apply_prefect_defaults() -> None:
    for name, value in DEFAULTS.items():
        os.environ.setdefault(name, value)


def without_heartbeats() -> Any:
    """Prefect's settings for an in-process flow run (the CLI's) without flow-run heartbeats.

    Heartbeats feed Prefect's zombie-run automation, which this project does not install; their
    thread sleeps in whole seconds and Prefect joins it when the run ends, which cost 0.5-1 s
    of every CLI release (issue 27). Served runs keep them.
    """
    from prefect.settings import temporary_settings

    return temporary_settings(updates={"flows.heartbeat_frequency": None})
