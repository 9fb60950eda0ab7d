"""The engine's loops, run through one seam: an executor of pieces.

A release's two loops that fan work out — scoring the lattice's candidate nodes, and ``aim``'s
rounds (score a round's candidates, select and measure one, re-fit) — are each written once:
``run_rounds`` here, ``medrelease.release.score_lattice`` beside the scoring it drives (with the
packing here). What runs their pieces is the caller's: ``InProcess`` (the driver
``medrelease.release``, the tests, the benchmarks and the audits) runs them in this process,
on threads when given workers; the flow passes an executor that runs each piece as a Prefect
task on its task runner (``tasks/executor.py``). An executor only runs pieces: the loop's
order, what is measured and what is drawn are the engine's, so a release for a seed does not
depend on who ran it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from medrelease.data.lattice import Node

# A progress report: (done, total, a short note for the bar, or None).
Progress = Callable[[int, int, str | None], None]


class Executor(Protocol):
    """Runs the pieces of a loop. ``map`` gives ``fn(piece, **shared)`` for each piece, in the
    pieces' order; ``call`` one step, ``fn(**arguments)``, where the loop needs its result
    before it goes on."""

    workers: int

    def map(self, fn: Callable[..., Any], pieces: Sequence[Any], **shared: Any) -> Iterator[Any]:
        ...

    def call(self, fn: Callable[..., Any], **arguments: Any) -> Any:
        ...


class Hooks:
    """What a caller sees of a release's long stages (``medrelease.release.choose``). Here
    every hook does nothing (tests, benchmarks, audits); the driver's progress bar
    (``ProgressHooks``) and the flow's progress, artifacts and log (``flows/stage_hooks.py``)
    fill what they show. Only public facts reach a hook: counts of nodes and rounds, the
    rounds' measurements (DP outputs), never a score or a value of the data."""

    def step(self, label: str, note: str = "") -> AbstractContextManager[None]:
        """A step whose length is unknown (a spinner while it runs)."""
        return nullcontext()

    def log(self, message: str) -> None:
        """A line for the run's log."""

    def scoring(self, nodes: int) -> Progress | None:
        """The scoring loop's progress over a lattice of ``nodes`` nodes, if shown."""
        return None

    def scored(self, summaries: Sequence[Any], minimum_loss: bool) -> None:
        """Every candidate scored (``minimum_loss``: the deterministic search)."""

    def materializing(self, nodes: int) -> None:
        """The chosen node is being drawn."""

    def rounds_started(self, run: Any) -> None:
        """A synthetic release's round 0 is measured."""

    def round_done(self, run: Any, record: Any) -> None:
        """A round was selected and measured, the model re-fitted."""

    def rounds_finished(self, run: Any, chosen: Any) -> None:
        """The rows are sampled."""


@dataclass
class ProgressHooks(Hooks):
    """The driver's: the scoring's (done, total) to a ``progress`` callback."""

    progress: Callable[[int, int], None] | None = None

    def scoring(self, nodes: int) -> Progress | None:
        report = self.progress
        if report is None:
            return None
        return lambda done, total, _note: report(done, total) if total else None


def workers_from_env(default: int = 2) -> int:
    """``MEDRELEASE_WORKERS``: how many pieces run at once (the one place it is read). A value
    that is not a whole number of at least 1 is refused, as Prefect's runner refused it."""
    text = os.environ.get("MEDRELEASE_WORKERS", str(default))
    try:
        workers = int(text)
    except ValueError:
        workers = 0
    if workers < 1:
        raise ValueError(f"MEDRELEASE_WORKERS must be a whole number of at least 1, got {text!r}")
    return workers


@dataclass
class InProcess:
    """The built-in executor: pieces in this process, on a thread pool when ``workers`` > 1."""

    workers: int = 1

    def map(self, fn: Callable[..., Any], pieces: Sequence[Any], **shared: Any) -> Iterator[Any]:
        if self.workers > 1 and len(pieces) > 1:
            with ThreadPoolExecutor(max_workers=self.workers) as pool:
                yield from pool.map(lambda piece: fn(piece, **shared), pieces)
            return
        for piece in pieces:
            yield fn(piece, **shared)

    def call(self, fn: Callable[..., Any], **arguments: Any) -> Any:
        return fn(**arguments)


# -- the lattice's pieces (the loop is ``medrelease.release.score_lattice``) ---------------------

SCORING_TASK_SECONDS = 2.0  # a piece's length once the first wave measured the rate
PROBE_NODES = 256           # nodes a first-wave piece scores (at least: whole batches)


def after(batches: list[list[Node]], nodes: int) -> list[list[Node]]:
    """The batches after the leading ones that hold ``nodes`` nodes (what ``packed`` made
    the first pieces of: whole batches, in order)."""
    count = 0
    for k, batch in enumerate(batches):
        if count >= nodes:
            return batches[k:]
        count += len(batch)
    return []


def packed(batches: list[list[Node]], nodes: int) -> list[list[Node]]:
    """Consecutive batches joined into pieces of at least ``nodes`` nodes (each keeps its
    pieces of the roll-up tree: the same roll-ups, fewer pieces)."""
    out: list[list[Node]] = []
    for batch in batches:
        if out and len(out[-1]) < nodes:
            out[-1] = [*out[-1], *batch]
        else:
            out.append(list(batch))
    return out


# -- aim: the rounds ---------------------------------------------------------------------------

# A round whose scoring took less than this scores the next round as one piece: a task costs
# ~12 ms of Prefect's bookkeeping and the thread runner's batches share one interpreter lock,
# so four batches of a 20-50 ms scoring (1,361,000 NPS-like rows) only add tasks
# (docs/results/aim.md). A dearer round (a large model, a Dask runner) fans out again.
FAN_OUT_SCORING_SECONDS = 0.5


def score_round_piece(indices: list[int], run: Any, round_plan: Any) -> np.ndarray:
    """One piece of a round's scoring: AIM's quality of a batch of candidates."""
    return run.score(round_plan, indices)


def finish_round_step(run: Any, round_plan: Any, indices: list[int], scores: np.ndarray) -> Any:
    """Select by the exponential mechanism, measure, re-fit (``AIMRounds.finish_round``)."""
    return run.finish_round(round_plan, indices, scores)


def run_rounds(run: Any, pieces: Executor, on_round: Callable[[Any], None] | None = None) -> None:
    """``aim``'s rounds after round 0 until its budget is spent: each round's candidates
    scored in batches (one batch once the last round's scoring took under
    ``FAN_OUT_SCORING_SECONDS``), one selected and measured, the model re-fitted. The
    selection takes the candidates in the plan's order (``finish_round``), so the release for a
    seed does not depend on the batches."""
    last_scoring: float | None = None
    while not run.state.done:
        round_plan = run.plan_round()
        fan_out = last_scoring is None or last_scoring >= FAN_OUT_SCORING_SECONDS
        batches = run.batches(round_plan, 2 * pieces.workers if fan_out else 1)
        started = time.perf_counter()
        scores = np.concatenate(list(pieces.map(score_round_piece, batches, run=run,
                                                round_plan=round_plan)))
        last_scoring = time.perf_counter() - started
        indices = [i for batch in batches for i in batch]
        record = pieces.call(finish_round_step, run=run, round_plan=round_plan,
                             indices=indices, scores=scores)
        if on_round:
            on_round(record)
