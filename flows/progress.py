"""How far a run's long steps are, as structured log records for the CLI's progress bar.

A flow reports ``StepProgress`` on the ``medrelease.progress`` logger; the CLI's handler reads
the record's ``medrelease_progress`` attribute (its ``extra``) instead of parsing log text. The
logger is outside Prefect's: nothing here reaches the run's log or its page, where the
progress artifacts and the log lines stay as they are. Without a handler (a served run) the
records go nowhere. Only public facts go in: counts of nodes or rounds, the share of the
budget spent; never a score or a value of the data.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

PROGRESS_LOGGER = "medrelease.progress"
PROGRESS_KEY = "medrelease_progress"  # the record attribute that holds the StepProgress

_logger = logging.getLogger(PROGRESS_LOGGER)
_logger.setLevel(logging.INFO)
_logger.propagate = False  # never to the root logger's (Prefect's) console handler
_logger.addHandler(logging.NullHandler())


@dataclass(frozen=True)
class StepProgress:
    """One long step's state: ``step`` names it for a person ("aim round 3 of about 12"),
    ``completed`` of ``total`` fills the bar (``total`` None: size unknown, a spinner), and
    ``detail`` is shown beside it ("rho used 25%", "1,200/7,776 nodes")."""

    step: str
    completed: float
    total: float | None
    detail: str = ""

    @property
    def finished(self) -> bool:
        return self.total is not None and self.completed >= self.total


def report_progress(step: str, completed: float, total: float | None, detail: str = "") -> None:
    """Tell whoever listens (the CLI) how far ``step`` is."""
    progress = StepProgress(step, completed, total, detail)
    _logger.info("%s: %s", step, detail or f"{completed:g} of {total}",
                 extra={PROGRESS_KEY: progress})
