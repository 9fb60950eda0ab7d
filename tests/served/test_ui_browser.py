"""The steward's on-demand form in a real browser: Debian's Chromium driven by Playwright
against a real ``prefect server`` serving the deployments (the ``served`` fixture).

For every registered mechanism the test opens the form in Prefect's default UI, picks the
mechanism from the dropdown by its guarantee label, fills epsilon (or leaves it empty for the
syntactic models) and an advanced parameter, submits, and checks that the run completes with
exactly those parameters. The newer UI is opened too and must list the same labels.
Screenshots go to the test's output folder (``pytest --basetemp`` or the printed path).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
from pathlib import Path
from uuid import UUID

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterName,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.settings import PREFECT_API_URL, temporary_settings

from medrelease.mechanisms import label, labels

pytestmark = [pytest.mark.server, pytest.mark.browser]
CHROMIUM = "/usr/bin/chromium"
WAIT_S = 240
# mechanism -> (dataset, epsilon typed in the form or None, advanced parameters as JSON)
SUBMISSIONS = {
    "ipa": ("nps-sample", "0.8", '{"suppression_threshold": 3}'),
    "ipa-paper": ("nps-sample", "0.5", '{"threshold_noise": "authors_code"}'),
    "histogram": ("nps-sample", "0.5", '{"cell_limit": 50000}'),
    "kanon": ("nps-sample", None, '{"k": 12}'),
    "mondrian": ("nps-sample", None, '{"variant": "relaxed"}'),
    "pseudonymize": ("nps-sample", None, '{"method": "hmac"}'),
    "diffgen": ("adult", "1.0", '{"specializations": 4}'),
    # aim with its defaults is the sample's default: test_submit_with_the_defaults_... releases
    # it; here one round per column keeps this walk through every mechanism short
    "aim": ("nps-sample", "1.0", '{"rounds_per_column": 1}'),
}

# no proven DP guarantee: the form needs 'Void the lifetime guarantee' ticked (issue 39)
VOIDS_THE_LIFETIME = ("ipa-paper", "kanon", "mondrian", "pseudonymize")


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `bash scripts/dev.sh test` installs Debian's "
                    "chromium package (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"])
        yield chromium
        chromium.close()


def _property(page, title: str):
    """The innermost form field whose label starts with ``title`` (Prefect's default UI)."""
    name = page.locator(".schema-form-property__label", has_text=re.compile("^" + re.escape(title)))
    return page.locator(".schema-form-property").filter(has=name).last


def _fill_form(page, mechanism: str, dataset: str, epsilon: str | None, advanced: str) -> str:
    _property(page, "Dataset").locator("textarea, input").first.fill(dataset)
    select = _property(page, "Mechanism").locator("button.p-select-button__control")
    select.focus()
    select.press("ArrowDown")  # opens the dropdown
    options = page.locator(".p-select-option")
    options.first.wait_for(timeout=10_000)
    shown = {options.nth(i).inner_text().strip() for i in range(options.count())}
    assert set(labels()) <= shown, f"dropdown shows {sorted(shown)}"
    options.filter(has_text=label(mechanism)).first.click()
    if epsilon is not None:
        _property(page, "Epsilon").locator("input").fill(epsilon)
    _property(page, "Advanced: mechanism parameters").locator("textarea").fill(advanced)
    if mechanism in VOIDS_THE_LIFETIME:  # the confirmation such a mechanism needs (issue 39)
        _property(page, "Void the lifetime guarantee").locator("[role=switch]").click()
    _property(page, "Seed").locator("textarea, input").first.fill("11")  # a TEST release
    _property(page, "Evaluate").locator("[role=switch]").click()  # the report is not tested here
    return page.locator("input").first.input_value()  # the run name Prefect proposed


def _log_in(page, url: str, auth: str, shots: Path | None = None) -> None:
    """The server asks for its auth string (Prefect's basic authentication) on first load:
    type it into the login form as a steward would; the UI keeps it for the session."""
    page.goto(url)
    box = page.locator("input[placeholder='admin:pass']")
    box.wait_for(timeout=60_000)
    if shots is not None:
        page.screenshot(path=str(shots / "login.png"), full_page=True)
    box.fill(auth)
    box.press("Enter")
    box.wait_for(state="detached", timeout=60_000)


def _submit_each(browser, ui: str, deployment_id: str, shots: Path, log: Path,
                 auth: str) -> dict:
    """Log in, submit the form once per mechanism, and return each mechanism's final flow run.

    The forms are submitted one after the other and the runs waited for together (served
    runs start two at a time, as ``medrelease serve`` runs them): a steward submitting several
    requests does not wait for each, and the runs finish while the next forms are filled."""
    page = browser.new_page(viewport={"width": 1300, "height": 1900})
    _log_in(page, f"{ui}/deployments/deployment/{deployment_id}/run", auth, shots)
    problems: list[str] = []
    page.on("response", lambda r: r.status >= 400 and problems.append(
        f"{r.request.method} {r.url} -> {r.status}"))
    names = {}
    for mechanism, (dataset, epsilon, advanced) in SUBMISSIONS.items():
        page.goto(f"{ui}/deployments/deployment/{deployment_id}/run")
        page.locator(".schema-form-property__label").first.wait_for(timeout=60_000)
        name = _fill_form(page, mechanism, dataset, epsilon, advanced)
        page.screenshot(path=str(shots / f"form-{mechanism}.png"), full_page=True)
        _submit(page, name, problems)
        if not _run_created(name):
            page.screenshot(path=str(shots / f"not-submitted-{mechanism}.png"), full_page=True)
            pytest.fail(f"{mechanism}: no flow run {name!r} after Submit; see "
                        f"{shots}/not-submitted-{mechanism}.png; browser saw: {problems[-5:]}")
        names[mechanism] = name
    page.close()
    with get_client(sync_client=True) as client:
        return {mechanism: _final_run(client, name, log) for mechanism, name in names.items()}


def _submit(page, name: str, problems: list[str]) -> None:
    """Click Submit; click it again, as a steward would, if Prefect's SQLite server answered
    503 "database is locked" (its UI shows "Oops. Something went wrong"; README).

    The run is known by the id in the server's answer to the form's ``create_flow_run``: a
    served run renames itself as it starts (``_SUBMITTED``), and one forked from the preloaded
    process can start, rename itself and finish between two polls by the proposed name."""
    for attempt in range(10):  # runs submitted before are running: the server is busy
        seen = len(problems)
        submit = page.get_by_role("button", name=re.compile("^Submit"))
        try:
            with page.expect_response(_creates_flow_run, timeout=30_000) as answer:
                if attempt:  # the last 503's toast ("Oops…") can lie over the button: a
                    submit.dispatch_event("click")  # steward closes it; the click is the same
                else:
                    submit.click()
            _note_created(name, answer.value)
        except PlaywrightTimeoutError:  # no request sent: the checks below say what happened
            pass
        if not _answered_503(page, name, problems, seen):
            return
        # A 503 comes at once when another run's write lands during the form's transaction
        # (SQLite's busy snapshot is not waited for): a steward clicking again at once meets
        # the same running releases. Wait a little longer each time (CI: 2 slow cores).
        page.wait_for_timeout(min(3_000 * (attempt + 1), 15_000))


def _creates_flow_run(response) -> bool:
    return response.request.method == "POST" and response.url.endswith("/create_flow_run")


def _note_created(name: str, response) -> None:
    """The run the server created for the form, by id, when it carries the proposed name."""
    if response.ok:
        created = response.json()
        if created.get("name") == name:
            _SUBMITTED[name] = UUID(created["id"])


def _answered_503(page, name: str, problems: list[str], seen: int, wait_s: float = 30) -> bool:
    """Wait for the run to exist (False) or for a 503 after response ``seen`` (True)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if _run_created(name, timeout_s=0):
            return False
        if any("create_flow_run -> 503" in p for p in problems[seen:]):
            return True
        page.wait_for_timeout(500)
    return False


# The id of each run found by the name the form proposed: the run renames itself when it starts
# ('<dataset> · <mechanism> · eps <epsilon>', issue 39), so it is followed by id from then on.
_SUBMITTED: dict[str, object] = {}


def _run_created(name: str, timeout_s: float = 90) -> bool:
    """The server has the run the form submitted (checked by its name, not by the page URL)."""
    if name in _SUBMITTED:
        return True
    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while True:
            found = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                name=FlowRunFilterName(any_=[name])))
            if found:
                _SUBMITTED[name] = found[0].id
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)


def _final_run(client, name: str, log: Path, run_id=None):
    """The run, once final: by its id (given, or found when the form created it), else by its
    name."""
    deadline = time.monotonic() + WAIT_S
    run_id = run_id or _SUBMITTED.get(name)
    while True:
        [run] = ([client.read_flow_run(run_id)] if run_id else client.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))) or [None]
        if run is not None and run.state and run.state.is_final():
            return run
        assert time.monotonic() < deadline, f"run {name} not final:\n{log.read_text()[-3000:]}"
        time.sleep(1)


def test_every_mechanism_from_the_form(served, browser, tmp_path: Path, request) -> None:
    shots = tmp_path / "screenshots"
    shots.mkdir()
    ui = served.api_url.removesuffix("/api")
    with temporary_settings(updates={PREFECT_API_URL: served.api_url}):
        with get_client(sync_client=True) as client:
            deployment = client.read_deployment_by_name("medrelease-release/on-demand")
        runs = _submit_each(browser, ui, str(deployment.id), shots, served.log, served.auth)
    for mechanism, run in runs.items():
        dataset, epsilon, advanced = SUBMISSIONS[mechanism]
        sent = run.parameters["request"]
        assert run.state.is_completed(), f"{mechanism}: {run.state.name}: {run.state.message}"
        assert sent["mechanism"] == label(mechanism) and sent["dataset"] == dataset
        assert sent.get("epsilon") == (float(epsilon) if epsilon else None)
        assert sent["parameters"] == json.loads(advanced) and str(sent["seed"]) == "11"
    manifests = list((served.home / "test-releases").rglob("manifest.json"))
    by_mechanism = {m["mechanism"]: m for m in (json.loads(p.read_text()) for p in manifests)}
    assert set(SUBMISSIONS) <= set(by_mechanism), sorted(by_mechanism)
    assert by_mechanism["ipa"]["epsilon_spent"] == pytest.approx(0.8)
    synthetic = by_mechanism["aim"]
    assert synthetic["mechanism_details"]["synthetic"].startswith("synthetic rows")
    assert synthetic["mechanism_details"]["measurements"], "aim's rounds are published"
    _keep(shots, request)


def _logged_in_form(served, browser, ui_path: str, viewport: tuple[int, int]):
    """A new page, logged in, on the on-demand deployment's run form (``{ui}{ui_path}/run``)."""
    ui = served.api_url.removesuffix("/api")
    with (temporary_settings(updates={PREFECT_API_URL: served.api_url}),
          get_client(sync_client=True) as client):
        deployment = client.read_deployment_by_name("medrelease-release/on-demand")
    page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
    url = f"{ui}{ui_path}/deployments/deployment/{deployment.id}/run"
    _log_in(page, url, served.auth)
    return page, url


def _submit_and_finish(page, served):
    """Submit the form as it stands; the run it created, once final."""
    name = page.locator("input").first.input_value()
    problems: list[str] = []  # the server's refusals, so a 503 "database is locked" is retried
    page.on("response", lambda r: r.status >= 400 and problems.append(
        f"{r.request.method} {r.url} -> {r.status}"))
    _submit(page, name, problems)
    assert _run_created(name), f"Submit created no run; the browser saw {problems[-5:]}"
    with get_client(sync_client=True) as client:
        return _final_run(client, name, served.log)


def test_submit_with_the_defaults_releases_the_sample(served, browser, tmp_path: Path,
                                                     request) -> None:
    """The steward's first click (issue 27): the form opens on the dataset default mechanism
    and Submit as it stands creates a run that releases with the dataset's own settings."""
    page, _ = _logged_in_form(served, browser, "", (1440, 1600))
    # Prefect's UI calls its API once before the login page (PrefectHQ/prefect#18518) and
    # keeps the refusals as toasts after the login; the README says to close them or reload.
    # After a reload nothing is refused and no such toast is left.
    refused: list[str] = []
    page.on("response", lambda r: r.status == 401 and refused.append(r.url))
    page.reload()
    page.locator(".schema-form-property__label").first.wait_for(timeout=60_000)
    page.wait_for_timeout(1500)
    assert not refused, refused
    assert page.get_by_text("Authentication failed").count() == 0
    assert page.get_by_text("Something went wrong").count() == 0
    mechanism = _property(page, "Mechanism").locator("button.p-select-button__control")
    assert "dataset default" in mechanism.inner_text()
    labels_shown = page.locator(".schema-form-property__label").all_inner_texts()
    assert labels_shown[0].strip() == "Release request", labels_shown[:3]  # not "request
    assert not any(t.strip().startswith("request") for t in labels_shown)  # (Optional)"
    page.screenshot(path=str(tmp_path / "form-defaults.png"), full_page=True)
    run = _submit_and_finish(page, served)
    page.close()
    assert run.state.is_completed(), f"{run.state.name}: {run.state.message}"
    assert run.parameters["request"]["mechanism"].startswith("dataset default")
    _keep(tmp_path / "form-defaults.png", request)


def test_a_wrong_parameter_from_the_form_is_refused_in_one_sentence_without_traceback(
        served, browser, tmp_path: Path, request) -> None:
    """Issue 27: a parameter the mechanism does not take, typed into the form, ends Refused; the
    run's page in the UI shows the one sentence and no traceback (screenshot at 1440 px), and the
    budget artifact fits the laptop screen."""
    with (temporary_settings(updates={PREFECT_API_URL: served.api_url}),
          get_client(sync_client=True) as client):  # one release first: a ledger to show
        deployment = client.read_deployment_by_name("medrelease-release/on-demand")
        first = client.create_flow_run_from_deployment(deployment.id, parameters={
            "request": {"dataset": "nps-sample", "mechanism": label("ipa"), "seed": 3,
                        "evaluate": False}})  # ipa: the node table artifact read below
    page, _ = _logged_in_form(served, browser, "", (1440, 1000))  # while that one runs
    page.locator(".schema-form-property__label").first.wait_for(timeout=60_000)
    _property(page, "Advanced: mechanism parameters").locator("textarea").fill(
        '{"nonsense": 1}')
    run = _submit_and_finish(page, served)
    assert run.state.name == "Refused", run.state
    with (temporary_settings(updates={PREFECT_API_URL: served.api_url}),
          get_client(sync_client=True) as client):
        assert _final_run(client, first.name, served.log, first.id).state.is_completed()
    assert "does not take nonsense" in run.state.message
    ui = served.api_url.removesuffix("/api")
    page.goto(f"{ui}/")  # one UI for the walk-through: "/" lands where the deep links do
    page.get_by_text("Switch to V2 UI").first.wait_for(timeout=60_000)
    assert "/v2" not in page.url
    page.goto(f"{ui}/runs/flow-run/{run.id}")
    page.get_by_text("release refused, nothing spent").first.wait_for(timeout=60_000)
    page.wait_for_timeout(1000)
    text = page.locator("body").inner_text()
    assert "does not take nonsense" in text and "Traceback" not in text
    page.screenshot(path=str(tmp_path / "refused-run.png"), full_page=True)
    with (temporary_settings(updates={PREFECT_API_URL: served.api_url}),
          get_client(sync_client=True) as client):
        logs = client.read_logs(log_filter=LogFilter(
            flow_run_id=LogFilterFlowRunId(any_=[run.id])))
    loud = [entry.message[:80] for entry in logs if entry.level >= logging.WARNING]
    assert len(loud) == 1 and loud[0].startswith("release refused"), loud  # one line
    for key in ("nps-sample-budget", "nps-sample-releases",  # refreshed by the refused run too
                "nps-sample-budget-steps", "nps-sample-input-rows", "nps-sample-release-summary",
                "nps-sample-node-information-loss"):
        page.goto(f"{ui}/artifacts/artifact/{_latest_artifact(served, key)}")
        page.get_by_text("nps-sample").first.wait_for(timeout=60_000)
        page.wait_for_timeout(1500)
        page.screenshot(path=str(tmp_path / f"artifact-{key}.png"), full_page=True)
        hidden = page.evaluate(CUT_OFF_CELLS)
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1") \
            and hidden == 0, f"{key}: {hidden} element(s) cut off on a 1440 px screen"
    page.close()
    for shot in tmp_path.glob("*.png"):
        _keep(shot, request)


# Table cells, list items and paragraphs whose right edge lies beyond the box that clips them.
CUT_OFF_CELLS = """[...document.querySelectorAll('td, th, li, p')].filter(e => {
    let box = e.parentElement;
    while (box && getComputedStyle(box).overflowX == 'visible') box = box.parentElement;
    return box && e.getBoundingClientRect().right > box.getBoundingClientRect().right + 1;
}).length"""


def test_a_repeat_under_a_new_name_is_visible_in_the_event_feed(served, browser, tmp_path: Path,
                                                                 request) -> None:
    """Issue 27: a file whose content the inbox already had, dropped under a new name, used to
    vanish into duplicates/; it now shows in the UI's Event Feed with its reason. (Content that
    fails validation, so nothing is spent: the first copy gives a Refused run.)"""
    bad = ("patient_id,age,sex,length_of_stay,surgery,region,diagnosis\n"
           "1,34,F,3,N,913578,A001\n")
    (served.inbox / "visits-a.csv").write_text(bad)
    _wait_for_file(served.inbox / "rejected" / "visits-a.csv", served.log)
    (served.inbox / "visits-a-again.csv").write_text(bad)
    _wait_for_file(served.inbox / "duplicates" / "visits-a-again.csv.reason.txt", served.log)
    ui = served.api_url.removesuffix("/api")
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    _log_in(page, f"{ui}/events", served.auth)
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    deadline = time.monotonic() + 60
    while True:  # the feed does not refresh itself: reload until the event is listed
        try:  # each load renders the feed a moment after it loads: wait for the text
            page.get_by_text("visits-a-again.csv").first.wait_for(timeout=5000)
            break
        except PlaywrightTimeout:
            assert time.monotonic() < deadline, "the filed event never showed in the Event Feed"
            page.reload()
    assert "medrelease.extract.filed" in page.locator("body").inner_text()
    # the arrival's card names the file, not only its hash (issue 39)
    assert re.search(r"medrelease\.extract\.visits-a\.csv\.[0-9a-f]{12}",
                     page.locator("body").inner_text())
    page.screenshot(path=str(tmp_path / "duplicate-event.png"), full_page=True)
    page.close()
    _keep(tmp_path / "duplicate-event.png", request)


def _wait_for_file(path: Path, log: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"no {path.name}:\n{log.read_text()[-3000:]}"
        time.sleep(0.5)


def _latest_artifact(served, key: str) -> str:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    with (temporary_settings(updates={PREFECT_API_URL: served.api_url}),
          get_client(sync_client=True) as client):
        [artifact] = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
            sort=ArtifactSort.CREATED_DESC, limit=1)
    return str(artifact.id)


def test_the_newer_ui_lists_the_same_labelled_mechanisms(served, browser, tmp_path: Path,
                                                         request) -> None:
    page, url = _logged_in_form(served, browser, "/v2", (1300, 1900))
    page.goto(url)
    page.get_by_text("Mechanism (Optional)").wait_for(timeout=60_000)
    page.get_by_role("button", name="Select Mechanism").click()
    for text in labels():
        page.get_by_role("option", name=text).wait_for(timeout=10_000)
    page.get_by_role("option", name=label("kanon")).click()
    page.screenshot(path=str(tmp_path / "v2-form.png"), full_page=True)
    assert page.get_by_text(label("kanon")).count() >= 1
    page.close()
    _keep(tmp_path / "v2-form.png", request)


def _keep(path: Path, request) -> None:
    """Copy screenshots to var/test-screenshots/ so a reader finds them after the run."""
    target = Path(__file__).resolve().parents[2] / "var" / "test-screenshots"
    target.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        for shot in path.glob("*.png"):
            shutil.copy(shot, target / shot.name)
    else:
        shutil.copy(path, target / path.name)
    print(f"{request.node.name}: screenshots in {target}")
