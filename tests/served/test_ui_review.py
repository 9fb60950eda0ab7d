"""Issue 39 in the real Prefect UI (Debian's Chromium, the served deployments): a dataset with
``review: required`` waits, Paused, with its approve / reject form; a steward opens the run,
clicks Resume, reads that the spend stays counted, approves with a reason, and the release is
published. The form's 'Void the lifetime guarantee' checkbox is shown with its consequence.
Screenshots: docs/ui/review-form.png, docs/ui/void-confirmation.png (copied to
var/test-screenshots/)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_API_URL, temporary_settings

from medrelease.mechanisms import label
from medrelease.privacy.ledger import Ledger
from tests.flow.test_review import ROWS, reviewed_dataset
from tests.served.test_ui_browser import (
    _final_run,
    _keep,
    _log_in,
    _logged_in_form,
    _property,
    _submit_and_finish,
    browser,  # noqa: F401  (the module's Chromium)
)

pytestmark = [pytest.mark.server, pytest.mark.browser]


def _paused(client, run_id, log: Path, timeout_s: float = 240):
    deadline = time.monotonic() + timeout_s
    while True:
        run = client.read_flow_run(run_id)
        if run.state and run.state.is_paused() and run.state.state_details.run_input_keyset:
            return run
        assert not (run.state and run.state.is_final()), f"{run.state}: {log.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"never paused:\n{log.read_text()[-3000:]}"
        time.sleep(1)


def _approve_in_the_ui(page, ui: str, run_id, auth: str, shots: Path,
                       decision: str = "approve", reason: str = "release board: fine") -> None:
    """Open the paused run, click Resume, read the form, decide with a reason, submit."""
    _log_in(page, f"{ui}/runs", auth)
    page.goto(f"{ui}/runs/flow-run/{run_id}")
    page.get_by_text("waiting for review").first.wait_for(timeout=60_000)
    page.get_by_role("button", name=re.compile("Resume")).first.click()
    page.get_by_text("stays counted").first.wait_for(timeout=30_000)
    page.wait_for_timeout(1000)
    page.screenshot(path=str(shots / "review-form.png"), full_page=True)
    dialog = page.locator("[role=dialog], .p-modal").last
    control = dialog.locator("button.p-select-button__control").first
    control.focus()
    control.press("ArrowDown")
    page.locator(".p-select-option", has_text=re.compile(f"^{decision}$")).first.click()
    dialog.locator("textarea, input[type=text]").last.fill(reason)
    page.screenshot(path=str(shots / f"review-form-{decision}.png"), full_page=True)
    refused: list[str] = []  # a 503 "database is locked" (SQLite; README) is sent again
    page.on("response", lambda r: r.status >= 400 and "/resume" in r.url and refused.append(
        f"{r.request.method} {r.url} -> {r.status}"))
    for _attempt in range(4):
        seen = len(refused)
        dialog.get_by_role("button", name=re.compile("^(Submit|Resume)$")).last.click()
        deadline = time.monotonic() + 30
        while len(refused) == seen and dialog.is_visible() and time.monotonic() < deadline:
            page.wait_for_timeout(250)
        if not any(answer.endswith("-> 503") for answer in refused[seen:]):
            assert len(refused) == seen, f"the review form was refused: {refused}"
            return
    raise AssertionError(f"the review form was refused each time: {refused}")


# The runs this module's tests read, submitted together when its first test starts (per
# served server): they run while the earlier tests drive the browser, instead of one after
# another. name -> (dataset folder, run id)
_RUNS: dict[str, dict[str, tuple[Path, object]]] = {}


def _submitted(served, name: str) -> tuple[Path, object]:
    """Submit this module's runs on first use: a histogram release of each of two datasets
    with ``review: required`` (their own sources; the paused runs wait for the steward), and
    an aim release of a small dataset (2,000 rows: aim in seconds)."""
    if served.api_url not in _RUNS:
        requests = {}
        for dataset, skip in (("reviewed", 0), ("aim-small", 2000), ("rejected", 2 * ROWS)):
            folder = served.home / "datasets" / dataset
            folder.mkdir(parents=True, exist_ok=True)
            review = "off" if dataset == "aim-small" else "required"
            config = reviewed_dataset(folder, review=review, name=dataset, skip=skip)
            requests[dataset] = (folder, {"dataset": str(config), "mechanism": label("histogram"),
                                          "epsilon": 0.5})
        requests["aim-small"][1].update(
            mechanism=label("aim"), epsilon=1.0, seed=5, evaluate=False,
            parameters={"rounds_per_column": 1, "iters": 50, "final_iters": 50,
                        "max_model_size": 1.0})
        with (temporary_settings(updates={PREFECT_API_URL: served.api_url}),
              get_client(sync_client=True) as client):
            deployment = client.read_deployment_by_name("medrelease-release/on-demand")
            _RUNS[served.api_url] = {
                dataset: (folder, client.create_flow_run_from_deployment(
                    deployment.id, parameters={"request": request}).id)
                for dataset, (folder, request) in requests.items()}
    return _RUNS[served.api_url][name]


def _paused_release(served, name: str):
    """A dataset with ``review: required`` (its own source), a histogram release of it
    submitted to the on-demand deployment, and that run once it waits, Paused, for review."""
    folder, run_id = _submitted(served, name)
    with (temporary_settings(updates={PREFECT_API_URL: served.api_url}),
          get_client(sync_client=True) as client):
        return folder, _paused(client, run_id, served.log)


def test_a_reviewed_release_waits_and_is_approved_in_the_ui(served, browser, tmp_path: Path,  # noqa: F811
                                                            request) -> None:
    _, run = _paused_release(served, "reviewed")
    ui = served.api_url.removesuffix("/api")
    assert run.name == "reviewed · histogram · eps 0.5"
    assert not (served.home / "releases" / "reviewed").exists()  # nothing public yet
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    try:
        _approve_in_the_ui(page, ui, run.id, served.auth, tmp_path)
    except Exception:
        page.screenshot(path=str(tmp_path / "review-debug.png"), full_page=True)
        _keep(tmp_path / "review-debug.png", request)
        (Path(__file__).resolve().parents[2] / "var" / "test-screenshots" /
         "review-debug.html").write_text(page.content())
        raise
    with (temporary_settings(updates={PREFECT_API_URL: served.api_url}),
          get_client(sync_client=True) as client):
        ended = _final_run(client, run.name, served.log, run.id)
    assert ended.state.is_completed(), f"{ended.state.name}: {ended.state.message}"
    [manifest] = list((served.home / "releases" / "reviewed").glob("*/manifest.json"))
    release_id = json.loads(manifest.read_text())["release_id"]
    assert ended.state.message.startswith("Published: ") and release_id in ended.state.message
    record = json.loads((served.home / "steward" / "reviewed" / release_id / "record.json")
                        .read_text())
    assert record["review"]["decision"] == "approve"
    assert record["review"]["reason"] == "release board: fine"
    page.close()
    # The confirmation a guarantee-voiding mechanism needs, as the form shows it.
    form, _ = _logged_in_form(served, browser, "", (1440, 1000))
    form.reload()  # the login's leftover toasts (README, step 3)
    box = _property(form, "Void the lifetime guarantee")
    box.wait_for(timeout=60_000)
    box.scroll_into_view_if_needed()
    assert "FOR GOOD" in box.inner_text()
    form.screenshot(path=str(tmp_path / "void-confirmation.png"))
    form.close()
    for shot in ("review-form.png", "review-form-approve.png", "void-confirmation.png"):
        _keep(tmp_path / shot, request)


def test_aims_summary_in_the_ui_speaks_of_rounds_and_marginals(served, browser,  # noqa: F811
                                                               tmp_path: Path, request) -> None:
    """The release summary artifact of an aim run, as the steward reads it at 1440 px: aim's
    own words (rounds, marginals measured, synthetic rows, error bars), no lattice or class
    sizes, nothing cut off on the right."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    from tests.served.test_ui_browser import CUT_OFF_CELLS

    _, run_id = _submitted(served, "aim-small")
    with (temporary_settings(updates={PREFECT_API_URL: served.api_url}),
          get_client(sync_client=True) as client):
        ended = _final_run(client, "aim-small", served.log, run_id)
        assert ended.state.is_completed(), ended.state.message
        [summary] = [a for a in client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))) if a.key
            and a.key.endswith("release-summary")]
    ui = served.api_url.removesuffix("/api")
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    _log_in(page, f"{ui}/runs", served.auth)
    page.goto(f"{ui}/artifacts/artifact/{summary.id}")
    page.get_by_text("marginals measured with noise").first.wait_for(timeout=60_000)
    page.wait_for_timeout(1000)
    page.screenshot(path=str(tmp_path / "aim-summary.png"), full_page=True)
    text = page.locator("body").inner_text()
    for words in ("lattice node", "ladder", "smallest class", "rows unique"):
        assert words not in text, words
    assert page.evaluate(CUT_OFF_CELLS) == 0
    page.close()
    _keep(tmp_path / "aim-summary.png", request)


def _release_of(served, folder: Path) -> list[Path]:
    return list((served.home / "releases" / folder.name).glob("*/manifest.json"))


def test_a_reviewed_release_rejected_in_the_ui_publishes_nothing_and_counts_the_spend(
        served, browser, tmp_path: Path, request) -> None:  # noqa: F811
    folder, run = _paused_release(served, "rejected")
    ui = served.api_url.removesuffix("/api")
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    try:
        _approve_in_the_ui(page, ui, run.id, served.auth, tmp_path, decision="reject",
                           reason="too coarse for the study")
    except Exception:
        page.screenshot(path=str(tmp_path / "reject-debug.png"), full_page=True)
        _keep(tmp_path / "reject-debug.png", request)
        raise
    finally:
        page.close()
    with (temporary_settings(updates={PREFECT_API_URL: served.api_url}),
          get_client(sync_client=True) as client):
        ended = _final_run(client, run.name, served.log, run.id)
    assert ended.state.name == "Not published", f"{ended.state.name}: {ended.state.message}"
    assert "too coarse for the study" in ended.state.message
    assert _release_of(served, folder) == []
    [spend] = Ledger(served.home / "ledger.sqlite").spends("rejected")
    assert spend.status == "failed" and spend.epsilon == pytest.approx(0.5)
    assert "too coarse for the study" in spend.note


def test_kanon_from_the_form_needs_the_void_confirmation(served, browser, tmp_path: Path,  # noqa: F811
                                                         request) -> None:
    """Without the box: Refused in one sentence, nothing spent, nothing published. With it:
    published, and its own manifest says it voided the source's lifetime guarantee."""
    folder = served.home / "datasets" / "voidable"
    folder.mkdir(parents=True, exist_ok=True)
    config = reviewed_dataset(folder, review="off", name="voidable", skip=3 * ROWS)
    ends = {}
    for confirmed in (False, True):
        form, _ = _logged_in_form(served, browser, "", (1300, 1900))
        try:
            form.locator(".schema-form-property__label").first.wait_for(timeout=60_000)
            _property(form, "Dataset").locator("textarea, input").first.fill(str(config))
            select = _property(form, "Mechanism").locator("button.p-select-button__control")
            select.focus()
            select.press("ArrowDown")
            form.locator(".p-select-option").filter(has_text=label("kanon")).first.click()
            _property(form, "Advanced: mechanism parameters").locator("textarea").fill(
                '{"k": 12}')
            if confirmed:
                _property(form, "Void the lifetime guarantee").locator("[role=switch]").click()
            _property(form, "Evaluate").locator("[role=switch]").click()
            with temporary_settings(updates={PREFECT_API_URL: served.api_url}):
                ends[confirmed] = _submit_and_finish(form, served)
        except Exception:
            form.screenshot(path=str(tmp_path / f"void-{confirmed}-debug.png"), full_page=True)
            _keep(tmp_path / f"void-{confirmed}-debug.png", request)
            raise
        finally:
            form.close()
        if not confirmed:
            refused = ends[False].state
            assert refused.name == "Refused", f"{refused.name}: {refused.message}"
            assert refused.message.startswith("Nothing spent: ")
            assert "void_lifetime_guarantee" in refused.message
            assert Ledger(served.home / "ledger.sqlite").spends("voidable") == []
            assert _release_of(served, folder) == []
    published = ends[True].state
    assert published.is_completed(), f"{published.name}: {published.message}"
    [manifest] = [json.loads(p.read_text()) for p in _release_of(served, folder)]
    assert manifest["mechanism"] == "kanon"
    assert manifest["lifetime"]["void"] and manifest["lifetime"]["voided_by_this_release"]
