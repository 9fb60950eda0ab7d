"""Publish atomically: the public release (data + manifest + report) and the steward record.

Everything the run knows is gathered as one dict of facts; ``medrelease.privacy.publication`` splits it
by its allow-list into the public manifest and the steward record. The steward record is written
first, then the release folder is renamed into its store (the test store for TEST releases);
the record then says where the release went (or why it failed).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from medrelease.data.config import DatasetConfig
from medrelease.mechanisms import capabilities
from medrelease.mechanisms.base import ReleaseContext
from medrelease.plan import MaterializedRelease, ReleasePlan
from medrelease.privacy.publication import (
    DETAILS,
    BoundaryError,
    public_columns,
    published_file_names,
    released_figures,
    render_public_report,
    split_facts,
)
from medrelease.settings import staging_root, steward_root, store_root, test_store_root
from medrelease.storage.store import CSV_TEXT_SAFETY, ReleaseStore, StewardRecords
from schemas.manifest import PublicManifest, StewardRecord
from schemas.output import CheckReport
from tasks.budget import Charge
from tasks.inputs import InputInfo

# Mechanism summaries that may be published, each with its basis (privacy/publication.py).
PUBLIC_DETAILS = tuple(DETAILS)
# The record attribute (log ``extra``) with the published folder: the CLI says "published"
# from it without parsing the message, before the evidence report is written.
PUBLISHED_KEY = "medrelease_published"


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
    record: dict
    test_release: bool


@dataclass(frozen=True)
class RunFacts:
    """What one release run produced, before it is split at the publication boundary."""

    config: DatasetConfig
    input_info: InputInfo
    release_plan: ReleasePlan
    context: ReleaseContext | None
    chosen: MaterializedRelease
    charge: Charge
    checks: CheckReport
    candidates: pd.DataFrame
    flow_run_id: str | None
    requested_at: datetime | None = None  # when the request was resolved, before any read
    release_id: str | None = None  # drawn at resolution (the run's first log lines name it)


def _selection(candidates: pd.DataFrame, chosen_index: int) -> dict[str, Any]:
    """How the node was chosen (computed from the input: steward only)."""
    if candidates.empty or "selection_probability" not in candidates:
        return {"candidates": 0}
    probs = candidates.set_index("index")["selection_probability"]
    best = candidates.sort_values(["il", "index"]).iloc[0]
    scored = {}
    if "score" in candidates and candidates["score"].notna().any():  # ipa: the score U
        top = candidates.loc[candidates["score"].idxmax()]
        scored = {"top_score_node_index": int(top["index"]),
                  "top_score_probability": float(top["selection_probability"])}
    return {**scored, "candidates": len(candidates), "chosen_index": chosen_index,
            "chosen_probability": float(probs.get(chosen_index, float("nan"))),
            "best_il_node_index": int(best["index"]),
            "best_il_node_probability": float(probs[int(best["index"])]),
            "uniform_probability": 1.0 / len(candidates),
            "il_min": float(candidates["il"].min()), "il_max": float(candidates["il"].max())}


def _declared_rows_check(config: DatasetConfig, rows: int) -> str | None:
    bound = config.privacy.max_rows
    if bound is None:
        return None
    where = "within" if rows <= bound else "ABOVE"
    return f"the input has {rows:,} rows, {where} the declared bound privacy.max_rows={bound:,}"


def public_facts(run: RunFacts, release_id: str) -> dict[str, Any]:
    """What the published manifest carries: public parameters, identities, the mechanism's
    outputs and figures of the released rows (``PUBLISHED`` says each field's basis)."""
    plan, chosen, config = run.release_plan, run.chosen, run.config
    guarantee = plan.guarantee
    steps = [s.as_dict() for s in plan.budget_steps]
    columns = chosen.rows.columns
    dims = [c for c in config.dimensions + config.set_valued if c in columns]
    node = (dict(zip(run.context.counts.dimensions, map(int, chosen.node), strict=True))
            if run.context is not None else {})
    return {
        "release_id": release_id,
        # the day only: a time of day would tell how long the run took (it grows with n)
        "created_at": (run.requested_at or datetime.now(UTC)).date().isoformat(),
        "test_release": plan.random.test_release,
        "dataset": config.name, "source": config.source_id,
        "package_version": package_version(),
        "mechanism": plan.mechanism, "parameters": plan.params.model_dump(mode="json"),
        "guarantee": {**guarantee.as_dict(), "statement": guarantee.statement()},
        "budget_steps": steps,
        "epsilon_spent": sum(s["epsilon"] for s in steps),
        "delta_spent": sum(s["delta"] for s in steps),
        "lifetime": run.charge.public_lifetime(),
        "seed_policy": plan.random.seed_policy,
        "randomness": plan.random.randomness,
        "columns": public_columns(config, columns),
        "checks": {"passed": run.checks.success, "checks": run.checks.public},
        "files": published_file_names(plan.random.test_release, tuple(chosen.tables)),
        "text_safety": {"csv": CSV_TEXT_SAFETY, "parquet": "raw values"},
        "chosen_node": node, "chosen_node_height": int(sum(chosen.node)),
        "mechanism_details": {k: v for k, v in chosen.details.items() if k in PUBLIC_DETAILS},
        "error_bars": chosen.error_bars or no_error_bars(plan.mechanism),
        **released_figures(chosen.rows, dims),
    }


def declared_tables(chosen: MaterializedRelease, mechanism: str) -> dict[str, pd.DataFrame]:
    """The tables the mechanism declares it publishes, exactly those (a missing or an extra
    one stops the release before anything is written)."""
    declared = set(capabilities(mechanism).published_tables)
    if set(chosen.tables) != declared:
        raise BoundaryError(f"{mechanism} declares published tables {sorted(declared)} but its "
                            f"release made {sorted(chosen.tables)}")
    return dict(chosen.tables)


def no_error_bars(mechanism: str) -> dict[str, Any]:
    """What a release without intervals says instead (a mechanism that adds no noise, or one
    whose intervals are not derived here)."""
    caps = capabilities(mechanism)
    statement = ("no noise is added: released counts are the input's for the rows released; "
                 "rows suppressed or withheld are missing from them (see the checks)"
                 if not caps.draws_declared_steps and caps.kind != "synthetic" else
                 "no error bars are derived for this mechanism")
    return {"level": None, "statement": statement}


def steward_facts(run: RunFacts) -> dict[str, Any]:
    """What only the steward record carries: everything computed from the raw input, and the
    run's internal identities."""
    plan, chosen, config = run.release_plan, run.chosen, run.config
    guarantee, il = plan.guarantee, chosen.il
    return {
        "flow_run_id": run.flow_run_id, "ledger_spend_id": run.charge.spend_id,
        "requested_at": (run.requested_at or datetime.now(UTC)).isoformat(timespec="seconds"),
        "published_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "ledger_charge": {"source": config.source_id, "mechanism": plan.mechanism,
                          "epsilon": float(guarantee.epsilon or 0.0),
                          "delta": float(guarantee.delta or 0.0), "dp": guarantee.proven,
                          "cap_epsilon": run.charge.lifetime.lifetime_epsilon,
                          "cap_delta": run.charge.lifetime.lifetime_delta,
                          "privacy_unit": guarantee.neighbouring,
                          # the journaled request: claims, input, policy, owner (to restore)
                          "request": run.charge.request},
        "input_file": run.input_info.path, "input_sha256": run.input_info.sha256,
        "input_rows_sha256": run.input_info.rows_sha256,
        "input_rows": run.input_info.rows, "dropped_rows": run.input_info.dropped_rows,
        "unit_bound": run.input_info.unit_bound,
        "dataset_config": config.model_dump(mode="json"),
        "information_loss": ({"ncp": il.ncp, "emd": il.emd, "rate": il.rate, "il": il.il}
                             if il is not None else {}),
        "selection": _selection(run.candidates, chosen.index),
        "output_checks": {"success": run.checks.success, "results": run.checks.results},
        "lifetime_cap_note": run.charge.lifetime.cap_note,
        "declared_rows_check": _declared_rows_check(config, run.input_info.rows),
    }


def _steward_files(run: RunFacts) -> dict[str, str]:
    return {"candidates.csv": run.candidates.to_csv(index=False),
            "checks.json": json.dumps({"success": run.checks.success,
                                       "results": run.checks.results,
                                       "suite": run.checks.suite}, indent=2, default=str)}


@task(name="publish-release", cache_policy=NO_CACHE)
def publish_release(run: RunFacts, destination: str | None) -> PublishResult:
    """Split the facts at the boundary, write the steward record, then publish atomically."""
    test = run.release_plan.random.test_release
    store = ReleaseStore(test_store_root() if test else store_root(), test=test)
    return _write_release(run, store, destination, staged=False)


@task(name="stage-release", cache_policy=NO_CACHE)
def stage_release(run: RunFacts) -> PublishResult:
    """``review: required``: the release, complete, into the steward side's staging area
    (``<steward>/.staging/<dataset>/<release_id>/``: data files, manifest.json, report.md, as
    they will be published) and its steward record, status 'awaiting review'. Nothing public."""
    store = ReleaseStore(staging_root(), test=run.release_plan.random.test_release)
    return _write_release(run, store, None, staged=True)


@task(name="publish-reviewed-release", cache_policy=NO_CACHE)
def publish_staged(staged: PublishResult, dataset: str, destination: str | None,
                   review: dict[str, Any]) -> PublishResult:
    """An approved release: its staged folder published atomically into its store, and the
    decision on its steward record."""
    test = staged.test_release
    store = ReleaseStore(test_store_root() if test else store_root(), test=test)
    records = StewardRecords(steward_root())
    try:
        published = store.publish_folder(dataset, staged.release_id, Path(staged.path),
                                          destination, _day_of(staged.manifest))
    except BaseException as exc:
        records.update(dataset, staged.release_id, status="failed", review=review,
                       error=f"{type(exc).__name__}: {exc}"[:500])
        raise
    record = records.update(dataset, staged.release_id, status="published", review=review,
                            published_path=str(published.path),
                            published_at=datetime.now(UTC).isoformat(timespec="seconds"))
    get_run_logger().info("published %srelease %s (approved at review) to %s",
                          "TEST " if test else "", staged.release_id, published.path,
                          extra={PUBLISHED_KEY: str(published.path)})
    return PublishResult(staged.release_id, str(published.path), staged.manifest, record, test)


@task(name="withdraw-staged-release", cache_policy=NO_CACHE)
def withdraw_staged(staged: PublishResult, dataset: str, review: dict[str, Any]) -> dict:
    """A rejected (or never reviewed) release: its staged data removed, so that nothing of it
    can be published later by mistake; the steward record keeps the decision and the evidence."""
    shutil.rmtree(staged.path, ignore_errors=True)
    return StewardRecords(steward_root()).update(dataset, staged.release_id,
                                                 status="not published", review=review)


def _day_of(manifest: dict) -> datetime:
    return datetime.fromisoformat(manifest["created_at"]).replace(tzinfo=UTC)


def _write_release(run: RunFacts, store: ReleaseStore, destination: str | None,
                   staged: bool) -> PublishResult:
    test = run.release_plan.random.test_release
    release_id = run.release_id or store.new_release_id(run.release_plan.mechanism,
                                                         run.requested_at)
    # split_facts is the gate: a field on the wrong side, or on neither, stops the release.
    public, private = split_facts({**public_facts(run, release_id), **steward_facts(run)})
    manifest = PublicManifest(**public).model_dump(mode="json")
    record = StewardRecord(release_id=release_id, dataset=run.config.name, test_release=test,
                           status="publishing", **private).model_dump(mode="json")
    records = StewardRecords(steward_root())
    records.write(run.config.name, release_id, record, _steward_files(run))
    try:
        published = store.publish(
            dataset=run.config.name, release_id=release_id, table=run.chosen.rows,
            manifest=manifest, extra_files={"report.md": render_public_report(manifest)},
            destination=destination, tables=declared_tables(run.chosen, run.release_plan.mechanism),
            released_on=run.requested_at)
    except BaseException as exc:
        records.update(run.config.name, release_id, status="failed",
                       error=f"{type(exc).__name__}: {exc}"[:500])
        raise
    if staged:
        record = records.update(run.config.name, release_id, status="awaiting review",
                                staged_path=str(published.path))
        get_run_logger().info("staged %srelease %s (n=%d) for review in %s",
                              "TEST " if test else "", release_id, len(run.chosen.rows),
                              published.path)
        return PublishResult(release_id, str(published.path), manifest, record, test)
    record = records.update(run.config.name, release_id, status="published",
                            published_path=str(published.path))
    get_run_logger().info("published %srelease %s (n=%d) to %s", "TEST " if test else "",
                          release_id, len(run.chosen.rows), published.path,
                          extra={PUBLISHED_KEY: str(published.path)})
    return PublishResult(release_id, str(published.path), manifest, record, test)
