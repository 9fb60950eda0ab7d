"""Where a steward opens a release in a browser: the release portal's URLs (``deployments/
portal.py``), for the run's artifacts, log lines and summaries.

A ``file://`` link does nothing in a browser that is not on the server's machine, and nothing
at all from Prefect's UI (issue 39): every link to a release or its evidence goes through the
portal instead. Its address is ``MEDRELEASE_PORTAL_URL`` (set by whoever deploys; ``medrelease
serve`` sets it for its runs to the portal it starts), by default the portal's own default
address on loopback. Plain functions without Prefect or the web stack, so that any task, the
CLI and the portal itself build the same URLs.
"""

from __future__ import annotations

import os
from urllib.parse import quote

DEFAULT_PORTAL_HOST = "127.0.0.1"
DEFAULT_PORTAL_PORT = 4280
PORTAL_URL_VARIABLE = "MEDRELEASE_PORTAL_URL"
STAGING = ".staging"  # the steward root's folder of releases awaiting review (settings)


def portal_url() -> str:
    """The portal's base URL, without a trailing slash."""
    default = f"http://{DEFAULT_PORTAL_HOST}:{DEFAULT_PORTAL_PORT}"
    return (os.environ.get(PORTAL_URL_VARIABLE) or default).rstrip("/")


def _part(text: str, what: str) -> str:
    """One checked path part, URL-quoted (the store's names are letters, digits, ``-_.``)."""
    from medrelease.storage.store import safe_relative  # (the CLI imports this module: cheap)

    safe_relative(text, what)
    return quote(text, safe="")


def catalogue_link(dataset: str) -> str:
    """The public catalogue of one dataset's releases."""
    return f"{portal_url()}/releases/{_part(dataset, 'dataset name')}"


def release_link(dataset: str, release_id: str) -> str:
    """A release's public page (report and files); a ``TEST-`` id is found in the test store."""
    return f"{catalogue_link(dataset)}/{_part(release_id, 'release id')}"


def steward_link(dataset: str, release_id: str) -> str:
    """A release's page in the steward area: its steward record and evidence report."""
    return (f"{portal_url()}/steward/{_part(dataset, 'dataset name')}/"
            f"{_part(release_id, 'release id')}")


def staged_link(dataset: str, release_id: str) -> str:
    """A release awaiting review (``review: required``), in the steward area: the files as
    they would be published, with links to its record and evidence."""
    return (f"{portal_url()}/steward/{STAGING}/{_part(dataset, 'dataset name')}/"
            f"{_part(release_id, 'release id')}")


def evidence_link(dataset: str, release_id: str) -> str:
    """The evidence report (``evaluation/report.html`` of the steward record) in the portal."""
    return f"{steward_link(dataset, release_id)}/evidence/report.html"


def is_test_release(release_id: str) -> bool:
    from medrelease.storage.store import TEST_PREFIX

    return release_id.startswith(TEST_PREFIX)
