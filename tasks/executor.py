"""The flow's executor for the engine's loops (``medrelease.stages``): each piece a Prefect task
on the flow's task runner, each step a task called in the flow.

The engine names the piece or step (``score_node_piece``, ``select_node``, ``start_rounds`` …);
the table below names the task that runs it, whose parameters are the engine function's.
Shared arguments go to the tasks quoted on the thread runner (Prefect would walk a count
table or a model per task otherwise); Dask packs parameters itself and turns a quote into a
plain tuple, so there they go as they are.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prefect import unmapped
from prefect.utilities.annotations import quote

from medrelease.release import (
    materialize_table,
    release_tables,
    release_without_lattice,
    sample_rows,
    score_node_piece,
    search_piece,
    select_node,
    start_rounds,
)
from medrelease.stages import finish_round_step, score_round_piece, workers_from_env
from tasks import lattice, synthetic

TASK_OF: dict[Callable[..., Any], Any] = {
    score_node_piece: lattice.score_node_batch,
    search_piece: lattice.search_lattice,
    select_node: lattice.select_candidate,
    materialize_table: lattice.materialize_release,
    release_without_lattice: lattice.release_rows,
    score_round_piece: synthetic.score_batch,
    finish_round_step: synthetic.select_and_measure,
    start_rounds: synthetic.start_rounds,
    sample_rows: synthetic.sample_rows,
    release_tables: synthetic.release_tables,
}


class PrefectPieces:
    """``medrelease.stages.Executor`` on a Prefect task runner (``runner``: the flow's, or the
    Dask one a request asked for)."""

    def __init__(self, runner: Any, quoted: bool = True) -> None:
        self.runner = runner
        self.quoted = quoted
        self.workers = workers_from_env()

    def _shared(self, value: Any) -> Any:
        return quote(value) if self.quoted else value

    def map(self, fn: Callable[..., Any], pieces: Sequence[Any], **shared: Any) -> Iterator[Any]:
        task = TASK_OF[fn]
        piece = next(iter(inspect.signature(task.fn).parameters))  # the piece's own name
        futures = self.runner.map(task, {piece: list(pieces), **{
            name: unmapped(self._shared(value)) for name, value in shared.items()}})
        for future in futures:
            yield future.result()

    def call(self, fn: Callable[..., Any], **arguments: Any) -> Any:
        """A step as a task called in the flow (never on the runner): its arguments are always
        quoted, on Dask too (Prefect would walk a count table or a model)."""
        return TASK_OF[fn](**{name: quote(value) for name, value in arguments.items()})
