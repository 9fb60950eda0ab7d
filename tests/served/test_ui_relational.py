"""Issue 58: a relational release from the Prefect form, in a real browser.

The steward's walk for ``mimic-relational`` (the MIMIC-III demo's patients -> admissions ->
diagnoses, prepared by ``medrelease prepare-mimic``): Debian's Chromium on the served
``prefect server`` (the ``served`` fixture) opens the on-demand release form, picks the dataset
and the ``relational`` mechanism from the dropdown, a seed (a TEST release), submits, and waits
for the run to end 'Published' with the portal link in its state message. The same browser then
opens that link: the release page lists one file per table (each saying what it references)
and intervals.csv, and renders report.md with "The tables and how they join". admissions.csv
and patients.csv are downloaded through the portal's file links and checked as a researcher
would: every admission's subject_id is a patient of patients.csv (and every diagnosis's
hadm_id an admission). Screenshots: form, run page, portal page (the test's output folder,
/tmp/relational-ui/ and var/test-screenshots/).
"""

from __future__ import annotations

import io
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from playwright.sync_api import expect

from medrelease.mechanisms import label

from .test_ui_browser import (  # the browser tests' Chromium and form helpers
    _fill_form,
    _keep,
    _log_in,
    _property,
    _submit_and_finish,
    browser,  # noqa: F401  (the module's Chromium)
)
from .test_ui_steward_controls import _newest_log_lines_first

pytestmark = [pytest.mark.server, pytest.mark.browser]

DATASET = "mimic-relational"
TABLES = ("patients", "admissions", "diagnoses")
WALK_SHOTS = Path("/tmp/relational-ui")


def _relational_input_ready() -> None:
    """mimic-relational's three input tables, written as ``medrelease prepare-mimic`` writes
    them (``write_admissions``: mimic-demo's file, then the three tables beside it) when any
    is missing; skipped without the MIMIC-III demo beside the checkout."""
    from flows.prepare import mimic_demo_folder
    from medrelease.data.config import find_config
    from medrelease.data.mimic import write_admissions

    folder = find_config(DATASET).input_path.parent
    if all((folder / f"{table}.csv").is_file() for table in TABLES):
        return
    source = mimic_demo_folder()
    if not source.is_dir():
        pytest.skip(f"MIMIC-III demo not beside the checkout ({source})")
    write_admissions(source, find_config("mimic-demo").input_path)
    assert all((folder / f"{table}.csv").is_file() for table in TABLES), sorted(
        p.name for p in folder.glob("*"))


def test_a_relational_release_from_the_form_joins_in_the_portal(
        served, browser, tmp_path: Path, request) -> None:  # noqa: F811
    from prefect.client.orchestration import get_client

    _relational_input_ready()
    shots = tmp_path / "shots"
    shots.mkdir()
    ui = served.api_url.removesuffix("/api")
    user, password = served.auth.split(":", 1)  # the portal takes the stewards' secret
    context = browser.new_context(viewport={"width": 1440, "height": 1000},
                                  http_credentials={"username": user, "password": password})
    page = context.new_page()
    try:
        with get_client(sync_client=True) as client:
            deployment = client.read_deployment_by_name("medrelease-release/on-demand")
        _log_in(page, f"{ui}/deployments/deployment/{deployment.id}/run", served.auth)
        # the login's leftover "Authentication failed" toasts (PrefectHQ/prefect#18518): the
        # README says reload, as test_ui_browser's defaults test does
        page.reload()
        page.locator(".schema-form-property__label").first.wait_for(timeout=60_000)
        # the dataset, relational from the dropdown by its label, epsilon, seed 11 (TEST),
        # evaluation off (the steward's report is not what this walk is about)
        _fill_form(page, "relational", DATASET, "1", "{}")
        # the switch's slide has ended (a screenshot right after the click showed it still on)
        expect(_property(page, "Evaluate").locator("[role=switch]")).to_have_attribute(
            "aria-checked", "false")
        page.wait_for_timeout(300)
        page.set_viewport_size({"width": 1440, "height": 3000})  # the form scrolls inside
        page.screenshot(path=str(shots / "relational-form.png"), full_page=True)
        page.set_viewport_size({"width": 1440, "height": 1000})
        run = _submit_and_finish(page, served)
        assert run.state.name in ("Published", "Published with warnings"), \
            f"{run.state.name}: {run.state.message}\n{served.log.read_text()[-3000:]}"
        sent = run.parameters["request"]
        assert sent["dataset"] == DATASET and str(sent["seed"]) == "11"
        assert sent["mechanism"] == label("relational") and sent["evaluate"] is False
        link = re.search(r"Published: (\S+)", run.state.message)
        assert link and link.group(1).startswith(f"{served.portal}/releases/{DATASET}/TEST-"), \
            run.state.message

        page.goto(f"{ui}/runs/flow-run/{run.id}")
        page.get_by_text(run.state.name).first.wait_for(timeout=60_000)
        _newest_log_lines_first(page)  # the run's last words first: the link and verdict
        page.get_by_text(f"published: {link.group(1)}").first.wait_for(timeout=60_000)
        page.wait_for_timeout(1000)
        page.screenshot(path=str(shots / "relational-run.png"), full_page=True)

        page.goto(link.group(1))  # the link as the steward follows it, in the same browser
        page.get_by_text("The tables and how they join").first.wait_for(timeout=30_000)
        files = page.locator("a.download").all_inner_texts()
        for name in (*(f"{t}.csv" for t in TABLES), "intervals.csv"):
            assert name in files, files
        assert files[:6] == [f"{t}.{kind}" for t in TABLES for kind in ("csv", "parquet")], \
            files  # one pair per table first
        text = page.locator("body").inner_text()
        assert "its subject_id is patients.subject_id" in text, text[:3000]
        assert "its hadm_id is admissions.hadm_id" in text, text[:3000]
        page.screenshot(path=str(shots / "relational-portal.png"), full_page=True)

        tables = {}
        for table in TABLES:  # downloaded as a researcher would: the file link, one GET each
            href = page.locator("a.download", has_text=re.compile(
                f"^{table}\\.csv$")).get_attribute("href")
            answer = context.request.get(served.portal + href)
            assert answer.ok, f"{href}: {answer.status} {answer.text()[:300]}"
            tables[table] = pd.read_csv(io.StringIO(answer.text()), dtype=str)
        patients, admissions, diagnoses = (tables[t] for t in TABLES)
        assert len(patients) and len(admissions) and len(diagnoses)
        orphans = admissions[~admissions["subject_id"].isin(patients["subject_id"])]
        assert orphans.empty, f"{len(orphans)} admission(s) of no released patient"
        assert diagnoses["hadm_id"].isin(admissions["hadm_id"]).all()
        assert admissions["subject_id"].value_counts().max() <= 2  # the YAML's max_children
    except Exception:
        page.screenshot(path=str(shots / "relational-debug.png"), full_page=True)
        raise
    finally:
        context.close()
        WALK_SHOTS.mkdir(parents=True, exist_ok=True)
        for shot in shots.glob("*.png"):
            shutil.copy(shot, WALK_SHOTS / shot.name)
        _keep(shots, request)
