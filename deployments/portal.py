"""The release portal: releases, their files and the steward's evidence, read-only over HTTP.

A steward reaches a release from the Prefect UI by a link, not a server path (issue 39): the
catalogue per dataset, a release's page (its ``report.md`` rendered, its files to download) and,
in a separate steward area under ``/steward/`` that no public page links to, the steward record
and the evidence report. Server-rendered HTML (Starlette + Jinja2, both installed with Prefect),
no client framework, no script on any page.

* **Who may read.** The same secret as the Prefect server's basic authentication
  (``PREFECT_SERVER_API_AUTH_STRING``, else ``PREFECT_API_AUTH_STRING``: the ``user:pass`` line
  of ``var/prefect-auth``): every request without it is answered 401 with a Basic challenge,
  compared in constant time. Without a secret the portal serves only on a loopback address, as
  Prefect's own server then does, and says so on every page; it refuses any other host, and
  answers 421 to a request whose Host header is not a loopback name (DNS rebinding).
* **What it reads.** Only the release stores (``MEDRELEASE_STORE``, ``MEDRELEASE_TEST_STORE``)
  and the steward records (``MEDRELEASE_STEWARD``), and there only named files: a path part is
  checked as the store checks it (``safe_relative``: no ``..``, no hidden names), a folder must
  hold its manifest (or record), and the file's real path, symbolic links resolved, must lie
  inside the store's real path; anything else is 404 before a byte is read.
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
import socket
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from markdown_it import MarkdownIt
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from medrelease.settings import steward_root, store_root, test_store_root
from medrelease.storage.links import (
    DEFAULT_PORTAL_HOST,
    DEFAULT_PORTAL_PORT,
    STAGING,
    is_test_release,
)
from medrelease.storage.store import PARTIAL_PREFIX, TEST_PREFIX, StoreError, safe_relative

AUTH_VARIABLES = ("PREFECT_SERVER_API_AUTH_STRING", "PREFECT_API_AUTH_STRING")
REALM = "medrelease release portal"
TEMPLATES = Path(__file__).resolve().parent / "templates"

# What a release page offers, in this order (a TEST release's data files carry TEST- too).
PUBLIC_FILES = ("data.csv", "data.parquet", "manifest.json", "report.md", "measurements.parquet")
FILE_NOTES = {
    "data.csv": "the released rows (formula-like text cells prefixed with ')",
    "data.parquet": "the released rows, every value raw",
    "manifest.json": "public parameters, guarantee, budget steps, checks passed",
    "report.md": "the manifest in plain words, with the error bars",
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


def check_binding(host: str, secret: str | None) -> None:
    """Refuse to serve steward evidence without a secret beyond loopback."""
    if secret is None and not is_loopback(host):
        raise PortalRefused(
            f"no secret for host {host}: set PREFECT_SERVER_API_AUTH_STRING or "
            "PREFECT_API_AUTH_STRING (the Prefect server's 'user:pass', e.g. "
            "\"$(cat var/prefect-auth)\") before serving beyond loopback, or use --host "
            "127.0.0.1")


@dataclass(frozen=True)
class PortalPlaces:
    """The folders the portal reads (and nothing else)."""

    store: Path
    test_store: Path
    steward: Path

    @classmethod
    def from_settings(cls) -> PortalPlaces:
        return cls(store_root(), test_store_root(), steward_root())


class BasicAuth:
    """401 with a Basic challenge unless the request carries the secret; security headers on
    every answer. The decoded ``user:pass`` is compared with the secret in constant time."""

    def __init__(self, app: ASGIApp, secret: str | None) -> None:
        self.app = app
        self.secret = secret.encode("utf-8") if secret else None

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

        if self.secret is None and not _loopback_host(scope):
            # open on loopback only: a page of another site whose name was re-pointed at
            # 127.0.0.1 (DNS rebinding) arrives with that name, and reads nothing
            response = Response("This portal has no secret and answers only to a loopback "
                                "address (127.0.0.1, localhost, ::1).\n", status_code=421,
                                media_type="text/plain")
            await response(scope, receive, with_headers)
            return
        if self.secret is not None and not self._allowed(scope):
            response = Response(
                "Authentication required: log in with the stewards' secret (the Prefect "
                "server's user:pass).\n", status_code=401, media_type="text/plain",
                headers={"www-authenticate": f'Basic realm="{REALM}", charset="UTF-8"'})
            await response(scope, receive, with_headers)
            return
        await self.app(scope, receive, with_headers)

    def _allowed(self, scope: Scope) -> bool:
        given = b""
        for name, value in scope.get("headers", []):
            if name.lower() == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"basic":
                    with contextlib.suppress(binascii.Error, ValueError):
                        given = base64.b64decode(token.strip(), validate=True)
        assert self.secret is not None
        # digests of equal length: the comparison's time tells nothing, not even the length
        return hmac.compare_digest(hashlib.sha256(given).digest(),
                                   hashlib.sha256(self.secret).digest())


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
    """``root/parts...`` as a real path inside ``root``'s real path, or ``None``.

    Each part must be one safe name (as the store names releases: no ``..``, no hidden or
    partial folders); symbolic links are resolved and may not lead out of ``root``."""
    try:
        for part in parts:
            if len(safe_relative(part, "path part").parts) != 1 or part.startswith(
                    PARTIAL_PREFIX):
                return None
    except StoreError:
        return None
    real_root = Path(os.path.realpath(root))
    real = Path(os.path.realpath(Path(root).joinpath(*parts)))
    if not real.is_relative_to(real_root) or not real.exists():
        return None
    return real


class Portal:
    """The pages and files, read from ``places`` on every request (nothing cached)."""

    def __init__(self, places: PortalPlaces, secret: str | None) -> None:
        self.places = places
        self.open_access = secret is None
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
            undefined=jinja2.StrictUndefined)
        self.templates.filters["when"] = _when
        self.templates.filters["size"] = _size
        self.markdown = MarkdownIt("commonmark", {"html": False}).enable("table")

    # --- finding things -------------------------------------------------------------------
    def release_folder(self, dataset: str, release_id: str) -> Path:
        """A published (or TEST) release's real folder, or 404."""
        store = self.places.test_store if is_test_release(release_id) else self.places.store
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

    def catalogue(self, dataset: str | None = None) -> dict[str, list[dict[str, Any]]]:
        """Every release per dataset, newest first, from the manifests of both stores."""
        found: dict[str, list[dict[str, Any]]] = {}
        for root in (self.places.store, self.places.test_store):
            for folder in self._release_folders(root, dataset):
                manifest = _read_json(folder / "manifest.json")
                if manifest is None or manifest.get("release_id") != folder.name:
                    continue
                found.setdefault(folder.parent.name, []).append(_catalogue_row(manifest))
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
                if _inside(root, name, child.name, "manifest.json") is not None:
                    yield Path(root) / name / child.name

    # --- pages ----------------------------------------------------------------------------
    def page(self, template: str, **values: Any) -> HTMLResponse:
        html = self.templates.get_template(template).render(open_access=self.open_access,
                                                            **values)
        return HTMLResponse(html)

    async def index(self, request: Request) -> Response:
        return self.page("index.html", catalogue=self.catalogue())

    async def dataset(self, request: Request) -> Response:
        dataset = request.path_params["dataset"]
        rows = self.catalogue(dataset).get(dataset)
        if not rows:
            raise HTTPException(404, "no release of this dataset")
        return self.page("catalogue.html", dataset=dataset, rows=rows)

    async def release(self, request: Request) -> Response:
        dataset, release_id = request.path_params["dataset"], request.path_params["release_id"]
        folder = self.release_folder(dataset, release_id)
        manifest = _read_json(folder / "manifest.json")
        if manifest is None:
            raise HTTPException(404, "no such release")
        return self.page("release.html", dataset=dataset, row=_catalogue_row(manifest),
                         manifest=manifest, files=self._public_files(folder, release_id),
                         report=self._report(folder))

    def _report(self, folder: Path) -> Markup:
        """A release folder's report.md, rendered (or a note that it has none)."""
        text = (folder / "report.md").read_text(encoding="utf-8") if _inside(
            folder, "report.md") is not None else "(this release has no report.md)"
        return self.render_markdown(text)

    def _public_files(self, folder: Path, release_id: str) -> list[dict[str, Any]]:
        """The release's files a researcher may download, with what each is and its size."""
        return [{"name": name, "size": (folder / stored).stat().st_size,
                 "note": FILE_NOTES[name]}
                for name in PUBLIC_FILES
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
        dataset, release_id = request.path_params["dataset"], request.path_params["release_id"]
        folder = self.staged_folder(dataset, release_id)
        manifest = _read_json(folder / "manifest.json")
        if manifest is None:
            raise HTTPException(404, "no release of this id awaits review")
        evidence = _inside(self.places.steward, dataset, release_id, "evaluation",
                           "report.html") is not None
        return self.page("staged_release.html", dataset=dataset, row=_catalogue_row(manifest),
                         files=self._public_files(folder, release_id),
                         report=self._report(folder), evidence=evidence)

    async def staged_file(self, request: Request) -> Response:
        dataset, release_id = request.path_params["dataset"], request.path_params["release_id"]
        name = request.path_params["name"]
        if name not in PUBLIC_FILES:
            raise HTTPException(404, "not a file of a release")
        return self._file(self.staged_folder(dataset, release_id), name,
                          f"{release_id}-staged-{name}", "this staged release has no such file")

    async def release_file(self, request: Request) -> Response:
        dataset, release_id = request.path_params["dataset"], request.path_params["release_id"]
        name = request.path_params["name"]
        if name not in PUBLIC_FILES:
            raise HTTPException(404, "not a file of a release")
        return self._file(self.release_folder(dataset, release_id),
                          self._stored_name(name, release_id), f"{release_id}-{name}",
                          "this release has no such file")

    @staticmethod
    def _stored_name(name: str, release_id: str) -> str:
        """A TEST release's data files are named TEST-data.* (``data_file_names``)."""
        if is_test_release(release_id) and name.startswith("data."):
            return f"{TEST_PREFIX}{name}"
        return name

    async def steward_index(self, request: Request) -> Response:
        records: dict[str, list[dict[str, Any]]] = {}
        for dataset_folder in sorted(_list(self.places.steward)):
            for folder in sorted(_list(dataset_folder), reverse=True):
                if _inside(self.places.steward, dataset_folder.name, folder.name,
                           "record.json") is None:
                    continue
                record = _read_json(folder / "record.json")
                if record is None or record.get("release_id") != folder.name:
                    continue
                records.setdefault(dataset_folder.name, []).append(_record_row(record, folder))
        return self.page("steward_index.html", records=records)

    async def steward_release(self, request: Request) -> Response:
        dataset, release_id = request.path_params["dataset"], request.path_params["release_id"]
        folder = self.record_folder(dataset, release_id)
        record = _read_json(folder / "record.json")
        if record is None:
            raise HTTPException(404, "no steward record for this release")
        published = None
        with contextlib.suppress(HTTPException):
            published = self.release_folder(dataset, release_id)
        evaluation = _inside(folder, "evaluation", "report.html")
        files = [{"name": name, "size": (folder / name).stat().st_size}
                 for name in STEWARD_FILES if _inside(folder, name) is not None]
        return self.page("steward_release.html", dataset=dataset, release_id=release_id,
                         row=_record_row(record, folder), facts=_record_facts(record),
                         files=files, evidence=evaluation is not None,
                         published=published is not None)

    async def steward_file(self, request: Request) -> Response:
        dataset, release_id = request.path_params["dataset"], request.path_params["release_id"]
        name = request.path_params["name"]
        if name not in STEWARD_FILES:
            raise HTTPException(404, "not a file of a steward record")
        return self._file(self.record_folder(dataset, release_id), name,
                          f"{release_id}-steward-{name}", "this record has no such file")

    async def evidence(self, request: Request) -> Response:
        """The evidence report and its plots, shown in the browser (not downloaded)."""
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


def _guarantee_short(guarantee: dict[str, Any]) -> str:
    """ "eps 1, delta 1e-06 — sound (epsilon, delta)-DP ..." for DP; the label otherwise."""
    label = guarantee.get("label") or ""
    if guarantee.get("epsilon") is None:
        return label
    delta = guarantee.get("delta") or 0
    budget = f"ε {guarantee['epsilon']:g}" + (f", δ {delta:g}" if delta else "")
    return f"{budget} — {label}"


def _catalogue_row(manifest: dict[str, Any]) -> dict[str, Any]:
    guarantee = manifest.get("guarantee") or {}
    lifetime = manifest.get("lifetime") or {}
    test = bool(manifest.get("test_release"))
    status = "TEST — never published" if test else "published"
    return {"id": manifest.get("release_id", ""), "date": manifest.get("created_at") or "",
            "mechanism": manifest.get("mechanism", ""),
            "guarantee": _guarantee_short(guarantee), "proven": bool(guarantee.get("proven")),
            "statement": guarantee.get("statement", ""), "rows": manifest.get("released_rows"),
            "status": status, "test": test, "void": bool(lifetime.get("void")),
            "lifetime": lifetime.get("statement", ""), "spent": _spent(lifetime),
            **_verdict_badge(manifest)}


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
    text = {404: "Not found", 405: "Read-only: only GET and HEAD"}.get(status, "Error")
    return HTMLResponse(f"<!doctype html><title>{status}</title><h1>{status} — {text}</h1>"
                        f"<p>{Markup.escape(detail)}</p><p><a href='/'>Releases</a></p>",
                        status_code=status)


def create_app(places: PortalPlaces | None = None, secret: str | None = None) -> ASGIApp:
    """The portal as an ASGI app: every route behind ``secret`` (when given)."""
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
    return BasicAuth(app, secret)


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


def portal_server(host: str = DEFAULT_PORTAL_HOST, port: int = DEFAULT_PORTAL_PORT):
    """(uvicorn server, bound socket) for the portal on ``host:port``, with the secret from
    the environment; ``PortalRefused`` if it may not or cannot listen there."""
    import uvicorn

    secret = auth_secret()
    check_binding(host, secret)
    sock = bound_socket(host, port)
    config = uvicorn.Config(create_app(secret=secret), log_level="warning", access_log=False,
                            server_header=False, proxy_headers=False)
    return uvicorn.Server(config), sock


def start_in_thread(host: str = DEFAULT_PORTAL_HOST, port: int = DEFAULT_PORTAL_PORT):
    """The portal in a daemon thread of this process (``medrelease serve``); returns the
    uvicorn server (set ``should_exit`` to stop it)."""
    server, sock = portal_server(host, port)
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="release-portal",
                     daemon=True).start()
    return server
