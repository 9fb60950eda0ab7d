"""Against a real ``prefect server``: a release run records its artifacts and task runs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    FlowRunFilter,
    FlowRunFilterId,
)
from prefect.settings import PREFECT_API_URL, temporary_settings

from deployments.local_server import drain_prefect_workers
from flows.release import ReleaseRequest, release_flow

pytestmark = pytest.mark.server


def _task_runs_when_recorded(client, flow_run_id, expected: int = 10, wait_s: float = 60):
    """Task runs reach the server as events, persisted in batches: wait until they are in."""
    deadline = time.monotonic() + wait_s
    while True:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        if len(runs) >= expected or time.monotonic() > deadline:
            return runs
        time.sleep(1)


@pytest.fixture
def api_url(served):
    """A real ``prefect server`` (not the test harness): the served block's (``served``, with
    its auth string in the settings while the block runs), instead of one more server start
    (15-30 s on 2 cores) for this one test."""
    return served.api_url


def test_release_run_records_artifacts_on_a_real_server(api_url, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path))
    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        # Prefect keeps one events worker per process, bound to the API it first saw (under
        # pytest-xdist: the harness, or a server already stopped). Task runs are recorded from
        # events, so start a fresh worker for this server, and flush it before reading back.
        drain_prefect_workers()
        # ipa named: this test reads the lattice's artifacts (node table, scoring progress)
        result = release_flow(ReleaseRequest(seed=6, batch_size=32, mechanism="ipa"))
        drain_prefect_workers()
        with get_client(sync_client=True) as client:
            run = client.read_flow_run(result["flow_run_id"])
            artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[run.id])))
            task_runs = _task_runs_when_recorded(client, run.id)
    assert run.state.is_completed()
    assert run.parameters["request"]["seed"] == 6
    by_key = {a.key: a for a in artifacts}
    assert set(by_key) == {"nps-sample-budget-steps", "nps-sample-node-information-loss",
                           "nps-sample-release-summary", "nps-sample-scoring-progress",
                           "nps-sample-input-rows", "nps-sample-budget", "nps-sample-releases",
                           # the evaluation's tasks run in the release's flow run (no subflow)
                           "nps-sample-evaluation", "nps-sample-evaluation-queries",
                           "nps-sample-evaluation-risk", "nps-sample-accuracy"}
    nodes = by_key["nps-sample-node-information-loss"].data
    nodes = json.loads(nodes) if isinstance(nodes, str) else nodes
    assert nodes[0]["chosen"] == "◀ chosen" and [n["chosen"] for n in nodes[1:]] == [""] * 255
    assert "age " in nodes[0]["node"] and " · " in nodes[0]["node"]  # named by its levels
    budget = by_key["nps-sample-budget-steps"].data
    assert "node selection" in str(budget) and "cells" in str(budget)
    assert "differential privacy" in by_key["nps-sample-release-summary"].data
    names = [t.name.rsplit("-", 1)[0] for t in task_runs]
    # a first wave of tasks measures the rate, the rest is packed into tasks of about 2 s
    # (issue 55): the sample's 256 nodes fit the first wave; every node was scored (above)
    assert 1 <= names.count("score-node-batch") <= 8
    assert {"validate-and-aggregate", "charge-budget", "select-node", "check-output",
            "publish-release"} <= set(names)
