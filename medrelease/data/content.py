"""What an extract holds, as rows: a digest of its parsed rows that stays the same whatever
file they are saved in.

The ledger ties the content a release reads to one source (``content_claims``). Keyed by the
file's bytes alone, the same rows saved with CRLF line ends, quoted differently, with the
columns in another order or re-exported as Parquet looked like new data and opened a fresh
budget (issue 36, cases 5 and 6). The *row digest* is a function of the multiset of rows of
the columns the release validates (``schemas.input.schema_columns``), each value as text:

* the columns are taken in name order, so their order in the file does not matter;
* each row is its values joined by U+001F, a missing value written as U+0000 (the input
  schema refuses control characters in these columns, so the joining is unambiguous for any
  extract a release accepts);
* each row's MD5 (128 bits) is split into two 64-bit halves, and each half is summed over
  all rows: sums do not depend on the order of the rows, and the parts of an extract read in
  chunks add up to the whole;
* the digest is the SHA-256 of a version tag, the column names, the row count and the two
  sums.

Format independence is the parser's: CSV values are read as text, Parquet values cast to
text (an integer column gives the same text as its CSV). DuckDB computes it in one streamed
pass (about the time DuckDB takes to group the extract; README, "Content claims"); an extract
DuckDB declines (another encoding, a CSV it will not parse strictly) is hashed row-wise from
the reader the release's own row-wise pass uses, with the same result. An extract that
neither reads has no row digest: its validation refuses it before any charge.

The digest is a deterministic function of the raw data (it tells two neighbouring tables
apart): it is steward-record and ledger data, never published.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from medrelease.data.config import DatasetConfig
from medrelease.data.duckdb_read import duckdb_memory_limit, extract_scan, identifier

LOG = logging.getLogger(__name__)

VERSION = "medrelease-rows-v1"
SEPARATOR = "\x1f"
MISSING = "\x00"
HALF = (1 << 64) - 1


@dataclass(frozen=True)
class RowSums:
    """The order-free sums of an extract's row hashes (they add up across chunks)."""

    rows: int = 0
    high: int = 0
    low: int = 0

    def __add__(self, other: RowSums) -> RowSums:
        return RowSums(self.rows + other.rows, self.high + other.high, self.low + other.low)


def digested_columns(config: DatasetConfig) -> list[str]:
    """The columns the digest covers: those the release validates, in name order."""
    from schemas.input import schema_columns

    return sorted(set(schema_columns(config)))


def row_digest(config: DatasetConfig, source: Path) -> str | None:
    """The row digest of ``source`` read as ``config`` says, or ``None`` when it cannot be
    parsed (the release's validation then refuses it, naming the problem)."""
    columns = digested_columns(config)
    sums = _duckdb_sums(config, source, columns)
    if sums is None:
        sums = _row_wise_sums(config, source, columns)
    return None if sums is None else digest_of(columns, sums)


def digest_of(columns: list[str], sums: RowSums) -> str:
    text = f"{VERSION}\n{SEPARATOR.join(columns)}\n{sums.rows}:{sums.high}:{sums.low}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def row_text_sql(columns: list[str]) -> str:
    """The SQL expression of a row's text over ``columns`` (in the order given: the digest's
    name order), each value cast to text, missing as U+0000, joined by U+001F."""
    return f" || chr({ord(SEPARATOR)}) || ".join(
        f"coalesce(CAST({identifier(c)} AS VARCHAR), chr({ord(MISSING)}))" for c in columns)


def hash_halves_sql(hashed: str) -> tuple[str, str]:
    """SQL for the two 64-bit halves, as UBIGINT, of the MD5 ``hashed`` names (an alias bound
    to ``md5_number`` of a row's text)."""
    return f"({hashed} >> 64)::UBIGINT", f"({hashed} & {HALF}::UHUGEINT)::UBIGINT"


def weighted_row_sums(weights: np.ndarray, high: np.ndarray, low: np.ndarray) -> RowSums:
    """The sums of a table of distinct rows each occurring ``weights`` times, given each
    distinct row's hash halves: what summing the hashes of every row gives, exactly.

    Integer arithmetic throughout: each 64-bit half is cut into four 16-bit limbs, and a
    limb's weighted sum is at most 65,535 x the row count, which int64 holds for any extract
    under 2^46 rows (checked); the limbs are then combined as Python integers."""
    weights = np.asarray(weights, dtype=np.int64)
    # checked before the int64 sum, which could wrap: a float sum of non-negative weights is
    # within a relative 2^-40 of the exact one here, so under 2^46 means under 2^47
    if weights.size and (int(weights.min()) < 0
                         or float(weights.sum(dtype=np.float64)) >= 2.0 ** 46):
        raise ValueError("row weights out of the exact range of the limb sums")
    rows = int(weights.sum())

    def total(halves: np.ndarray) -> int:
        halves = np.asarray(halves, dtype=np.uint64)
        return sum(int(np.dot(weights, ((halves >> np.uint64(16 * j)) & np.uint64(0xFFFF))
                              .astype(np.int64))) << (16 * j) for j in range(4))

    return RowSums(rows, total(high), total(low))


def _duckdb_sums(config: DatasetConfig, source: Path, columns: list[str]) -> RowSums | None:
    """One streamed DuckDB pass over the file as the grouped count reads it (same scan)."""
    import duckdb

    scan = extract_scan(config, source, columns)
    if scan is None:
        return None
    high, low = hash_halves_sql("h")
    query = (f"SELECT count(*)::BIGINT, coalesce(sum({high}), 0)::HUGEINT, "
             f"coalesce(sum({low}), 0)::HUGEINT "
             f"FROM (SELECT md5_number({row_text_sql(columns)}) AS h FROM {scan})")
    connection = duckdb.connect(config={"memory_limit": duckdb_memory_limit()})
    try:
        connection.execute("SET enable_progress_bar = false")
        rows, high_sum, low_sum = connection.execute(query).fetchone()
    except Exception as exc:  # DuckDB's message quotes the file; only its kind is kept
        LOG.info("DuckDB declined the extract for its row digest (%s); hashing it row-wise",
                 type(exc).__name__)
        return None
    finally:
        connection.close()
    return RowSums(int(rows), int(high_sum), int(low_sum))


def _row_wise_sums(config: DatasetConfig, source: Path, columns: list[str]) -> RowSums | None:
    """The same sums from the chunks the row-wise pass reads (slower: hashed in Python)."""
    from medrelease.storage.io import iter_chunks

    total = RowSums()
    try:
        for chunk in iter_chunks(config, source):
            if not set(columns) <= set(chunk.columns):
                return None
            total = total + frame_sums(chunk, columns)
    except Exception as exc:  # the release's validation reports it, with file lines
        LOG.info("the extract could not be read for its row digest (%s)", type(exc).__name__)
        return None
    return total


def frame_sums(frame: pd.DataFrame, columns: list[str]) -> RowSums:
    """The row sums of a frame's ``columns`` (values as text, missing as U+0000)."""
    if frame.empty:
        return RowSums()
    texts = [frame[c].map(_text, na_action="ignore").fillna(MISSING).astype(str)
             for c in columns]
    joined = texts[0].str.cat(texts[1:], sep=SEPARATOR) if len(texts) > 1 else texts[0]
    high = low = 0
    for text in joined:
        value = int.from_bytes(hashlib.md5(text.encode("utf-8"), usedforsecurity=False).digest(), "little")
        high += value >> 64
        low += value & HALF
    return RowSums(len(frame), high, low)


def _text(value: object) -> str:
    """A value as DuckDB casts it to text (the cases a text or integer column holds)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
