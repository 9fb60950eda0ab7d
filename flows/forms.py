"""The forms' help read when a form opens (issue 56: the release form said "9 left" when 0
was left).

Prefect's UI draws a deployment's run form from the parameter schema stored with the
deployment (``parameter_openapi_schema``), which ``Runner.add_deployment`` writes once, when
``medrelease serve`` starts; the form runs no code of ours when it opens. The help texts that
depend on the ledger and the files (budget left per source, which datasets are ready, which
sources are already VOID, the cap form's list of sources) are therefore rebuilt here, in a
thread of ``serve``, every few seconds, and written back with Prefect's documented
``PATCH /deployments/{id}`` (``DeploymentUpdate.parameter_openapi_schema``) whenever they
changed: after every release, every cap change (from the cap form or ``medrelease ledger
set-cap`` in a terminal, on any host of a PostgreSQL ledger) and every prepared input. A form
opened a few seconds after a change shows it; nothing else of the deployment is touched.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from prefect.logging import get_logger

REFRESH_SECONDS = "MEDRELEASE_FORM_REFRESH_SECONDS"


def form_schema(flow: Any) -> dict[str, Any]:
    """The flow's parameter schema as the runner stores it (``RunnerDeployment``: Prefect's
    ``parameter_schema`` of the flow), its help texts built now."""
    from prefect.utilities.callables import parameter_schema

    return parameter_schema(flow).model_dump(exclude_unset=True)


class FormRefresher:
    """Keeps the stored form of each served deployment whose help reads the ledger in step
    with what that help says now. ``served``: (deployment id, flow) pairs."""

    def __init__(self, served: list[tuple[Any, Any]]) -> None:
        self.served = served
        self.stored: dict[str, str] = {}  # deployment id -> the schema last seen stored
        self.failed = False  # said once in serve's log, not every few seconds

    def refresh(self) -> int:
        """Write every form whose help changed; the number written."""
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.actions import DeploymentUpdate

        schemas: dict[int, tuple[dict[str, Any], str]] = {}
        written = 0
        with get_client(sync_client=True) as client:
            for deployment_id, flow in self.served:
                if id(flow) not in schemas:
                    schema = form_schema(flow)
                    schemas[id(flow)] = (schema, json.dumps(schema, sort_keys=True))
                schema, text = schemas[id(flow)]
                key = str(deployment_id)
                if key not in self.stored:  # first pass: what the runner stored
                    stored = client.read_deployment(deployment_id).parameter_openapi_schema
                    self.stored[key] = json.dumps(stored, sort_keys=True)
                if self.stored[key] == text:
                    continue
                client.update_deployment(deployment_id,
                                         DeploymentUpdate(parameter_openapi_schema=schema))
                self.stored[key] = text
                written += 1
        return written

    def run(self, stop: threading.Event) -> None:
        """Refresh every ``MEDRELEASE_FORM_REFRESH_SECONDS`` (default 3) until ``stop``."""
        interval = float(os.environ.get(REFRESH_SECONDS, "3"))
        logger = get_logger("medrelease.serve")
        while not stop.wait(interval):
            try:
                self.refresh()
                self.failed = False
            except Exception as exc:  # the server restarting, a ledger being restored
                if not self.failed:
                    logger.warning("the forms' budget help was not refreshed (%s); trying "
                                   "again every %g s", type(exc).__name__, interval)
                self.failed = True


def start_refreshing(served: list[tuple[Any, Any]]) -> threading.Event:
    """Start the refresher in a daemon thread of ``serve``; set the event returned to stop."""
    stop = threading.Event()
    threading.Thread(target=FormRefresher(served).run, args=(stop,), name="form-refresher",
                     daemon=True).start()
    return stop
