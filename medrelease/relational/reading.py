"""Read a relational dataset's extract: one file per table (the parent table first), as text,
only the columns the release reads (keys, references, released columns), then every table and
every reference checked (``schema.check``: one sentence per problem, counts only) before
anything is counted or spent."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from medrelease.data.config import DatasetConfig
from medrelease.data.extract import InputInfo, ResolvedExtract
from medrelease.errors import InputValidationError
from medrelease.relational.schema import RelTable, check


def table_reading(config: DatasetConfig) -> dict[str, tuple[str, str]]:
    """Each table's (format, delimiter), the parent table's from ``input``."""
    spec = config.relational
    assert spec is not None
    out = {config.root_table: (config.input.format, config.input.delimiter)}
    for table in spec.tables:
        out[table.table] = (table.format, table.delimiter)
    return out


def read_table(path: Path, columns: list[str], fmt: str, delimiter: str, encoding: str,
               table: str) -> pd.DataFrame:
    """One table as text (blank cells stay blank: the schema's missing rules decide), only
    ``columns``; a column the file lacks is the schema check's to name."""
    try:
        if fmt == "parquet":
            frame = pd.read_parquet(path)
            frame = frame[[c for c in columns if c in frame.columns]].astype("string")
            return frame.fillna("")
        header = pd.read_csv(path, nrows=0, sep=delimiter, encoding=encoding).columns
        wanted = [c for c in columns if c in header]
        return pd.read_csv(path, usecols=wanted, dtype=str, keep_default_na=False,
                           sep=delimiter, encoding=encoding)[wanted]
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise InputValidationError(f"table {table}: its file {path.name} cannot be read as "
                                   f"{fmt} ({type(exc).__name__}). Nothing was read further "
                                   "or spent.") from None


def read_config_table(config: DatasetConfig, table: RelTable, path: Path) -> pd.DataFrame:
    """One table of a relational dataset from ``path``, as the release reads it: its key,
    its reference and its released columns, as text, in its declared format."""
    fmt, delimiter = table_reading(config)[table.name]
    needed = [c for c in (table.key, table.parent_key) if c] + list(table.column_names)
    return read_table(path, needed, fmt, delimiter, config.input.encoding, table.name)


def read_table_files(config: DatasetConfig, paths: Mapping[str, Path]
                     ) -> dict[str, pd.DataFrame]:
    """Every table of a relational dataset from its file (``paths`` by table name; not
    checked: ``check`` does that)."""
    return {t.name: read_config_table(config, t, paths[t.name])
            for t in config.relational_schema.tables}


def read_tables(config: DatasetConfig, extract: ResolvedExtract
                ) -> tuple[dict[str, pd.DataFrame], InputInfo]:
    """The extract's tables, validated (every problem at once, counts only), and the read's
    facts (steward side: the parent table's path and digests, the patients read)."""
    schema = config.relational_schema
    if len(extract.files) != len(schema.tables):
        raise InputValidationError(f"dataset {config.name!r} has {len(schema.tables)} tables "
                                   f"but the extract {len(extract.files)} file(s)")
    frames = read_table_files(config, {t.name: f.read_from for t, f in zip(
        schema.tables, extract.files, strict=True)})
    check(schema, frames)
    root = extract.files[0]
    return frames, InputInfo(path=root.path, sha256=extract.digest,
                             rows=len(frames[schema.root.name]),
                             rows_sha256=root.rows_sha256,
                             text_rows_sha256=root.text_rows_sha256)
