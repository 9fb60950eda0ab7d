"""The three ways releases start, as Prefect deployments served from one process.

* ``medrelease-release/on-demand``: a steward fills in the form in the Prefect UI;
* ``medrelease-release/scheduled-<dataset>``: one per dataset config with a ``schedule`` (cron);
* ``medrelease-on-arrival/on-arrival``: started by the ``medrelease.extract.arrived`` event that
  the inbox watcher emits, with the event's dataset, file and hash as parameters;
* ``medrelease-watch-inbox/watch-inbox``: the watcher itself as a long-lived flow run, for the
  inbox and dataset ``serve --inbox --dataset`` fixed (no run parameter changes either).

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
import multiprocessing
import multiprocessing.forkserver
import os
import threading
import warnings
from pathlib import Path

from prefect.events import DeploymentEventTrigger
from prefect.runner import Runner

from flows.arrival import arrival_release_flow
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
    "run' pop-up. The first "
    "lines of its log give the release's portal URL, or the one-sentence refusal; a dataset "
    "with `review: required` waits there, Paused, for its approve / reject form (Resume).")


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
    forked = start_runs_from_a_preloaded_process()
    for deployment in build_deployments(with_inbox=inbox is not None):
        deployment_id = runner.add_deployment(deployment)
        if forked:
            _run_in_a_subprocess(runner, deployment_id, deployment.flow_name)
    runner.handle_sigterm = _stop_on_sigterm(runner)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(runner.start())


SERVED_FLOWS = {f.name: f for f in (release_flow, arrival_release_flow, watch_inbox_flow)}


def _run_in_a_subprocess(runner: Runner, deployment_id, flow_name: str) -> None:
    """Tell the runner which flow object a deployment runs, as ``Runner.add_flow`` does (a
    deployment added as such is run by ``python -m prefect.engine``, a new interpreter that
    loads the flow from its entrypoint; with the flow known, by ``run_flow_in_subprocess``,
    which ``start_runs_from_a_preloaded_process`` turns into a fork of the preloaded process).
    Prefect 3.8 has no public call for a deployment built with ``to_deployment``; where its
    registry is not there, runs keep the entrypoint's way."""
    registry = getattr(runner, "_deployment_registry", None)
    if registry is not None and hasattr(registry, "register_flow"):
        registry.register_flow(deployment_id, SERVED_FLOWS[flow_name])


# What a served run's process needs before it can start: the served flows' modules (and through
# them Prefect, pandas, numpy, DuckDB, the engine), imported once in the fork server.
PRELOADED = sorted({f.fn.__module__ for f in SERVED_FLOWS.values()})


class _ForkServerForSpawn:
    """``multiprocessing`` as ``prefect.flow_engine`` sees it, but whose "spawn" context is a
    fork server with the flows preloaded (every other attribute: the real module)."""

    def __init__(self, context: multiprocessing.context.BaseContext) -> None:
        self._context = context

    def get_context(self, method: str | None = None):
        return self._context if method == "spawn" else multiprocessing.get_context(method)

    def __getattr__(self, name: str):
        return getattr(multiprocessing, name)


def start_runs_from_a_preloaded_process() -> bool:
    """Served runs forked from a process that has imported the flows once, instead of each
    run's process importing them afresh.

    Prefect's runner starts every served run with ``multiprocessing``'s "spawn" context, fixed
    in ``prefect.flow_engine.run_flow_in_subprocess``: a new interpreter that imports
    ``flows.release`` (Prefect, pandas, pandera, the form's schema: 2.2-3.5 s of CPU) before
    the run's first line, for every run a steward starts from the form. A fork server
    (``multiprocessing``'s "forkserver": a clean process, no threads, started at the first run)
    imports them once and forks each run from it; the run still gets Prefect's payload, its
    environment and its settings exactly as under "spawn" (Prefect sends them to the child), and
    stays a process of its own that the runner joins, cancels and kills by pid as before. The
    flows are the code ``serve`` started with: a new version is served after a restart (as the
    deployments' form already was). Returns False, leaving Prefect's "spawn", where this Prefect
    does not start runs that way (a later version that changed it) or
    ``MEDRELEASE_SERVED_RUN_START=spawn`` asks for it.
    """
    import prefect.flow_engine as flow_engine

    if (os.environ.get("MEDRELEASE_SERVED_RUN_START", "forkserver") == "spawn"
            or getattr(flow_engine, "multiprocessing", None) is not multiprocessing
            or "forkserver" not in multiprocessing.get_all_start_methods()):
        return False
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOADED)
    flow_engine.multiprocessing = _ForkServerForSpawn(context)
    multiprocessing.forkserver.ensure_running()  # now, not at the first run: it imports for it
    return True


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
