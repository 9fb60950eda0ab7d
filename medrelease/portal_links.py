"""Where a release is shown in the release portal (``medrelease portal``): one place for its
URLs, so the flow's log, its artifacts and the portal agree.

The base is ``MEDRELEASE_PORTAL_URL`` (default ``http://127.0.0.1:8765``, where the portal
binds unless told otherwise). Paths:

* ``/releases/<dataset>/<release_id>`` — a published release (``/test-releases/...`` for a TEST
  release, which lives in the test store);
* ``/releases/<dataset>`` — a dataset's catalogue;
* ``/steward/staging/<dataset>/<release_id>`` — a release waiting for review (steward area:
  ``<steward>/.staging/<dataset>/<release_id>/``, see ``tasks/publish.py``).
"""

from __future__ import annotations

import os
from urllib.parse import quote

DEFAULT_PORTAL_URL = "http://127.0.0.1:8765"


def portal_base() -> str:
    return (os.environ.get("MEDRELEASE_PORTAL_URL") or DEFAULT_PORTAL_URL).rstrip("/")


def portal_url(dataset: str | None = None, release_id: str | None = None, *,
               test: bool = False, staged: bool = False) -> str:
    """The portal page of a release (or of a dataset's catalogue, or the portal's front page).
    Dataset names and release ids are slugs; they are quoted all the same."""
    if dataset is None:
        return portal_base() + "/"
    area = "steward/staging" if staged else ("test-releases" if test else "releases")
    path = f"/{area}/{quote(dataset, safe='')}"
    if release_id is not None:
        path += f"/{quote(release_id, safe='')}"
    return portal_base() + path
