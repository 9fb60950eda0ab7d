"""What a release's long stages show in Prefect: the engine's ``Hooks`` filled with the run's
progress bar (``flows/progress.py``), its progress artifacts and its log.

The engine's driver (``medrelease.release.choose``) calls these at the same points for every
caller; here is only what the flow shows. Public facts only: counts of nodes and rounds, the
share of the budget spent, the rounds' measurements (DP outputs), never a score.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from prefect import get_run_logger
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from flows.progress import report_progress, ticking
from medrelease.stages import Hooks, Progress
from tasks.artifacts import table_artifact
from tasks.budget import artifact_key


class FlowHooks(Hooks):
    """The flow's view of the stages of one release of ``dataset`` on ``runner``."""

    def __init__(self, dataset: str, runner: str) -> None:
        self.dataset = dataset
        self.runner = runner
        self.logger = get_run_logger()
        self.progress_id: Any = None

    def step(self, label: str, note: str = "") -> AbstractContextManager[None]:
        return ticking(label, note)

    def log(self, message: str) -> None:
        self.logger.info(message)

    def scoring(self, nodes: int) -> Progress:
        """The bar, and a progress artifact of the nodes scored."""
        self.progress_id = create_progress_artifact(
            progress=0.0, key=artifact_key(self.dataset, "scoring-progress"),
            description=f"Lattice nodes scored ({nodes:,} nodes)")

        def progress(done: int, total: int, note: str | None) -> None:
            if total == 0:  # the deterministic search (kanon): one step in the flow
                report_progress("searching the lattice", 0, None, note)
                return
            if done == 0:
                self.logger.info("scoring on the %s task runner", self.runner)
            elif note is None:
                update_progress_artifact(self.progress_id, progress=100.0 * done / total)
            report_progress("scoring lattice nodes", done, total,
                            f"{done:,}/{total:,} nodes" + (f"; {note}" if note else ""),
                            headline=note is not None)

        return progress

    def scored(self, summaries: Sequence[Any], minimum_loss: bool) -> None:
        if minimum_loss:
            update_progress_artifact(self.progress_id, progress=100.0)
        else:
            self.logger.info("scored all %d candidate lattice nodes", len(summaries))

    def materializing(self, nodes: int) -> None:
        report_progress("materializing the chosen node", 0, None, f"of a {nodes:,}-node lattice")

    def rounds_started(self, run: Any) -> None:
        self.progress_id = create_progress_artifact(
            progress=0.0, key=artifact_key(self.dataset, "aim-budget-used"),
            description="aim: share of the release's rho spent by the rounds so far")
        self._report_rounds(run, 0)

    def round_done(self, run: Any, record: Any) -> None:
        update_progress_artifact(self.progress_id,
                                 progress=min(100.0, 100.0 * record.rho_used / run.settings.rho))
        self._report_rounds(run, record.round)

    def rounds_finished(self, run: Any, chosen: Any) -> None:
        """Every round as a table (public: columns, levels, sigma, selection epsilon, rho)."""
        rows = [{"round": r.round, "marginal": " x ".join(r.columns),
                 "levels": ", ".join(str(x) for x in r.levels), "cells": r.cells,
                 "sigma": round(r.sigma, 2), "selection eps": round(r.selection_epsilon, 4),
                 "rho used": f"{r.rho_used / run.settings.rho:.0%}",
                 "annealed": "yes" if r.annealed else ""} for r in run.state.records]
        table_artifact(key=artifact_key(self.dataset, "aim-rounds"), table=rows,
                       description="aim: the marginals measured, round by round (DP outputs)")
        sampled = len(chosen.rows)  # a DP output: the noisy total (capped), never the input's
        self.logger.info("aim: %d rounds, %s synthetic rows sampled from the model",
                         len(run.state.records), f"{sampled:,}")

    @staticmethod
    def _report_rounds(run: Any, done: int) -> None:
        """Round ``done`` of about the rounds the run's budget left buys at its current cost
        (``AIMRounds.rounds_estimate``: it falls as rounds anneal, where the nominal number
        stayed; issue 55: "of about 44" ended at 16); the share of rho spent is the progress,
        and its time left is measured from it."""
        share = min(1.0, run.state.rho_used / run.settings.rho)
        report_progress(f"aim round {done} of about {run.rounds_estimate()}", share, 1.0,
                        f"rho used {share:.0%}")
