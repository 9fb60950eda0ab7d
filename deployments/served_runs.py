"""How ``medrelease serve`` starts a served run: as a fork of one process that imported the
flows once, instead of a new interpreter that imports them for every run.

Prefect 3.8's runner starts a run of a deployment added with ``Runner.add_deployment`` (ours,
as ``prefect.serve`` does) with ``python -m prefect.engine``; one whose flow object it knows
(``Runner.add_flow``) with ``prefect.flow_engine.run_flow_in_subprocess``, whose
``multiprocessing`` context is "spawn". Either way each run is a new interpreter importing
Prefect, pandas, pandera, the engine and the form's schema before its first line: 2.2-3.5 s
of CPU, for every run a steward starts from the form (docs/results/performance.md). Here the
runner is told each deployment's flow, and "spawn" in ``prefect.flow_engine`` becomes a
``multiprocessing`` fork server that has imported the flows' modules: Prefect's own payload,
environment and settings go to the forked run exactly as to a spawned one, and the run stays
a process of its own that the runner joins, cancels and kills by pid.

Two points of Prefect's internals are used (its version is pinned; each is checked, and where
one is missing runs start Prefect's way): the runner's deployment registry, and the
``multiprocessing`` module ``prefect.flow_engine`` asks for its context.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import os
import time
from collections.abc import Iterable
from multiprocessing import popen_forkserver
from typing import Any

from medrelease.storage.store import process_running

SPAWN_ASKED = "MEDRELEASE_SERVED_RUN_START"  # "spawn": Prefect's own way
FROZEN_AFTER_IMPORTS = "deployments.fork_server_ready"  # imported last: gc.freeze()


def tell_the_runner_the_flows(runner: Any, served: Iterable[tuple[Any, Any]]) -> bool:
    """Register each (deployment id, flow) with the runner as ``Runner.add_flow`` does, so its
    runs start with ``run_flow_in_subprocess`` (Prefect 3.8 has no public call for a deployment
    built with ``to_deployment``). False where this Prefect's runner has no such registry: its
    runs then start as ``python -m prefect.engine``."""
    registry = getattr(runner, "_deployment_registry", None)
    if registry is None or not hasattr(registry, "register_flow"):
        return False
    for deployment_id, flow in served:
        registry.register_flow(deployment_id, flow)
    return True


def fork_runs_from_a_preloaded_process(preload: list[str]) -> bool:
    """``run_flow_in_subprocess``'s runs forked from a fork server that imported ``preload``
    (module names), started now rather than at the first run. False, leaving Prefect's "spawn",
    where ``MEDRELEASE_SERVED_RUN_START=spawn`` asks for it or this Prefect does not take its
    context from ``multiprocessing`` any more.

    The fork server has no threads of its own (numpy's OpenBLAS and pyarrow's allocator start
    idle ones at import; both reset them at a fork). Runs are the code ``serve`` started with:
    after an upgrade, restart ``serve`` (docs/OPERATIONS.md)."""
    import prefect.flow_engine as flow_engine

    if (os.environ.get(SPAWN_ASKED, "forkserver") == "spawn"
            or getattr(flow_engine, "multiprocessing", None) is not multiprocessing
            or "forkserver" not in multiprocessing.get_all_start_methods()):
        return False
    context = _RunContext()
    context.set_forkserver_preload([*preload, FROZEN_AFTER_IMPORTS])
    flow_engine.multiprocessing = _ForkServerForSpawn(context)
    multiprocessing.forkserver.ensure_running()
    return True


class _RunPopen(popen_forkserver.Popen):
    """A forked run as the runner sees it, also when the fork server is gone.

    Python reads a forked process's exit status from the fork server and takes the server's
    end for the process's (status 255 at once, the process still running). The runner would
    then mark a live run Crashed and start another in its slot. Here a 255 whose process still
    runs is reported only once the process is gone (as 255: its own status went with the
    server); a join then waits for that, whatever its timeout (the runner's has none)."""

    def poll(self, flag: int = os.WNOHANG) -> int | None:
        code = super().poll(flag)
        if code != 255 or not process_running(self.pid):
            return code
        if flag == os.WNOHANG:
            self.returncode = None  # asked again later
            return None
        while process_running(self.pid):
            time.sleep(0.5)
        return code


class _RunProcess(multiprocessing.context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> _RunPopen:
        return _RunPopen(process_obj)


class _RunContext(multiprocessing.context.ForkServerContext):
    Process = _RunProcess


class _ForkServerForSpawn:
    """``multiprocessing`` as ``prefect.flow_engine`` sees it: its "spawn" context is the fork
    server's (every other name: the real module)."""

    def __init__(self, context: multiprocessing.context.BaseContext) -> None:
        self._context = context

    def get_context(self, method: str | None = None) -> Any:
        return self._context if method == "spawn" else multiprocessing.get_context(method)

    def __getattr__(self, name: str) -> Any:
        return getattr(multiprocessing, name)
