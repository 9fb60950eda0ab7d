"""The extract counted by DuckDB: one out-of-core pass reads the file and groups its rows, and
validation runs on each column's distinct values instead of on every row.

Every input check is a check of one value (its form, taxonomy coverage, declared domain,
control characters, presence), so a column passes on its distinct values exactly when it passes
on its rows. This path only ever *accepts*: a file DuckDB will not parse strictly, an encoding
other than UTF-8, a header problem, or a value that fails a check makes it return ``None``, and
the caller runs the row-wise path (``medrelease.storage.io`` + ``data/input_schema.py``), whose
messages (column, problem, count, file lines) stay the single source of truth. DuckDB's own messages
quote file lines, so they are never shown or logged.

The count table is the one ``aggregate_chunks`` builds from the same file, key for key.
"""

from __future__ import annotations

import logging
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from medrelease.data.aggregate import (
    MAX_KEY,
    CountTable,
    canonical_informative,
    check_drop_limit,
    group_sum,
    key_space,
    numeric_informative,
    place_values,
    wide_count_table,
)
from medrelease.data.binning import canonical_numbers
from medrelease.data.config import DatasetConfig
from medrelease.data.content import (
    DigestSpec,
    RowSums,
    digest_query,
    digest_spec,
    hash_halves_sql,
    weighted_row_sums,
)
from medrelease.data.duckdb_read import (
    duckdb_memory_limit,
    extract_scan,
    identifier,
    is_text_scan,
)
from medrelease.data.units import UnitBound, bounded_weights
from medrelease.privacy.randomness import generator_for

LOG = logging.getLogger(__name__)

ROWS = "__medrelease_rows"


@dataclass(frozen=True)
class GroupedColumn:
    """One column of the grouped extract: its distinct values and, per group, which one."""

    values: pd.Series  # distinct values; the last entry is None when the column has nulls
    index: np.ndarray  # per group: position in ``values`` (int32: 14M groups at 30M rows)


@dataclass(frozen=True)
class GroupedCount:
    """What the grouped pass gives: the count table (``None``: the row-wise path must run)
    and, when asked for, the row sums of the file's rows (``content.RowSums``) taken from the
    same pass: the digest is a sum over rows, so it is the sum over the distinct rows of their
    count times their hash. ``None`` where this pass cannot give them bit for bit: a Parquet
    file's typed columns group values whose texts may differ (the caller digests the file on
    its own then)."""

    counts: CountTable | None
    row_sums: RowSums | None = None


def grouped_count_table(config: DatasetConfig, source: Path, threads: int | None = None,
                        unit: UnitBound | None = None) -> CountTable | None:
    """The count table of ``source`` via DuckDB, or ``None`` when the row-wise path must run
    (it either reports the problem precisely or reads what this path declined)."""
    return grouped_count(config, source, threads, unit).counts


def grouped_count(config: DatasetConfig, source: Path, threads: int | None = None,
                  unit: UnitBound | None = None, row_sums: bool = False) -> GroupedCount:
    """The grouped pass over ``source``. With ``unit`` the groups carry the unit's identifier
    and each unit's rows are cut to ``unit.max_rows`` on the group weights
    (``bounded_weights``) before the count table is built; the row sums are of the file's
    rows, before that cut (they identify the file's content)."""
    from medrelease.data.input_schema import schema_columns, validate_input

    columns = schema_columns(config)
    scan = extract_scan(config, source, columns)
    if scan is None:
        return GroupedCount(None)
    whole = is_text_scan(scan) and source.stat().st_size <= WHOLE_FETCH_MAX_BYTES
    digested = digest_spec(config) if row_sums and is_text_scan(scan) else None
    grouped, weights, sums = _group(scan, columns, threads, whole, digested)
    if grouped is None or weights.sum() == 0:
        return GroupedCount(None)
    distinct = _distinct_frame({c: grouped[c].values for c in columns})
    try:
        validate_input(distinct, config)
    except Exception:  # the row-wise path reports it, with file lines
        return GroupedCount(None)
    report = None
    if unit is not None:
        weights, report = bounded_weights(grouped[unit.column].index, weights, unit.max_rows,
                                          generator_for(unit.seed))
    counts = _count_table(config, grouped, weights)
    if counts is not None and report is not None:
        counts = replace(counts, unit_bound=report)
    return GroupedCount(counts, sums)  # the sums of a file read strictly, counted or not


GROUP_BATCH = 1_000_000  # groups fetched from DuckDB at a time
# A CSV extract up to this size has its groups fetched at once: at most ~2.5M rows, so at most
# that many groups, ~200 MB as Arrow text (DuckDB's hash table holds more meanwhile).
WHOLE_FETCH_MAX_BYTES = 64 * 2**20


Grouped = tuple[dict[str, GroupedColumn] | None, np.ndarray, RowSums | None]


def _group(scan: str, columns: list[str], threads: int | None, whole: bool = False,
           digested: DigestSpec | None = None) -> Grouped:
    """``_group_within`` DuckDB's memory limit, once more without it if that was too little
    (a run slower than the grouped pass is the row-wise pass, minutes at 30M rows)."""
    import duckdb

    try:
        return _group_within(scan, columns, threads, duckdb_memory_limit(), whole, digested)
    except duckdb.OutOfMemoryException:
        LOG.info("DuckDB needed more than %s to group the extract; grouping again without "
                 "that limit", duckdb_memory_limit())
    try:
        return _group_within(scan, columns, threads, None, whole, digested)
    except duckdb.OutOfMemoryException:
        return None, np.zeros(0, dtype=np.int64), None


HASH, HIGH, LOW = "__medrelease_hash", "__medrelease_high", "__medrelease_low"
TEXT_HASH, TEXT_HIGH, TEXT_LOW = ("__medrelease_text_hash", "__medrelease_text_high",
                                  "__medrelease_text_low")


def _groups_query(scan: str, columns: list[str], digested: DigestSpec | None) -> str:
    """Distinct rows and their counts; with ``digested``, each distinct row's hash halves
    too (hashed once per distinct row, over the digest's columns in its order)."""
    names = ", ".join(identifier(c) for c in columns)
    query = f"SELECT {names}, count(*)::BIGINT AS {ROWS} FROM {scan} GROUP BY ALL"
    if digested is None:
        return query
    high, low = hash_halves_sql(HASH)
    text_high, text_low = hash_halves_sql(TEXT_HASH)
    return (f"SELECT * EXCLUDE ({HASH}, {TEXT_HASH}), {high} AS {HIGH}, {low} AS {LOW}, "
            f"{text_high} AS {TEXT_HIGH}, {text_low} AS {TEXT_LOW} FROM "
            f"({digest_query(digested, f'({query})', HASH, TEXT_HASH)})")


def _group_within(scan: str, columns: list[str], threads: int | None, memory: str | None,
                  whole: bool = False, digested: DigestSpec | None = None) -> Grouped:
    """Distinct rows of the declared columns and how often each occurs (one pass), and with
    ``digested`` the row sums of the rows read.

    The groups are fetched in record batches and each column is turned into codes of its
    distinct values batch by batch, so neither DuckDB's result nor its text is ever held
    whole (a 30M-row extract has 14M groups)."""
    import duckdb

    encoders = {name: _ColumnEncoder() for name in columns}
    weights: list[np.ndarray] = []
    sums = RowSums() if digested is not None else None
    with tempfile.TemporaryDirectory(prefix="medrelease-duckdb-") as spill:
        connection = duckdb.connect(config={
            "temp_directory": spill, **({"memory_limit": memory} if memory else {}),
            "preserve_insertion_order": False,  # groups are re-sorted by key afterwards
            **({"threads": threads} if threads else {})})
        try:
            connection.execute("SET enable_progress_bar = false")
            groups = connection.sql(_groups_query(scan, columns, digested))
            # A small extract's groups in one parallel fetch (1.17M groups: 0.41 s against the
            # streamed batches' 0.48 s); a large one's batch by batch, never held whole.
            parts = ([groups.to_arrow_table()] if whole else groups.to_arrow_reader(GROUP_BATCH))
            with ThreadPoolExecutor(max_workers=2) as pool:  # Arrow and numpy free the GIL
                for batch in parts:
                    list(pool.map(lambda name, b=batch: encoders[name].add(b.column(name)),
                                  columns))
                    counts = np.asarray(batch.column(ROWS))
                    weights.append(counts)
                    if sums is not None:
                        sums = sums + weighted_row_sums(
                            counts, *(np.asarray(batch.column(c))
                                      for c in (HIGH, LOW, TEXT_HIGH, TEXT_LOW)))
        except duckdb.OutOfMemoryException:
            raise
        except Exception as exc:  # DuckDB's message quotes the file; only its kind is kept
            LOG.info("DuckDB declined the extract (%s); reading it row-wise",
                     type(exc).__name__)
            return None, np.zeros(0, dtype=np.int64), None
        finally:
            connection.close()
    grouped = {name: encoder.column() for name, encoder in encoders.items()}
    return grouped, (np.concatenate(weights).astype(np.int64) if weights
                     else np.zeros(0, dtype=np.int64)), sums


class _ColumnEncoder:
    """Codes of one column's distinct values, assigned as batches arrive (nulls last)."""

    def __init__(self) -> None:
        self.codes: dict = {}
        self.parts: list[np.ndarray] = []
        self.has_null = False

    def add(self, array) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        encoded = pc.dictionary_encode(array)
        if isinstance(encoded, pa.ChunkedArray):
            encoded = encoded.combine_chunks()
        local = encoded.dictionary.to_pylist()
        lookup = np.array([self.codes.setdefault(v, len(self.codes)) for v in local] + [-1],
                          dtype=np.int32)
        self.has_null |= encoded.null_count > 0
        index = pc.fill_null(encoded.indices, len(local)).to_numpy(zero_copy_only=False)
        # The smallest signed type for the codes so far (and a null code after them): at 14M
        # groups a column of 100 ages is 14 MB, not 56 (the codes are the grouping's peak).
        self.parts.append(lookup[index].astype(np.min_scalar_type(-(len(self.codes) + 1))))

    def column(self) -> GroupedColumn:
        values = pd.Series(list(self.codes), dtype=object)
        index = np.concatenate(self.parts) if self.parts else np.zeros(0, np.int32)
        if self.has_null:
            index[index < 0] = len(values)
            values = pd.concat([values, pd.Series([None], dtype=object)], ignore_index=True)
        return GroupedColumn(values.reset_index(drop=True), index)


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
    for name in numeric_informative(config):  # one spelling per number, as the domain has it
        grouped[name] = _canonical(grouped[name])
    filled = {c: _filled(config, c, grouped[c]) for c in needed}
    incomplete = np.zeros(weights.size, dtype=bool)
    for name in needed:
        missing = filled[name].isna().to_numpy()
        if missing.any():  # checked on the distinct values first: usually none
            incomplete |= missing[grouped[name].index]
    dropped, total = int(weights[incomplete].sum()), int(weights.sum())
    if dropped and config.missing != "drop_rows":
        return None
    check_drop_limit(dropped, total, config)
    keep = ~incomplete if dropped else slice(None)
    kept = weights[keep]
    inf_codes, informative = _informative_codes(config, grouped, filled, keep, kept.size)
    taxonomies = tuple(config.taxonomies[c] for c in config.dimensions)
    n_inf = max(len(informative), 1)
    public = bool(config.informative) and config.informative_domain is not None
    if key_space(taxonomies, n_inf) >= MAX_KEY:  # a wide table: a code per column per group
        codes = [_leaf_codes(filled[name], taxonomy)[grouped[name].index[keep]]
                 for name, taxonomy in zip(config.dimensions, taxonomies, strict=True)]
        grouped.clear()
        return wide_count_table(config.dimensions, taxonomies, codes, inf_codes, kept,
                                informative, public, dropped)
    keys = inf_codes.astype(np.int64)
    for name, taxonomy, radix in zip(config.dimensions, taxonomies,
                                     place_values(taxonomies, n_inf), strict=True):
        present = filled[name].notna().to_numpy()
        leaf = np.full(len(filled[name]), -1, dtype=np.int64)
        leaf[present] = taxonomy.encode(filled[name][present].reset_index(drop=True))
        leaf *= radix  # on the distinct values: one gather per group, no product
        keys += leaf[grouped[name].index[keep]]
    grouped.clear()  # the caller's columns: their codes are in the keys now (333 MB at 14M)
    cell_keys, counts = group_sum(keys, kept, scratch=True)
    return CountTable(
        dimensions=tuple(config.dimensions), taxonomies=taxonomies, cell_keys=cell_keys,
        counts=counts, informative=informative, n_rows=int(kept.sum()),
        public_domain=bool(config.informative) and config.informative_domain is not None,
        dropped_rows=dropped)


def _leaf_codes(values: pd.Series, taxonomy) -> np.ndarray:
    """Leaf code of each distinct value (-1 for a missing one, whose groups were dropped)."""
    present = values.notna().to_numpy()
    leaf = np.full(len(values), -1, dtype=np.int64)
    leaf[present] = taxonomy.encode(values[present].reset_index(drop=True))
    return leaf


def _canonical(column: GroupedColumn) -> GroupedColumn:
    """The column with its distinct values in one spelling per number (``3.0`` -> ``3``):
    spellings of one number become one value, so the groups' codes point to it."""
    codes, uniques = pd.factorize(canonical_numbers(column.values), use_na_sentinel=False)
    values = pd.Series(np.asarray(uniques, dtype=object), dtype=object)
    if values.isna().any():  # the null value last, as ``_ColumnEncoder`` keeps it
        null = int(np.flatnonzero(values.isna().to_numpy())[0])
        order = np.array([i for i in range(len(values)) if i != null] + [null])
        codes = np.argsort(order)[codes]
        values = values.iloc[order].reset_index(drop=True)
    return GroupedColumn(values, codes.astype(np.int64)[column.index])


def _filled(config: DatasetConfig, name: str, column: GroupedColumn) -> pd.Series:
    """Distinct values with the column's declared ``missing:`` category in place of nulls."""
    label = config.columns[name].missing
    return column.values.fillna(label) if label is not None else column.values


def _informative_codes(config: DatasetConfig, grouped: dict[str, GroupedColumn],
                       filled: dict[str, pd.Series], keep: np.ndarray | slice, n_kept: int
                       ) -> tuple[np.ndarray, pd.DataFrame]:
    """Per kept group (``keep``: a mask, or every group), its informative code; codes follow
    ``canonical_informative``."""
    names = config.informative
    if not names:
        return np.zeros(n_kept, dtype=np.int64), pd.DataFrame(index=pd.RangeIndex(1))
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
