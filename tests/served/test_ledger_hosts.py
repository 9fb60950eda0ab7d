"""Several hosts (issue 40): a Prefect server on PostgreSQL, two ``medrelease serve`` processes
with their own ``MEDRELEASE_HOME`` (standing in for two hosts) serving the same deployments,
one PostgreSQL ledger and one shared release store (``MEDRELEASE_STORE``).

Six on-demand runs of one source whose cap admits three: exactly three are published, by
whichever host picked each run up (both do: each runs at most two at a time), the others are
refused at the charge with nothing spent; no run is charged twice and every release id is
unique.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import psycopg
import pytest
from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_API_URL, temporary_settings

from deployments.local_server import drain_prefect_workers, running_serve, running_server
from medrelease.privacy.ledger_backends import open_ledger

from ..flow.test_ledger_journal import _dataset

pytestmark = [pytest.mark.server, pytest.mark.slow]

RUNS, CAP, WAIT_S = 6, 3.0, 420
SERVED = {"on-demand"}


def _deployments_served(client, logs: list[Path], procs) -> None:
    deadline = time.monotonic() + WAIT_S
    while not {d.name for d in client.read_deployments()} >= SERVED:
        for proc, log in zip(procs, logs, strict=True):
            assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "deployments not served in time"
        time.sleep(1)


def test_two_hosts_share_one_ledger_and_never_exceed_a_cap(pg_cluster, tmp_path: Path) -> None:
    with psycopg.connect(pg_cluster.url(), autocommit=True) as conn:
        conn.execute("CREATE DATABASE prefect_hosts")
    ledger_url = pg_cluster.url(pg_cluster.fresh_database(), "medrelease_service")
    datasets = tmp_path / "datasets"  # the dataset configs every host reads
    _dataset(datasets / "ward", name="ward", source="ward", lifetime_epsilon=CAP)
    store = tmp_path / "shared-releases"  # the shared filesystem's release store
    shared = {"MEDRELEASE_LEDGER_URL": ledger_url, "MEDRELEASE_STORE": str(store),
              "MEDRELEASE_DATASETS": str(datasets), "MEDRELEASE_INPUT_ROOTS": str(datasets),
              "PREFECT_RUNNER_POLL_FREQUENCY": "1", "PREFECT_RUNNER_PROCESS_LIMIT": "2",
              "PREFECT_LOGGING_LEVEL": "INFO"}
    hosts = [tmp_path / "host-a", tmp_path / "host-b"]
    for host in hosts:
        host.mkdir()
    database = f"postgresql+asyncpg://postgres@127.0.0.1:{pg_cluster.port}/prefect_hosts"
    with running_server(tmp_path, database_url=database) as api_url, \
            contextlib.ExitStack() as serving, \
            temporary_settings(updates={PREFECT_API_URL: api_url}):
        procs = [serving.enter_context(running_serve(host, api_url, env=shared))
                 for host in hosts]
        logs = [host / "serve.log" for host in hosts]
        drain_prefect_workers()
        with get_client(sync_client=True) as client:
            _deployments_served(client, logs, procs)
            deployment = client.read_deployment_by_name("medrelease-release/on-demand")
            runs = [client.create_flow_run_from_deployment(
                deployment.id, parameters={"request": {"dataset": "ward", "evaluate": False}})
                for _ in range(RUNS)]
            deadline = time.monotonic() + WAIT_S
            while not all(client.read_flow_run(r.id).state.is_final() for r in runs):
                assert time.monotonic() < deadline, "\n".join(
                    log.read_text()[-2000:] for log in logs)
                time.sleep(2)
            final = [client.read_flow_run(r.id) for r in runs]

    published = ("Published", "Published with warnings")  # (named after the publication verdict)
    states = sorted("Published" if run.state.name in published else run.state.name
                    for run in final)
    assert states == ["Published"] * 3 + ["Refused"] * 3, [
        (r.state.name, r.state.message) for r in final]
    refusals = [r.state.message for r in final if r.state.name == "Refused"]
    assert all("would exceed the lifetime privacy budget" in m for m in refusals), refusals
    ledger = open_ledger(ledger_url)
    spends = ledger.spends("ward")
    assert len(spends) == 3 and all(s.status == "released" for s in spends)
    assert ledger.state("ward").epsilon_spent <= CAP + 1e-9
    completed = {str(r.id) for r in final if r.state.name in published}
    assert {s.flow_run_id for s in spends} == completed  # each published run charged once
    manifests = [json.loads(p.read_text()) for p in store.rglob("manifest.json")]
    release_ids = [m["release_id"] for m in manifests]
    assert len(release_ids) == 3 == len(set(release_ids))
    assert set(release_ids) == {s.release_id for s in spends}
    # each host kept the steward records of what it published; both took part
    by_host = [len(list((host / "home" / "steward").rglob("record.json"))) for host in hosts]
    ran = [log.read_text().count("Finished in state") for log in logs]
    assert sum(by_host) == 3 and all(ran), (by_host, ran)
    ledger.verify()
