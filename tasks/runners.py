"""Which task runner the lattice fan-out uses: threads (default) or Dask.

Threads are the default: on a small machine Prefect's Dask runner costs far more per task than
the scoring itself (issue 7 measured about a minute for 256 trivial tasks on 2 cores against
1.5 s on threads), so batches of many lattice nodes go to each task either way. Dask runs on a
local cluster (one single-threaded worker process per core asked for) unless a scheduler
address is given.
"""

from __future__ import annotations

import os
from typing import Literal

from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

RunnerKind = Literal["thread", "dask"]


def fan_out_runner(kind: RunnerKind, workers: int | None = None,
                   dask_address: str | None = None) -> TaskRunner:
    workers = workers or int(os.environ.get("MEDRELEASE_WORKERS", "2"))
    if kind == "thread":
        return ThreadPoolTaskRunner(max_workers=workers)
    from prefect_dask import DaskTaskRunner

    address = dask_address or os.environ.get("MEDRELEASE_DASK_ADDRESS")
    if address:
        return DaskTaskRunner(address=address)
    return DaskTaskRunner(cluster_kwargs={"n_workers": workers, "threads_per_worker": 1,
                                          "processes": True, "dashboard_address": None})
