"""Output checks as a task: the suite (``schemas/output.py``) built for the release and run."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from medrelease.data.config import DatasetConfig
from medrelease.mechanisms.base import ReleaseContext
from medrelease.plan import CheckReport, MaterializedRelease
from schemas.output import OutputCheckError, checked_output

__all__ = ["OutputCheckError", "check_output"]


@task(name="check-output", cache_policy=NO_CACHE)
def check_output(config: DatasetConfig, context: ReleaseContext | None,
                 chosen: MaterializedRelease, mechanism: str = "") -> CheckReport:
    return checked_output(config, context, chosen, mechanism)
