"""The three ways releases start, as Prefect deployments served from one process.

* ``medrelease-release/on-demand``: a steward fills in the form in the Prefect UI;
* ``medrelease-release/scheduled-<dataset>``: one per dataset config with a ``schedule`` (cron);
* ``medrelease-on-arrival/on-arrival``: started by the ``medrelease.extract.arrived`` event that
  the inbox watcher emits, with the event's dataset, file and hash as parameters;
* ``medrelease-watch-inbox/watch-inbox``: the watcher itself as a long-lived flow run, for the
  inbox and dataset ``serve --inbox --dataset`` fixed (no run parameter changes either);
* ``medrelease-set-cap/set-cap``: the steward raises or lowers a source's cap with a reason
  (``medrelease ledger set-cap``'s engine call, rules and journal);
* ``medrelease-prepare-mimic/prepare-mimic``: writes ``mimic-demo``'s input (``medrelease
  prepare-mimic`` with its defaults).

The forms whose help reads the ledger are kept current by a thread of ``serve``
(``flows/forms.py``).

``medrelease serve`` runs the first two against the server named by ``PREFECT_API_URL``; with
``--inbox`` also the inbox's two and the watcher. With several hosts, one runs ``--inbox``.
They are declared here only: ``deployments/prefect.yaml`` (the same deployments for
``prefect deploy`` with a process work pool) is generated from :func:`build_deployments` by
``python -m deployments.prefect_yaml``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import warnings
from pathlib import Path
from typing import Any

from prefect.events import DeploymentEventTrigger
from prefect.logging import get_logger
from prefect.runner import Runner

from deployments.served_runs import (
    SPAWN_ASKED,
    fork_runs_from_a_preloaded_process,
    tell_the_runner_the_flows,
)
from flows.arrival import arrival_release_flow
from flows.cap import CAP_DEPLOYMENT, set_cap_flow
from flows.forms import start_refreshing
from flows.prepare import PREPARE_MIMIC_DEPLOYMENT, prepare_mimic_flow
from flows.release import release_flow
from flows.request_form import DATASET_DEFAULT
from flows.watch import ARRIVED, watch_inbox_flow, watch_loop
from medrelease.data.config import load_config, project_root
from medrelease.storage.inbox import inbox_settings

ARRIVAL_PARAMETERS = {
    "dataset": "{{ event.payload.dataset }}",
    "path": "{{ event.payload.path }}",
    "sha256": "{{ event.payload.sha256 }}",
}


def scheduled_datasets() -> list[tuple[str, str]]:
    """(dataset name, cron) for every bundled dataset config that has a schedule."""
    found = []
    for path in sorted((project_root() / "datasets").glob("*/dataset.yaml")):
        config = load_config(path)
        if config.schedule:
            found.append((config.name, config.schedule))
    return found


WHERE_THE_RUN_APPEARS = (
    "Release a dataset on demand: fill in dataset, mechanism and budget, then Submit. "
    "**Where the run appears**: Prefect opens this deployment's page; the run is under "
    "**Runs** in the left menu (and in this page's Runs tab once it has started), named by "
    "dataset, mechanism and epsilon (e.g. 'nps-sample · aim · eps 1') — or follow the 'View "
    "run' pop-up. Its state says how it ended: **Published** (or *Published with warnings*) "
    "with the release's portal URL, **Refused** with the one-sentence reason (nothing spent; "
    f"over budget: raise the cap with the **{CAP_DEPLOYMENT}** deployment, then Retry the run),"
    " or *Not published* (grey) for a release rejected at review; a dataset with `review: "
    "required` waits there, Paused, for its approve / reject form (Resume).")


def build_deployments(with_inbox: bool = True) -> list:
    """The deployments a host serves. ``with_inbox``: also the inbox's (watch-inbox,
    on-arrival) — only on the one host that watches the inbox, so that an arrival's run never
    lands on a host that does not know the inbox (several hosts: docs/OPERATIONS.md)."""
    deployments = [
        release_flow.to_deployment(
            name="on-demand",
            description=WHERE_THE_RUN_APPEARS,
            tags=["medrelease", "on-demand"],
            # the form opens on working values: Submit as it stands releases the sample with
            # its dataset's own mechanism and budget (Prefect's form shows a nested model's
            # fields empty unless the deployment gives them)
            parameters={"request": {"dataset": "nps-sample", "mechanism": DATASET_DEFAULT}},
        )
    ]
    deployments.append(set_cap_flow.to_deployment(
        name=CAP_DEPLOYMENT,
        description="Raise or lower a source's lifetime privacy budget, with a reason: the same "
                    "rules and journal as `medrelease ledger set-cap`. The form lists every "
                    "source with its cap, spend and what is left. After a budget refusal: "
                    "change the cap here, then open the refused run and click **Retry**.",
        tags=["medrelease", "steward"],
    ))
    deployments.append(prepare_mimic_flow.to_deployment(
        name=PREPARE_MIMIC_DEPLOYMENT,
        description="Write mimic-demo's input from the MIMIC-III demo CSVs beside the checkout "
                    "(as `medrelease prepare-mimic`); the release form then lists mimic-demo "
                    "as ready. Takes no parameter.",
        tags=["medrelease", "steward"],
    ))
    for dataset, cron in scheduled_datasets():
        deployments.append(release_flow.to_deployment(
            name=f"scheduled-{dataset}",
            cron=cron,
            # the dataset's own mechanism and parameters; an unchanged extract spends nothing
            parameters={"request": {"dataset": dataset, "skip_unchanged": True}},
            description=f"Scheduled release of {dataset} ({cron}, UTC). Each run is listed "
                        "under Runs, named by dataset, mechanism and epsilon; its log's first "
                        "lines give the release's portal URL or the refusal.",
            tags=["medrelease", "scheduled"],
        ))
    if not with_inbox:
        return deployments
    deployments.append(watch_inbox_flow.to_deployment(
        name="watch-inbox",
        description="Long-lived inbox watcher as a flow run (alternative to `medrelease watch`)",
        tags=["medrelease", "watcher"],
    ))
    deployments.append(arrival_release_flow.to_deployment(
        name="on-arrival",
        description="Release exactly the extract announced by the inbox watcher",
        tags=["medrelease", "on-arrival"],
        triggers=[DeploymentEventTrigger(
            name="extract-arrived",
            expect={ARRIVED},
            match={"prefect.resource.id": "medrelease.extract.*"},
            parameters=ARRIVAL_PARAMETERS,
        )],
    ))
    return deployments


def _not_a_cancelled_callback(record: logging.LogRecord) -> bool:
    """Drop asyncio's report of a callback whose task was cancelled (shutdown, not a fault)."""
    error = record.exc_info[1] if record.exc_info else None
    return not isinstance(error, asyncio.CancelledError)


def serve_all(inbox: Path | None = None, dataset: str = "nps-sample",
              interval_s: float = 1.0) -> None:
    """Serve every deployment; with ``inbox``, also watch it in a background thread."""
    if inbox is not None:
        # extracts announced from this inbox may be released, as this dataset only (served
        # runs inherit both; a run's parameters cannot change them)
        os.environ.update(inbox_settings(Path(inbox), dataset))
        threading.Thread(target=watch_loop, args=(inbox, dataset, interval_s),
                         name="inbox-watcher", daemon=True).start()
    # The traceback asyncio sometimes logs for the runner's control channel cancelled on the
    # way out would only alarm whoever stops the service.
    warnings.filterwarnings("ignore", message="coroutine 'Runner.astop' was never awaited")
    logging.getLogger("asyncio").addFilter(_not_a_cancelled_callback)
    # A stop (SIGTERM from systemd, Ctrl-C) must not pause the monthly schedules: Prefect's
    # default would leave every deployment paused until someone resumes it in the UI.
    # How often the runner asks the API for runs to start: every second. (Setting
    # PREFECT_RUNNER_POLL_FREQUENCY here had no effect: Prefect had read its settings at import,
    # so runs waited for the default 10 s poll; measured Submit -> run start 5.5-8 s.)
    poll = float(os.environ.get("MEDRELEASE_RUNNER_POLL_SECONDS", "1"))
    runner = Runner(pause_on_shutdown=False, limit=2, query_seconds=poll)
    served = [(runner.add_deployment(deployment), deployment.flow_name)
              for deployment in build_deployments(with_inbox=inbox is not None)]
    get_logger("medrelease.serve").info("served runs start %s", start_served_runs(runner, served))
    # the forms whose help reads the ledger, kept current (the UI draws them from the stored
    # schema and runs no code when a form opens: flows/forms.py)
    stop_refreshing = start_refreshing([(i, SERVED_FLOWS[name]) for i, name in served
                                        if name in LIVE_FORMS])
    runner.handle_sigterm = _stop_on_sigterm(runner)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(runner.start())
    finally:
        stop_refreshing.set()


SERVED_FLOWS = {f.name: f for f in (release_flow, arrival_release_flow, watch_inbox_flow,
                                    set_cap_flow, prepare_mimic_flow)}
# the flows whose form help says the budget, the datasets ready or the sources' state
LIVE_FORMS = (release_flow.name, set_cap_flow.name)
# What a served run's process needs before its first line: the served flows' modules (and
# through them Prefect, pandas, pandera, the engine), imported once in the fork server.
PRELOADED = sorted({f.fn.__module__ for f in SERVED_FLOWS.values()})


def start_served_runs(runner: Runner, served: list[tuple[Any, str]]) -> str:
    """How this ``serve`` starts its runs (``deployments/served_runs.py``): as forks of one
    process that imported the flows, or Prefect's way; said in one line of its log."""
    if os.environ.get(SPAWN_ASKED) == "spawn":
        return f"each in a new interpreter, Prefect's way ({SPAWN_ASKED}=spawn)"
    if not tell_the_runner_the_flows(runner, [(i, SERVED_FLOWS[name]) for i, name in served]):
        return "each in a new interpreter, Prefect's way (this Prefect's runner was not told " \
               "the flows)"
    if not fork_runs_from_a_preloaded_process(PRELOADED):
        return "each in a new interpreter, Prefect's way (this Prefect does not take its " \
               "process context from multiprocessing)"
    return f"as forks of one process that imported {', '.join(PRELOADED)}"


def _stop_on_sigterm(runner: Runner):
    """SIGTERM stops the runner from inside its event loop.

    Prefect's own handler calls ``sys.exit(0)`` from the signal handler, which raises
    ``SystemExit`` in whatever coroutine the main thread is in; inside an HTTP call to the API
    that surfaced as an exception-group traceback on a routine stop (the served fixture's
    clean-stop check caught it once). Here the handler only schedules ``Runner.astop`` on the
    loop: the polling loops are cancelled at an await, ``start()`` returns, the process exits 0.
    """
    def handle(*_: object) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not inside the runner's loop (starting up): exit as Prefect does
            raise SystemExit(0) from None
        runner._logger.info("SIGTERM received, stopping the runner")
        loop.call_soon_threadsafe(lambda: loop.create_task(runner.astop()))

    return handle
