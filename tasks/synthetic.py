"""``aim``'s rounds as tasks: set up, score a batch of candidates, select + measure, sample."""

from __future__ import annotations

import numpy as np
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from medrelease.data.aggregate import CountTable
from medrelease.data.config import DatasetConfig
from medrelease.mechanisms import get_mechanism
from medrelease.plan import MaterializedRelease, ReleasePlan
from medrelease.release import sample_rows as sample_rows_step
from medrelease.stages import finish_round_step, score_round_piece
from medrelease.synthetic.aim_rounds import AIMRounds, RoundPlan, RoundRecord


@task(name="aim-start", cache_policy=NO_CACHE)
def start_rounds(counts: CountTable, config: DatasetConfig, plan: ReleasePlan) -> AIMRounds:
    """Round 0 (leaf 1-way marginals, rare values merged), then the candidates and their true
    marginals from the count table."""
    logger = get_run_logger()
    run = get_mechanism(plan.mechanism).start_rounds(counts, config, plan, logger.info)
    logger.info("aim: %d candidate marginals (attribute sets x taxonomy levels) from the "
                "workload", len(run.candidates))
    return run


@task(name="aim-score-batch", cache_policy=NO_CACHE)
def score_batch(indices: list[int], run: AIMRounds, round_plan: RoundPlan) -> np.ndarray:
    """AIM's quality of a batch of candidates against the current model (never published)."""
    return score_round_piece(indices, run, round_plan)


@task(name="aim-select-measure", cache_policy=NO_CACHE)
def select_and_measure(run: AIMRounds, round_plan: RoundPlan, indices: list[int],
                       scores: np.ndarray) -> RoundRecord:
    """The exponential mechanism picks a candidate; it is measured; the model re-fitted."""
    return finish_round_step(run, round_plan, indices, scores)


@task(name="aim-sample", cache_policy=NO_CACHE)
def sample_rows(run: AIMRounds, counts: CountTable, plan: ReleasePlan) -> MaterializedRelease:
    """Final estimate and the synthetic rows (as many as the noisy total)."""
    return sample_rows_step(run, counts, plan)


@task(name="relational-release", cache_policy=NO_CACHE)
def release_tables(frames: dict, config: DatasetConfig, plan: ReleasePlan) -> MaterializedRelease:
    """A relational release: one model per child table (aim's rounds on its patient-normalised
    table), then synthetic patients and their rows with fresh keys; the log says each model's
    rounds (measured columns and sigmas: DP outputs, never a value)."""
    logger = get_run_logger()
    return get_mechanism(plan.mechanism).release_tables(frames, config, plan, logger.info)
