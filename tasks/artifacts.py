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
"""

from __future__ import annotations

import re
from typing import Any
from uuid import UUID

from prefect.artifacts import create_markdown_artifact, create_table_artifact

ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
UNSAFE_LINK = re.compile(r"\]\(\s*(javascript|vbscript|data)\s*:", re.IGNORECASE)


def inert(text: str) -> str:
    """``text`` with no HTML element, entity trick or script link left in it."""
    escaped = re.sub(r"[&<>]", lambda m: ENTITIES[m.group()], text)
    return UNSAFE_LINK.sub(lambda m: f"](unsafe-{m.group(1).lower()}-", escaped)


def _inert_cell(value: Any) -> Any:
    return inert(value) if isinstance(value, str) else value


def markdown_artifact(markdown: str, key: str | None = None,
                      description: str | None = None) -> UUID:
    """``create_markdown_artifact`` with the markdown and the description made inert."""
    return create_markdown_artifact(markdown=inert(markdown), key=key,
                                    description=inert(description) if description else None)


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
    return create_table_artifact(table=safe, key=key,
                                 description=inert(description) if description else None)
