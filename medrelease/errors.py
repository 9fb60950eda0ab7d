"""Errors a steward can act on: each says what is wrong, where, and what to do.

Every error the engine raises on bad input derives from ``MedreleaseError`` so that the CLI and
the flows can show the message without a traceback, and so that callers can tell "your input or
parameters are wrong" apart from a bug.
"""

from __future__ import annotations


class MedreleaseError(Exception):
    """Base class: the message is meant for the person running the release."""


class ConfigError(MedreleaseError):
    """The dataset config (YAML) is malformed or inconsistent."""


class TaxonomyError(MedreleaseError):
    """A taxonomy file is malformed (missing '*', duplicate leaf, inconsistent parents...)."""


class InputValidationError(MedreleaseError):
    """The input table does not match its dataset config.

    ``problems`` keeps one entry per finding (column, value, row count, first rows) so flows can
    render them as a table as well as in the message.
    """

    def __init__(self, message: str, problems: list[dict] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []


class ParameterError(MedreleaseError):
    """A mechanism parameter is invalid (eps <= 0, shares not adding up, t < 2, ...)."""


class BudgetExceededError(MedreleaseError):
    """A spend would exceed a privacy budget; nothing was drawn."""


def format_rows(rows: list[int], limit: int = 5) -> str:
    """Row numbers as people count them in a file (1 = first data row), first few only."""
    shown = ", ".join(str(r + 1) for r in rows[:limit])
    more = f" and {len(rows) - limit} more" if len(rows) > limit else ""
    return f"{shown}{more}"
