"""Prefect artifacts with their text made inert: every artifact of the project goes through
``markdown_artifact`` or ``table_artifact``.

The Prefect UI renders a markdown artifact (and every artifact's description) as markdown
with raw HTML, so a raw value of the extract — a diagnosis written ``<img src=x onerror=…>``,
named in an accuracy warning — became a live element in the steward's browser (issue 36,
case 19). Escaping each value where it is formatted would have to be remembered at every
f-string; escaping at the one place artifacts are created cannot be forgotten. The project's
own markdown uses no HTML, so ``<``, ``>`` and ``&`` are written as entities everywhere (they
render as themselves), and a link to a ``javascript:``, ``vbscript:`` or ``data:`` address
loses its scheme. Table cells and keys get the same treatment.

Markdown itself is disarmed the same way (issue 56): a raw value written ``![x](http://...)``
was an image the steward's browser fetched from an outside server, ``[click](...)`` a link.
The project's own markdown draws no image and links only to the release portal
(``medrelease.storage.links``), so outside code spans every ``[``, ``]`` and ``!`` is escaped
(no image, link or reference can form) except in a link to the portal, and a bare address
(``http://``, ``www.``, ``user@host``) is broken with a backslash, so the UI's renderer (marked,
GitHub-flavoured) does not link it. Escaped characters render as themselves.
"""

from __future__ import annotations

import re
from typing import Any
from uuid import UUID

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from medrelease.storage.links import portal_url

ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
UNSAFE_LINK = re.compile(r"\]\(\s*(javascript|vbscript|data)\s*:", re.IGNORECASE)
# A code span (its backticks matched as CommonMark does): nothing in it is live markdown.
CODE_SPAN = re.compile(r"(`+)(?:.|\n)*?(?<!`)\1(?!`)")
BARE_ADDRESS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*):(?=//)|\b(www)\.(?=\S)|(?<=\w)@(?=\w)")


def inert(text: str) -> str:
    """``text`` with no HTML element, entity trick or script link left in it, and no image,
    link or linked address but the project's own links to the release portal."""
    escaped = re.sub(r"[&<>]", lambda m: ENTITIES[m.group()], text)
    escaped = UNSAFE_LINK.sub(lambda m: f"](unsafe-{m.group(1).lower()}-", escaped)
    parts, last = [], 0
    for span in CODE_SPAN.finditer(escaped):
        parts += [_disarmed(escaped[last:span.start()]), span.group()]
        last = span.end()
    return "".join([*parts, _disarmed(escaped[last:])])


def _disarmed(text: str) -> str:
    """Markdown outside code spans with its links, images, references and bare addresses
    escaped, but for inline links to the release portal (kept as they are)."""
    portal = re.escape(portal_url() + "/")
    own = re.compile(rf"(?<![!\\])\[[^\[\]\n]*\]\({portal}[^()\s]*\)")
    pieces, last = [], 0
    for link in own.finditer(text):
        pieces += [_escaped(text[last:link.start()]), link.group()]
        last = link.end()
    return "".join([*pieces, _escaped(text[last:])])


def _escaped(text: str) -> str:
    # a backslash before one of them is escaped too: it cannot undo the escape
    text = re.sub(r"(\\?)([\[\]!])",
                  lambda m: ("\\\\" if m.group(1) else "") + "\\" + m.group(2), text)
    return BARE_ADDRESS.sub(lambda m: (f"{m.group(1)}\\:" if m.group(1) else
                                       f"{m.group(2)}\\." if m.group(2) else "\\@"), text)


def _inert_cell(value: Any) -> Any:
    return inert(value) if isinstance(value, str) else value


def markdown_artifact(markdown: str, key: str | None = None,
                      description: str | None = None) -> UUID:
    """``create_markdown_artifact`` with the markdown and the description made inert, and
    cut to fit one Prefect event (``EVENT_BUDGET``)."""
    text = inert(markdown)
    if len(text.encode()) > EVENT_BUDGET:
        text = text.encode()[:EVENT_BUDGET].decode(errors="ignore") + CUT_NOTE
    return create_markdown_artifact(markdown=text, key=key,
                                    description=inert(description) if description else None)


# Prefect's server refuses an event larger than PREFECT_EVENTS_MAXIMUM_SIZE_BYTES (1.5 MB),
# and an artifact's creation event carries its data: an 18,432-node table (5 MB) was logged
# as "Refusing to publish event of size 4608619" (issue 55). An artifact is held well under.
EVENT_BUDGET = 400_000
CUT_NOTE = ("\n\n(cut here: the rest is too large for one Prefect event; the steward record "
            "holds all of it)")


def _fitting_rows(rows: list, budget: int = EVENT_BUDGET) -> list:
    """The first rows of a table whose JSON fits ``budget`` bytes (all of them when it
    does)."""
    import json

    sizes = [len(json.dumps(r, default=str).encode()) + 2 for r in rows]
    total, kept = 0, 0
    for size in sizes:
        if total + size > budget:
            break
        total, kept = total + size, kept + 1
    return rows[:kept]


def table_artifact(table: list[dict[str, Any]] | dict[str, list[Any]] | list[list[Any]],
                   key: str | None = None, description: str | None = None) -> UUID:
    """``create_table_artifact`` with every text cell, column name and the description made
    inert (rows as dicts, columns as a dict of lists, or rows as lists)."""
    if isinstance(table, dict):
        safe: Any = {inert(str(k)): [_inert_cell(v) for v in column]
                     for k, column in table.items()}
    else:
        safe = [({inert(str(k)): _inert_cell(v) for k, v in row.items()}
                 if isinstance(row, dict) else [_inert_cell(v) for v in row]) for row in table]
        fitting = _fitting_rows(safe)
        if len(fitting) < len(safe):  # one Prefect event holds the artifact: its first rows
            description = (f"{description or ''} (the first {len(fitting):,} of "
                           f"{len(safe):,} rows: the rest is too large for one Prefect event; "
                           "the steward record holds them all)").strip()
            safe = fitting
    return create_table_artifact(table=safe, key=key,
                                 description=inert(description) if description else None)
