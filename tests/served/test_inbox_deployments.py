"""Issue 36, cases 14, 16 and 20 on a real ``prefect server`` (basic auth, loopback) and
``medrelease serve --inbox ... --dataset nps-arrivals``: what a UI user can send the inbox's
deployments, the UI's Retry on an arrival held for its budget, and the websocket endpoints
without the stewards' secret."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client

from medrelease.privacy.ledger import Ledger

from ..conftest import ARRIVALS, ROOT
from .test_deployments import WAIT_S, _retry_from_the_ui, _runs

pytestmark = pytest.mark.server


def _final(client, run, log: Path):
    deadline = time.monotonic() + WAIT_S
    while not (run := client.read_flow_run(run.id)).state.is_final():
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(1)
    return run


def _arrival_run_of(client, deployment_id, sha256: str, log: Path):
    """The on-arrival run the watcher's event started for this content, once final."""
    deadline = time.monotonic() + WAIT_S
    while True:
        for run in _runs(client, deployment_id):
            if run.parameters.get("sha256") == sha256 and run.state and run.state.is_final():
                return run
        assert time.monotonic() < deadline, f"no arrival run in time:\n{log.read_text()[-3000:]}"
        time.sleep(1)


def _drop(inbox: Path, name: str, frame) -> str:
    """Write an extract beside the inbox, then move it in whole (as a sender should)."""
    staged = inbox.parent / f"staged-{name}"
    frame.to_csv(staged, index=False)
    sha = hashlib.sha256(staged.read_bytes()).hexdigest()
    staged.rename(inbox / name)
    return sha


def test_the_inbox_deployments_refuse_another_dataset(served) -> None:
    """Case 14. Before: watch-inbox run with {"dataset": "copy1"} announced the next arrival
    as copy1, and on-arrival released whatever dataset its parameters named."""
    ledger = Ledger(served.home / "ledger.sqlite")
    spends = len(ledger.spends()) if (served.home / "ledger.sqlite").exists() else 0
    with get_client(sync_client=True) as client:
        watch = client.read_deployment_by_name("medrelease-watch-inbox/watch-inbox")
        run = _final(client, client.create_flow_run_from_deployment(
            watch.id, parameters={"dataset": "copy1", "max_seconds": 1}), served.log)
        assert run.state.name == "Refused", run.state
        assert "parameter 'dataset' is 'copy1'" in run.state.message
        assert f"dataset {ARRIVALS!r}" in run.state.message

        arrival = client.read_deployment_by_name("medrelease-on-arrival/on-arrival")
        sha = "f" * 64
        run = _final(client, client.create_flow_run_from_deployment(arrival.id, parameters={
            "dataset": "nps-sample", "sha256": sha,
            "path": str(served.inbox.resolve() / "processing" / f"{sha}-extract.csv")}),
            served.log)
        assert run.state.name == "Refused", run.state
        assert "parameter 'dataset' is 'nps-sample'" in run.state.message
    assert len(ledger.spends()) == spends if (served.home / "ledger.sqlite").exists() else True


def test_an_arrival_held_for_its_budget_is_released_by_the_ui_retry(served,
                                                                    nps_sample) -> None:
    """Case 16. Before: refused for the budget, the extract went to rejected/ with an ERROR,
    and the UI's Retry on that run ended Refused (its file was gone from processing/)."""
    ledger = Ledger(served.home / "ledger.sqlite")
    with get_client(sync_client=True) as client:
        arrival = client.read_deployment_by_name("medrelease-on-arrival/on-arrival")
        if ARRIVALS not in (ledger.sources() if ledger.path.exists() else []):
            # the source's cap is fixed at its first spend: make one
            sha = _drop(served.inbox, "first-month.csv", nps_sample.iloc[6000:9000])
            first = _arrival_run_of(client, arrival.id, sha, served.log)
            assert first.state.is_completed(), first.state.message
        budget = ledger.state(ARRIVALS)
        ledger.set_cap(ARRIVALS, budget.epsilon_spent, budget.lifetime_delta,
                       "test: no budget left for the next arrival")
        try:
            spends = len(ledger.spends())
            sha = _drop(served.inbox, "held-month.csv", nps_sample.iloc[9000:12000])
            run = _arrival_run_of(client, arrival.id, sha, served.log)
            assert run.state.name == "Refused", run.state
            assert "lifetime privacy budget" in run.state.message
            held = served.inbox / "held" / f"{sha}-held-month.csv"
            assert held.is_file() and not (served.inbox / "rejected" / "held-month.csv").exists()
            assert len(ledger.spends()) == spends

            ledger.set_cap(ARRIVALS, budget.lifetime_epsilon, budget.lifetime_delta,
                           "test: the committee restored the budget")
            retried = _retry_from_the_ui(client, run, served.log)
            assert retried.state.is_completed(), retried.state
            assert (served.inbox / "released" / "held-month.csv").is_file()
            assert not held.exists() and len(ledger.spends()) == spends + 1
            records = [json.loads(p.read_text())
                       for p in (served.home / "steward").rglob("record.json")]
            assert [r["input_sha256"] for r in records if not r["test_release"]].count(sha) == 1
        finally:
            if ledger.state(ARRIVALS).lifetime_epsilon < budget.lifetime_epsilon:
                ledger.set_cap(ARRIVALS, budget.lifetime_epsilon, budget.lifetime_delta,
                               "test: the committee restored the budget")


def _knock(url: str, subprotocol: bool, token: str | None) -> str:
    """One websocket attempt as an outsider without the secret would make it."""
    from websockets.exceptions import ConnectionClosed, InvalidStatus
    from websockets.sync.client import connect

    try:
        with connect(url, open_timeout=10,
                     subprotocols=["prefect"] if subprotocol else None) as socket:
            socket.send(json.dumps({"type": "auth", "token": token} if token is not None
                                   else {"type": "filter", "filter": {}}))
            reply = socket.recv(timeout=10)
            return f"open: {reply[:40]}"
    except InvalidStatus as exc:
        return f"HTTP {exc.response.status_code}"
    except ConnectionClosed as exc:
        return f"closed {exc.rcvd.code if exc.rcvd else None}"


def test_the_websocket_endpoints_refuse_callers_without_the_secret(served) -> None:
    """Case 20. README said Prefect's websocket endpoints do not check the secret; on Prefect
    3.8.8 they do (measured here): the handshake without Prefect's subprotocol is refused
    403, and without the secret as the first message's token the socket is closed 1008."""
    base = served.api_url.replace("http://", "ws://")
    for endpoint in ("/events/out", "/events/in", "/logs/out",
                     "/task_runs/subscriptions/scheduled"):
        assert _knock(base + endpoint, subprotocol=False, token=None) == "HTTP 403", endpoint
        assert _knock(base + endpoint, subprotocol=True, token=None) == "closed 1008", endpoint
        assert _knock(base + endpoint, subprotocol=True, token="steward:guess") == \
            "closed 1008", endpoint
        assert _knock(base + endpoint, subprotocol=True, token=served.auth).startswith(
            'open: {"type":"auth_success"'), endpoint
    readme = (ROOT / "README.md").read_text()
    safeguards = (ROOT / "docs" / "SAFEGUARDS.md").read_text()
    assert "do not check the" not in readme and "websockets included" in readme
    assert "1008" in safeguards and "do not check the" not in safeguards
