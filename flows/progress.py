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
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
    elapsed: float = 0.0              # seconds since the step's family first reported
    remaining: float | None = None    # an estimate of the seconds left, once there is one
    headline: bool = False            # said up front (how long, and why): always printed

    @property
    def finished(self) -> bool:
        return self.total is not None and self.completed >= self.total

    @property
    def detail_with_estimate(self) -> str:
        """``detail`` and, once known, "about 40 s left" (the progress bar shows it)."""
        if self.remaining is None or self.finished:
            return self.detail
        left = (f"about {self.remaining:.0f} s left" if self.remaining < 120
                else f"about {self.remaining / 60:.0f} min left")
        return f"{self.detail}, {left}" if self.detail else left


FAMILY = re.compile(r"\d+")
MIN_SHARE_FOR_ESTIMATE = 0.1  # below this share done, an extrapolation says nothing
MIN_REPORTS_FOR_ESTIMATE = 3  # aim: round 0 and two more rounds


@dataclass
class _Clock:
    started: float
    reports: int = 0
    last: float = 0.0


_clocks: dict[str, _Clock] = {}


def _estimate(step: str, completed: float, total: float | None) -> tuple[float, float | None]:
    """Seconds since this step's family ("aim round 3 of about 12" and "aim round 4 of about
    12" are one family: the step with its numbers blanked) first reported, and the time left
    by extrapolating its share done so far, once it is at least 10 % and 3 reports along."""
    family = FAMILY.sub("#", step)
    now = time.perf_counter()
    clock = _clocks.get(family)
    if clock is None or completed <= 0 or completed < clock.last:  # a new run of the step
        clock = _clocks[family] = _Clock(now)
    clock.reports += 1
    clock.last = completed
    elapsed = now - clock.started
    if (total is None or total <= 0 or clock.reports < MIN_REPORTS_FOR_ESTIMATE
            or completed / total < MIN_SHARE_FOR_ESTIMATE or completed >= total):
        return elapsed, None
    return elapsed, elapsed * (total - completed) / completed


def report_progress(step: str, completed: float, total: float | None, detail: str = "",
                    headline: bool = False) -> None:
    """Tell whoever listens (the CLI) how far ``step`` is; ``headline``: what a steward must
    read even between the lines a long step prints every few seconds (how long it will take,
    and why)."""
    elapsed, remaining = _estimate(step, completed, total)
    progress = StepProgress(step, completed, total, detail, elapsed, remaining, headline)
    _logger.info("%s: %s", step, detail or f"{completed:g} of {total}",
                 extra={PROGRESS_KEY: progress})


TICK_SECONDS = 5.0  # a long step says it is still going at least this often (issue 55)


@contextmanager
def ticking(step: str, detail: str = "",
            estimate: Callable[[float], float | None] | None = None) -> Iterator[None]:
    """Report ``step`` now and every ``TICK_SECONDS`` until the block ends, with the time it
    has taken (and, from ``estimate(elapsed)``, the time left when one is known): a step
    with no count to show (one pass over a file, a model's fit) is never silent for
    minutes. Reports from a thread of its own; public facts only."""
    started = time.perf_counter()
    done = threading.Event()

    def tell() -> None:
        elapsed = time.perf_counter() - started
        left = estimate(elapsed) if estimate is not None else None
        what = f"{detail}, " if detail else ""
        more = f", about {left:.0f} s left" if left is not None else ""
        report_progress(step, 0, None, f"{what}{elapsed:.0f} s so far{more}")

    def loop() -> None:
        while not done.wait(TICK_SECONDS):
            tell()

    report_progress(step, 0, None, detail)
    ticker = threading.Thread(target=loop, name="medrelease-progress", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join(timeout=1)
