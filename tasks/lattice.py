"""Aggregate once, score lattice nodes in batches, select privately, materialize the choice."""

from __future__ import annotations

import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from medrelease.data.config import DatasetConfig
from medrelease.data.lattice import Node
from medrelease.mechanisms import capabilities
from medrelease.mechanisms.base import NodeSummary, ReleaseContext
from medrelease.plan import MaterializedRelease, ReleasePlan
from medrelease.release import (
    materialize_table,
    release_without_lattice,
    score_node_piece,
    search_piece,
    select_node,
)


@task(name="score-node-batch", cache_policy=NO_CACHE)
def score_node_batch(
    nodes: list[Node], context: ReleaseContext, plan: ReleasePlan
) -> list[NodeSummary]:
    """Perturb and score a batch of lattice nodes; returns small summaries, never tables."""
    return score_node_piece(nodes, context, plan)


@task(name="search-lattice", cache_policy=NO_CACHE)
def search_lattice(context: ReleaseContext, plan: ReleasePlan) -> list[NodeSummary]:
    """Deterministic lattice search with monotonicity pruning (kanon); summaries only."""
    return search_piece(context, plan)


@task(name="select-node", cache_policy=NO_CACHE)
def select_candidate(plan: ReleasePlan, summaries: list[NodeSummary]) -> tuple[int, np.ndarray]:
    return select_node(plan, summaries)


@task(name="materialize-release", cache_policy=NO_CACHE)
def materialize_release(context: ReleaseContext, plan: ReleasePlan, index: int
                        ) -> MaterializedRelease:
    return materialize_table(context, plan, index)


@task(name="release-without-lattice", cache_policy=NO_CACHE)
def release_rows(table: pd.DataFrame, config: DatasetConfig, plan: ReleasePlan,
                 unit_bound: dict | None = None) -> MaterializedRelease:
    """Mondrian, pseudonymization, DiffGen: no lattice search.

    The pseudonymization key is read here and goes nowhere else (no task takes it as a
    parameter). ``unit_bound``: what the privacy unit's bound cut (the input facts' counts;
    steward-side), for the step that publishes a noisy count of it.
    """
    key = load_pseudonym_key(plan.params) if capabilities(plan.mechanism).needs_secret else None
    return release_without_lattice(table, config, plan, key, unit_bound)


def load_pseudonym_key(params) -> bytes | None:
    """The pseudonymization key: Prefect Secret block first, then MEDRELEASE_PSEUDONYM_KEY."""
    import os

    from prefect.blocks.system import Secret

    try:
        value = Secret.load(params.key_source).get()
    except (ValueError, KeyError, RuntimeError, ImportError, OSError) as _missing:
        value = os.environ.get("MEDRELEASE_PSEUDONYM_KEY")
    if not value:
        return None
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)
