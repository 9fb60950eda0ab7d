"""The release portal: releases, their files and the steward's evidence, read-only over HTTP.

A steward reaches a release from the Prefect UI by a link, not a server path (issue 39): the
catalogue per dataset, a release's page (its ``report.md`` rendered, its files to download) and,
in a separate steward area under ``/steward/`` that no public page links to, the steward record
and the evidence report. Server-rendered HTML (Starlette + Jinja2, both installed with Prefect),
no client framework, no script on any page.

* **Who may read, and what.** Two roles. A *researcher* reads the catalogue, the release
  pages and the published files; a *steward* reads everything, the steward area (``/steward``:
  records, evidence reports, releases awaiting review) and TEST releases included. Logins are
  HTTP basic: the Prefect server's secret (``PREFECT_SERVER_API_AUTH_STRING``, else
  ``PREFECT_API_AUTH_STRING``: the ``user:pass`` line of ``var/prefect-auth``; a steward), or a
  portal account (``medrelease portal add-user``, ``medrelease.storage.accounts``: a name, a
  role, a scrypt hash). Optionally a reverse proxy's single sign-on names the user in a header
  (``MEDRELEASE_PORTAL_USER_HEADER``), believed only from a loopback peer. A request without a
  valid login is answered 401 with a Basic challenge; a researcher asking for the steward area
  403, before anything is looked up; a TEST release is 404 to a researcher. Without a secret
  and without accounts the portal serves only on a loopback address, as Prefect's own server
  then does, and says so on every page; it refuses any other host, and answers 421 to a
  request whose Host header is not a loopback name (DNS rebinding).
* **What it reads.** Only the release stores (``MEDRELEASE_STORE``, ``MEDRELEASE_TEST_STORE``)
  and the steward records (``MEDRELEASE_STEWARD``), and there only named files: a path part is
  checked as the store checks it (``safe_relative``: no ``..``, no hidden or partial names), a
  folder must hold its manifest (or record), and the file's real path, symbolic links
  resolved, must be exactly the path asked for under the store's real path: a link anywhere
  below the store (a release folder, a dataset folder or a file that is a link, even one that
  stays inside the store, e.g. to a hidden ``.partial-`` folder) is 404 before a byte is read.
  A manifest that cannot be read does not take the catalogue down: the release is listed as
  unreadable, and its files are not offered.
* **Read-only.** GET and HEAD only.

No Prefect here: ``medrelease portal`` runs no flow (issue 37's rule for the CLI).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import ipaddress
import json
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from markdown_it import MarkdownIt
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from medrelease.errors import MedreleaseError
from medrelease.settings import steward_root, store_root, test_store_root
from medrelease.storage.accounts import (
    NAME,
    Account,
    AccountStore,
    AccountStoreUnavailable,
    dummy_hash,
    open_accounts,
    verify_password,
)
from medrelease.storage.links import (
    DEFAULT_PORTAL_HOST,
    DEFAULT_PORTAL_PORT,
    STAGING,
    is_test_release,
)
from medrelease.storage.store import PARTIAL_PREFIX, TEST_PREFIX, StoreError, safe_relative

AUTH_VARIABLES = ("PREFECT_SERVER_API_AUTH_STRING", "PREFECT_API_AUTH_STRING")
USER_HEADER_VARIABLE = "MEDRELEASE_PORTAL_USER_HEADER"
HEADER_NAME = re.compile(r"^[A-Za-z0-9-]{1,64}$")
STEWARD, RESEARCHER = "steward", "researcher"
REALM = "medrelease release portal"
TEMPLATES = Path(__file__).resolve().parent / "templates"

# What a release page offers, in this order (a TEST release's data files carry TEST- too).
PUBLIC_FILES = ("data.csv", "data.parquet", "manifest.json", "report.md", "intervals.csv",
                "measurements.parquet")
FILE_NOTES = {
    "data.csv": "the released rows (formula-like text cells prefixed with ')",
    "data.parquet": "the released rows, every value raw",
    "manifest.json": "public parameters, guarantee, budget steps, checks passed",
    "report.md": "the manifest in plain words, with the error bars",
    "intervals.csv": "every estimate with its 95 % interval (report.md: how to read it)",
    "measurements.parquet": "every noisy marginal aim measured (labels, sigma, noisy count)",
}
# The steward record's files that may be downloaded, and the evidence report's.
STEWARD_FILES = ("record.json", "checks.json", "candidates.csv")
EVIDENCE_FILES = ("report.html", "evaluation.json")
PLOT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\.svg$")

# Every page: nothing runs (no script anywhere), nothing loads from elsewhere, no framing.
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; "
                               "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
    "x-frame-options": "DENY",
}


def auth_secret() -> str | None:
    """The Prefect server's basic-auth secret (``user:pass``), as the README's service
    walk-through exports it; ``None`` when none is set."""
    for name in AUTH_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return None


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable only from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class PortalRefused(Exception):
    """The portal will not start as asked (the message says why and what to do)."""


def check_binding(host: str, secret: str | None, accounts: bool = False) -> None:
    """Refuse to serve steward evidence beyond loopback when nobody has to log in: without a
    secret and without accounts, the portal is open to whoever reaches it."""
    if secret is None and not accounts and not is_loopback(host):
        raise PortalRefused(
            f"no secret for host {host}: set PREFECT_SERVER_API_AUTH_STRING or "
            "PREFECT_API_AUTH_STRING (the Prefect server's 'user:pass', e.g. "
            "\"$(cat var/prefect-auth)\") or add a portal account ('medrelease portal "
            "add-user NAME --role steward') before serving beyond loopback, or use --host "
            "127.0.0.1")


def user_header() -> str | None:
    """The header a single sign-on proxy names the user in (``MEDRELEASE_PORTAL_USER_HEADER``,
    e.g. ``X-Remote-User``), or ``None``: no header is believed unless whoever deploys says so."""
    value = os.environ.get(USER_HEADER_VARIABLE, "").strip()
    if value and not HEADER_NAME.match(value):
        raise PortalRefused(f"{USER_HEADER_VARIABLE}: not an HTTP header name")
    return value or None


@dataclass(frozen=True)
class PortalPlaces:
    """The folders the portal reads (and nothing else)."""

    store: Path
    test_store: Path
    steward: Path

    @classmethod
    def from_settings(cls) -> PortalPlaces:
        return cls(store_root(), test_store_root(), steward_root())


@dataclass(frozen=True)
class Viewer:
    """Who is reading, as the access layer established it: a name, a role and how they logged
    in (``secret``: the Prefect server's; ``account``: a portal account's password; ``sso``: a
    proxy's header; ``open``: no login configured, loopback only)."""

    name: str
    role: str
    how: str

    @property
    def steward(self) -> bool:
        return self.role == STEWARD


VIEWER_KEY = "medrelease.viewer"
OPEN_VIEWER = Viewer("", STEWARD, "open")


def viewer_of(request: Request) -> Viewer:
    """The viewer the access layer put on the request (there is always one past it)."""
    viewer = request.scope.get(VIEWER_KEY)
    if not isinstance(viewer, Viewer):  # only reachable if the app ran without its guard
        raise HTTPException(403, "no login")
    return viewer


def is_steward_path(path: str) -> bool:
    """Whether ``path`` (decoded, as routes see it) lies in the steward area."""
    return path == "/steward" or path.startswith("/steward/")


class PasswordChecks:
    """Account passwords checked with the scrypt KDF, at most ``SLOTS`` at once (each takes
    32 MiB and 0.4 s: a flood of wrong passwords waits here instead of exhausting memory).

    HTTP basic sends the password with every request, and a page with plots is several
    requests: an answer is remembered as a keyed digest of (name, password, stored hash) under
    a key made at start and held in memory only — a login that passed for ``PASSED_S``, one
    that failed for ``FAILED_S`` (a browser holding a wrong password asks again for every
    image, each a KDF otherwise; a new guess is a new digest and costs its KDF). The password
    itself is not kept, and a changed or removed account (another stored hash, or none) is
    not let in by what was remembered."""

    SLOTS = 2
    PASSED_S = 300.0
    FAILED_S = 60.0
    REMEMBERED = 4096

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)
        self._answers: dict[bytes, tuple[bool, float]] = {}
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(self.SLOTS)

    def _tag(self, name: str, password: str, stored: str) -> bytes:
        return hmac.new(self._key, b"\0".join(
            (name.encode(), password.encode("utf-8", "surrogatepass"), stored.encode())),
            hashlib.sha256).digest()

    def check(self, account: Account | None, name: str, password: str) -> bool:
        """Whether ``password`` opens ``account`` (run in a worker thread: it may block)."""
        stored = account.password_hash if account is not None and account.has_password else None
        tag = self._tag(name, password, stored or "")
        with self._lock:
            answer, until = self._answers.get(tag, (False, 0.0))
            if until > time.monotonic():
                return answer
        with self._slots:
            # a name without an account (or without a password) costs one KDF all the same:
            # the answer's time does not tell which names exist
            ok = verify_password(password, stored or dummy_hash()) and stored is not None
        with self._lock:
            if len(self._answers) >= self.REMEMBERED:
                self._answers.clear()
            self._answers[tag] = (ok, time.monotonic() + (self.PASSED_S if ok
                                                          else self.FAILED_S))
        return ok


class AccessControl:
    """Every request logged in or answered 401 (a Basic challenge), the steward area closed to
    researchers (403) before any route runs, security headers on every answer.

    The secret is compared in constant time; an account's password through its scrypt hash
    (``PasswordChecks``). ``user_header``: the header a single sign-on proxy names the user in,
    believed only from a loopback peer (uvicorn runs without proxy headers, so the peer is the
    TCP connection's). Without a secret and without accounts the portal is *open*, on loopback
    only; the first account added switches logins on for good (never off again)."""

    def __init__(self, app: Starlette, secret: str | None,
                 accounts: AccountStore | None = None, user_header: str | None = None,
                 refused: Any = None) -> None:
        self.app = app
        # the 403 page (the portal's, with its header); plain text without one
        self.refused = refused or (lambda viewer, message: _text(403, message + "\n"))
        self.secret = secret.encode("utf-8") if secret else None
        self.accounts = accounts
        self.user_header = user_header.lower().encode("latin-1") if user_header else None
        self.passwords = PasswordChecks()
        self.open = self.secret is None and not self.accounts_exist()

    @property
    def routes(self) -> list[Any]:
        """The app's routes (a test enumerates them, so that a new route cannot be missed)."""
        return self.app.routes

    def accounts_exist(self) -> bool:
        """Whether any account exists (``True`` when the store cannot tell: fail closed)."""
        if self.accounts is None:
            return False
        try:
            return self.accounts.has_accounts()
        except AccountStoreUnavailable:
            return True  # cannot tell: logins on (closed, not open)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", [])
                           if k.decode("latin-1").lower() not in SECURITY_HEADERS]
                headers += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        if self.open and self.accounts is not None:
            self.open = not await run_in_threadpool(self.accounts_exist)
        if self.open:
            if not _loopback_host(scope):
                # open on loopback only: a page of another site whose name was re-pointed at
                # 127.0.0.1 (DNS rebinding) arrives with that name, and reads nothing
                await _text(421, "This portal has no secret and answers only to a loopback "
                                 "address (127.0.0.1, localhost, ::1).\n")(
                    scope, receive, with_headers)
                return
            viewer: Viewer | None = OPEN_VIEWER
        else:
            try:
                viewer = await self._login(scope)
            except AccountStoreUnavailable:
                await _text(503, "The portal's accounts cannot be read just now; try again "
                                 "in a minute.\n")(scope, receive, with_headers)
                return
            except _NoAccount:
                await _text(403, "Your single sign-on name has no portal account: ask a data "
                                 "steward for one.\n")(scope, receive, with_headers)
                return
        if viewer is None:
            await _text(401, "Authentication required: log in with your portal account (or "
                             "the stewards' secret, the Prefect server's user:pass).\n",
                        {"www-authenticate": f'Basic realm="{REALM}", charset="UTF-8"'})(
                scope, receive, with_headers)
            return
        if is_steward_path(scope.get("path", "")) and not viewer.steward:
            await self.refused(viewer, "The steward area is for data stewards: your account "
                                       "is a researcher's.")(scope, receive, with_headers)
            return
        scope[VIEWER_KEY] = viewer
        await self.app(scope, receive, with_headers)

    async def _login(self, scope: Scope) -> Viewer | None:
        """The viewer the request's login names, or ``None`` (401)."""
        if self.user_header is not None and _loopback_peer(scope):
            name = _header(scope, self.user_header)
            if name is not None:
                name = name.strip().lower()
                account = await run_in_threadpool(self._account, name)
                if account is None:
                    raise _NoAccount
                return Viewer(account.name, account.role, "sso")
        given = _basic_credentials(scope)
        if given is None:
            return None
        if self.secret is not None and hmac.compare_digest(
                hashlib.sha256(given).digest(), hashlib.sha256(self.secret).digest()):
            # digests of equal length: the comparison's time tells nothing, not even the length
            return Viewer(self.secret.partition(b":")[0].decode("utf-8", "replace"), STEWARD,
                          "secret")
        if self.accounts is None:
            return None
        try:
            name, _, password = given.decode("utf-8").partition(":")
        except UnicodeDecodeError:
            return None
        if not NAME.match(name):
            return None
        account = await run_in_threadpool(self._account, name)
        if await run_in_threadpool(self.passwords.check, account, name, password):
            assert account is not None
            return Viewer(account.name, account.role, "account")
        return None

    def _account(self, name: str) -> Account | None:
        assert self.accounts is not None
        if not NAME.match(name):
            return None
        return self.accounts.get(name)


class _NoAccount(Exception):
    """A single sign-on name without a portal account (403: logged in, but not here)."""


def _text(status: int, text: str, headers: dict[str, str] | None = None) -> Response:
    return Response(text, status_code=status, media_type="text/plain", headers=headers)


def _header(scope: Scope, wanted: bytes) -> str | None:
    for name, value in scope.get("headers", []):
        if name.lower() == wanted:
            return value.decode("latin-1")
    return None


def _basic_credentials(scope: Scope) -> bytes | None:
    """The decoded ``user:pass`` of a Basic ``Authorization`` header, or ``None``."""
    for name, value in scope.get("headers", []):
        if name.lower() == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"basic":
                with contextlib.suppress(binascii.Error, ValueError):
                    return base64.b64decode(token.strip(), validate=True)
    return None


def _loopback_peer(scope: Scope) -> bool:
    """Whether the TCP peer is on this machine (the proxy that sets the user header)."""
    client = scope.get("client")
    return bool(client) and is_loopback(str(client[0]))


def _loopback_host(scope: Scope) -> bool:
    """Whether the request's Host header names a loopback address."""
    for name, value in scope.get("headers", []):
        if name.lower() == b"host":
            host = value.decode("latin-1").strip()
            host = host[1:host.index("]")] if host.startswith("[") and "]" in host else (
                host.rsplit(":", 1)[0] if host.count(":") == 1 else host)
            return is_loopback(host)
    return False


def _inside(root: Path, *parts: str) -> Path | None:
    """``root/parts...`` as a real path, or ``None``: it must exist and be *exactly*
    ``root``'s real path followed by ``parts``.

    Each part must be one safe name (as the store names releases: no ``..``, no hidden or
    partial folders). Symbolic links are resolved, and a link anywhere below ``root`` is
    refused, wherever it points: one leading out of the store, and one that stays inside it
    but lands on a name the parts could not say (a hidden ``.partial-`` folder still being
    written, another release, another dataset). Only ``root`` itself may be a link (a store
    mounted elsewhere)."""
    try:
        for part in parts:
            if len(safe_relative(part, "path part").parts) != 1 or part.startswith(
                    PARTIAL_PREFIX):
                return None
    except StoreError:
        return None
    expected = Path(os.path.realpath(root)).joinpath(*parts)
    real = Path(os.path.realpath(Path(root).joinpath(*parts)))
    if real != expected or not real.exists():
        return None
    return real


class Portal:
    """The pages and files, read from ``places`` on every request (nothing cached)."""

    def __init__(self, places: PortalPlaces, secret: str | None) -> None:
        self.places = places
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
            undefined=jinja2.StrictUndefined)
        self.templates.filters["when"] = _when
        self.templates.filters["size"] = _size
        self.markdown = MarkdownIt("commonmark", {"html": False}).enable("table")

    # --- finding things -------------------------------------------------------------------
    def release_folder(self, dataset: str, release_id: str, viewer: Viewer = OPEN_VIEWER
                       ) -> Path:
        """A published (or, for a steward, TEST) release's real folder, or 404. A TEST
        release was made with a fixed seed (its noise can be removed by whoever knows it): it
        is never shown to a researcher."""
        test = is_test_release(release_id)
        if test and not viewer.steward:
            raise HTTPException(404, "no such release")
        store = self.places.test_store if test else self.places.store
        folder = _inside(store, dataset, release_id)
        if folder is None or not folder.is_dir() or _inside(
                store, dataset, release_id, "manifest.json") is None:
            raise HTTPException(404, "no such release")
        return folder

    def staged_folder(self, dataset: str, release_id: str) -> Path:
        """A release waiting for review (``<steward>/.staging/<dataset>/<id>``), or 404."""
        staging = Path(self.places.steward) / STAGING
        folder = _inside(staging, dataset, release_id)
        if folder is None or not folder.is_dir() or _inside(
                staging, dataset, release_id, "manifest.json") is None:
            raise HTTPException(404, "no release of this id awaits review")
        return folder

    def record_folder(self, dataset: str, release_id: str) -> Path:
        folder = _inside(self.places.steward, dataset, release_id)
        if folder is None or not folder.is_dir() or _inside(
                self.places.steward, dataset, release_id, "record.json") is None:
            raise HTTPException(404, "no steward record for this release")
        return folder

    def catalogue(self, dataset: str | None = None, viewer: Viewer = OPEN_VIEWER
                  ) -> dict[str, list[dict[str, Any]]]:
        """Every release per dataset, newest first, from the manifests of the store (and, for
        a steward, the test store). A manifest that cannot be read, or read into a row, is
        listed as unreadable under its folder's name: one bad file never takes the catalogue
        down. A manifest naming another release (a copied folder) is not a release of this
        id, and is not listed."""
        found: dict[str, list[dict[str, Any]]] = {}
        roots = (self.places.store, self.places.test_store) if viewer.steward else (
            self.places.store,)
        for root in roots:
            for folder in self._release_folders(root, dataset):
                row = _row_of_folder(folder)
                if row is not None:
                    found.setdefault(folder.parent.name, []).append(row)
        for rows in found.values():
            # ids start with the request's time (a TEST id after its prefix)
            rows.sort(key=lambda row: (row["date"], row["id"].removeprefix(TEST_PREFIX)),
                      reverse=True)
        return dict(sorted(found.items()))

    @staticmethod
    def _release_folders(root: Path, dataset: str | None) -> Iterable[Path]:
        datasets = [dataset] if dataset else sorted(
            p.name for p in _list(root) if not p.name.startswith("."))
        for name in datasets:
            parent = _inside(root, name)
            if parent is None or not parent.is_dir():
                continue
            for child in sorted(_list(Path(root) / name)):
                manifest = _inside(root, name, child.name, "manifest.json")
                if manifest is not None and manifest.is_file():
                    yield Path(root) / name / child.name

    # --- pages ----------------------------------------------------------------------------
    def refused(self, viewer: Viewer, message: str) -> HTMLResponse:
        """The 403 page a researcher gets for the steward area: says why, links back home,
        and names nothing it holds (the answer is the same whether a path exists or not)."""
        html = self.templates.get_template("refused.html").render(
            open_access=False, viewer=viewer, message=message)
        return HTMLResponse(html, status_code=403)

    def page(self, request: Request, template: str, **values: Any) -> HTMLResponse:
        viewer = viewer_of(request)
        html = self.templates.get_template(template).render(
            open_access=viewer.how == "open", viewer=viewer, **values)
        return HTMLResponse(html)

    async def index(self, request: Request) -> Response:
        return self.page(request, "index.html",
                         catalogue=self.catalogue(viewer=viewer_of(request)))

    async def dataset(self, request: Request) -> Response:
        dataset = request.path_params["dataset"]
        rows = self.catalogue(dataset, viewer_of(request)).get(dataset)
        if not rows:
            raise HTTPException(404, "no release of this dataset")
        return self.page(request, "catalogue.html", dataset=dataset, rows=rows,
                         lifetime=next((r for r in rows if not r["unreadable"]), rows[0]),
                         any_test=any(r["test"] for r in rows))

    async def release(self, request: Request) -> Response:
        dataset, release_id = request.path_params["dataset"], request.path_params["release_id"]
        folder = self.release_folder(dataset, release_id, viewer_of(request))
        row = _row_of_folder(folder)
        if row is None:  # a copy naming another release: not a release of this id
            raise HTTPException(404, "no such release")
        if row["unreadable"]:
            return self.page(request, "release.html", dataset=dataset, row=row, files=[],
                             report=None)
        return self.page(request, "release.html", dataset=dataset, row=row,
                         files=self._public_files(folder, release_id),
                         report=self._report(folder))

    def _report(self, folder: Path) -> Markup:
        """A release folder's report.md, rendered (or a note that it has none)."""
        text = (folder / "report.md").read_text(encoding="utf-8", errors="replace") if _inside(
            folder, "report.md") is not None else "(this release has no report.md)"
        return self.render_markdown(text)

    def _public_files(self, folder: Path, release_id: str) -> list[dict[str, Any]]:
        """The release's files a researcher may download, with what each is and its size (a
        relational release: one pair per table first, each saying what it references)."""
        tables = table_file_notes(folder)
        notes = {**tables, **FILE_NOTES}
        return [{"name": name, "size": (folder / stored).stat().st_size,
                 "note": notes[name]}
                for name in [*tables, *PUBLIC_FILES]
                if (stored := self._stored_name(name, release_id)) and _inside(
                    folder, stored) is not None]

    @staticmethod
    def _file(folder: Path, stored: str, download_as: str, missing: str) -> Response:
        """One file of a checked folder, as a download (404 if it is not there)."""
        path = _inside(folder, stored)
        if path is None or not path.is_file():
            raise HTTPException(404, missing)
        return FileResponse(path, filename=download_as, media_type=_media_type(stored))

    async def staged_release(self, request: Request) -> Response:
        """A release awaiting review, as it would be published, in the steward area."""
        _steward_only(request)
        dataset, release_id = request.path_params["dataset"], request.path_params["release_id"]
        folder = self.staged_folder(dataset, release_id)
        row = _row_of_folder(folder)
        if row is None:
            raise HTTPException(404, "no release of this id awaits review")
        evidence = _inside(self.places.steward, dataset, release_id, "evaluation",
                           "report.html") is not None
        return self.page(request, "staged_release.html", dataset=dataset, row=row,
                         files=[] if row["unreadable"] else self._public_files(
                             folder, release_id),
                         report=None if row["unreadable"] else self._report(folder),
                         evidence=evidence)

    async def staged_file(self, request: Request) -> Response:
        _steward_only(request)
        dataset, release_id = request.path_params["dataset"], request.path_params["release_id"]
        name = request.path_params["name"]
        folder = self.staged_folder(dataset, release_id)
        if name not in PUBLIC_FILES and name not in table_file_notes(folder):
            raise HTTPException(404, "not a file of a release")
        stored = self._stored_name(name, release_id) if name not in PUBLIC_FILES else name
        return self._file(folder, stored,
                          f"{release_id}-staged-{name}", "this staged release has no such file")

    async def release_file(self, request: Request) -> Response:
        dataset, release_id = request.path_params["dataset"], request.path_params["release_id"]
        name = request.path_params["name"]
        folder = self.release_folder(dataset, release_id, viewer_of(request))
        if name not in PUBLIC_FILES and name not in table_file_notes(folder):
            raise HTTPException(404, "not a file of a release")
        row = _row_of_folder(folder)
        if row is None or row["unreadable"]:
            # without a readable manifest nobody can say what guarantee the rows carry
            raise HTTPException(404, "this release's manifest cannot be read: its files are "
                                     "not offered")
        return self._file(folder, self._stored_name(name, release_id), f"{release_id}-{name}",
                          "this release has no such file")

    @staticmethod
    def _stored_name(name: str, release_id: str) -> str:
        """A TEST release's data files are named TEST-data.* (``data_file_names``)."""
        if is_test_release(release_id) and (name.startswith("data.") or (name.endswith(
                (".csv", ".parquet")) and name not in PUBLIC_FILES)):
            return f"{TEST_PREFIX}{name}"
        return name

    async def steward_index(self, request: Request) -> Response:
        _steward_only(request)
        records: dict[str, list[dict[str, Any]]] = {}
        for dataset_folder in sorted(_list(self.places.steward)):
            if _inside(self.places.steward, dataset_folder.name) is None:
                continue
            for folder in sorted(_list(dataset_folder), reverse=True):
                if _inside(self.places.steward, dataset_folder.name, folder.name,
                           "record.json") is None:
                    continue
                record = _read_json(folder / "record.json")
                if record is None or record.get("release_id") != folder.name:
                    continue
                try:
                    row = _record_row(record, folder)
                except Exception:  # one odd record must not take the page down
                    row = {"id": folder.name, "dataset": dataset_folder.name, "date": "",
                           "status": "record unreadable", "test": False, "evidence": False}
                records.setdefault(dataset_folder.name, []).append(row)
        return self.page(request, "steward_index.html", records=records)

    async def steward_release(self, request: Request) -> Response:
        _steward_only(request)
        dataset, release_id = request.path_params["dataset"], request.path_params["release_id"]
        folder = self.record_folder(dataset, release_id)
        record = _read_json(folder / "record.json")
        if record is None:
            raise HTTPException(404, "no steward record for this release")
        published = None
        with contextlib.suppress(HTTPException):
            published = self.release_folder(dataset, release_id, viewer_of(request))
        evaluation = _inside(folder, "evaluation", "report.html")
        files = [{"name": name, "size": (folder / name).stat().st_size}
                 for name in STEWARD_FILES if _inside(folder, name) is not None]
        return self.page(request, "steward_release.html", dataset=dataset,
                         release_id=release_id, row=_record_row(record, folder),
                         facts=_record_facts(record), files=files,
                         evidence=evaluation is not None, published=published is not None)

    async def steward_file(self, request: Request) -> Response:
        _steward_only(request)
        dataset, release_id = request.path_params["dataset"], request.path_params["release_id"]
        name = request.path_params["name"]
        if name not in STEWARD_FILES:
            raise HTTPException(404, "not a file of a steward record")
        return self._file(self.record_folder(dataset, release_id), name,
                          f"{release_id}-steward-{name}", "this record has no such file")

    async def evidence(self, request: Request) -> Response:
        """The evidence report and its plots, shown in the browser (not downloaded)."""
        _steward_only(request)
        dataset, release_id = request.path_params["dataset"], request.path_params["release_id"]
        parts = request.path_params["path"].split("/")
        if not ((len(parts) == 1 and parts[0] in EVIDENCE_FILES)
                or (len(parts) == 2 and parts[0] == "plots" and PLOT.match(parts[1]))):
            raise HTTPException(404, "not a file of the evidence report")
        path = _inside(self.record_folder(dataset, release_id), "evaluation", *parts)
        if path is None or not path.is_file():
            raise HTTPException(404, "this release has no evidence report")
        if parts == ["report.html"]:  # with the steward area's bar: where it is, the way back
            bar = self.templates.get_template("evidence_bar.html").render(
                dataset=dataset, release_id=release_id)
            page = path.read_text(encoding="utf-8")
            head, body, rest = page.partition("<body>")
            return HTMLResponse(head + body + bar + rest if body else bar + page)
        return FileResponse(path, media_type=_media_type(parts[-1]),
                            content_disposition_type="inline")

    def render_markdown(self, text: str) -> Markup:
        """report.md as HTML: raw HTML in it is escaped, and links that are not http(s) or
        relative (``javascript:``, ``file:``, ``data:``) are not made (markdown-it's own
        check). The suppressed label ``'*'`` is kept literal: two of them on one line would
        otherwise be read as emphasis and vanish."""
        text = re.sub(r"(?<!\\)'\*'", r"'\\*'", text)
        return Markup(self.markdown.render(text))  # markdown-it escaped it (html off)


def _steward_only(request: Request) -> None:
    """Each steward page checks the role itself too: the access layer's path rule is the
    first wall, this one holds if a route is ever mounted elsewhere."""
    if not viewer_of(request).steward:
        raise HTTPException(403, "the steward area is for data stewards")


def _list(folder: Path) -> list[Path]:
    try:
        return [p for p in Path(folder).iterdir() if not p.name.startswith(".")]
    except OSError:
        return []


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def table_file_notes(folder: Path) -> dict[str, str]:
    """A relational release's data files (``<table>.csv``, ``<table>.parquet``), each with
    what it is and how it joins, from its manifest (``mechanism_details.tables``); none for
    any other release. Names are checked: lower-case letters, digits and '_' only."""
    manifest = _read_json(folder / "manifest.json") or {}
    tables = (manifest.get("mechanism_details") or {}).get("tables") if isinstance(
        manifest.get("mechanism_details"), dict) else None
    notes: dict[str, str] = {}
    keys = {t.get("table"): t.get("key") for t in tables or [] if isinstance(t, dict)}
    for table in tables or []:
        name = table.get("table") if isinstance(table, dict) else None
        if not isinstance(name, str) or not TABLE_FILE.match(name):
            continue
        joins = (f"; its {table.get('references')} is {table.get('parent')}."
                 f"{keys.get(table.get('parent'))} (at most {table.get('max_children')} per "
                 f"row of {table.get('parent')})" if table.get("parent") else
                 f"; one row per patient, key {table.get('key')}")
        notes[f"{name}.csv"] = f"table {name}: {table.get('rows')} synthetic rows{joins}"
        notes[f"{name}.parquet"] = f"table {name}, every value raw"
    return notes


TABLE_FILE = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


def _row_of_folder(folder: Path) -> dict[str, Any] | None:
    """A release folder's catalogue row: from its manifest, or an *unreadable* row when the
    manifest is not JSON, not an object, has no release id, or holds fields of the wrong
    kind; ``None`` when it names another release (the folder is a copy, not that release)."""
    manifest = _read_json(folder / "manifest.json")
    named = manifest.get("release_id") if manifest is not None else None
    if isinstance(named, str) and named != folder.name:
        return None
    if manifest is None or not _readable(manifest):
        return _unreadable_row(folder.name)
    try:
        return _catalogue_row(manifest)
    except Exception:  # one odd manifest must not take the catalogue down
        return _unreadable_row(folder.name)


# What a page needs of a manifest to say what a release is: without a guarantee it can say
# nothing a researcher could rely on. Other fields of the wrong kind are shown as missing.
REQUIRED_TEXT = ("release_id", "mechanism", "created_at")


def _readable(manifest: dict[str, Any]) -> bool:
    guarantee = manifest.get("guarantee")
    return (all(isinstance(manifest.get(key), str) for key in REQUIRED_TEXT)
            and isinstance(guarantee, dict) and isinstance(guarantee.get("label"), str)
            and isinstance(guarantee.get("proven"), bool))


def _unreadable_row(release_id: str) -> dict[str, Any]:
    test = is_test_release(release_id)
    return {"id": release_id, "date": "", "mechanism": "", "guarantee": "", "proven": False,
            "statement": "", "rows": None, "status": "manifest unreadable", "test": test,
            "void": False, "lifetime": "", "spent": "", "unreadable": True,
            "verdict": None, "verdict_class": "", "verdict_headline": ""}


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


def _guarantee_short(guarantee: dict[str, Any]) -> str:
    """ "eps 1, delta 1e-06 — sound (epsilon, delta)-DP ..." for DP; the label otherwise."""
    label = _str(guarantee.get("label"))
    epsilon = _number(guarantee.get("epsilon"))
    if epsilon is None:
        return label
    delta = _number(guarantee.get("delta")) or 0
    budget = f"ε {epsilon:g}" + (f", δ {delta:g}" if delta else "")
    return f"{budget} — {label}"


def _catalogue_row(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest's public facts as the pages show them, each of the kind the page expects
    (text, a whole number or nothing): a field of another kind is shown as missing."""
    guarantee = manifest.get("guarantee")
    guarantee = guarantee if isinstance(guarantee, dict) else {}
    lifetime = manifest.get("lifetime")
    lifetime = lifetime if isinstance(lifetime, dict) else {}
    rows = manifest.get("released_rows")
    test = manifest.get("test_release") is True
    status = "TEST — never published" if test else "published"
    return {"id": _str(manifest.get("release_id")), "date": _str(manifest.get("created_at")),
            "mechanism": _str(manifest.get("mechanism")),
            "guarantee": _guarantee_short(guarantee), "proven": guarantee.get("proven") is True,
            "statement": _str(guarantee.get("statement")),
            "rows": rows if isinstance(rows, int) and not isinstance(rows, bool) else None,
            "status": status, "test": test, "void": lifetime.get("void") is True,
            "lifetime": _str(lifetime.get("statement")), "spent": _spent(lifetime),
            "unreadable": False, **_verdict_badge(manifest)}


# The publication verdict's level as a badge: its words and the badge's colour class.
VERDICT_BADGES = {"fit": "ok", "use with care": "warn", "not fit": "bad"}


def _verdict_badge(manifest: dict[str, Any]) -> dict[str, Any]:
    """The release's publication verdict as the catalogue shows it: the level as a badge
    (fit / use with care / not fit) and the headline; read from the manifest, which publishes
    it (a manifest from before the verdict existed: no badge)."""
    verdict = manifest.get("verdict")
    level = verdict.get("level") if isinstance(verdict, dict) else None
    if level not in VERDICT_BADGES:
        return {"verdict": None, "verdict_class": "", "verdict_headline": ""}
    return {"verdict": level, "verdict_class": VERDICT_BADGES[level],
            "verdict_headline": str(verdict.get("headline") or "")}


def _spent(lifetime: dict[str, Any]) -> str:
    """ "ε 3 of 10 spent" on the source, as the manifest says after this release."""
    try:
        return f"ε {lifetime['epsilon_spent']:g} of {lifetime['epsilon_cap']:g} spent"
    except (KeyError, TypeError, ValueError):
        return ""


def _record_row(record: dict[str, Any], folder: Path) -> dict[str, Any]:
    return {"id": record.get("release_id", folder.name), "dataset": record.get("dataset", ""),
            "date": record.get("requested_at") or "", "status": record.get("status", ""),
            "test": bool(record.get("test_release")),
            "evidence": (folder / "evaluation" / "report.html").is_file()}


RECORD_FACTS = (
    ("status", "status"), ("requested_at", "requested"), ("published_at", "published"),
    ("error", "error"), ("input_file", "input file"), ("input_sha256", "input sha256"),
    ("input_rows", "input rows"), ("dropped_rows", "rows dropped"),
    ("information_loss", "information loss"), ("lifetime_cap_note", "lifetime cap"),
    ("declared_rows_check", "declared rows"), ("flow_run_id", "flow run"),
    ("ledger_spend_id", "ledger spend"), ("ledger_charge", "ledger charge"),
)


def _record_facts(record: dict[str, Any]) -> list[tuple[str, str]]:
    """The record's main facts as (label, text); the full record is a download."""
    facts = []
    for key, label in RECORD_FACTS:
        value = record.get(key)
        if value in (None, "", [], {}):
            continue
        if isinstance(value, dict):  # its plain figures; the nested rest is in record.json
            value = ", ".join(f"{k} {_plain(v)}" for k, v in value.items()
                              if isinstance(v, str | int | float) and len(str(v)) < 80)
        elif key.endswith("_at"):
            value = _when(value)
        facts.append((label, _plain(value)))
    return facts


def _plain(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _when(text: str) -> str:
    """ISO time as "2026-11-25 15:50 UTC", or "2026-11-25" for a day: a manifest is dated by
    its day only (the time would tell how long the run took; ``release_day``)."""
    try:
        moment = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return text or "-"
    if (moment.hour, moment.minute, moment.second) == (0, 0, 0):
        return moment.strftime("%Y-%m-%d")
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def _size(size: int) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:,} {unit}" if unit == "bytes" else f"{size:,.1f} {unit}"
        size /= 1024
    return str(size)


def _media_type(name: str) -> str:
    return {".csv": "text/csv; charset=utf-8", ".json": "application/json",
            ".md": "text/markdown; charset=utf-8", ".parquet": "application/vnd.apache.parquet",
            ".html": "text/html; charset=utf-8", ".svg": "image/svg+xml"}.get(
        Path(name).suffix, "application/octet-stream")


async def _not_found(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 404)
    detail = getattr(exc, "detail", "not found")
    text = {403: "Not for your role", 404: "Not found",
            405: "Read-only: only GET and HEAD"}.get(status, "Error")
    return HTMLResponse(f"<!doctype html><title>{status}</title><h1>{status} — {text}</h1>"
                        f"<p>{Markup.escape(detail)}</p><p><a href='/'>Releases</a></p>",
                        status_code=status)


def create_app(places: PortalPlaces | None = None, secret: str | None = None,
               accounts: AccountStore | None = None, user_header: str | None = None
               ) -> AccessControl:
    """The portal as an ASGI app: every route behind ``secret`` and ``accounts`` (when given;
    with neither it is open, for loopback only); ``user_header``: see ``AccessControl``."""
    portal = Portal(places or PortalPlaces.from_settings(), secret)
    routes = [
        Route("/", portal.index, methods=["GET"]),
        Route("/releases", portal.index, methods=["GET"]),
        Route("/releases/{dataset}", portal.dataset, methods=["GET"]),
        Route("/releases/{dataset}/{release_id}", portal.release, methods=["GET"]),
        Route("/releases/{dataset}/{release_id}/{name}", portal.release_file, methods=["GET"]),
        Route("/steward", portal.steward_index, methods=["GET"]),
        Route(f"/steward/{STAGING}/{{dataset}}/{{release_id}}", portal.staged_release,
              methods=["GET"]),
        Route(f"/steward/{STAGING}/{{dataset}}/{{release_id}}/{{name}}", portal.staged_file,
              methods=["GET"]),
        Route("/steward/{dataset}/{release_id}", portal.steward_release, methods=["GET"]),
        Route("/steward/{dataset}/{release_id}/evidence/{path:path}", portal.evidence,
              methods=["GET"]),
        Route("/steward/{dataset}/{release_id}/{name}", portal.steward_file, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _not_found})
    return AccessControl(app, secret, accounts, user_header, portal.refused)


def bound_socket(host: str, port: int) -> socket.socket:
    """A listening socket, bound now: a port in use fails here, in the caller's words."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise PortalRefused(f"cannot listen on {host}:{port} ({exc.strerror or exc}): is a "
                            "portal already running there? choose another --port") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


@dataclass(frozen=True)
class PortalLogins:
    """How the portal about to start lets people in (what ``serve`` and ``portal`` print)."""

    secret: bool
    accounts: bool
    accounts_location: str
    user_header: str | None

    def describe(self) -> str:
        ways = (["the Prefect server's secret (stewards)"] if self.secret else []) + (
            [f"portal accounts ({self.accounts_location})"] if self.accounts else []) + (
            [f"single sign-on header {self.user_header} from loopback"]
            if self.user_header else [])
        return "log in with " + " or ".join(ways) if ways else ""


def portal_server(host: str = DEFAULT_PORTAL_HOST, port: int = DEFAULT_PORTAL_PORT):
    """(uvicorn server, bound socket) for the portal on ``host:port``, with the secret from
    the environment and the accounts beside the ledger (``open_accounts``); ``PortalRefused``
    if it may not or cannot listen there. The server's ``logins`` attribute says how."""
    import uvicorn

    secret = auth_secret()
    header = user_header()
    try:
        accounts = open_accounts()
    except MedreleaseError as exc:
        raise PortalRefused(str(exc)) from None
    app = create_app(secret=secret, accounts=accounts, user_header=header)
    has_accounts = app.accounts_exist()
    check_binding(host, secret, has_accounts)
    sock = bound_socket(host, port)
    config = uvicorn.Config(app, log_level="warning", access_log=False, server_header=False,
                            proxy_headers=False)
    server = uvicorn.Server(config)
    server.logins = PortalLogins(secret is not None, has_accounts, accounts.location, header)
    return server, sock


def start_in_thread(host: str = DEFAULT_PORTAL_HOST, port: int = DEFAULT_PORTAL_PORT):
    """The portal in a daemon thread of this process (``medrelease serve``); returns the
    uvicorn server (set ``should_exit`` to stop it)."""
    server, sock = portal_server(host, port)
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="release-portal",
                     daemon=True).start()
    return server
