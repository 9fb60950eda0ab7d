"""Screenshots of the release portal over a data home, for docs/ui/ (1440x900, Debian's chromium).

    python scripts/portal_screenshots.py HOME DATASET RELEASE_ID OUT_FOLDER

HOME is a ``MEDRELEASE_HOME`` holding releases (e.g. after ``medrelease release nps-sample``);
the portal runs on a free loopback port with a throw-away secret. Writes portal-catalogue.png,
portal-release.png, portal-steward.png and portal-evidence.png. (tests/served/test_portal.py takes the
same pages of its own small release; this script shows them on a realistic one.)
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import uvicorn
from playwright.sync_api import sync_playwright

from deployments.local_server import free_port
from deployments.portal import PortalPlaces, bound_socket, create_app

CHROMIUM = "/usr/bin/chromium"


def main(home: Path, dataset: str, release_id: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    port, user, password = free_port(), "steward", "screenshots"
    places = PortalPlaces(home / "releases", home / "test-releases", home / "steward")
    server = uvicorn.Server(uvicorn.Config(create_app(places, f"{user}:{password}"),
                                           log_level="warning"))
    threading.Thread(target=server.run, kwargs={"sockets": [bound_socket("127.0.0.1", port)]},
                     daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}"
    pages = {
        "portal-catalogue": f"/releases/{dataset}",
        "portal-release": f"/releases/{dataset}/{release_id}",
        "portal-steward": f"/steward/{dataset}/{release_id}",
        "portal-evidence": f"/steward/{dataset}/{release_id}/evidence/report.html",
    }
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_context(viewport={"width": 1440, "height": 900},
                                   http_credentials={"username": user, "password": password}
                                   ).new_page()
        for name, path in pages.items():
            answer = page.goto(url + path)
            assert answer is not None and answer.status == 200, (path, answer and answer.status)
            page.wait_for_load_state("networkidle")
            page.screenshot(path=str(out / f"{name}.png"))
            print(out / f"{name}.png")
        browser.close()
    server.should_exit = True


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4]))
