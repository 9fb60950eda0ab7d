"""Publish atomically: the public release (data + manifest + report) and the steward record.

Everything the run knows is gathered as one dict of facts; ``medrelease.privacy.publication`` splits it
by its allow-list into the public manifest and the steward record. The steward record is written
first, then the release folder is renamed into its store (the test store for TEST releases);
the record then says where the release went (or why it failed).
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from medrelease.privacy.publication import (  # the run's facts
    PUBLISHED_KEY,
    PublishResult,
    RunFacts,
    declared_tables,
    public_facts,
    render_public_report,
    split_facts,
    steward_facts,
    steward_files,
)
from medrelease.settings import staging_root, steward_root, store_root, test_store_root
from medrelease.storage.manifest_model import PublicManifest, StewardRecord
from medrelease.storage.store import ReleaseStore, StewardRecords


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
    they will be published) and its steward record, status 'awaiting review'. Nothing public.
    Staged releases of the dataset that no run will carry out any more are swept first."""
    swept = sweep_staged(run.config.name)
    if swept:
        get_run_logger().info("removed %d staged release(s) whose review ended without their "
                              "run: %s", len(swept), ", ".join(swept))
    store = ReleaseStore(staging_root(), test=run.release_plan.random.test_release)
    return _write_release(run, store, None, staged=True)


# A staged release still 'awaiting review' this long after its review's deadline belongs to no
# run: the run's own watchdog ends a review at the deadline, and a decision taken before it is
# carried out in seconds; only a run killed outright (SIGKILL, a lost machine) leaves it.
STAGED_GRACE_S = 600


def withdraw_ended(staged: PublishResult, dataset: str, why: str) -> None:
    """A review that ended before its decision was carried out (a crash, a cancellation): the
    staged data removed, and its record, still 'awaiting review', says 'not published' and
    why. A plain function, not a task: it runs while the run is being cancelled."""
    shutil.rmtree(staged.path, ignore_errors=True)
    records = StewardRecords(steward_root())
    try:
        record = records.read(dataset, staged.release_id)
        if record.get("status") == "awaiting review":
            records.update(dataset, staged.release_id, status="not published",
                           review={"decision": "ended", "reason": why, "decided_at": _now()})
    except (OSError, ValueError):  # the record is the steward's to check; the data is gone
        return


def sweep_staged(dataset: str, now: datetime | None = None) -> list[str]:
    """Remove the staged releases of ``dataset`` that no run will publish: their record says
    they are no longer awaiting review (published, failed, not published), or their review's
    deadline passed ``STAGED_GRACE_S`` ago (its run was killed before it could end it; the
    record then says 'not published'). Returns their ids."""
    folder = staging_root() / dataset
    if not folder.is_dir():
        return []
    now = now or datetime.now(UTC)
    records = StewardRecords(steward_root())
    swept = []
    for staged in sorted(folder.iterdir()):
        if staged.name.startswith(".") or not staged.is_dir():
            continue  # a partial folder: the store sweeps its own
        try:
            record = records.read(dataset, staged.name)
        except (OSError, ValueError):
            continue
        status = record.get("status")
        if status == "awaiting review":
            hours = float((record.get("dataset_config") or {}).get("review_timeout_hours", 168))
            asked = datetime.fromisoformat(record.get("requested_at") or now.isoformat())
            if (now - asked).total_seconds() < hours * 3600 + STAGED_GRACE_S:
                continue
            records.update(dataset, staged.name, status="not published", review={
                "decision": "timeout", "decided_at": _now(),
                "reason": "its run ended without carrying out a decision (killed while "
                          "paused?); removed after its review's deadline"})
        elif status == "publishing":
            continue  # being staged right now
        shutil.rmtree(staged, ignore_errors=True)
        swept.append(staged.name)
    return swept


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


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
    records.write(run.config.name, release_id, record, steward_files(run))
    try:
        published = store.publish(
            dataset=run.config.name, release_id=release_id, table=run.chosen.rows,
            manifest=manifest, extra_files={"report.md": render_public_report(manifest)},
            destination=destination, tables=declared_tables(run.chosen, run.release_plan.mechanism),
            released_on=run.requested_at, data_tables=run.chosen.data_tables or None)
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
