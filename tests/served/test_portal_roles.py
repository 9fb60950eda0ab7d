"""Issue 56: accounts and roles in the release portal, and hole 10 (a link in the store served a
hidden partial folder; one malformed manifest took the catalogue down with a 500).

The portal is started as ``medrelease serve`` starts it (``_start_portal``: the secret from
``PREFECT_API_AUTH_STRING``, the accounts beside the ledger under ``MEDRELEASE_HOME``), its
accounts made with ``medrelease portal add-user`` (the password on stdin), and every route of
the app, enumerated from the app itself, is asked for over real HTTP by a researcher, a
steward, the Prefect server's secret, a wrong password and nobody.

The store is written once for the module, without Prefect: one release made by the engine
(``medrelease.release.release``) and published by the store (``ReleaseStore.publish``), with
``report.md`` rendered from its manifest as the flow renders it; a TEST release; a release
awaiting review; a steward record and an evidence report carrying the raw figures a researcher
must never see ("H062 (29 input rows)", the input's row count, hash and path); two malformed
manifests; and a link to a hidden ``.partial-`` folder inside the store.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import re
import shutil
import stat
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from deployments.cli import app as cli_app
from deployments.local_server import free_port
from medrelease.data.config import load_config
from medrelease.privacy.publication import render_public_report
from medrelease.release import release
from medrelease.storage.accounts import (
    SCRYPT_N,
    SCRYPT_P,
    SCRYPT_R,
    Account,
    hash_password,
    verify_password,
)
from medrelease.storage.store import CSV_TEXT_SAFETY, ReleaseStore, StewardRecords

from ..conftest import PAPER_TABLE_5
from .test_portal import _paper_with_a_public_disease_list

DATASET = "paper-example"
RID = "20991120T101500Z-histogram-0a1b2c3d"
TEST_RID = "TEST-20991121T090000Z-histogram-5eed0001"
STAGED_RID = "20991122T080000Z-histogram-57a9ed01"
BROKEN_RID = "20991118T000000Z-histogram-b40c3701"  # manifest.json is not JSON
ODD_RID = "20991119T000000Z-histogram-0dd00001"  # JSON, with fields of the wrong kind
LINKED_RID = "20991123T000000Z-histogram-11ed0001"  # a link to a hidden partial folder
PARTIAL = f".partial-{LINKED_RID}@otherhost@4242@0"

SECRET = "steward:roles-test-secret-8c1d7e"
RESEARCHER = ("rita", "rita-reads-releases-only")
STEWARD = ("sam", "sam-keeps-the-evidence-22")
WRONG = ("rita", "not-rita-s-password-333")
PARTIAL_MARKER = "HALF-WRITTEN-PARTIAL-91c2"
# What the steward record and the evidence report hold, and no researcher page may show: the
# per-value input count of the issue, the input's exact row count, hash and path.
INPUT_ROWS = 29_417
INPUT_SHA = hashlib.sha256(b"the raw extract").hexdigest()
INPUT_FILE = "/data/hospital/extract-2099-11-steward-only.csv"
STEWARD_ONLY = ("H062 (29 input rows)", "29,417", "29417", INPUT_SHA, INPUT_FILE, "input rows",
                "STEWARD", "INTERNAL", "/steward", TEST_RID, STAGED_RID, PARTIAL_MARKER)

PUBLIC, STEWARDS_ONLY = (200, 200), (403, 200)  # (researcher, steward)
TEST_ONLY = (404, 200)  # a TEST release: not for researchers, and not said to exist
NOWHERE = (404, 404)

# Route (as the app declares it) -> [(a path on it, (researcher's status, steward's status))].
# The test fails when the app has a route this table does not name, or names one it lacks.
ROUTE_TABLE: dict[str, list[tuple[str, tuple[int, int]]]] = {
    "/": [("/", PUBLIC)],
    "/releases": [("/releases", PUBLIC)],
    "/releases/{dataset}": [(f"/releases/{DATASET}", PUBLIC),
                            ("/releases/no-such-dataset", NOWHERE)],
    "/releases/{dataset}/{release_id}": [
        (f"/releases/{DATASET}/{RID}", PUBLIC),
        (f"/releases/{DATASET}/{TEST_RID}", TEST_ONLY),
        (f"/releases/{DATASET}/{BROKEN_RID}", PUBLIC),  # a page saying it cannot be read
        (f"/releases/{DATASET}/{ODD_RID}", PUBLIC),
        (f"/releases/{DATASET}/{LINKED_RID}", NOWHERE),  # hole 10
        (f"/releases/{DATASET}/{STAGED_RID}", NOWHERE)],
    "/releases/{dataset}/{release_id}/{name}": [
        (f"/releases/{DATASET}/{RID}/data.csv", PUBLIC),
        (f"/releases/{DATASET}/{RID}/manifest.json", PUBLIC),
        (f"/releases/{DATASET}/{RID}/report.md", PUBLIC),
        (f"/releases/{DATASET}/{TEST_RID}/data.csv", TEST_ONLY),
        (f"/releases/{DATASET}/{BROKEN_RID}/data.csv", NOWHERE),  # no guarantee, no files
        (f"/releases/{DATASET}/{ODD_RID}/data.csv", NOWHERE),
        (f"/releases/{DATASET}/{LINKED_RID}/data.csv", NOWHERE),
        (f"/releases/{DATASET}/{LINKED_RID}/manifest.json", NOWHERE),
        (f"/releases/{DATASET}/{STAGED_RID}/data.csv", NOWHERE)],
    "/steward": [("/steward", STEWARDS_ONLY)],
    "/steward/.staging/{dataset}/{release_id}": [
        (f"/steward/.staging/{DATASET}/{STAGED_RID}", STEWARDS_ONLY),
        (f"/steward/.staging/{DATASET}/no-such-release", (403, 404))],
    "/steward/.staging/{dataset}/{release_id}/{name}": [
        (f"/steward/.staging/{DATASET}/{STAGED_RID}/data.csv", STEWARDS_ONLY)],
    "/steward/{dataset}/{release_id}": [
        (f"/steward/{DATASET}/{RID}", STEWARDS_ONLY),
        (f"/steward/{DATASET}/no-such-release", (403, 404))],  # 403: existence not told
    "/steward/{dataset}/{release_id}/evidence/{path:path}": [
        (f"/steward/{DATASET}/{RID}/evidence/report.html", STEWARDS_ONLY),
        (f"/steward/{DATASET}/{RID}/evidence/plots/accuracy.svg", STEWARDS_ONLY)],
    "/steward/{dataset}/{release_id}/{name}": [
        (f"/steward/{DATASET}/{RID}/record.json", STEWARDS_ONLY),
        (f"/steward/{DATASET}/{RID}/checks.json", STEWARDS_ONLY)],
}


def _manifest(release_id: str, result, test: bool = False) -> dict:
    """A manifest with the fields the flow writes and ``render_public_report`` reads, from the
    engine's release (guarantee, node, budget steps, seed policy) and its released rows."""
    table = result.table
    dimensions = ["Age", "Gender", "Zipcode"]
    sizes = table.groupby(dimensions, observed=True).size()
    return {
        "release_id": release_id, "dataset": DATASET, "created_at": "2099-11-20T00:00:00+00:00",
        "mechanism": result.mechanism, "test_release": test,
        "guarantee": {**result.guarantee.as_dict(), "statement": result.guarantee.statement()},
        "lifetime": {"source": DATASET, "statement": "Source paper-example: epsilon 1 of 100 "
                     "spent over 1 release(s); the lifetime guarantee holds.",
                     "epsilon_spent": 1.0, "epsilon_cap": 100.0, "void": False},
        "released_rows": len(table), "chosen_node": result.node, "mechanism_details": {},
        "files": ["data.parquet", "data.csv", "manifest.json", "report.md"],
        "seed_policy": result.seed_policy, "randomness": "OS entropy",
        "text_safety": {"csv": CSV_TEXT_SAFETY},
        "risk": {"classes": len(sizes), "smallest_class": int(sizes.min()),
                 "unique_row_share": float((sizes == 1).sum() / len(table)),
                 "prosecutor_risk_max": float(1 / sizes.min()),
                 "prosecutor_risk_mean": float(len(sizes) / len(table))},
        "budget_steps": [step.as_dict() for step in result.budget_steps],
        "epsilon_spent": result.epsilon_spent, "delta_spent": 0.0,
        "checks": {"checks": ["every released value lies in its taxonomy",
                              "no identifier column is released"]},
        "verdict": {"level": "fit", "headline": "fit: every declared value released"},
    }


def _publish(store: ReleaseStore, release_id: str, result, test: bool = False) -> Path:
    manifest = _manifest(release_id, result, test)
    return store.publish(DATASET, release_id, result.table, manifest,
                         extra_files={"report.md": render_public_report(manifest)}).path


def build_home(home: Path) -> SimpleNamespace:
    """The store, the test store and the steward records the module's portal reads."""
    config = load_config(_paper_with_a_public_disease_list(home.parent / "paper-config"))
    result = release(PAPER_TABLE_5, config, mechanism="histogram", params={"epsilon": 1.0})
    store = ReleaseStore(home / "releases")
    published = _publish(store, RID, result)
    test_release = _publish(ReleaseStore(home / "test-releases", test=True), TEST_RID, result,
                            test=True)
    records = StewardRecords(home / "steward")
    record = records.write(DATASET, RID, {
        "release_id": RID, "dataset": DATASET, "status": "published",
        "requested_at": "2099-11-20T10:15:00+00:00", "input_file": INPUT_FILE,
        "input_sha256": INPUT_SHA, "input_rows": INPUT_ROWS,
        "information_loss": {"ncp": 0.21}}, files={"checks.json": json.dumps(
            {"input": {"rows": INPUT_ROWS, "values": {"H062": 29}}})})
    evaluation = record / "evaluation"
    (evaluation / "plots").mkdir(parents=True)
    (evaluation / "report.html").write_text(
        "<!doctype html><html><head><title>evidence</title></head><body><h1>Evidence</h1>"
        "<p>outcome values lost: H062 (29 input rows)</p><img src='plots/accuracy.svg'>"
        "</body></html>")
    (evaluation / "plots" / "accuracy.svg").write_text(
        "<svg xmlns='http://www.w3.org/2000/svg' width='40' height='20'>"
        "<rect width='40' height='20' fill='#1f5fbf'/></svg>")
    (evaluation / "evaluation.json").write_text(json.dumps({"input_rows": INPUT_ROWS}))
    # awaiting review: on the steward side only
    staged = home / "steward" / ".staging" / DATASET / STAGED_RID
    shutil.copytree(published, staged)
    (staged / "manifest.json").write_text(json.dumps(
        {**json.loads((published / "manifest.json").read_text()), "release_id": STAGED_RID}))
    # two malformed manifests: not JSON; JSON with fields of the wrong kind (a 500 before)
    for rid, text in ((BROKEN_RID, '{"release_id": "' + BROKEN_RID + '", "guarantee": {'),
                      (ODD_RID, json.dumps({"release_id": ODD_RID, "guarantee": "sound",
                                            "released_rows": "many", "created_at": 20991119,
                                            "mechanism": ["histogram"], "lifetime": [1],
                                            "verdict": {"level": "fit", "headline": 3}}))):
        folder = home / "releases" / DATASET / rid
        shutil.copytree(published, folder)
        (folder / "manifest.json").write_text(text)
    # a publish still being written (hidden), and a link to it under a release's name
    partial = home / "releases" / DATASET / PARTIAL
    shutil.copytree(published, partial)
    (partial / "manifest.json").write_text(json.dumps(
        {**json.loads((published / "manifest.json").read_text()), "release_id": LINKED_RID,
         "mechanism": PARTIAL_MARKER}))
    (partial / "data.csv").write_text(f"secret\n{PARTIAL_MARKER}\n")
    (home / "releases" / DATASET / LINKED_RID).symlink_to(PARTIAL, target_is_directory=True)
    return SimpleNamespace(release=published, test_release=test_release, record=record,
                           staged=staged)


def add_user(name: str, role: str, password: str, *extra: str):
    return CliRunner().invoke(cli_app, ["portal", "add-user", name, "--role", role, *extra],
                              input=password + "\n")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The store above, two accounts made by the CLI, and the portal started as ``serve``
    starts it, on a free loopback port."""
    from deployments.cli import _start_portal

    home = tmp_path_factory.mktemp("roles") / "home"
    port = free_port()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MEDRELEASE_HOME", str(home))
        for name in ("MEDRELEASE_LEDGER_URL", "MEDRELEASE_STORE", "MEDRELEASE_TEST_STORE",
                     "MEDRELEASE_STEWARD", "PREFECT_SERVER_API_AUTH_STRING",
                     "MEDRELEASE_PORTAL_USER_HEADER"):
            env.delenv(name, raising=False)
        env.setenv("PREFECT_API_AUTH_STRING", SECRET)  # README step 4
        env.setenv("MEDRELEASE_PORTAL_URL", f"http://127.0.0.1:{port}")
        built = build_home(home)
        added = [add_user(RESEARCHER[0], "researcher", RESEARCHER[1]),
                 add_user(STEWARD[0], "steward", STEWARD[1])]
        server = _start_portal("127.0.0.1", port)
        assert server is not None, "the portal did not start"
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline, "the portal did not start"
            time.sleep(0.05)
        try:
            yield SimpleNamespace(port=port, home=home, server=server, added=added, **vars(built))
        finally:
            server.should_exit = True


def get(site, path: str, who: tuple[str, str] | str | None, method: str = "GET",
        headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """``path`` as written, over a fresh connection, as ``who`` (name, password), the secret's
    ``user:pass`` line, or nobody."""
    connection = http.client.HTTPConnection("127.0.0.1", site.port, timeout=30)
    sent = dict(headers or {})
    if who is not None:
        line = who if isinstance(who, str) else f"{who[0]}:{who[1]}"
        sent["Authorization"] = "Basic " + base64.b64encode(line.encode()).decode()
    try:
        connection.request(method, path, headers=sent)
        answer = connection.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        connection.close()


def links(body: bytes) -> list[str]:
    return re.findall(r'href="([^"]+)"', body.decode("utf-8", "replace"))


def test_accounts_are_made_by_the_cli_and_only_their_hash_is_kept(site) -> None:
    """add-user read each password from stdin and printed neither it nor its hash; the file
    holds scrypt hashes only, and is readable by its owner only."""
    for result, (name, password) in zip(site.added, (RESEARCHER, STEWARD), strict=True):
        assert result.exit_code == 0, result.output
        assert f"portal account {name}:" in result.output
        assert password not in result.output and "scrypt$" not in result.output
    accounts = site.home / "portal-accounts.sqlite"
    assert stat.S_IMODE(os.stat(accounts).st_mode) == 0o600
    data = accounts.read_bytes()
    for _, password in (RESEARCHER, STEWARD):
        assert password.encode() not in data
    assert data.count(f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}$".encode()) == 2
    listed = CliRunner().invoke(cli_app, ["portal", "list-users"])
    assert listed.exit_code == 0
    assert re.search(r"rita\s+researcher", listed.output)
    assert re.search(r"sam\s+steward", listed.output)
    assert "scrypt" not in listed.output and RESEARCHER[1] not in listed.output


def test_every_route_answers_each_login_as_its_role_allows(site) -> None:
    """The route x role table, over real HTTP, on every route the app declares."""
    declared = {route.path for route in site.server.config.app.routes}
    assert declared == set(ROUTE_TABLE), (
        f"routes without an expectation here: {sorted(declared - set(ROUTE_TABLE))}; "
        f"expectations of routes the app lacks: {sorted(set(ROUTE_TABLE) - declared)}")
    failures = []
    for route, cases in ROUTE_TABLE.items():
        for path, (researcher, steward) in cases:
            for who, expected in ((RESEARCHER, researcher), (STEWARD, steward),
                                  (SECRET, steward), (WRONG, 401), (None, 401),
                                  ((STEWARD[0], WRONG[1]), 401), ("steward:wrong", 401)):
                status, headers, body = get(site, path, who)
                label = who if isinstance(who, str | None) else who[0]
                if status != expected:
                    failures.append(f"{route}: {path} as {label}: {status}, not {expected}")
                if status == 401 and not headers.get("www-authenticate", "").startswith(
                        "Basic realm="):
                    failures.append(f"{path} as {label}: 401 without a Basic challenge")
                if status != 200 and (INPUT_SHA.encode() in body or b"H062" in body):
                    failures.append(f"{path} as {label}: a refusal carries the record")
                assert headers["x-content-type-options"] == "nosniff"
    assert not failures, "\n".join(failures)


def test_nothing_of_the_steward_record_reaches_a_researcher(site) -> None:
    """Every page and file a researcher can reach — by the links from the front page, and
    every path of the table that answers them 200 — is free of the steward's record: no input
    count, hash or path, no evidence, no TEST or staged release, no link into /steward."""
    seen: dict[str, bytes] = {}
    queue = ["/"] + [path for cases in ROUTE_TABLE.values() for path, (researcher, _) in cases
                     if researcher == 200]
    while queue:
        path = queue.pop()
        if path in seen:
            continue
        status, headers, body = get(site, path, RESEARCHER)
        assert status == 200, (path, status)
        seen[path] = body
        if headers["content-type"].startswith("text/html"):
            queue += [link for link in links(body) if link.startswith("/")]
    assert f"/releases/{DATASET}/{RID}/data.parquet" in seen  # the crawl went all the way
    leaks = [(path, marker) for path, body in seen.items() for marker in STEWARD_ONLY
             if marker.encode() in body]
    assert leaks == []
    # what the steward sees on the same pages: the TEST release is listed for them only
    _, _, catalogue = get(site, f"/releases/{DATASET}", STEWARD)
    assert TEST_RID.encode() in catalogue and TEST_RID.encode() not in seen[f"/releases/{DATASET}"]
    _, _, steward_page = get(site, f"/steward/{DATASET}/{RID}", STEWARD)
    assert b"29,417" in steward_page and INPUT_SHA.encode() in steward_page
    _, _, evidence = get(site, f"/steward/{DATASET}/{RID}/evidence/report.html", SECRET)
    assert b"H062 (29 input rows)" in evidence


def test_the_catalogue_survives_malformed_manifests_and_lists_them_unreadable(site) -> None:
    """Hole 10, second half: a manifest that is not JSON and one whose fields are of the wrong
    kind (a 500 on the whole catalogue before) are listed as unreadable; their files are not
    offered; the good release is listed as before."""
    for who in (RESEARCHER, STEWARD):
        status, _, body = get(site, f"/releases/{DATASET}", who)
        page = body.decode()
        assert status == 200
        for rid in (BROKEN_RID, ODD_RID):
            row = page[page.index(f">{rid}<"):]
            assert "manifest unreadable" in row[:row.index("</tr>")], rid
        good = page[page.index(f">{RID}<"):]
        assert "published" in good[:good.index("</tr>")]
        status, _, front = get(site, "/", who)
        assert status == 200 and f'href="/releases/{DATASET}"'.encode() in front
        status, _, release_page = get(site, f"/releases/{DATASET}/{ODD_RID}", who)
        assert status == 200 and b"manifest cannot be read" in release_page
        assert f"/releases/{DATASET}/{ODD_RID}/data.csv".encode() not in release_page


def test_a_link_in_the_store_never_serves_a_hidden_partial_folder(site) -> None:
    """Hole 10, first half: ``<store>/<dataset>/<id>`` a symbolic link to the hidden
    ``.partial-`` folder beside it (inside the store) is not a release: 404 for everyone, not
    listed, nothing of it read; the partial folder itself is never a path."""
    assert (site.home / "releases" / DATASET / LINKED_RID).is_symlink()
    for who in (RESEARCHER, STEWARD, SECRET):
        for path in (f"/releases/{DATASET}/{LINKED_RID}", f"/releases/{DATASET}/{LINKED_RID}"
                     "/data.csv", f"/releases/{DATASET}/{PARTIAL}/data.csv",
                     f"/releases/{DATASET}/%2epartial-{LINKED_RID}/data.csv"):
            status, _, body = get(site, path, who)
            assert status == 404 and PARTIAL_MARKER.encode() not in body, (path, status)
        for path in ("/", "/releases", f"/releases/{DATASET}"):
            body = get(site, path, who)[2]
            assert LINKED_RID.encode() not in body and PARTIAL_MARKER.encode() not in body


def test_the_servers_secret_still_opens_the_steward_area_and_says_who_is_in(site) -> None:
    status, _, body = get(site, "/steward", SECRET)
    assert status == 200 and RID.encode() in body and b"signed in with the server's secret" in body
    status, _, body = get(site, "/", RESEARCHER)
    assert b"signed in as rita \xc2\xb7 researcher" in body
    status, _, body = get(site, "/steward", STEWARD)
    assert status == 200 and b"signed in as sam \xc2\xb7 steward" in body


def test_a_removed_account_is_refused_at_its_next_request(site) -> None:
    """A login passed is remembered (a keyed digest, for five minutes), but never past a
    change of the account: removed, its next request is 401; added back with another role,
    the old password does not open it."""
    name, password = "rosa", "rosa-s-password-for-a-day"
    assert add_user(name, "steward", password).exit_code == 0
    assert get(site, "/steward", (name, password))[0] == 200
    removed = CliRunner().invoke(cli_app, ["portal", "remove-user", name])
    assert removed.exit_code == 0, removed.output
    assert get(site, "/steward", (name, password))[0] == 401
    assert add_user(name, "researcher", "rosa-s-new-password-1234").exit_code == 0
    assert get(site, "/", (name, password))[0] == 401
    assert get(site, "/steward", (name, "rosa-s-new-password-1234"))[0] == 403
    assert CliRunner().invoke(cli_app, ["portal", "remove-user", name]).exit_code == 0


def test_a_researcher_cannot_write_or_guess_their_way_into_the_steward_area(site) -> None:
    """Methods other than GET/HEAD, encoded paths and a forged proxy header (none is trusted
    unless configured) leave a researcher outside."""
    for path in ("/steward", "/%73teward", "/steward/", f"/steward/{DATASET}/{RID}/record.json",
                 f"/%73teward/{DATASET}/{RID}/evidence/report.html"):
        status, _, body = get(site, path, RESEARCHER)
        assert status in (403, 404) and b"H062" not in body and INPUT_SHA.encode() not in body
    for method in ("POST", "PUT", "DELETE"):
        assert get(site, f"/releases/{DATASET}/{RID}/data.csv", RESEARCHER, method)[0] == 405
        assert get(site, "/steward", RESEARCHER, method)[0] == 403
    for header in ("X-Remote-User", "X-Forwarded-User", "Remote-User"):
        assert get(site, "/steward", RESEARCHER, headers={header: STEWARD[0]})[0] == 403
        assert get(site, "/steward", None, headers={header: STEWARD[0]})[0] == 401


def test_the_kdf_is_salted_scrypt_and_a_malformed_hash_opens_nothing() -> None:
    first, second = hash_password("same password here"), hash_password("same password here")
    assert first != second  # salted
    scheme, n, r, p, salt, key = first.split("$")
    assert (scheme, int(n), int(r), int(p)) == ("scrypt", 2 ** 15, 8, 3)
    assert len(base64.b64decode(salt)) == 16 and len(base64.b64decode(key)) == 32
    assert verify_password("same password here", first)
    assert not verify_password("same password herE", first)
    for stored in ("", "!", "plain", first.replace("scrypt", "md5"), "scrypt$1$8$1$AAAA$AAAA",
                   first.replace(f"${2 ** 15}$", f"${2 ** 30}$"), first + "$x"):
        assert not verify_password("same password here", stored), stored
    assert "scrypt" not in repr(Account("a", "steward", first, "now"))


@pytest.mark.browser
def test_a_researcher_and_a_steward_walk_the_portal_in_chromium(site, tmp_path: Path,
                                                                request) -> None:
    """In Chromium at 1440x900, as the researcher: the catalogue, a release, its CSV
    downloaded, the steward area refused; as the steward account: the steward area with the
    record and the release awaiting review. Screenshots (copied to var/test-screenshots/, and
    from there by hand to docs/ui/): portal-researcher-catalogue.png, portal-researcher.png,
    portal-researcher-refused.png, portal-steward-account.png."""
    from playwright.sync_api import sync_playwright

    from .test_ui_browser import CHROMIUM, _keep

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium")
    shots = tmp_path / "screenshots"
    shots.mkdir()
    url = f"http://127.0.0.1:{site.port}"
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM,
                                              args=["--no-sandbox", "--disable-gpu"])
        try:
            researcher = chromium.new_context(
                viewport={"width": 1440, "height": 900}, accept_downloads=True,
                http_credentials={"username": RESEARCHER[0], "password": RESEARCHER[1]})
            page = researcher.new_page()
            page.goto(url)
            assert "signed in as rita · researcher" in page.locator("header").inner_text()
            page.get_by_role("link", name=DATASET).click()
            page.wait_for_url(f"**/releases/{DATASET}")
            ids = page.locator("tbody tr td.id").all_inner_texts()
            assert ids == [RID, ODD_RID, BROKEN_RID]  # no TEST release, the link not listed
            assert "TEST" not in page.locator("main").inner_text()
            page.screenshot(path=str(shots / "portal-researcher-catalogue.png"))
            page.get_by_role("link", name=RID).click()
            page.wait_for_url(f"**/releases/{DATASET}/{RID}")
            assert page.get_by_role("heading", name="Guarantee", exact=True).is_visible()
            page.screenshot(path=str(shots / "portal-researcher.png"), full_page=True)
            with page.expect_download() as download:
                page.get_by_role("link", name="data.csv").click()
            assert download.value.suggested_filename == f"{RID}-data.csv"
            assert Path(download.value.path()).read_bytes() == (
                site.release / "data.csv").read_bytes()
            refused = page.goto(f"{url}/steward/{DATASET}/{RID}")
            assert refused.status == 403
            text = page.locator("body").inner_text()
            assert "for data stewards" in text and "29,417" not in text and "H062" not in text
            page.screenshot(path=str(shots / "portal-researcher-refused.png"))
            steward = chromium.new_context(
                viewport={"width": 1440, "height": 900},
                http_credentials={"username": STEWARD[0], "password": STEWARD[1]})
            page = steward.new_page()
            page.goto(f"{url}/steward")
            header = page.locator("header").inner_text()
            assert "STEWARD AREA" in header and "signed in as sam · steward" in header
            page.get_by_role("link", name=RID).click()
            page.wait_for_url(f"**/steward/{DATASET}/{RID}")
            assert "29,417" in page.locator("main").inner_text()
            page.screenshot(path=str(shots / "portal-steward-account.png"))
            answer = page.goto(f"{url}/steward/.staging/{DATASET}/{STAGED_RID}")
            assert answer.status == 200 and "NOT PUBLISHED" in page.locator("main").inner_text()
        finally:
            chromium.close()
    _keep(shots, request)


def test_accounts_from_postgresql_read_by_the_service_and_changed_by_the_owner(
        tmp_path: Path, monkeypatch, pg_cluster) -> None:
    """With a PostgreSQL ledger, accounts are ``medrelease_portal.accounts`` in its database:
    add-user needs the owner (--admin-url), the service role reads them and cannot change
    them, and the portal started as ``serve`` starts it, connected as the service, lets the
    account in with its role."""
    import psycopg

    from deployments.cli import _start_portal
    from medrelease.storage.accounts import PostgresAccounts, open_accounts

    database = pg_cluster.fresh_database()
    service_url = pg_cluster.url(database, "medrelease_service")
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MEDRELEASE_LEDGER_URL", service_url)
    for name in ("PREFECT_API_AUTH_STRING", "PREFECT_SERVER_API_AUTH_STRING",
                 "MEDRELEASE_PORTAL_USER_HEADER"):
        monkeypatch.delenv(name, raising=False)
    accounts = open_accounts()
    assert isinstance(accounts, PostgresAccounts) and not accounts.has_accounts()
    refused = add_user("pia", "researcher", "pia-reads-from-postgres")
    assert refused.exit_code == 1 and "--admin-url" in refused.output
    added = add_user("pia", "researcher", "pia-reads-from-postgres", "--admin-url",
                     pg_cluster.url(database))
    assert added.exit_code == 0, added.output
    assert "medrelease_portal.accounts" in added.output
    assert not (tmp_path / "home" / "portal-accounts.sqlite").exists()
    assert accounts.get("pia").role == "researcher"
    with psycopg.connect(service_url, autocommit=True) as conn:
        stored = conn.execute("SELECT password_hash FROM medrelease_portal.accounts").fetchall()
        assert [row[0].split("$")[0] for row in stored] == ["scrypt"]
        for statement in ("INSERT INTO medrelease_portal.accounts VALUES ('eve', 'steward', "
                          "'!', 'now')", "UPDATE medrelease_portal.accounts SET role = "
                          "'steward'", "DELETE FROM medrelease_portal.accounts",
                          "DROP TABLE medrelease_portal.accounts"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
    port = free_port()
    monkeypatch.setenv("MEDRELEASE_PORTAL_URL", f"http://127.0.0.1:{port}")
    server = _start_portal("127.0.0.1", port)  # no secret: the accounts are the only login
    try:
        while not server.started:
            time.sleep(0.05)
        portal = SimpleNamespace(port=port)
        assert get(portal, "/", ("pia", "pia-reads-from-postgres"))[0] == 200
        assert get(portal, "/steward", ("pia", "pia-reads-from-postgres"))[0] == 403
        assert get(portal, "/", ("pia", "wrong-password-for-pia"))[0] == 401
        assert get(portal, "/", None)[0] == 401  # not open: there are accounts
        removed = CliRunner().invoke(cli_app, ["portal", "remove-user", "pia", "--admin-url",
                                               pg_cluster.url(database)])
        assert removed.exit_code == 0, removed.output
        assert accounts.get("pia") is None
        assert get(portal, "/", ("pia", "pia-reads-from-postgres"))[0] == 401
    finally:
        server.should_exit = True


def test_a_single_sign_on_header_is_believed_from_loopback_only(tmp_path: Path,
                                                                monkeypatch) -> None:
    """MEDRELEASE_PORTAL_USER_HEADER names the proxy's header: from a loopback peer it logs the
    named account in with its role (a name without an account: 403); from any other peer it
    is ignored, and the request needs a password like any other. (In-process ASGI calls: a
    peer other than loopback cannot be had over this machine's loopback HTTP.)"""
    import asyncio

    import httpx

    from deployments.portal import PortalPlaces, create_app
    from medrelease.storage.accounts import SqliteAccounts

    accounts = SqliteAccounts(tmp_path / "accounts.sqlite")
    accounts.add("rita@example.org", "researcher", None)  # single sign-on only
    accounts.add("sam@example.org", "steward", None)
    places = PortalPlaces(tmp_path / "releases", tmp_path / "test-releases", tmp_path / "steward")
    app = create_app(places, None, accounts, user_header="X-Remote-User")

    async def statuses(peer: str) -> list[int]:
        transport = httpx.ASGITransport(app=app, client=(peer, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://portal.example.org"
                                     ) as client:
            asked = [("/", {"X-Remote-User": "Rita@Example.org"}, None),
                     ("/steward", {"X-Remote-User": "sam@example.org"}, None),
                     ("/steward", {"X-Remote-User": "rita@example.org"}, None),
                     ("/", {"X-Remote-User": "mallory"}, None),
                     # an account without a password opens with no password
                     ("/", {}, ("rita@example.org", ""))]
            return [(await client.get(path, headers=headers, auth=auth)).status_code
                    for path, headers, auth in asked]

    assert asyncio.run(statuses("127.0.0.1")) == [200, 200, 403, 403, 401]
    assert asyncio.run(statuses("10.1.2.3")) == [401, 401, 401, 401, 401]


def test_the_first_account_switches_logins_on_for_good(tmp_path: Path) -> None:
    """A portal started with neither a secret nor an account is open (loopback only); once an
    account exists, every request needs a login, even after the last account is removed."""
    import asyncio

    import httpx

    from deployments.portal import PortalPlaces, PortalRefused, check_binding, create_app
    from medrelease.storage.accounts import SqliteAccounts

    accounts = SqliteAccounts(tmp_path / "accounts.sqlite")
    places = PortalPlaces(tmp_path / "releases", tmp_path / "test-releases", tmp_path / "steward")
    app = create_app(places, None, accounts)

    async def status(path: str) -> int:
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            return (await client.get(path)).status_code

    assert asyncio.run(status("/steward")) == 200  # open, as before accounts existed
    accounts.add("ada", "researcher", "ada-reads-the-releases")
    assert asyncio.run(status("/")) == 401
    accounts.remove("ada")
    assert asyncio.run(status("/steward")) == 401  # never open again in this process
    with pytest.raises(PortalRefused):
        check_binding("0.0.0.0", None, accounts=False)
    check_binding("0.0.0.0", None, accounts=True)  # a login exists: may listen beyond loopback
