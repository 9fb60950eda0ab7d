"""Load the dataset config and the extract, and validate it before any budget is touched.

Validation failures reach Prefect (logs, state message, events) with counts and file lines
only; the values themselves go to a steward-only log file whose path the message names.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from medrelease.data.aggregate import (
    CountTable,
    aggregate,
    aggregate_chunks,
    check_drop_limit,
    merge_count_tables,
)
from medrelease.data.config import DatasetConfig, find_config
from medrelease.data.content import RowSums, digested_columns, digests_of, row_digests
from medrelease.data.extract import (
    ExtractFile,
    InputInfo,
    ResolvedExtract,
    extract_digest,
    refuse_several_files,
)
from medrelease.data.grouped_input import grouped_count
from medrelease.data.input_schema import missing_rows, validate_input
from medrelease.data.units import UnitBound, bound_frame
from medrelease.errors import InputValidationError, write_steward_log
from medrelease.settings import steward_log_dir, steward_root
from medrelease.storage.io import counting_positions, iter_chunks, read_input
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


@contextmanager
def _values_to_the_steward_log(config: DatasetConfig) -> Iterator[None]:
    """Re-raise a validation failure with the path of the steward-only log of its values."""
    try:
        yield
    except InputValidationError as exc:
        log = write_steward_log(steward_log_dir(), config.name, exc)
        raise InputValidationError(
            f"{exc}\n(example values and all details, for the steward only: {log})",
            exc.problems) from None


@contextmanager
def _named_as_the_extract(files: tuple[ExtractFile, ...]) -> Iterator[None]:
    """The readers' messages name the snapshot they read; the steward knows the file by its
    own path, so that is the one a message gives."""
    try:
        yield
    except InputValidationError as exc:
        message = str(exc)
        for file in files:
            if file.snapshot:
                message = message.replace(file.snapshot, file.path)
        if message == str(exc):
            raise
        raise InputValidationError(message, exc.problems) from None


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
    """Read the extract as text and check it against the pandera schema of its config; with
    a declared privacy unit, cut each unit's rows to its bound (after validation, so a bad
    row anywhere is reported, and before anything is counted)."""
    with _named_as_the_extract(extract.files), _values_to_the_steward_log(config):
        refuse_several_files(extract, config, rows_kind=True, unit_column=None)
        path, source = extract.paths[0], extract.files[0].read_from  # the snapshot is read
        with counting_positions(config, source):
            frame = validate_input(read_input(config, source), config)
        frame, report = bound_frame(frame, unit) if unit is not None else (frame, None)
        needed = config.dimensions + config.informative + config.class_columns
        dropped = len(missing_rows(frame, needed)) if config.missing == "drop_rows" else 0
        check_drop_limit(dropped, len(frame), config)
    info = InputInfo(path=str(path), sha256=extract.files[0].sha256,
                     rows=len(frame) - dropped, dropped_rows=dropped,
                     unit_bound=report.as_dict() if report else None,
                     rows_sha256=extract.rows_digest)
    get_run_logger().info("input %s validated: n=%d", path.name, info.rows)
    _report_rows(config, info)
    return frame, info


@dataclass(frozen=True)
class PartitionCounts:
    """One file of an extract, validated and aggregated (on whichever worker read it)."""

    path: str
    sha256: str
    counts: CountTable
    how: str
    rows_sha256: str | None = None
    text_rows_sha256: str | None = None  # where it differs from the row digest (content)


def count_partition(config: DatasetConfig, file: ExtractFile,
                    rows_per_chunk: int = 500_000, partitioned: bool = False,
                    unit: UnitBound | None = None) -> PartitionCounts:
    """One out-of-core pass over one file: DuckDB groups it and the checks run on each
    column's distinct values; when that path declines (or the input is bad), the row-wise pass
    validates each chunk and folds it in, with messages naming file lines (and, for an extract
    of several files, the file). Memory follows the count table; no noise is drawn. What is
    read is the file's snapshot (the bytes its hash was taken of); messages name the file by
    its own path."""
    with _named_as_the_extract((file,)):
        return _count_file(config, file, rows_per_chunk, partitioned, unit)


def _count_file(config: DatasetConfig, file: ExtractFile, rows_per_chunk: int,
                partitioned: bool, unit: UnitBound | None) -> PartitionCounts:
    path = file.read_from
    grouped = grouped_count(config, path, unit=unit, row_sums=file.rows_by_count)
    counts, how = grouped.counts, "grouped by DuckDB"
    if counts is None and unit is not None:  # a unit's rows are bounded together: one frame
        with _values_to_the_steward_log(config), counting_positions(config, path):
            frame, report = bound_frame(validate_input(read_input(config, path), config), unit)
        counts = replace(aggregate(frame, config), unit_bound=report)
        how = "read row-wise, bounded per unit"
    if counts is None:  # the row-wise pass: reads what DuckDB declined, or says what is wrong
        try:
            with _values_to_the_steward_log(config):
                chunks = (validate_input(chunk, config)
                          for chunk in iter_chunks(config, path, rows_per_chunk) if len(chunk))
                with counting_positions(config, path):
                    counts, how = aggregate_chunks(chunks, config), "read row-wise in chunks"
        except InputValidationError as exc:
            if not partitioned:
                raise
            raise InputValidationError(f"in {path.name}: {exc}", exc.problems) from None
    digests = _rows_digests(config, file, grouped.row_sums)
    return PartitionCounts(file.path, file.sha256, counts, how, digests[0] if digests else None,
                           digests[1] if len(digests) > 1 else None)


def _rows_digests(config: DatasetConfig, file: ExtractFile,
                  sums: RowSums | None) -> tuple[str, ...]:
    """The file's row digest (and its text digest where it differs): taken at resolution,
    else from the grouped pass's row sums, else (a pass that declined the file or cannot give
    them) by a pass of its own."""
    if not file.rows_by_count:
        return tuple(d for d in (file.rows_sha256, file.text_rows_sha256) if d)
    if sums is not None:
        return digests_of(digested_columns(config), sums)
    return row_digests(config, file.read_from)


@task(name="aggregate-partition", cache_policy=NO_CACHE)
def aggregate_partition(config: DatasetConfig, file: ExtractFile,
                        rows_per_chunk: int = 500_000) -> PartitionCounts:
    """One file of a partitioned extract, on a fan-out worker (Dask) or in the flow."""
    return count_partition(config, file, rows_per_chunk, partitioned=True)


@task(name="merge-partitions", cache_policy=NO_CACHE)
def merge_partitions(config: DatasetConfig, parts: list[PartitionCounts],
                     pattern: str) -> tuple[CountTable, InputInfo]:
    """The extract's count table from its files' (equal to reading them as one)."""
    counts = merge_count_tables([p.counts for p in parts])  # each file passed the drop limit
    bound = parts[0].counts.unit_bound if len(parts) == 1 else None
    files = ResolvedExtract(pattern, tuple(ExtractFile(p.path, p.sha256, p.rows_sha256)
                                           for p in parts))
    info = InputInfo(path=parts[0].path if len(parts) == 1 else pattern,
                     sha256=extract_digest([(p.path, p.sha256) for p in parts]),
                     rows=counts.n_rows,
                     dropped_rows=counts.dropped_rows,
                     unit_bound=bound.as_dict() if bound is not None else None,
                     rows_sha256=files.rows_digest,
                     text_rows_sha256=parts[0].text_rows_sha256 if len(parts) == 1 else None)
    how = ", ".join(sorted({p.how for p in parts}))
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
    """Every file of the extract in turn, in this process (the Dask fan-out is in the flow)."""
    refuse_several_files(extract, config, rows_kind=False,  # (check asks the same)
                         unit_column=unit.column if unit is not None else None)
    parts = [count_partition(config, f, rows_per_chunk, partitioned=len(extract.files) > 1,
                             unit=unit)
             for f in extract.files]
    return merge_partitions.fn(config, parts, extract.pattern)
