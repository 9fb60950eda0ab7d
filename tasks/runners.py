"""Which task runner the lattice fan-out uses: threads (default) or Dask.

Threads are the default: on a small machine Prefect's Dask runner costs far more per task than
the scoring itself (issue 7 measured about a minute for 256 trivial tasks on 2 cores against
1.5 s on threads), so batches of many lattice nodes go to each task either way. Dask runs on a
local cluster (one single-threaded worker process per core asked for) unless a scheduler
address is given.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from typing import Literal

from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from medrelease.errors import MedreleaseError
from medrelease.plan import ReleasePlan
from medrelease.stages import workers_from_env


class RunnerUnavailableError(MedreleaseError):
    """The fan-out's task runner could not start (raised before any budget is spent)."""

RunnerKind = Literal["thread", "dask"]


def fan_out_runner(kind: RunnerKind | None, workers: int | None = None
                   ) -> TaskRunner | AbstractContextManager[None]:
    """The fan-out's runner, entered by the caller (``kind`` None: no fan-out, nothing
    started). A Dask scheduler address comes only from the deployment's environment
    (``MEDRELEASE_DASK_ADDRESS``), never from a form: the count table is sent to whatever
    scheduler is named."""
    if kind is None:
        return nullcontext()
    workers = workers or workers_from_env()
    if kind == "thread":
        return ThreadPoolTaskRunner(max_workers=workers)
    from prefect_dask import DaskTaskRunner

    address = os.environ.get("MEDRELEASE_DASK_ADDRESS")
    if address:
        timeout = os.environ.get("MEDRELEASE_DASK_CONNECT_TIMEOUT", "15s")
        return DaskTaskRunner(address=address, client_kwargs={"timeout": timeout})
    return DaskTaskRunner(cluster_kwargs={"n_workers": workers, "threads_per_worker": 1,
                                          "processes": True, "dashboard_address": None})


def connect(runner: TaskRunner | None, kind: RunnerKind | None) -> None:
    """Start the local cluster or reach the scheduler now, so a failure costs no budget."""
    if kind != "dask":
        return
    try:
        runner.client  # noqa: B018 - the property starts the cluster / connects
    except Exception as exc:
        raise RunnerUnavailableError(
            f"the Dask task runner did not start ({type(exc).__name__}: {exc}); no budget was "
            "spent. Check MEDRELEASE_DASK_ADDRESS, or use task_runner 'thread'"
        ) from exc


def runner_kind(requested: RunnerKind, plan: ReleasePlan) -> RunnerKind | None:
    """The runner a release's fan-out uses: the one asked for where there is a fan-out (the
    count of a partitioned extract, the lattice's scoring, the rounds'); none for a mechanism
    that releases from the rows in one step (its one task is called in the flow)."""
    return requested if plan.kind != "rows" else None
