"""Served runs start from a process that imported the flows once (``deployments.serve``):
Prefect's own ``run_flow_in_subprocess`` runs the flow in a fork of the preloaded process,
with Prefect's payload, on a real API."""

from __future__ import annotations

import json
import multiprocessing
import os

import prefect.flow_engine as flow_engine
import pytest

from deployments import serve

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_a_served_run_forks_from_the_preloaded_process(tmp_path, monkeypatch) -> None:
    from tests.served_probe import probe

    monkeypatch.setattr(flow_engine, "multiprocessing", multiprocessing)  # restored after
    monkeypatch.setattr(serve, "PRELOADED", ["tests.served_probe"])
    monkeypatch.delenv("MEDRELEASE_SERVED_RUN_START", raising=False)
    assert serve.start_runs_from_a_preloaded_process()
    out = tmp_path / "probe.json"
    process = flow_engine.run_flow_in_subprocess(probe, parameters={"out": str(out)})
    process.join(120)
    assert process.exitcode == 0
    assert isinstance(process, multiprocessing.context.ForkServerProcess)
    seen = json.loads(out.read_text(encoding="utf-8"))
    assert seen["run_by"] == process.pid and seen["parent"] != os.getpid()
    # the module came with the fork: imported by the fork server, before this run existed
    assert seen["imported_by"] == seen["parent"] != seen["run_by"]
    assert not seen["release_flow_loaded"]  # only what was asked for is preloaded


def test_spawn_is_kept_when_asked_for(monkeypatch) -> None:
    monkeypatch.setattr(flow_engine, "multiprocessing", multiprocessing)
    monkeypatch.setenv("MEDRELEASE_SERVED_RUN_START", "spawn")
    assert not serve.start_runs_from_a_preloaded_process()
    assert flow_engine.multiprocessing is multiprocessing
