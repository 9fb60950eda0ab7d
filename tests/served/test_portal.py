"""The release portal over real HTTP (uvicorn on a free loopback port): the secret, the paths it
will not follow, the steward area kept apart, the links the run's artifacts give.

One real release (the paper's table with a declared disease list, ``histogram``: seconds) is
published and evaluated by the release flow once for the module; beside the store lies a folder
"outside" whose files carry a marker, reached only through symbolic links planted in the store
and the steward records. Requests go through ``http.client``, which sends a path as written
(``..`` and ``%2e%2e`` included), where httpx would normalize it first.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from deployments.local_server import free_port
from deployments.portal import (
    PortalPlaces,
    PortalRefused,
    bound_socket,
    check_binding,
    create_app,
)
from medrelease.storage.accounts import SqliteAccounts
from medrelease.storage.links import evidence_link, release_link, steward_link

from ..conftest import write_paper_dataset

pytestmark = pytest.mark.usefixtures("prefect_harness")

SECRET = "steward:portal-test-secret-1f2e3d"
RESEARCHER = ("rita", "rita-reads-releases-only")  # a portal account (issue 56)
MARKER = "OUTSIDE-THE-STORE-3b9c"
DISEASES = "Gastritis\nPneumonia\nAnemia\nDiabetes\nStroke\n"
LINKED_RELEASE = "20990101T000000Z-histogram-5ca1ab1e"  # a symlink to a folder outside
LINKED_FILE_RELEASE = "20990101T000000Z-histogram-f11e0000"  # a copy whose data.csv links out


def _paper_with_a_public_disease_list(folder: Path) -> Path:
    """Table 5 with its disease list declared: histogram's guarantee is then proven."""
    folder.mkdir(parents=True)
    config = write_paper_dataset(folder)
    (folder / "diseases.txt").write_text(DISEASES)
    config.write_text(config.read_text().replace(
        "Disease: {role: informative}", "Disease: {role: informative, domain: diseases.txt}"))
    return config


def _plant_links_outside(home: Path, release: Path, record: Path) -> Path:
    """A folder outside every store, and symbolic links into it from the store and records."""
    outside = home.parent / f"{home.name}-outside"
    fake = outside / "release"
    fake.mkdir(parents=True)
    (fake / "manifest.json").write_text(json.dumps(
        {**json.loads((release / "manifest.json").read_text()), "release_id": LINKED_RELEASE,
         "mechanism": MARKER}))
    (fake / "data.csv").write_text(f"secret\n{MARKER}\n")
    (fake / "record.json").write_text(json.dumps({"release_id": LINKED_RELEASE,
                                                  "input_file": MARKER}))
    (fake / "evaluation").mkdir()
    (fake / "evaluation" / "report.html").write_text(f"<p>{MARKER}</p>")
    (outside / "secret.csv").write_text(f"{MARKER}\n")
    (outside / "paper-example").mkdir()
    (outside / "paper-example" / LINKED_RELEASE).symlink_to(fake)
    # a release folder, a dataset folder, a record folder and a data file that lead outside
    (release.parent / LINKED_RELEASE).symlink_to(fake, target_is_directory=True)
    (home / "releases" / "linked-dataset").symlink_to(outside / "paper-example")
    copy = release.parent / LINKED_FILE_RELEASE
    shutil.copytree(release, copy)
    (copy / "data.csv").unlink()
    (copy / "data.csv").symlink_to(outside / "secret.csv")
    (record.parent / LINKED_RELEASE).symlink_to(fake, target_is_directory=True)
    return outside


@pytest.fixture(scope="module")
def portal(tmp_path_factory, prefect_harness):
    """One published, evaluated release, links planted outside, and the portal on HTTP."""
    import uvicorn

    from flows.release import ReleaseRequest, release_flow

    home = tmp_path_factory.mktemp("portal") / "home"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MEDRELEASE_HOME", str(home))
        env.setenv("MEDRELEASE_DATASETS", str(home.parent))
        env.setenv("MEDRELEASE_PORTAL_URL", url)  # the links the run's artifacts give
        config = _paper_with_a_public_disease_list(home.parent / "paper")
        result = release_flow(ReleaseRequest(dataset=str(config), mechanism="histogram",
                                             epsilon=1.0))
        release = Path(result["path"])
        record = Path(result["evaluation"]).parent.parent
        test_release = Path(release_flow(ReleaseRequest(
            dataset=str(config), mechanism="histogram", epsilon=0.5, seed=5,
            evaluate=False))["path"])  # a TEST release: the test store, TEST-data.* files
        outside = _plant_links_outside(home, release, record)
        places = PortalPlaces(home / "releases", home / "test-releases", home / "steward")
        accounts = SqliteAccounts(home / "portal-accounts.sqlite")
        accounts.add(RESEARCHER[0], "researcher", RESEARCHER[1])
        server = uvicorn.Server(uvicorn.Config(create_app(places, SECRET, accounts),
                                               log_level="warning"))
        thread = threading.Thread(target=server.run,
                                  kwargs={"sockets": [bound_socket("127.0.0.1", port)]},
                                  daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline, "the portal did not start"
            time.sleep(0.05)
        try:
            yield SimpleNamespace(url=url, port=port, home=home, release=release, record=record,
                                  outside=outside, result=result,
                                  release_id=release.name, test_release=test_release)
        finally:
            server.should_exit = True
            thread.join(timeout=10)


def get(portal, path: str, auth: str | None = SECRET, method: str = "GET"
        ) -> tuple[int, dict[str, str], bytes]:
    """``path`` exactly as written, over a fresh connection."""
    connection = http.client.HTTPConnection("127.0.0.1", portal.port, timeout=30)
    headers = {}
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(auth.encode()).decode()
    try:
        connection.request(method, path, headers=headers)
        answer = connection.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        connection.close()


def links(body: bytes) -> list[str]:
    return re.findall(r'href="([^"]+)"', body.decode())


def test_without_the_secret_every_page_is_401_with_a_basic_challenge(portal) -> None:
    rid = portal.release_id
    pages = ["/", "/releases/paper-example", f"/releases/paper-example/{rid}",
             f"/releases/paper-example/{rid}/data.csv", "/steward",
             f"/steward/paper-example/{rid}", f"/steward/paper-example/{rid}/evidence/report.html",
             "/no-such-page"]
    for path in pages:
        for auth in (None, "steward:wrong", "steward", SECRET + "x", SECRET.upper()):
            status, headers, body = get(portal, path, auth)
            assert status == 401, (path, auth, status)
            assert headers["www-authenticate"].startswith("Basic realm=")
            assert rid.encode() not in body and b"Disease" not in body
        status, headers, _ = get(portal, path)
        assert status == (404 if path == "/no-such-page" else 200), path
        assert headers["content-security-policy"].startswith("default-src 'none'")
        assert headers["x-content-type-options"] == "nosniff"


def test_the_catalogue_lists_the_release_with_its_public_facts(portal) -> None:
    manifest = json.loads((portal.release / "manifest.json").read_text())
    status, _, body = get(portal, "/releases/paper-example")
    page = body.decode()
    assert status == 200
    row = page[page.index(portal.release_id):]
    row = row[:row.index("</tr>")]
    assert "histogram" in row and "ε 1" in row and "published" in row
    assert f">{manifest['released_rows']:,}<" in row
    assert manifest["created_at"][:10] in row
    # the links planted in the store lead nowhere: not listed, here or on the front page
    assert LINKED_RELEASE not in page and MARKER not in page
    _, _, front = get(portal, "/")
    assert b"/releases/paper-example" in front and b"linked-dataset" not in front


def test_a_release_page_renders_its_report_and_serves_its_files(portal) -> None:
    rid = portal.release_id
    status, _, body = get(portal, f"/releases/paper-example/{rid}")
    page = body.decode()
    assert status == 200 and "<h2>Guarantee</h2>" in page and "<table>" in page
    offered = [link.rsplit("/", 1)[1] for link in links(body) if link.startswith(
        f"/releases/paper-example/{rid}/")]
    # every public file the release folder holds, in the portal's order (intervals.csv where
    # the mechanism states intervals), and never one it lacks
    from deployments.portal import PUBLIC_FILES

    assert offered == [name for name in PUBLIC_FILES if (portal.release / name).is_file()]
    assert offered[:4] == ["data.csv", "data.parquet", "manifest.json", "report.md"]
    for name in offered:
        status, headers, data = get(portal, f"/releases/paper-example/{rid}/{name}")
        assert status == 200 and data == (portal.release / name).read_bytes(), name
        assert headers["content-disposition"] == f'attachment; filename="{rid}-{name}"'
    assert headers["cache-control"] == "no-store"
    # only aim writes measurements: none here, so no link and no file
    assert get(portal, f"/releases/paper-example/{rid}/measurements.parquet")[0] == 404
    # not a release file, though it lies in the folder or beside it
    for name in ("record.json", "data.txt", ".hidden", "manifest.json.bak"):
        assert get(portal, f"/releases/paper-example/{rid}/{name}")[0] == 404


def test_a_test_release_is_found_in_the_test_store_and_marked(portal) -> None:
    rid = portal.test_release.name
    assert portal.test_release.parent.parent.name == "test-releases"
    _, _, catalogue = get(portal, "/releases/paper-example")
    row = catalogue.decode()[catalogue.decode().index(rid):]
    assert "TEST — never published" in row[:row.index("</tr>")]
    status, _, body = get(portal, f"/releases/paper-example/{rid}")
    assert status == 200 and b"TEST release" in body
    status, _, data = get(portal, f"/releases/paper-example/{rid}/data.csv")
    assert status == 200 and data == (portal.test_release / "TEST-data.csv").read_bytes()
    # the same id without its prefix is not looked for in the test store
    assert get(portal, f"/releases/paper-example/{rid.removeprefix('TEST-')}")[0] == 404


def test_the_report_is_rendered_safely(portal) -> None:
    """Raw HTML in report.md is shown as text; links other than web ones are not made; the
    suppressed label '*' stays visible."""
    from deployments.portal import Portal

    render = Portal(PortalPlaces(portal.home, portal.home, portal.home), None).render_markdown
    html = render("<script>alert(1)</script>\n\n<img src=x onerror=alert(1)>\n\n"
                  "[a](javascript:alert(1)) [b](file:///etc/passwd) [c](data:text/html,x)\n\n"
                  "- a row's '*' values, or it is '*' on every dimension\n")
    assert "<script" not in html and "<img" not in html and "&lt;script&gt;" in html
    assert "href" not in html
    assert "'*' values, or it is '*' on" in html and "<em>" not in html


TRAVERSALS = [
    "/releases/../../{outside}/secret.csv",
    "/releases/%2e%2e/%2e%2e/{outside}/secret.csv",
    "/releases/paper-example/%2e%2e%2f%2e%2e%2f{outside}%2fsecret.csv",
    "/releases/paper-example/..%2f..%2f..%2f{outside}%2frelease/data.csv",
    "/releases/paper-example/{rid}/..%2f..%2f..%2f{outside}%2fsecret.csv",
    "/releases/paper-example/{rid}/%2e%2e",
    "/releases/..%2F{outside}/release/data.csv",
    "/releases/paper-example/%252e%252e/data.csv",
    "/releases/paper-example/" + LINKED_RELEASE,
    "/releases/paper-example/" + LINKED_RELEASE + "/data.csv",
    "/releases/paper-example/" + LINKED_RELEASE + "/manifest.json",
    "/releases/linked-dataset",
    "/releases/linked-dataset/" + LINKED_RELEASE + "/data.csv",
    "/releases/paper-example/" + LINKED_FILE_RELEASE + "/data.csv",
    "/steward/paper-example/" + LINKED_RELEASE,
    "/steward/paper-example/" + LINKED_RELEASE + "/record.json",
    "/steward/paper-example/" + LINKED_RELEASE + "/evidence/report.html",
    "/steward/%2e%2e/{outside}/record.json",
    "/steward/paper-example/{rid}/evidence/..%2f..%2f..%2f..%2f{outside}%2fsecret.csv",
    "/steward/paper-example/{rid}/evidence/plots/..%2f..%2frecord.json",
    "/steward/paper-example/{rid}/evidence/../../../{outside}/secret.csv",
    "/steward/paper-example/{rid}/evidence/evaluation/../report.html",
    "/steward/snapshots/x/record.json",
]


@pytest.mark.parametrize("template", TRAVERSALS)
def test_paths_out_of_the_store_are_404_and_nothing_outside_is_read(portal, template: str
                                                                    ) -> None:
    path = template.format(outside=portal.outside.name, rid=portal.release_id)
    status, _, body = get(portal, path)
    assert status == 404, (path, status, body[:200])
    assert MARKER.encode() not in body


def test_the_planted_links_are_listed_nowhere(portal) -> None:
    for path in ("/", "/releases/paper-example", "/steward"):
        status, _, body = get(portal, path)
        assert status == 200 and MARKER.encode() not in body
        # (the copy's manifest names another release: a folder is listed under its own id)
        assert LINKED_RELEASE.encode() not in body and LINKED_FILE_RELEASE.encode() not in body
    _, _, steward = get(portal, "/steward")
    assert portal.release_id.encode() in steward


def test_steward_pages_are_never_linked_from_public_pages(portal) -> None:
    """Every page reachable from the front page by its links is public, and none of them
    links into /steward; the steward area itself is there and marked internal."""
    seen, queue, pages = set(), ["/"], 0
    while queue:
        path = queue.pop()
        if path in seen:
            continue
        seen.add(path)
        status, headers, body = get(portal, path)
        assert status == 200, path
        if not headers["content-type"].startswith("text/html"):
            continue
        pages += 1
        assert b"/steward" not in body and b"STEWARD" not in body and b"INTERNAL" not in body, path
        queue += [link for link in links(body) if link.startswith("/")]
    assert pages >= 3 and f"/releases/paper-example/{portal.release_id}/data.csv" in seen
    status, _, body = get(portal, f"/steward/paper-example/{portal.release_id}")
    assert status == 200 and b"STEWARD AREA" in body and b"INTERNAL" in body
    evidence = f"/steward/paper-example/{portal.release_id}/evidence/report.html"
    assert evidence in links(body)
    status, headers, body = get(portal, evidence)
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert b"INTERNAL" in body and f"/steward/paper-example/{portal.release_id}" in links(body)
    for plot in re.findall(r"src='(plots/[^']+\.svg)'", body.decode()):
        status, headers, _ = get(portal, evidence.rsplit("/", 1)[0] + "/" + plot)
        assert status == 200 and headers["content-type"] == "image/svg+xml", plot


def test_a_researcher_reaches_nothing_of_the_runs_steward_record(portal) -> None:
    """Issue 56 on a release the flow made: every page and file a researcher's links reach
    is free of its steward record (the input's path and hash, the 'input rows' the record and
    the evidence report state) and of the TEST release; the record itself is 403."""
    record = json.loads((portal.record / "record.json").read_text())
    markers = [record["input_sha256"], str(record["input_file"]), "input rows", "INTERNAL",
               "/steward", portal.test_release.name]
    assert all(markers)
    who = ":".join(RESEARCHER)
    seen, queue = set(), ["/"]
    while queue:
        path = queue.pop()
        if path in seen:
            continue
        seen.add(path)
        status, headers, body = get(portal, path, who)
        assert status == 200, path
        found = [marker for marker in markers if marker.encode() in body]
        assert found == [], (path, found)
        if headers["content-type"].startswith("text/html"):
            queue += [link for link in links(body) if link.startswith("/")]
    assert f"/releases/paper-example/{portal.release_id}/data.csv" in seen
    rid = portal.release_id
    for path in (f"/steward/paper-example/{rid}", f"/steward/paper-example/{rid}/record.json",
                 f"/steward/paper-example/{rid}/evidence/report.html"):
        status, _, body = get(portal, path, who)
        assert status == 403 and record["input_sha256"].encode() not in body, path
    # the same pages hold those facts for a steward: the markers are not vacuous
    status, _, body = get(portal, f"/steward/paper-example/{rid}")
    assert status == 200 and record["input_sha256"].encode() in body and b"input rows" in body


def test_the_portal_is_read_only(portal) -> None:
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        assert get(portal, f"/releases/paper-example/{portal.release_id}/data.csv",
                   method=method)[0] == 405


def test_every_link_of_the_runs_artifacts_opens_in_the_portal(portal) -> None:
    """The catalogue's, the summary's and the evaluation's links are the portal's URLs (never
    file://), and each one answers 200 there."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[portal.result["flow_run_id"]])))
    text = "\n".join(str(a.data) for a in artifacts if a.type == "markdown")
    assert "file://" not in text and str(portal.release) not in text
    assert str(portal.record / "evaluation") not in text
    found = set(re.findall(r"\]\((http[^)]+)\)", text))
    rid = portal.release_id
    assert {release_link("paper-example", rid), evidence_link("paper-example", rid)} <= found
    for link in found:
        assert link.startswith(portal.url), link
        assert get(portal, link.removeprefix(portal.url))[0] == 200, link
    assert steward_link("paper-example", rid) == f"{portal.url}/steward/paper-example/{rid}"


def test_no_secret_means_loopback_only() -> None:
    check_binding("127.0.0.1", None)
    check_binding("::1", None)
    check_binding("0.0.0.0", SECRET)
    for host in ("0.0.0.0", "192.0.2.7", "portal.example.org"):
        with pytest.raises(PortalRefused, match="PREFECT_SERVER_API_AUTH_STRING"):
            check_binding(host, None)


@pytest.mark.browser
def test_a_steward_opens_a_release_downloads_its_csv_and_reads_the_evidence(
        portal, tmp_path: Path, request) -> None:
    """In Chromium at 1440x900: refused without the secret; logged in, the catalogue, a
    release's page, its CSV downloaded, and (typed, as the run's artifact links it) the steward
    record and its evidence report with every plot."""
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    from .test_ui_browser import CHROMIUM, _keep

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium")
    shots = tmp_path / "screenshots"
    shots.mkdir()
    user, _, password = SECRET.partition(":")
    rid = portal.release_id
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM,
                                              args=["--no-sandbox", "--disable-gpu"])
        try:
            for credentials in (None, {"username": user, "password": "wrong"}):
                stranger = chromium.new_context(http_credentials=credentials).new_page()
                try:  # without an answer to the challenge, Chromium stops at the 401 itself
                    answer = stranger.goto(portal.url + "/releases")
                    assert answer.status == 401 and rid not in answer.text()
                except PlaywrightError as exc:
                    assert "ERR_INVALID_AUTH_CREDENTIALS" in str(exc)
            context = chromium.new_context(
                viewport={"width": 1440, "height": 900}, accept_downloads=True,
                http_credentials={"username": user, "password": password})
            page = context.new_page()
            failed: list[str] = []
            page.on("response", lambda r: r.status >= 400 and failed.append(
                f"{r.status} {r.url}"))
            page.goto(portal.url)
            page.get_by_role("link", name="paper-example").click()
            page.wait_for_url("**/releases/paper-example")
            assert page.locator("tbody tr").count() == 2  # the release and the TEST release
            page.screenshot(path=str(shots / "portal-catalogue.png"))
            page.get_by_role("link", name=rid).click()
            page.wait_for_url(f"**/releases/paper-example/{rid}")
            assert page.get_by_role("heading", name="Guarantee", exact=True).is_visible()
            page.screenshot(path=str(shots / "portal-release.png"), full_page=True)
            with page.expect_download() as download:
                page.get_by_role("link", name="data.csv").click()
            assert download.value.suggested_filename == f"{rid}-data.csv"
            assert Path(download.value.path()).read_bytes() == (
                portal.release / "data.csv").read_bytes()
            page.goto(f"{portal.url}/steward/paper-example/{rid}")
            assert "STEWARD AREA" in page.locator("header").inner_text()
            page.screenshot(path=str(shots / "portal-steward.png"))
            page.get_by_role("link", name="Open the evidence report").click()
            page.wait_for_url("**/evidence/report.html")
            page.wait_for_load_state("networkidle")
            images = page.locator("img")
            assert images.count() >= 1
            for index in range(images.count()):
                assert images.nth(index).evaluate("i => i.naturalWidth") > 0
            page.screenshot(path=str(shots / "portal-evidence.png"))
            assert not failed, failed
        finally:
            chromium.close()
    _keep(shots, request)


def test_without_a_secret_only_loopback_names_are_answered(portal) -> None:
    """Open on loopback (no secret): a request naming another host, as a page of another site
    re-pointed at 127.0.0.1 sends it (DNS rebinding), reads nothing."""
    import uvicorn

    places = PortalPlaces(portal.home / "releases", portal.home / "test-releases",
                          portal.home / "steward")
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(places, None), log_level="warning"))
    thread = threading.Thread(target=server.run,
                              kwargs={"sockets": [bound_socket("127.0.0.1", port)]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        for host, expected in (("127.0.0.1", 200), (f"localhost:{port}", 200), ("[::1]", 200),
                               (f"attacker.example:{port}", 421), ("10.0.0.1", 421)):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            connection.request("GET", "/steward", headers={"Host": host})
            answer = connection.getresponse()
            body = answer.read()
            connection.close()
            assert answer.status == expected, host
            assert (portal.release_id.encode() in body) == (expected == 200), host
            if expected == 200:
                assert b"No secret is configured" in body
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_a_release_awaiting_review_is_shown_only_in_the_steward_area(portal) -> None:
    """``review: required`` stages a release under ``<steward>/.staging/<dataset>/<id>``: the
    portal shows it there (what it would publish), never in the public catalogue, and a path
    out of the staging folder is 404."""
    import shutil

    staged_id = "20991231T000000Z-histogram-staged01"
    staged = portal.home / "steward" / ".staging" / "paper-example" / staged_id
    shutil.copytree(portal.release, staged)
    manifest = json.loads((staged / "manifest.json").read_text())
    (staged / "manifest.json").write_text(json.dumps({**manifest, "release_id": staged_id}))
    try:
        status, _, body = get(portal, f"/steward/.staging/paper-example/{staged_id}")
        assert status == 200 and b"NOT PUBLISHED" in body and staged_id.encode() in body
        status, _, data = get(portal, f"/steward/.staging/paper-example/{staged_id}/data.csv")
        assert status == 200 and data == (staged / "data.csv").read_bytes()
        assert get(portal, f"/steward/.staging/paper-example/{staged_id}", auth=None)[0] == 401
        for path in (f"/releases/paper-example/{staged_id}", "/releases/paper-example",
                     "/", "/releases"):
            assert staged_id.encode() not in get(portal, path)[2] or path.endswith(staged_id)
        assert get(portal, f"/releases/paper-example/{staged_id}")[0] == 404
        for path in (f"/steward/.staging/%2e%2e/{portal.outside.name}/release",
                     f"/steward/.staging/paper-example/{staged_id}/..%2f..%2frecord.json",
                     f"/steward/.staging/paper-example/{staged_id}/secret.csv"):
            status, _, body = get(portal, path)
            assert status == 404 and MARKER.encode() not in body, path
    finally:
        shutil.rmtree(staged.parent.parent)
