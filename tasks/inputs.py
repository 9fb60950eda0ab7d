"""Load the dataset config and the extract, and validate it before any budget is touched.

The reading is the engine's (``medrelease/data/reading.py``); these tasks add the run's log
lines and the steward's artifact of rows read, dropped and kept. Validation failures reach
Prefect (logs, state message, events) with counts and file lines only; the values themselves
go to a steward-only log file whose path the message names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from prefect import get_run_logger, task, unmapped
from prefect.cache_policies import NO_CACHE
from prefect.utilities.annotations import quote

from medrelease.data.aggregate import CountTable
from medrelease.data.config import DatasetConfig, find_config
from medrelease.data.extract import ExtractFile, InputInfo, ResolvedExtract
from medrelease.data.reading import (
    PartitionCounts,
    count_partition,
    counted_partitions,
    merged_partitions,
    named_as_the_extract,
    read_validated,
)
from medrelease.data.units import UnitBound
from medrelease.plan import ReleasePlan
from medrelease.relational.reading import read_tables
from medrelease.release import Inputs
from medrelease.settings import steward_root
from medrelease.storage.store import StewardRecords
from tasks.artifacts import table_artifact
from tasks.budget import artifact_key


@task(name="load-dataset-config", cache_policy=NO_CACHE)
def load_dataset_config(dataset: str) -> DatasetConfig:
    return find_config(dataset)


@task(name="check-for-new-data", cache_policy=NO_CACHE)
def released_before(config: DatasetConfig, extract: ResolvedExtract) -> str | None:
    """The release that already published this exact extract (by content hash), if any."""
    return StewardRecords(steward_root()).released_input(config.name, extract.digest)


def _report_rows(config: DatasetConfig, info: InputInfo) -> None:
    """A steward artifact: rows read, dropped by missing: drop_rows, kept (counts only)."""
    bound = info.unit_bound or {}
    cut = bound.get("rows before the bound", 0) - bound.get("rows after the bound", 0)
    table_artifact(
        table=[{"rows read": info.rows + info.dropped_rows + cut,
                "cut by the unit bound": cut if info.unit_bound else "no unit declared",
                "units over the bound": bound.get("units over the bound", ""),
                "dropped (missing values)": info.dropped_rows, "kept": info.rows,
                "policy": config.missing}],
        key=artifact_key(config.name, "input-rows"),
        description=f"Rows of the extract of {config.name} (steward only)")
    if info.dropped_rows:
        get_run_logger().warning("missing: drop_rows dropped %d of %d rows (limit %.1f%%)",
                                 info.dropped_rows, info.rows + info.dropped_rows,
                                 100 * config.drop_limit)


@task(name="validate-input", cache_policy=NO_CACHE)
def load_and_validate_input(
    config: DatasetConfig, extract: ResolvedExtract, unit: UnitBound | None = None
) -> tuple[pd.DataFrame, InputInfo]:
    """The extract read, validated and bounded per unit (``read_validated``)."""
    frame, info = read_validated(config, extract, unit)
    get_run_logger().info("input %s validated: n=%d", Path(info.path).name, info.rows)
    _report_rows(config, info)
    return frame, info


@task(name="validate-tables", cache_policy=NO_CACHE)
def load_and_validate_tables(config: DatasetConfig, extract: ResolvedExtract
                             ) -> tuple[dict[str, pd.DataFrame], InputInfo]:
    """A relational extract: every table read and checked, references included
    (``read_tables``: one sentence per problem, counts only)."""
    with named_as_the_extract(extract.files):
        frames, info = read_tables(config, extract)
    get_run_logger().info("input validated: %s", ", ".join(
        f"{name} ({Path(file.path).name}) n={len(frame)}"
        for (name, frame), file in zip(frames.items(), extract.files, strict=True)))
    return frames, info


@task(name="aggregate-partition", cache_policy=NO_CACHE)
def aggregate_partition(config: DatasetConfig, file: ExtractFile,
                        rows_per_chunk: int = 500_000) -> PartitionCounts:
    """One file of a partitioned extract, on a fan-out worker (Dask) or in the flow."""
    return count_partition(config, file, rows_per_chunk, partitioned=True)


@task(name="merge-partitions", cache_policy=NO_CACHE)
def merge_partitions(config: DatasetConfig, parts: list[PartitionCounts],
                     pattern: str) -> tuple[CountTable, InputInfo]:
    """The extract's count table from its files' (equal to reading them as one)."""
    counts, info, how = merged_partitions(parts, pattern)
    get_run_logger().info("input %s validated and aggregated (%d file(s), %s): n=%d, %d cells",
                          Path(info.path).name, len(parts), how, info.rows,
                          counts.cell_keys.size)
    _report_rows(config, info)
    return counts, info


@task(name="validate-and-aggregate", cache_policy=NO_CACHE)
def validate_and_aggregate(
    config: DatasetConfig, extract: ResolvedExtract, rows_per_chunk: int = 500_000,
    unit: UnitBound | None = None
) -> tuple[CountTable, InputInfo]:
    """Every file of the extract in turn, in this process (the Dask fan-out is
    ``read_extract``'s)."""
    parts = counted_partitions(config, extract, rows_per_chunk, unit)
    return merge_partitions.fn(config, parts, extract.pattern)


def read_step(plan: ReleasePlan) -> str:
    """The read stage's name on the progress bar: rows checked, or rows counted."""
    return ("reading and checking the extract" if plan.kind in ("rows", "relational")
            else "reading and counting the extract")


def read_extract(config: DatasetConfig, extract: ResolvedExtract, plan: ReleasePlan,
                 runner: Any = None, runner_kind: str = "thread") -> Inputs:
    """The read stage: the extract's rows, validated and bounded per unit (kind ``rows``), or
    its count table (the other kinds), in this process or file by file on the Dask workers
    (each reads and aggregates its own files; a bad row in any file stops the run before any
    spend)."""
    if plan.kind == "relational":
        frames, info = load_and_validate_tables(quote(config), quote(extract))
        return Inputs(tables=frames, info=info)
    if plan.kind == "rows":
        frame, info = load_and_validate_input(quote(config), quote(extract), plan.unit)
        return Inputs(frame=frame, info=info, unit_bound=info.unit_bound)
    if runner_kind != "dask" or len(extract.files) < 2 or plan.unit is not None:
        counts, info = validate_and_aggregate(quote(config), quote(extract), unit=plan.unit)
    else:
        futures = runner.map(aggregate_partition, {"config": unmapped(config),
                                                   "file": list(extract.files)})
        parts = [future.result() for future in futures]
        counts, info = merge_partitions(quote(config), quote(parts), extract.pattern)
    return Inputs(counts=counts, info=info)
