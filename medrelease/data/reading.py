"""Reading an extract: validated (the pandera input schema), bounded per unit, counted.

What the flow's input tasks and ``medrelease check`` do, without Prefect: the tasks
(``tasks/inputs.py``) add the run's log lines and the steward's artifact. Validation failures
carry counts and file lines only; the values go to a steward-only log whose path the message
names (``values_to_the_steward_log``), and the message names the file by the steward's path,
not the snapshot read (``named_as_the_extract``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import pandas as pd

from medrelease.data.aggregate import (
    CountTable,
    aggregate,
    aggregate_chunks,
    check_drop_limit,
    merge_count_tables,
)
from medrelease.data.config import DatasetConfig
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
from medrelease.settings import steward_log_dir
from medrelease.storage.io import counting_positions, iter_chunks, read_input


@contextmanager
def values_to_the_steward_log(config: DatasetConfig) -> Iterator[None]:
    """Re-raise a validation failure with the path of the steward-only log of its values."""
    try:
        yield
    except InputValidationError as exc:
        log = write_steward_log(steward_log_dir(), config.name, exc)
        raise InputValidationError(
            f"{exc}\n(example values and all details, for the steward only: {log})",
            exc.problems) from None


@contextmanager
def named_as_the_extract(files: tuple[ExtractFile, ...]) -> Iterator[None]:
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


def read_validated(config: DatasetConfig, extract: ResolvedExtract, unit: UnitBound | None = None
                   ) -> tuple[pd.DataFrame, InputInfo]:
    """Read the extract as text and check it against the pandera schema of its config; with
    a declared privacy unit, cut each unit's rows to its bound (after validation, so a bad
    row anywhere is reported, and before anything is counted). Kind ``rows``: one file."""
    with named_as_the_extract(extract.files), values_to_the_steward_log(config):
        refuse_several_files(extract, config, rows_kind=True, unit_column=None)
        path, source = extract.paths[0], extract.files[0].read_from  # the snapshot is read
        with counting_positions(config, source):
            frame = validate_input(read_input(config, source), config)
        frame, report = bound_frame(frame, unit) if unit is not None else (frame, None)
        needed = config.dimensions + config.informative + config.class_columns
        dropped = len(missing_rows(frame, needed)) if config.missing == "drop_rows" else 0
        check_drop_limit(dropped, len(frame), config)
    return frame, InputInfo(path=str(path), sha256=extract.files[0].sha256,
                            rows=len(frame) - dropped, dropped_rows=dropped,
                            unit_bound=report.as_dict() if report else None,
                            rows_sha256=extract.rows_digest)


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
    with named_as_the_extract((file,)):
        return _count_file(config, file, rows_per_chunk, partitioned, unit)


def _count_file(config: DatasetConfig, file: ExtractFile, rows_per_chunk: int,
                partitioned: bool, unit: UnitBound | None) -> PartitionCounts:
    path = file.read_from
    grouped = grouped_count(config, path, unit=unit, row_sums=file.rows_by_count)
    counts, how = grouped.counts, "grouped by DuckDB"
    if counts is None and unit is not None:  # a unit's rows are bounded together: one frame
        with values_to_the_steward_log(config), counting_positions(config, path):
            frame, report = bound_frame(validate_input(read_input(config, path), config), unit)
        counts = replace(aggregate(frame, config), unit_bound=report)
        how = "read row-wise, bounded per unit"
    if counts is None:  # the row-wise pass: reads what DuckDB declined, or says what is wrong
        try:
            with values_to_the_steward_log(config):
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


def merged_partitions(parts: list[PartitionCounts], pattern: str
                      ) -> tuple[CountTable, InputInfo, str]:
    """The extract's count table from its files' (equal to reading them as one), its input
    facts, and how the files were read."""
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
    return counts, info, ", ".join(sorted({p.how for p in parts}))


def counted_partitions(config: DatasetConfig, extract: ResolvedExtract,
                       rows_per_chunk: int = 500_000, unit: UnitBound | None = None
                       ) -> list[PartitionCounts]:
    """Every file of the extract in turn, in this process (the Dask fan-out is the flow's)."""
    refuse_several_files(extract, config, rows_kind=False,  # (check asks the same)
                         unit_column=unit.column if unit is not None else None)
    return [count_partition(config, f, rows_per_chunk, partitioned=len(extract.files) > 1,
                            unit=unit)
            for f in extract.files]
