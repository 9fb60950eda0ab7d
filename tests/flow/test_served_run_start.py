"""Served runs start as forks of a process that imported the flows once
(``deployments/served_runs.py``): Prefect's own ``run_flow_in_subprocess`` runs the flow in a
fork of the preloaded process, on a real API; the runner is told each deployment's flow; a
run outlives its fork server without being taken for ended."""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import time
from pathlib import Path

import prefect.flow_engine as flow_engine
import pytest

from deployments import serve, served_runs

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture
def forked_runs(monkeypatch):
    """Prefect's "spawn" as the fork server with ``tests.served_probe`` preloaded, for this
    test only: Prefect's module restored and the fork server stopped afterwards."""
    monkeypatch.setattr(flow_engine, "multiprocessing", multiprocessing)
    monkeypatch.delenv(served_runs.SPAWN_ASKED, raising=False)
    assert served_runs.fork_runs_from_a_preloaded_process(["tests.served_probe"])
    yield
    multiprocessing.forkserver._forkserver._stop()  # (Python's own; a later one starts anew)


def _run_probe(out: Path, hold_s: float = 0.0):
    from tests.served_probe import probe

    return flow_engine.run_flow_in_subprocess(probe, parameters={"out": str(out),
                                                                 "hold_s": hold_s})


def test_a_served_run_forks_from_the_preloaded_process(tmp_path, forked_runs) -> None:
    out = tmp_path / "probe.json"
    process = _run_probe(out)
    try:
        process.join(120)
        assert process.exitcode == 0
    finally:
        process.kill()
    assert isinstance(process, multiprocessing.context.ForkServerProcess)
    seen = json.loads(out.read_text(encoding="utf-8"))
    assert seen["run_by"] == process.pid and seen["parent"] != os.getpid()
    # the module came with the fork: imported by the fork server, before this run existed
    assert seen["imported_by"] == seen["parent"] != seen["run_by"]
    assert not seen["release_flow_loaded"]  # only what was asked for is preloaded
    assert seen["frozen_objects"] > 10_000  # the imports' objects, out of the collector's way


def test_a_run_whose_fork_server_dies_is_not_taken_for_ended(tmp_path, forked_runs) -> None:
    """Python reads a forked run's exit status from its fork server and, the server gone,
    reports 255 at once while the run goes on; the runner would mark it Crashed and fill its
    slot. The run is reported ended only once it has."""
    out = tmp_path / "probe.json"
    process = _run_probe(out, hold_s=4.0)
    try:
        started = Path(f"{out}.started")
        deadline = time.monotonic() + 120
        while not started.exists():
            assert time.monotonic() < deadline and process.exitcode is None
            time.sleep(0.1)
        fork_server = json.loads(started.read_text(encoding="utf-8"))["parent"]
        os.kill(fork_server, signal.SIGKILL)
        assert process.exitcode is None and process.is_alive()  # the run goes on
        process.join(120)
        assert out.exists(), "join returned while the run was still running"
        assert process.exitcode == 255  # its status went with the fork server
    finally:
        process.kill()


def test_the_runner_is_told_each_served_deployments_flow() -> None:
    from prefect.runner import Runner

    runner = Runner(pause_on_shutdown=False)
    deployment = serve.build_deployments(with_inbox=False)[0]
    deployment_id = runner.add_deployment(deployment)
    flow = serve.SERVED_FLOWS[deployment.flow_name]
    assert served_runs.tell_the_runner_the_flows(runner, [(deployment_id, flow)])
    assert runner._deployment_registry.get_flow(deployment_id) is flow


def test_prefects_way_is_kept_when_asked_for(monkeypatch) -> None:
    monkeypatch.setattr(flow_engine, "multiprocessing", multiprocessing)
    monkeypatch.setenv(served_runs.SPAWN_ASKED, "spawn")
    assert not served_runs.fork_runs_from_a_preloaded_process(serve.PRELOADED)
    assert flow_engine.multiprocessing is multiprocessing
    assert "Prefect's way" in serve.start_served_runs(object(), [])
