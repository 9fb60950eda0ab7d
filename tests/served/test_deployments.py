"""On a real ``prefect server``: ``medrelease serve`` registers the schedule, runs on-demand
requests with their parameters, and releases exactly one file per inbox drop."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

from medrelease.mechanisms import label
from medrelease.privacy.ledger import Ledger

from ..conftest import ARRIVALS

pytestmark = pytest.mark.server
WAIT_S = 180


def _runs(client, deployment_id) -> list:
    return client.read_flow_runs(
        deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))


def _wait_final(client, deployment_id, count: int, log: Path) -> list:
    deadline = time.monotonic() + WAIT_S
    while True:
        runs = [r for r in _runs(client, deployment_id) if r.state and r.state.is_final()]
        if len(runs) >= count:
            return runs
        assert time.monotonic() < deadline, f"no final run in time:\n{log.read_text()[-3000:]}"
        time.sleep(1)


def test_schedule_is_registered_with_the_configs_cron(served) -> None:
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("medrelease-release/scheduled-nps-sample")
    [schedule] = deployment.schedules
    assert schedule.schedule.cron == "0 2 1 * *" and schedule.active
    # the dataset's own mechanism; an unchanged extract is not released (and spends) again
    assert deployment.parameters == {"request": {"dataset": "nps-sample",
                                                 "skip_unchanged": True}}


def test_on_demand_run_with_custom_parameters(served) -> None:
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("medrelease-release/on-demand")
        schema = json.dumps(deployment.parameter_openapi_schema)
        for text in ("TEST ONLY", "Dataset name", "ipa-paper", "suppression_threshold"):
            assert text in schema  # the UI form: fields, defaults and descriptions
        # the engineering fields sit in their own object, after the steward's fields
        properties = deployment.parameter_openapi_schema["definitions"]["ReleaseRequest"][
            "properties"]
        assert list(properties)[-1] == "run_settings" and "batch_size" not in properties
        parameters = {"request": {"dataset": "nps-sample", "seed": 7,
                                  "run_settings": {"batch_size": 64},
                                  "mechanism": label("ipa-paper"), "epsilon": 0.5,
                                  "void_lifetime_guarantee": True}}
        run = client.create_flow_run_from_deployment(deployment.id, parameters=parameters)
        deadline = time.monotonic() + WAIT_S
        while not (run := client.read_flow_run(run.id)).state.is_final():
            assert time.monotonic() < deadline, served.log.read_text()[-3000:]
            time.sleep(1)
    assert run.state.is_completed(), run.state.message
    assert run.parameters["request"]["mechanism"].startswith("ipa-paper — ")
    assert run.parameters["request"]["seed"] == 7
    # a seed makes a TEST release: the test store, never the publishable one
    [manifest_path] = list((served.home / "test-releases").rglob("*ipa-paper*/manifest.json"))
    manifest = json.loads(manifest_path.read_text())
    record = json.loads((served.home / "steward" / "nps-sample" / manifest["release_id"]
                         / "record.json").read_text())
    assert record["flow_run_id"] == str(run.id) and manifest["epsilon_spent"] == 0.5


def test_inbox_drop_releases_exactly_that_file_once(served, nps_sample) -> None:
    with get_client(sync_client=True) as client:
        arrival = client.read_deployment_by_name("medrelease-on-arrival/on-arrival")
        automations = client.read_resource_related_automations(f"prefect.deployment.{arrival.id}")
        assert [a.name for a in automations] == ["extract-arrived"]
        assert automations[0].trigger.expect == {"medrelease.extract.arrived"}
        good = served.inbox.parent / "good.csv"
        nps_sample.head(3000).to_csv(good, index=False)
        sha = hashlib.sha256(good.read_bytes()).hexdigest()
        started = time.monotonic()
        shutil.copy(good, served.inbox / "extract-2026-11.csv")
        [run] = _wait_final(client, arrival.id, 1, served.log)
        latency = time.monotonic() - started
        assert run.state.is_completed(), run.state.message
        assert run.parameters["sha256"] == sha and run.parameters["dataset"] == ARRIVALS
        records = [json.loads(p.read_text())
                   for p in (served.home / "steward").rglob("record.json")]
        assert [r["input_sha256"] for r in records if not r["test_release"]].count(sha) == 1
        [record] = [r for r in records if r["input_sha256"] == sha and not r["test_release"]]
        manifest = json.loads((Path(record["published_path"]) / "manifest.json").read_text())
        assert manifest["mechanism"] == "ipa"  # the arrival follows its dataset's config
        assert (served.inbox / "released" / "extract-2026-11.csv").exists()
        print(f"inbox drop -> completed release: {latency:.1f} s")

        spends_before = len(Ledger(served.home / "ledger.sqlite").spends())
        (served.inbox / "bad.csv").write_text(
            "patient_id,age,sex,length_of_stay,surgery,region,diagnosis\n1,34,F,3,N,913579,A001\n")
        runs = _wait_final(client, arrival.id, 2, served.log)
        failed = [r for r in runs if r.state.is_failed()]
        message = failed[0].state.message if len(failed) == 1 else ""
        assert "column 'region'" in message and "file line 2" in message and "913579" not in message
        assert (served.inbox / "rejected" / "bad.csv").exists()
        reason = (served.inbox / "rejected" / "bad.csv.reason.txt").read_text()
        assert "not covered" in reason and "913579" not in reason
        assert len(Ledger(served.home / "ledger.sqlite").spends()) == spends_before

        shutil.copy(good, served.inbox / "same-content.csv")  # identical bytes: never again
        deadline = time.monotonic() + 30
        while not (served.inbox / "duplicates" / "same-content.csv").exists():
            assert time.monotonic() < deadline
            time.sleep(0.5)
        time.sleep(5)
        assert len(_runs(client, arrival.id)) == 2


def _retry_from_the_ui(client, run, log: Path):
    """What the UI's Retry button sends (set_state to Scheduled 'AwaitingRetry', not forced),
    then the run's next final state."""
    from prefect.client.schemas.objects import State, StateType

    previous = run.state.timestamp
    client.set_flow_run_state(run.id, State(type=StateType.SCHEDULED, name="AwaitingRetry",
                                            message="Retry from the UI"), force=False)
    deadline = time.monotonic() + WAIT_S
    while True:
        run = client.read_flow_run(run.id)
        if run.state.is_final() and run.state.timestamp > previous:
            return run
        assert time.monotonic() < deadline, f"retry not run in time:\n{log.read_text()[-3000:]}"
        time.sleep(1)


def test_a_retry_from_the_ui_never_spends_twice(served) -> None:
    """Prefect's UI offers Retry on every finished run of a deployment. On a finished release
    it is refused: it would spend again under the same run (a retried refusal simply runs the
    same checks again)."""
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("medrelease-release/on-demand")
        run = client.create_flow_run_from_deployment(deployment.id, parameters={
            "request": {"dataset": "nps-sample", "seed": 5, "mechanism": label("histogram"),
                        "epsilon": 0.1}})
        deadline = time.monotonic() + WAIT_S
        while not (run := client.read_flow_run(run.id)).state.is_final():
            assert time.monotonic() < deadline, served.log.read_text()[-3000:]
            time.sleep(1)
        assert run.state.is_completed(), run.state.message
        ledger = Ledger(served.home / "ledger.sqlite")
        spends = len(ledger.spends())
        retried = _retry_from_the_ui(client, run, served.log)
        assert retried.state.name == "Refused", retried.state
        assert "already published release" in retried.state.message
        assert "start a new run" in retried.state.message
        assert len(ledger.spends()) == spends



def test_an_api_call_without_the_auth_string_is_refused(served) -> None:
    """Only stewards in the UI: Prefect's basic authentication on the served server; the
    secret never reaches the logs."""
    import base64
    import urllib.error
    import urllib.request

    def call(authorization: str | None) -> int:
        request = urllib.request.Request(f"{served.api_url}/deployments/filter", data=b"{}",
                                         method="POST",
                                         headers={"Content-Type": "application/json"})
        if authorization:
            request.add_header("Authorization", authorization)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code

    token = base64.b64encode(served.auth.encode()).decode()
    wrong = base64.b64encode(b"steward:guess").decode()
    assert (call(None), call(f"Basic {wrong}"), call(f"Basic {token}")) == (401, 401, 200)
    secret = served.auth.split(":", 1)[1]
    for log in served.log.parent.glob("*.log"):
        assert secret not in log.read_text(errors="replace"), log.name


def test_the_arrival_and_watch_deployments_touch_nothing_outside_their_inbox(
        served, tmp_path: Path) -> None:
    """Before: started from the UI/API with any path and a wrong hash, on-arrival moved that
    file into a rejected/ folder beside it; watch-inbox took any folder as its inbox."""
    victim = tmp_path / "elsewhere" / "precious.csv"
    victim.parent.mkdir()
    victim.write_text("patient_id,age\n1,34\n")
    with get_client(sync_client=True) as client:
        arrival = client.read_deployment_by_name("medrelease-on-arrival/on-arrival")
        run = client.create_flow_run_from_deployment(arrival.id, parameters={
            "dataset": "nps-sample", "path": str(victim), "sha256": "0" * 64})
        deadline = time.monotonic() + WAIT_S
        while not (run := client.read_flow_run(run.id)).state.is_final():
            assert time.monotonic() < deadline, served.log.read_text()[-3000:]
            time.sleep(1)
        assert run.state.name == "Refused" and "not an extract announced" in run.state.message
        watch = client.read_deployment_by_name("medrelease-watch-inbox/watch-inbox")
        assert "inbox" not in (watch.parameter_openapi_schema or {}).get("properties", {})
        try:  # refused at creation, or the run fails on the unknown parameter
            run = client.create_flow_run_from_deployment(watch.id, parameters={
                "inbox": str(victim.parent), "max_seconds": 1})
        except Exception as exc:  # either way, nothing may be touched
            assert "inbox" in str(exc)
        else:
            deadline = time.monotonic() + WAIT_S
            while not (run := client.read_flow_run(run.id)).state.is_final():
                assert time.monotonic() < deadline, served.log.read_text()[-3000:]
                time.sleep(1)
            assert not run.state.is_completed(), run.state
    assert victim.is_file() and sorted(p.name for p in victim.parent.iterdir()) == [
        "precious.csv"]


def test_a_wrong_field_from_the_ui_ends_refused_with_one_sentence(served) -> None:
    """Issue 27: a parameter the mechanism does not take (here a left-over epsilon for kanon)
    ended Failed with zero task runs and Prefect's ParameterTypeError traceback."""
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("medrelease-release/on-demand")
        run = client.create_flow_run_from_deployment(deployment.id, parameters={
            "request": {"dataset": "nps-sample", "mechanism": label("kanon"), "epsilon": 1.0,
                        "parameters": {"kk": 3}}})
        deadline = time.monotonic() + WAIT_S
        while not (run := client.read_flow_run(run.id)).state.is_final():
            assert time.monotonic() < deadline, served.log.read_text()[-3000:]
            time.sleep(1)
    assert run.state.name == "Refused", run.state
    assert "kanon does not take kk" in run.state.message
    assert "Nothing was read or spent" in run.state.message


def test_serve_starts_the_release_portal_behind_the_servers_secret(served) -> None:
    """``medrelease serve`` starts the portal (README: the URL it prints), with the secret of
    the Prefect server it serves for; it lists every release its runs published."""
    import base64
    import urllib.error
    import urllib.request

    assert f"release portal: {served.portal}" in served.log.read_text()
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{served.portal}/releases", timeout=10)
    assert refused.value.code == 401
    token = base64.b64encode(served.auth.encode()).decode()
    pages = {}
    for path in ("/", "/steward"):
        request = urllib.request.Request(served.portal + path,
                                         headers={"Authorization": f"Basic {token}"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            pages[path] = answer.read().decode()
    for store in ("releases", "test-releases"):
        for manifest in (served.home / store).glob("*/*/manifest.json"):
            assert f'href="/releases/{manifest.parent.parent.name}"' in pages["/"]
            assert manifest.parent.name in pages["/steward"]
