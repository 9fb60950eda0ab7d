"""What a ledger location is: a SQLite file path or a PostgreSQL URL, and the URL's safe form.

Its own module (no ledger imports) so that settings, both back-ends and the opener can read it
without an import circle.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit


def is_database_url(location: str | Path) -> bool:
    """Whether a ledger location names a PostgreSQL database rather than a SQLite file."""
    return isinstance(location, str) and location.startswith(("postgresql://", "postgres://"))


def redacted(url: str) -> str:
    """The URL without its password: what logs, messages and Prefect parameters may carry."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = (f"{parts.username}@" if parts.username else "") + host + (
        f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
