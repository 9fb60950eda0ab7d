"""Plan the release (parameters, guarantee, budget steps) and charge the ledger."""

from __future__ import annotations

import math

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from medrelease.config import DatasetConfig
from medrelease.ledger import Ledger
from medrelease.mechanisms import check_fits
from medrelease.release import ReleasePlan, numeric_predictors, plan_release


def artifact_key(dataset: str, what: str) -> str:
    """Artifact keys allow lower-case letters, digits and dashes only."""
    return f"{dataset.replace('_', '-')}-{what}"


def lattice_size(config: DatasetConfig) -> int:
    return math.prod(config.taxonomies[c].height + 1 for c in config.dimensions)


@task(name="plan-release", cache_policy=NO_CACHE)
def plan(config: DatasetConfig, mechanism: str, params: dict, n_rows: int,
         seed: int | None, public_domain: bool) -> ReleasePlan:
    """Validate parameters and state the guarantee; draws no noise."""
    check_fits(config, mechanism)
    return plan_release(mechanism, params, n_rows, lattice_size(config), seed, public_domain,
                        numeric_predictors(config))


@task(name="charge-budget", cache_policy=NO_CACHE)
def charge_budget(
    config: DatasetConfig, release_plan: ReleasePlan, ledger_path: str, flow_run_id: str | None
) -> str:
    """Reserve the release's (eps, delta) in the ledger or refuse; log the spend as an artifact."""
    guarantee = release_plan.guarantee
    spend_id = Ledger(ledger_path).reserve(
        dataset=config.name,
        epsilon=float(guarantee.epsilon or 0.0),
        delta=float(guarantee.delta or 0.0),
        mechanism=release_plan.mechanism,
        lifetime_epsilon=config.privacy.lifetime_epsilon,
        lifetime_delta=config.privacy.lifetime_delta,
        flow_run_id=flow_run_id,
    )
    create_table_artifact(
        table=[
            {"step": s.step, "eps": s.epsilon, "delta": s.delta, "mechanism": s.mechanism,
             "description": s.description}
            for s in release_plan.budget_steps
        ],
        key=artifact_key(config.name, "budget-steps"),
        description=(
            f"Privacy budget spent by this release of {config.name} "
            f"(ledger spend {spend_id}; guarantee: {guarantee.statement()})"
        ),
    )
    get_run_logger().info("budget reserved: eps=%g delta=%g (spend %s)", guarantee.epsilon or 0,
                          guarantee.delta or 0, spend_id)
    return spend_id


@task(name="finalize-spend", cache_policy=NO_CACHE)
def finalize_spend(ledger_path: str, spend_id: str, status: str, release_id: str | None = None,
                   note: str | None = None) -> None:
    Ledger(ledger_path).mark(spend_id, status, release_id=release_id, note=note)
