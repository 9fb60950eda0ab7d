"""Load the dataset config and the extract, and validate it before any budget is touched."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from medrelease.aggregate import CountTable, aggregate_chunks
from medrelease.config import DatasetConfig, find_config
from medrelease.io import file_sha256, iter_chunks, read_input
from schemas.input import validate_input


@dataclass(frozen=True)
class InputInfo:
    path: str
    sha256: str
    rows: int


@task(name="load-dataset-config", cache_policy=NO_CACHE)
def load_dataset_config(dataset: str) -> DatasetConfig:
    return find_config(dataset)


@task(name="validate-input", cache_policy=NO_CACHE)
def load_and_validate_input(
    config: DatasetConfig, input_path: str | None = None
) -> tuple[pd.DataFrame, InputInfo]:
    """Read the extract as text and check it against the pandera schema of its config."""
    path = Path(input_path) if input_path else config.input_path
    frame = validate_input(read_input(config, path), config)
    info = InputInfo(path=str(path.resolve()), sha256=file_sha256(path), rows=len(frame))
    get_run_logger().info("input %s validated: n=%d, sha256 %s", path.name, info.rows,
                          info.sha256[:12])
    return frame, info


@task(name="validate-and-aggregate", cache_policy=NO_CACHE)
def validate_and_aggregate(
    config: DatasetConfig, input_path: str | None = None, rows_per_chunk: int = 500_000
) -> tuple[CountTable, InputInfo]:
    """One streamed pass: validate each chunk, fold it into the count table.

    Memory stays bounded by the count table, not by the number of rows; no noise is drawn.
    """
    path = Path(input_path) if input_path else config.input_path
    chunks = (validate_input(chunk, config) for chunk in iter_chunks(config, path, rows_per_chunk)
              if len(chunk))
    counts = aggregate_chunks(chunks, config)
    info = InputInfo(path=str(path.resolve()), sha256=file_sha256(path), rows=counts.n_rows)
    get_run_logger().info("input %s validated and aggregated in chunks: n=%d, %d cells",
                          path.name, info.rows, counts.cell_keys.size)
    return counts, info
