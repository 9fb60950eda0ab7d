"""The extract counted by DuckDB: one out-of-core pass reads the file and groups its rows, and
validation runs on each column's distinct values instead of on every row.

Every input check is a check of one value (its form, taxonomy coverage, declared domain,
control characters, presence), so a column passes on its distinct values exactly when it passes
on its rows. This path only ever *accepts*: a file DuckDB will not parse strictly, an encoding
other than UTF-8, a header problem, or a value that fails a check makes it return ``None``, and
the caller runs the row-wise path (``medrelease.io`` + ``schemas.input``), whose messages
(column, problem, count, file lines) stay the single source of truth. DuckDB's own messages
quote file lines, so they are never shown or logged.

The count table is the one ``aggregate_chunks`` builds from the same file, key for key.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from medrelease.aggregate import (
    MAX_KEY,
    CountTable,
    canonical_informative,
    check_drop_limit,
    group_sum,
    key_space,
    place_values,
)
from medrelease.config import DatasetConfig

UTF8 = {"utf-8", "utf8", "utf_8"}
ROWS = "__medrelease_rows"


@dataclass(frozen=True)
class GroupedColumn:
    """One column of the grouped extract: its distinct values and, per group, which one."""

    values: pd.Series  # distinct values; the last entry is None when the column has nulls
    index: np.ndarray  # per group: position in ``values``


def grouped_count_table(config: DatasetConfig, source: Path, threads: int | None = None
                        ) -> CountTable | None:
    """The count table of ``source`` via DuckDB, or ``None`` when the row-wise path must run
    (it either reports the problem precisely or reads what this path declined)."""
    from schemas.input import schema_columns, validate_input

    columns = schema_columns(config)
    scan = _scan(config, source, columns)
    if scan is None:
        return None
    grouped, weights = _group(scan, columns, threads)
    if grouped is None or weights.sum() == 0:
        return None
    distinct = _distinct_frame({c: grouped[c].values for c in columns})
    try:
        validate_input(distinct, config)
    except Exception:  # the row-wise path reports it, with file lines
        return None
    return _count_table(config, grouped, weights)


def _scan(config: DatasetConfig, source: Path, columns: list[str]) -> str | None:
    """The DuckDB table expression reading ``source`` strictly, all columns as text."""
    if not source.is_file() or source.stat().st_size == 0:
        return None
    if config.input.format == "parquet" or source.suffix.lower() == ".parquet":
        return f"read_parquet({_literal(str(source))})"
    if config.input.encoding.lower() not in UTF8:
        return None
    from medrelease.io import _raw_header

    try:
        header = _raw_header(source, "utf-8-sig", config.input.delimiter)
    except Exception:  # the row-wise path explains
        return None
    if len(header) != len(set(header)) or not set(columns) <= set(header):
        return None
    types = ", ".join(f"{_literal(name)}: 'VARCHAR'" for name in header)
    return (f"read_csv({_literal(str(source))}, header=true, auto_detect=false, "
            f"columns={{{types}}}, delim={_literal(config.input.delimiter)}, quote='\"', "
            "escape='\"', comment='', strict_mode=true, null_padding=false)")


def _group(scan: str, columns: list[str], threads: int | None
           ) -> tuple[dict[str, GroupedColumn] | None, np.ndarray]:
    """Distinct rows of the declared columns and how often each occurs (one pass)."""
    import duckdb
    import pyarrow.compute as pc

    names = ", ".join(_identifier(c) for c in columns)
    with tempfile.TemporaryDirectory(prefix="medrelease-duckdb-") as spill:
        connection = duckdb.connect(config={"temp_directory": spill,
                                            **({"threads": threads} if threads else {})})
        try:
            table = connection.execute(
                f"SELECT {names}, count(*)::BIGINT AS {ROWS} FROM {scan} GROUP BY ALL"
            ).to_arrow_table()
        except Exception:  # DuckDB's message quotes the file; not shown
            return None, np.zeros(0, dtype=np.int64)
        finally:
            connection.close()
    grouped = {}
    for name in columns:
        encoded = pc.dictionary_encode(table[name]).combine_chunks()
        values = encoded.dictionary.to_pandas().astype(object)
        index = pc.fill_null(encoded.indices, len(values)).to_numpy(zero_copy_only=False)
        if encoded.null_count:
            values = pd.concat([values, pd.Series([None], dtype=object)], ignore_index=True)
        grouped[name] = GroupedColumn(values.reset_index(drop=True), index.astype(np.int64))
    return grouped, table[ROWS].to_numpy(zero_copy_only=False).astype(np.int64)


def _distinct_frame(values: dict[str, pd.Series]) -> pd.DataFrame:
    """Each column's distinct values, padded to one length by repeating its last value (no
    value is added, so the frame passes the input schema exactly when the extract does)."""
    height = max(len(v) for v in values.values())
    padded = {name: list(v) + [v.iloc[-1]] * (height - len(v)) for name, v in values.items()}
    return pd.DataFrame(padded, dtype=object)


def _count_table(config: DatasetConfig, grouped: dict[str, GroupedColumn],
                 weights: np.ndarray) -> CountTable | None:
    """Encode the grouped extract as ``aggregate_chunks`` does (same keys, same order)."""
    needed = config.dimensions + config.informative
    filled = {c: _filled(config, c, grouped[c]) for c in needed}
    incomplete = np.zeros(weights.size, dtype=bool)
    for name in needed:
        incomplete |= filled[name].isna().to_numpy()[grouped[name].index]
    dropped, total = int(weights[incomplete].sum()), int(weights.sum())
    if dropped and config.missing != "drop_rows":
        return None
    check_drop_limit(dropped, total, config)
    keep = ~incomplete
    kept = weights[keep]
    inf_codes, informative = _informative_codes(config, grouped, filled, keep)
    taxonomies = tuple(config.taxonomies[c] for c in config.dimensions)
    n_inf = max(len(informative), 1)
    if key_space(taxonomies, n_inf) >= MAX_KEY:
        return None
    keys = inf_codes.astype(np.int64)
    for name, taxonomy, radix in zip(config.dimensions, taxonomies,
                                     place_values(taxonomies, n_inf), strict=True):
        present = filled[name].notna().to_numpy()
        leaf = np.full(len(filled[name]), -1, dtype=np.int64)
        leaf[present] = taxonomy.encode(filled[name][present].reset_index(drop=True))
        keys += leaf[grouped[name].index[keep]] * radix
    cell_keys, counts = group_sum(keys, kept)
    return CountTable(
        dimensions=tuple(config.dimensions), taxonomies=taxonomies, cell_keys=cell_keys,
        counts=counts, informative=informative, n_rows=int(kept.sum()),
        public_domain=bool(config.informative) and config.informative_domain is not None,
        dropped_rows=dropped)


def _filled(config: DatasetConfig, name: str, column: GroupedColumn) -> pd.Series:
    """Distinct values with the column's declared ``missing:`` category in place of nulls."""
    label = config.columns[name].missing
    return column.values.fillna(label) if label is not None else column.values


def _informative_codes(config: DatasetConfig, grouped: dict[str, GroupedColumn],
                       filled: dict[str, pd.Series], keep: np.ndarray
                       ) -> tuple[np.ndarray, pd.DataFrame]:
    """Per kept group, its informative code; codes follow ``canonical_informative``."""
    names = config.informative
    if not names:
        return np.zeros(int(keep.sum()), dtype=np.int64), pd.DataFrame(index=pd.RangeIndex(1))
    if config.informative_domain is not None:
        domain = pd.Index(config.informative_domain, dtype="string")
        per_value = pd.Categorical(filled[names[0]].astype("string"), categories=domain).codes
        codes = per_value[grouped[names[0]].index[keep]].astype(np.int64)
        return codes, pd.DataFrame({names[0]: np.asarray(config.informative_domain, dtype=object)})
    stacked = np.stack([grouped[n].index[keep] for n in names], axis=1)
    combos, inverse = np.unique(stacked, axis=0, return_inverse=True)
    found = pd.DataFrame({n: filled[n].to_numpy(dtype=object)[combos[:, i]]
                          for i, n in enumerate(names)})
    informative, rank = canonical_informative(found)
    return rank[inverse.reshape(-1)], informative


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
