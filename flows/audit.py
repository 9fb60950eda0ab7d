"""The audit flow: an empirical lower bound on a mechanism's epsilon, runs fanned out as tasks.

Each task runs the mechanism on one neighbouring table for a batch of seeds and returns only the
per-run statistics; the bound is computed once all batches are in (see ``medrelease.audit``).
"""

from __future__ import annotations

import os
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE
from prefect.futures import as_completed
from prefect.task_runners import ThreadPoolTaskRunner

from medrelease.audit import DESIGNS, bound_from_statistics, default_design, run_batch, seeds_for


@task(name="audit-batch", cache_policy=NO_CACHE)
def audit_batch(mechanism: str, epsilon: float, design: str, table: str,
                seeds: list[int | None]) -> tuple[str, int, list[float]]:
    return table, len(seeds), run_batch(mechanism, epsilon, design, table, seeds)


@flow(name="medrelease-audit", description="Empirical privacy audit of one mechanism",
      task_runner=ThreadPoolTaskRunner(max_workers=int(os.environ.get("MEDRELEASE_WORKERS", "2"))),
      validate_parameters=True)
def audit_flow(mechanism: str = "ipa-paper", epsilon: float = 1.0, runs: int = 200,
               design: str | None = None, batch_size: int = 20, seed: int | None = None,
               confidence: float = 0.95) -> dict[str, Any]:
    """Run ``runs`` releases on each neighbour (batches fanned out) and bound epsilon."""
    logger = get_run_logger()
    design = design or default_design(mechanism)
    if design not in DESIGNS:
        raise ValueError(f"unknown audit design {design!r}; choose one of {', '.join(DESIGNS)}")
    seeds = dict(zip(("without", "with"), seeds_for(runs, seed), strict=True))
    futures = [audit_batch.submit(mechanism, epsilon, design, table,
                                  seeds[table][start:start + batch_size])
               for table in ("without", "with") for start in range(0, runs, batch_size)]
    progress = create_progress_artifact(0.0, description=f"audit runs of {mechanism}")
    by_start: dict[str, dict[int, list[float]]] = {"without": {}, "with": {}}
    index = {id(f): i for i, f in enumerate(futures)}
    done = 0
    for future in as_completed(futures):
        table, n, values = future.result()
        by_start[table][index[id(future)]] = values
        done += n
        update_progress_artifact(progress, progress=100.0 * done / (2 * runs))
        logger.info("audited %d of %d runs", done, 2 * runs)
    stats = {t: [v for i in sorted(parts) for v in parts[i]] for t, parts in by_start.items()}
    result = bound_from_statistics(mechanism, epsilon, design, stats["without"], stats["with"],
                                  confidence)
    verdict = "EXCEEDS ITS CLAIM" if result.exceeds_claim else "within its claim"
    create_markdown_artifact(
        f"# Audit of `{mechanism}` at claimed eps = {epsilon:g}\n\n"
        f"- design: {design}, {runs} runs per neighbouring table\n"
        f"- event: {result.event}\n"
        f"- second half: {result.hits_with} hits with the target, {result.hits_without} without\n"
        f"- **eps lower bound ({confidence:.0%}): {result.epsilon_lower_bound:.2f}** -> {verdict}\n",
        key=f"audit-{mechanism}", description="Empirical privacy audit")
    return {**result.__dict__, "exceeds_claim": result.exceeds_claim}
