"""Issue 56, item 2: the steward's controls in the browser, not in a terminal.

In-process (the harness): a budget refusal comes before the input is read and says what is
left and how to raise the cap in the UI; the cap flow applies ``set-cap``'s rules and journal;
a dataset whose input is missing is refused with how to prepare it; the form says it before
the run (ready datasets, pseudonymize's key, the source the void switch voids); a mechanism
without noise names no random source.

Served (Debian's Chromium on a real ``prefect server`` and ``medrelease serve``): the steward's
walk — a small cap spent, the refusal read in the UI, the cap raised with the ``set-cap`` form,
the refused run's Retry published; a rejected run's Retry ends 'Not published' again, saying
it was rejected and that a new run is a new spend; the run list tells the endings apart.
Screenshots (var/test-screenshots/, copied to docs/ui/): budget-refusal.png, cap-form.png,
form-budget-help.png, form-datasets-and-void.png, retry-after-raise.png,
retry-after-reject.png, runs-list.png, secret-block-form.png.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml

from flows.cap import CAP_CHANGED, set_cap_flow
from flows.release import ReleaseRequest, release_flow
from flows.request_form import SECRET_BLOCK_FORM
from flows.states import result_of
from medrelease.privacy.ledger import Ledger

from ..flow.test_review import ROWS, reviewed_dataset
from .test_ui_browser import browser  # noqa: F401  (the module's Chromium, for the walk)


def small_cap_dataset(folder: Path, name: str, cap: float, review: str = "off",
                      skip: int = 0) -> Path:
    """The NPS sample's config on ``ROWS`` of its rows, its own source, lifetime cap ``cap``."""
    folder.mkdir(parents=True, exist_ok=True)
    config = reviewed_dataset(folder, review=review, name=name, skip=skip)
    spec = yaml.safe_load(config.read_text())
    spec["privacy"]["lifetime_epsilon"] = cap
    config.write_text(yaml.safe_dump(spec))
    return config


# the name follows the publication verdict of a noisy release: either is a publication
PUBLISHED = ("Published", "Published with warnings")


def histogram(config: Path, epsilon: float = 0.5) -> dict:
    return {"dataset": str(config), "mechanism": "histogram", "epsilon": epsilon,
            "evaluate": False}


# -- in-process -------------------------------------------------------------------------------

@pytest.fixture
def home(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.mark.usefixtures("prefect_harness")
def test_a_budget_refusal_comes_before_the_input_is_read_and_says_how_to_raise_it(
        home: Path, tmp_path: Path) -> None:
    """Before: the budget was first checked at the charge, after the extract was copied,
    hashed and counted, and the refusal said "left: 0" and nothing about what to do."""
    config = small_cap_dataset(tmp_path / "capped", "capped", cap=0.5)
    first = release_flow(ReleaseRequest(**histogram(config)), return_state=True)
    assert first.name in PUBLISHED, first.message
    # a scheduled run (skip if unchanged) of the same extract: nothing new, not a refusal
    unchanged = release_flow(ReleaseRequest(**histogram(config), skip_unchanged=True),
                             return_state=True)
    assert unchanged.name == "No new data", unchanged.message
    # read now, it would be refused for its rows (and copied to a snapshot first)
    (tmp_path / "capped" / "extract.csv").write_text("not,the,columns\n1,2,3\n")
    snapshots = home / "steward" / "snapshots"
    before = sorted(snapshots.rglob("*")) if snapshots.exists() else []
    state = release_flow(ReleaseRequest(**histogram(config)), return_state=True)
    assert state.name == "Refused", state.message
    assert "would exceed the lifetime privacy budget" in state.message, state.message
    assert "(left: 0). To raise the cap of source 'capped'" in state.message
    assert "column" not in state.message
    assert "Deployments → set-cap → Run" in state.message and "Retry this run" in state.message
    assert "medrelease ledger set-cap capped --epsilon" in state.message
    assert (sorted(snapshots.rglob("*")) if snapshots.exists() else []) == before
    assert len(Ledger(home / "ledger.sqlite").spends("capped")) == 1


@pytest.mark.usefixtures("prefect_harness")
def test_the_cap_form_applies_set_caps_rules_and_journal(home: Path, tmp_path: Path) -> None:
    config = small_cap_dataset(tmp_path / "capped", "capped", cap=0.5)
    assert release_flow(ReleaseRequest(**histogram(config)), return_state=True).is_completed()
    ledger = Ledger(home / "ledger.sqlite")
    short = set_cap_flow({"source": "capped", "epsilon": 2.0, "reason": "because"},
                         return_state=True)
    assert short.name == "Refused" and short.message.startswith("Nothing changed: ")
    assert "at least 10 characters" in short.message
    below = set_cap_flow({"source": "capped", "epsilon": 0.25, "reason": "board said lower"},
                         return_state=True)
    assert below.name == "Refused" and "cannot go below" in below.message
    unknown = set_cap_flow({"source": "nowhere", "epsilon": 2.0, "reason": "board minute 12"},
                           return_state=True)
    assert unknown.name == "Refused" and "no source 'nowhere'" in unknown.message
    assert ledger.cap_changes("capped") == []
    raised = set_cap_flow({"source": "capped", "epsilon": 2.0, "reason": "board minute 12"},
                          return_state=True)
    assert raised.name == CAP_CHANGED, raised.message
    assert "epsilon 0.5 -> 2" in raised.message and "left 1.5" in raised.message
    [change] = ledger.cap_changes("capped")
    assert (change.old_epsilon, change.new_epsilon, change.reason) == (0.5, 2.0,
                                                                       "board minute 12")
    assert change.new_delta == change.old_delta  # empty delta: unchanged
    journal = [json.loads(line) for line in Ledger.journal_path_for(home / "ledger.sqlite")
               .read_text().splitlines()]
    assert [e for e in journal if e.get("event") == "cap"][-1]["new_epsilon"] == 2.0
    again = release_flow(ReleaseRequest(**histogram(config)), return_state=True)
    assert again.name in PUBLISHED, again.message
    manifest = result_of(again)["manifest"]
    assert "board minute 12" in manifest["lifetime"]["statement"]


@pytest.mark.usefixtures("prefect_harness")
def test_not_published_is_not_success_and_its_callers_still_read_it(home: Path,
                                                                    tmp_path: Path) -> None:
    """'Not published' is a CANCELLED state (grey in the run list, where COMPLETED was the
    green of a publication); the CLI, the arrival flow and other in-process callers read its
    result through ``result_of`` (Prefect's ``result()`` raises for a CANCELLED state)."""
    from prefect.client.schemas.objects import StateType
    from typer.testing import CliRunner

    from deployments.cli import app
    from flows.review import ReviewDecision, set_local_reviewer

    config = small_cap_dataset(tmp_path / "reviewed", "reviewed", cap=10, review="required")
    set_local_reviewer(lambda summary: ReviewDecision(decision="reject", reason="too coarse"))
    try:
        state = release_flow(ReleaseRequest(**histogram(config)), return_state=True)
    finally:
        set_local_reviewer(None)
    assert state.name == "Not published" and state.type == StateType.CANCELLED
    assert "rejected at review (too coarse)" in result_of(state)["not_published"]
    shown = CliRunner().invoke(app, ["release", str(config), "--mechanism", "histogram",
                                     "--epsilon", "0.5", "--reject", "still too coarse"])
    assert shown.exit_code == 0, shown.output
    assert "Not published" in shown.output and "still too coarse" in shown.output
    assert [s.status for s in Ledger(home / "ledger.sqlite").spends("reviewed")] == \
        ["failed", "failed"]


@pytest.mark.usefixtures("prefect_harness")
def test_a_dataset_whose_input_is_missing_is_refused_with_how_to_prepare_it(
        home: Path, tmp_path: Path) -> None:
    from flows.prepare import how_to_prepare
    from medrelease.data.config import find_config

    config = small_cap_dataset(tmp_path / "unready", "unready", cap=1.0)
    (tmp_path / "unready" / "extract.csv").unlink()
    state = release_flow(ReleaseRequest(**histogram(config)), return_state=True)
    assert state.name == "Refused", state.message
    assert "the input of dataset 'unready' is not there yet" in state.message
    assert "Nothing was read or spent" in state.message
    assert not (home / "ledger.sqlite").exists() or not Ledger(home / "ledger.sqlite").spends()
    hint = how_to_prepare(find_config("mimic-demo"))
    assert "Deployments → prepare-mimic → Run" in hint and "medrelease prepare-mimic" in hint


def test_the_form_says_before_the_run_what_each_choice_needs(tmp_path: Path,
                                                             monkeypatch) -> None:
    """Which datasets are ready (mimic-demo's input is prepared, or the form says how), the
    key pseudonymize needs with a link to Prefect's own Secret block form, and the source the
    void switch voids, with what happens once it is void."""
    from flows.prepare import input_missing
    from medrelease.data.config import find_config

    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    properties = ReleaseRequest.model_json_schema()["properties"]
    dataset = properties["dataset"]["description"]
    mimic = find_config("mimic-demo")
    if input_missing(mimic):
        assert "NOT READY: **mimic-demo**: its input is missing — prepare it first" in dataset
    else:
        assert "mimic-demo (one patient" in dataset
    assert "nps-sample (one row)" in dataset
    mechanisms = properties["mechanism"]["description"]
    pseudonymize = next(line for line in mechanisms.split("\n\n") if "**pseudonymize**" in line)
    assert f"[create it]({SECRET_BLOCK_FORM})" in pseudonymize
    assert "`medrelease-pseudonym-key`" in pseudonymize and "not 'AWS Secret'" in pseudonymize
    assert SECRET_BLOCK_FORM == "/blocks/catalog/secret/create"
    assert "Needs a key" not in mechanisms.replace(pseudonymize, "")
    names = list(properties)
    assert names.index("void_lifetime_guarantee") == names.index("mechanism") + 1
    void = properties["void_lifetime_guarantee"]
    assert "this dataset's source" in void["title"] and "IRREVERSIBLE" in void["title"]
    assert "nps-sample → source **nps-sample** (holds)" in void["description"]
    assert "adult, adult-ipa → source **adult-census**" in void["description"]
    assert "publish with no confirmation, and, spending no epsilon, even when no budget is " \
           "left" in void["description"]


def test_a_mechanism_without_noise_names_no_random_source(nps_config) -> None:
    from medrelease.privacy.publication import randomness_words
    from medrelease.privacy.randomness import PUBLICATION_RANDOMNESS
    from medrelease.refusals import plan_for_config

    kanon = randomness_words(plan_for_config(nps_config, "kanon", {"k": 10}, None))
    assert kanon.startswith("none: kanon draws no noise")
    assert "only the order of the released rows is shuffled" in kanon
    histogram = plan_for_config(nps_config, "histogram", {"epsilon": 1.0}, None)
    assert randomness_words(histogram) == PUBLICATION_RANDOMNESS


# -- served: the steward's walk in Chromium --------------------------------------------------

WALK_WAIT_S = 120


def _run_after(client, run_id, log: Path, not_name: str | None = None, paused: bool = False,
               runs_before: int = 0):
    """The run once final (or paused), and, after a Retry, once it ran again (its run count
    past ``runs_before``) and its state is no longer ``not_name``."""
    deadline = time.monotonic() + WALK_WAIT_S
    while True:
        run = client.read_flow_run(run_id)
        state = run.state
        if state is not None and run.run_count > runs_before and state.name != not_name and (
                state.is_final() or (paused and state.is_paused()
                                     and state.state_details.run_input_keyset)):
            return run
        assert time.monotonic() < deadline, \
            f"{run.name}: {state.name if state else None}\n{log.read_text()[-3000:]}"
        time.sleep(0.5)


def _reject(client, run_id, reason: str) -> None:
    """What the review form's reject sends, once the run waits for it (its schema saved)."""
    from prefect.flow_runs import resume_flow_run

    keyset = client.read_flow_run(run_id).state.state_details.run_input_keyset
    deadline = time.monotonic() + 30
    while True:
        try:
            client.read_flow_run_input(run_id, keyset["schema"])
            break
        except Exception:
            assert time.monotonic() < deadline, "the review form's schema was never saved"
            time.sleep(0.3)
    # (_sync: Playwright's sync API runs an event loop in this thread, which Prefect's
    # dispatch would take for an async caller and hand back an unawaited coroutine)
    resume_flow_run(run_id, run_input={"decision": "reject", "reason": reason}, _sync=True)


def _retry_in_the_ui(page, ui: str, run_id) -> None:
    """The run page's Retry button, and Retry again in the dialog that asks."""
    page.goto(f"{ui}/runs/flow-run/{run_id}")
    page.get_by_role("button", name=re.compile(r"^\s*Retry\s*$")).first.click()
    dialog = page.locator("[role=dialog], .p-modal").last
    dialog.wait_for(timeout=30_000)
    dialog.get_by_role("button", name=re.compile(r"^\s*Retry\s*$")).last.click()
    dialog.wait_for(state="hidden", timeout=30_000)


def _newest_log_lines_first(page) -> None:
    """The run page's log, newest line first: after a Retry, what the retry said."""
    control = page.locator(".logs-sort button.p-select-button__control, "
                           ".logs-sort .p-select-button__control").first
    control.wait_for(timeout=60_000)
    control.focus()
    control.press("ArrowDown")  # opens it, as the form tests open their dropdowns
    page.locator(".p-select-option", has_text="Newest to oldest").first.click()


def _wait_for_text(page, pattern: str, timeout_s: float = 60) -> None:
    """Until the page's text matches ``pattern`` (the help's markdown splits it into nodes)."""
    deadline = time.monotonic() + timeout_s
    while not re.search(pattern, page.locator("body").inner_text()):
        assert time.monotonic() < deadline, f"never shown: {pattern}"
        page.wait_for_timeout(500)


def _badge_colour(page, name: str) -> str:
    """The background colour of the first state badge in the run list whose whole text
    matches ``name`` (a pattern)."""
    badge = page.locator(".state-badge", has_text=re.compile(f"^\\s*(?:{name})\\s*$"))
    badge.first.wait_for(timeout=30_000)
    return badge.first.evaluate("e => getComputedStyle(e).backgroundColor")


@pytest.mark.server
@pytest.mark.browser
def test_the_stewards_walk_exhaust_raise_retry_and_a_rejected_runs_retry(
        served, browser, tmp_path: Path, request) -> None:  # noqa: F811
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from medrelease.mechanisms import label

    from .test_ui_browser import _final_run, _keep, _log_in, _property, _submit

    ui = served.api_url.removesuffix("/api")
    capped = small_cap_dataset(served.home / "datasets" / "capped", "capped", cap=0.5,
                               skip=5 * ROWS)
    rejecting = small_cap_dataset(served.home / "datasets" / "rejecting", "rejecting", cap=10,
                                  review="required", skip=6 * ROWS)
    ledger = served.home / "ledger.sqlite"
    shots = tmp_path / "shots"
    shots.mkdir()
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    with (temporary_settings(updates={PREFECT_API_URL: served.api_url}),
          get_client(sync_client=True) as client):
        on_demand = client.read_deployment_by_name("medrelease-release/on-demand")
        cap_form = client.read_deployment_by_name("medrelease-set-cap/set-cap")

        def submit(config: Path):  # as the form sends it: the mechanism by its label
            return client.create_flow_run_from_deployment(on_demand.id, parameters={
                "request": {**histogram(config), "mechanism": label("histogram")}}).id

        spent, rejected = submit(capped), submit(rejecting)
        assert _run_after(client, spent, served.log).state.name in PUBLISHED
        refused = submit(capped)  # the cap (0.5) is spent: refused before anything is read
        ended = _run_after(client, refused, served.log).state
        assert ended.name == "Refused" and "(left: 0)" in ended.message, ended.message
        try:
            # 1. the refusal, as the steward reads it in the UI
            _log_in(page, f"{ui}/runs", served.auth)
            page.goto(f"{ui}/runs/flow-run/{refused}")  # (and no leftover login toasts)
            page.get_by_text("would exceed the lifetime privacy budget").first.wait_for(
                timeout=60_000)
            text = page.locator("body").inner_text()
            assert "left: 0" in text and "Deployments → set-cap → Run" in text, text[:3000]
            assert "Retry this run" in text and "Traceback" not in text
            assert "/releases/capped/" not in text  # no link to a release that never was
            page.wait_for_timeout(500)
            page.screenshot(path=str(shots / "budget-refusal.png"), full_page=True)

            # 2. the cap form: the source's budget shown as it is now, raised with a reason
            page.goto(f"{ui}/deployments/deployment/{cap_form.id}/run")
            _wait_for_text(page, r"capped: cap epsilon 0\.5 / delta [0-9.e-]+, spent 0\.5, "
                                 r"left 0;")
            _property(page, "Source").locator("textarea, input").first.fill("capped")
            _property(page, "New lifetime epsilon").locator("input").first.fill("1")
            _property(page, "Reason").locator("textarea, input").first.fill(
                "release board, minute 12: one more release")
            page.screenshot(path=str(shots / "cap-form.png"), full_page=True)
            name = page.locator("input").first.input_value()
            _submit(page, name, [])
            changed = _final_run(client, name, served.log)
            assert changed.state.name == "Cap changed", changed.state.message
            assert "epsilon 0.5 -> 1" in changed.state.message
            assert "left 0.5" in changed.state.message

            # 3. the release form's budget help, read after the change (serve rewrites it)
            page.goto(f"{ui}/deployments/deployment/{on_demand.id}/run")
            deadline = time.monotonic() + 30
            while "source capped: 0.5 left" not in page.locator("body").inner_text():
                assert time.monotonic() < deadline, "the form's budget help was not refreshed"
                page.wait_for_timeout(1000)
                page.reload()
                page.locator(".schema-form-property__label").first.wait_for(timeout=60_000)
            epsilon = _property(page, "Epsilon")
            epsilon.scroll_into_view_if_needed()
            epsilon.screenshot(path=str(shots / "form-budget-help.png"))
            # the datasets ready (or how to prepare them), and the void switch right under the
            # mechanism it confirms, naming the sources
            page.set_viewport_size({"width": 1440, "height": 2400})  # the three fields at once
            dataset = _property(page, "Dataset")
            dataset.scroll_into_view_if_needed()
            void = _property(page, "Void the lifetime guarantee")
            assert "source **" not in void.inner_text() and "nps-sample → source nps-sample" \
                in void.inner_text()
            top, bottom = dataset.bounding_box(), void.bounding_box()
            page.screenshot(path=str(shots / "form-datasets-and-void.png"),
                            clip={"x": top["x"] - 8, "y": top["y"] - 8,
                                  "width": top["width"] + 16,
                                  "height": bottom["y"] + bottom["height"] - top["y"] + 16})
            page.set_viewport_size({"width": 1440, "height": 1000})
            link = page.locator(f"a[href='{SECRET_BLOCK_FORM}']")
            assert link.count() >= 1, "pseudonymize's help has no link to the Secret block form"
            page.goto(ui + link.first.get_attribute("href"))  # where the link leads
            _wait_for_text(page, r"Secret")
            heading = page.locator("body").inner_text()[:400]
            assert "AWS" not in heading and page.url.endswith(SECRET_BLOCK_FORM), heading
            page.screenshot(path=str(shots / "secret-block-form.png"), full_page=False)

            # 4. Retry on the refused run: checked again, published
            _retry_in_the_ui(page, ui, refused)
            retried = _run_after(client, refused, served.log, not_name="Refused",
                                 runs_before=1)
            assert retried.state.name in PUBLISHED, retried.state.message
            # the link in the state message ends where the release's URL ends
            assert re.search(r"/releases/capped/[0-9A-Za-z-]+ — publication verdict",
                             retried.state.message), retried.state.message
            page.goto(f"{ui}/runs/flow-run/{refused}")
            _newest_log_lines_first(page)
            page.get_by_text("published: http").first.wait_for(timeout=60_000)
            page.wait_for_timeout(1000)
            page.screenshot(path=str(shots / "retry-after-raise.png"), full_page=True)
            assert len(Ledger(ledger).spends("capped")) == 2

            # 5. a rejected release: 'Not published' (grey), and its Retry says so again
            _run_after(client, rejected, served.log, paused=True)
            _reject(client, rejected, "too coarse for the study")
            first = _run_after(client, rejected, served.log)
            assert first.state.name == "Not published", first.state.message
            assert first.state.type == StateType.CANCELLED
            _retry_in_the_ui(page, ui, rejected)
            again = _run_after(client, rejected, served.log, runs_before=first.run_count)
            message = again.state.message
            assert again.state.name == "Not published" and again.state.is_cancelled(), message
            assert "rejected at review" in message and "too coarse for the study" in message
            assert "a new run is a new spend" in message and "spent nothing" in message
            page.goto(f"{ui}/runs/flow-run/{rejected}")
            _newest_log_lines_first(page)
            page.get_by_text("a new run is a new spend").first.wait_for(timeout=60_000)
            page.wait_for_timeout(1000)
            page.screenshot(path=str(shots / "retry-after-reject.png"), full_page=True)
            [spend] = Ledger(ledger).spends("rejecting")  # the retry charged nothing
            assert spend.status == "failed" and "too coarse for the study" in spend.note

            # 6. the run list tells the endings apart (another refusal: the raised cap is spent)
            assert _run_after(client, submit(capped), served.log).state.name == "Refused"
            page.set_viewport_size({"width": 1440, "height": 1500})  # the list below its chart
            page.goto(f"{ui}/runs")
            colours = {name: _badge_colour(page, name)
                       for name in ("Published(?: with warnings)?", "Refused", "Not published")}
            assert len(set(colours.values())) == 3, colours
            page.wait_for_timeout(1000)
            page.screenshot(path=str(shots / "runs-list.png"))

            # every release form is kept current, the scheduled ones' Custom run included
            scheduled = client.read_deployment_by_name("medrelease-release/scheduled-nps-sample")
            help_text = json.dumps(scheduled.parameter_openapi_schema)
            deadline = time.monotonic() + 30
            while "source capped: 0 left" not in help_text:
                assert time.monotonic() < deadline, "the scheduled deployment's form is stale"
                time.sleep(1)
                help_text = json.dumps(client.read_deployment_by_name(
                    "medrelease-release/scheduled-nps-sample").parameter_openapi_schema)
            assert not scheduled.paused and all(s.active for s in scheduled.schedules)
            assert "was not refreshed" not in served.log.read_text()
        except Exception:
            page.screenshot(path=str(shots / "walk-debug.png"), full_page=True)
            raise
        finally:
            page.close()
            _keep(shots, request)


def test_the_forms_budget_glance_reads_both_ledgers_without_writing(ledger_at: str,
                                                                    tmp_path: Path) -> None:
    """What the forms' help reads every few seconds (``medrelease/privacy/budget_glance``):
    every source's cap, spend and void, the same on SQLite and PostgreSQL, and, on SQLite, a
    read that leaves the ledger file and its journal untouched."""
    from medrelease.privacy.budget_glance import source_budgets
    from medrelease.privacy.ledger_backends import open_ledger

    from .test_ledger import _request

    missing = str(tmp_path / "none.sqlite")
    assert source_budgets(missing) == [] and not Path(missing).exists()
    ledger = open_ledger(ledger_at)
    ledger.mark(ledger.reserve(_request("ward", 0.75, 1e-6, cap=1.0)), "released",
                release_id="r1")
    ledger.mark(ledger.reserve(_request("kept", 0.0, mechanism="kanon", cap=2.0, dp=False)),
                "released", release_id="r2")  # a published release without DP: VOID
    ledger.set_cap("ward", 3.0, 1e-5, "release board, minute 12")
    files = sorted(Path(ledger_at).parent.glob("*")) if "://" not in ledger_at else []
    before = [(p, p.stat().st_mtime_ns, p.stat().st_size) for p in files]
    budgets = {b.source: b for b in source_budgets(ledger_at)}
    assert set(budgets) == {"ward", "kept"}
    ward = budgets["ward"]
    assert (ward.lifetime_epsilon, ward.epsilon_spent, ward.epsilon_left) == (3.0, 0.75, 2.25)
    assert ward.delta_spent == pytest.approx(1e-6) and not ward.void
    assert ward.words() == "cap epsilon 3 / delta 1e-05, spent 0.75, left 2.25"
    assert budgets["kept"].void and budgets["kept"].words().startswith(
        "cap epsilon 2 / delta 1e-05, spent 0, lifetime guarantee VOID")
    assert [(p, p.stat().st_mtime_ns, p.stat().st_size) for p in files] == before
