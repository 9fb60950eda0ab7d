"""Errors a steward can act on: each says what is wrong, where, and what to do.

Every error the engine raises on bad input derives from ``MedreleaseError`` so that the CLI and
the flows can show the message without a traceback, and so that callers can tell "your input or
parameters are wrong" apart from a bug.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from pathlib import Path


class MedreleaseError(Exception):
    """Base class: the message is meant for the person running the release."""


class ConfigError(MedreleaseError):
    """The dataset config (YAML) is malformed or inconsistent."""


class TaxonomyError(MedreleaseError):
    """A taxonomy file is malformed (missing '*', duplicate leaf, inconsistent parents...)."""


class InputValidationError(MedreleaseError):
    """The input table does not match its dataset config.

    The message names the column, the kind of problem, counts and file lines — never a value
    from the file: it ends up in Prefect's database, whose audience is wider than the raw
    data's. ``problems`` keeps one entry per finding, with example values under ``"values"``;
    only the steward-only log (``write_steward_log``) ever shows those.
    """

    def __init__(self, message: str, problems: list[dict] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []


class ParameterError(MedreleaseError):
    """A mechanism parameter is invalid (eps <= 0, shares not adding up, t < 2, ...)."""


class PolicyError(MedreleaseError):
    """The dataset's release policy does not allow this request (mechanism, epsilon, k)."""


class BudgetExceededError(MedreleaseError):
    """A spend would exceed a privacy budget; nothing was drawn."""


_POSITIONS: ContextVar[tuple[str, int]] = ContextVar("medrelease_positions",
                                                    default=("data row", 1))


@contextmanager
def positions_counted_as(word: str, offset: int) -> Iterator[None]:
    """How ``format_rows`` names positions inside this block: a CSV file ("file line", 2) —
    header on line 1 — a Parquet file ("row", 1). Outside, in-memory frames: ("data row", 1)."""
    token = _POSITIONS.set((word, offset))
    try:
        yield
    finally:
        _POSITIONS.reset(token)


def format_rows(rows: Sequence[int], limit: int = 5) -> str:
    """0-based data row indices as people find them in the file: "file lines 3, 9 and 2 more"."""
    word, offset = _POSITIONS.get()
    shown = ", ".join(str(int(r) + offset) for r in list(rows)[:limit])
    more = f" and {len(rows) - limit} more" if len(rows) > limit else ""
    return f"{word}{'s' if len(rows) != 1 else ''} {shown}{more}"


def position_numbers(rows: Sequence[int], limit: int = 5) -> list[int]:
    """The first positions as numbers (file lines or rows, as ``format_rows`` names them)."""
    offset = _POSITIONS.get()[1]
    return [int(r) + offset for r in list(rows)[:limit]]


def write_steward_log(folder: Path, dataset: str, error: InputValidationError) -> Path:
    """The full detail of a validation failure, values included, in a steward-only file."""
    folder.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    path = folder / f"validation-{dataset}-{stamp}.txt"
    lines = [f"dataset {dataset}: input validation failed at {stamp}", "", str(error), "",
             "findings (with example values — steward only, never sent to Prefect):"]
    for problem in error.problems:
        lines.append("  " + json.dumps(problem, default=str, ensure_ascii=False)[:2000])
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
