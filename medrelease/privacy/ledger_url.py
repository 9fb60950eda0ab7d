"""What a ledger location is: a SQLite file path or a PostgreSQL URL, and the URL's safe form.

Its own module (no ledger imports) so that settings, both back-ends and the opener can read it
without an import circle.

A PostgreSQL URL can carry a password in two places libpq reads: the user-info part
(``user:secret@host``) and the query (``?password=secret``, its name percent-encoded or not;
``sslpassword`` unlocks the client's key). ``redacted`` removes both, keeping every other part
as written (several hosts, IPv6 hosts, other parameters), so that what logs, messages, run
parameters and Prefect's database carry names the database without the secret; ``scrubbed``
removes the secret from text a driver wrote (libpq may quote a value it cannot decode).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, unquote_plus

# Query parameters whose value is a secret (compared after percent-decoding, in any case).
SECRET_PARAMETERS = ("password", "sslpassword")


def is_database_url(location: str | Path) -> bool:
    """Whether a ledger location names a PostgreSQL database rather than a SQLite file."""
    return isinstance(location, str) and location.startswith(("postgresql://", "postgres://"))


def _split(url: str) -> tuple[str, str, str, str, str] | None:
    """(scheme and '//', user-info, hosts and path, query, fragment) of a ``scheme://`` URL,
    split by hand: ``urlsplit`` cannot read several hosts (``h1:5432,h2:5433``)."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        return None
    rest, hash_sign, fragment = rest.partition("#")
    rest, question, query = rest.partition("?")
    authority, slash, path = rest.partition("/")
    userinfo, at, hosts = authority.rpartition("@")  # a password may hold an unencoded '@'
    return (f"{scheme}://", userinfo if at else "", hosts + slash + path,
            query if question else "", (hash_sign + fragment) if hash_sign else "")


def _is_secret(name: str) -> bool:
    return unquote_plus(name).strip().lower() in SECRET_PARAMETERS


def _safe_query(query: str) -> str:
    """The query without its secret parameters (the others as written)."""
    return "&".join(part for part in query.split("&")
                    if part and not _is_secret(part.partition("=")[0]))


def redacted(url: str) -> str:
    """The URL without its password, wherever it is written: what logs, messages and Prefect
    parameters may carry."""
    parts = _split(url)
    if parts is None:
        return url
    scheme, userinfo, rest, query, fragment = parts
    user = userinfo.partition(":")[0]
    safe = _safe_query(query)
    return (scheme + (f"{user}@" if user else "") + rest + (f"?{safe}" if safe else "")
            + fragment)


def secrets_in(url: str) -> list[str]:
    """The secret values a URL holds (as written and percent-decoded), longest first."""
    parts = _split(url)
    if parts is None:
        return []
    _, userinfo, _, query, _ = parts
    found = []
    if ":" in userinfo:
        found.append(userinfo.partition(":")[2])
    found += [part.partition("=")[2] for part in query.split("&")
              if _is_secret(part.partition("=")[0])]
    values = {v for value in found for v in (value, unquote(value), unquote_plus(value)) if v}
    return sorted(values, key=len, reverse=True)


def scrubbed(text: str, url: str) -> str:
    """``text`` (a driver's message, say) with the URL's secrets cut out of it."""
    for secret in secrets_in(url):
        text = text.replace(secret, "***")
    return text


def with_user_and_database(url: str, user: str, database: str) -> str:
    """The URL of another role and database on the same server(s), without any secret
    (``ledger init-db`` prints the service's URL from the administrator's)."""
    parts = _split(url)
    if parts is None:
        return url
    scheme, _, rest, query, _ = parts
    hosts = rest.partition("/")[0]
    safe = _safe_query(query)
    return f"{scheme}{user}@{hosts}/{database}" + (f"?{safe}" if safe else "")
