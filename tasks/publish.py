"""Publish atomically: manifest + data + report into the release store."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version

import pandas as pd
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from medrelease.config import DatasetConfig
from medrelease.mechanisms.base import ReleaseContext
from medrelease.release import MaterializedRelease, ReleasePlan
from medrelease.risk import risk_report
from medrelease.store import ReleaseStore
from schemas.manifest import Manifest
from schemas.output import CheckReport
from tasks.inputs import InputInfo
from tasks.report import release_summary_markdown

DATA_FILES = ["data.parquet", "data.csv", "manifest.json", "report.md", "candidates.csv",
              "checks.json"]


def package_version() -> str:
    try:
        return version("medrelease")
    except PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class PublishResult:
    release_id: str
    path: str
    manifest: dict


def build_manifest(
    release_id: str, config: DatasetConfig, input_info: InputInfo, release_plan: ReleasePlan,
    context: ReleaseContext | None, chosen: MaterializedRelease, spend_id: str,
    flow_run_id: str | None, checks: CheckReport,
) -> dict:
    guarantee = release_plan.guarantee
    steps = [s.as_dict() for s in release_plan.budget_steps]
    manifest = Manifest(
        release_id=release_id,
        dataset=config.name,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        package_version=package_version(),
        flow_run_id=flow_run_id,
        input_file=input_info.path,
        input_sha256=input_info.sha256,
        dataset_config=config.model_dump(mode="json"),
        mechanism=release_plan.mechanism,
        parameters=release_plan.params.model_dump(mode="json"),
        guarantee={**guarantee.as_dict(), "statement": guarantee.statement()},
        budget_steps=steps,
        epsilon_spent=sum(s["epsilon"] for s in steps),
        delta_spent=sum(s["delta"] for s in steps),
        ledger_spend_id=spend_id,
        seed_policy=release_plan.random.seed_policy,
        for_publication=release_plan.random.for_publication,
        chosen_node=(dict(zip(context.counts.dimensions, map(int, chosen.node), strict=True))
                     if context is not None else {}),
        chosen_node_height=int(sum(chosen.node)),
        input_rows=input_info.rows,
        released_rows=len(chosen.table),
        information_loss=({"ncp": chosen.il.ncp, "emd": chosen.il.emd, "rate": chosen.il.rate,
                           "il": chosen.il.il} if chosen.il is not None else {}),
        risk=risk_report(chosen.table, config.dimensions + config.set_valued),
        mechanism_details={k: v for k, v in chosen.details.items() if k in PUBLIC_DETAILS},
        checks_passed=checks.success,
        files=DATA_FILES,
    )
    return manifest.model_dump(mode="json")


# Mechanism summaries that are outputs of the mechanism (no raw values, nothing un-noised).
PUBLIC_DETAILS = ("leaf_partitions", "cut", "set_specializations")


@task(name="publish-release", cache_policy=NO_CACHE)
def publish_release(
    store_root: str, destination: str | None, config: DatasetConfig, input_info: InputInfo,
    release_plan: ReleasePlan, context: ReleaseContext | None, chosen: MaterializedRelease,
    candidates: pd.DataFrame, checks: CheckReport, spend_id: str, flow_run_id: str | None,
) -> PublishResult:
    store = ReleaseStore(store_root)
    release_id = store.new_release_id(release_plan.mechanism)
    manifest = build_manifest(release_id, config, input_info, release_plan, context, chosen,
                              spend_id, flow_run_id, checks)
    published = store.publish(
        dataset=config.name,
        release_id=release_id,
        table=chosen.table,
        manifest=manifest,
        extra_files={
            "report.md": release_summary_markdown(manifest, candidates),
            "candidates.csv": candidates.to_csv(index=False),
            "checks.json": json.dumps({"success": checks.success, "results": checks.results,
                                       "suite": checks.suite}, indent=2, default=str),
        },
        destination=destination,
    )
    get_run_logger().info("published release %s (n=%d) to %s", release_id,
                          len(chosen.table), published.path)
    return PublishResult(release_id, str(published.path), manifest)
