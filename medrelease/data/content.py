"""What an extract holds, as rows: a digest of its parsed rows that stays the same whatever
file they are saved in.

The ledger ties the content a release reads to one source (``content_claims``). Keyed by the
file's bytes alone, the same rows saved with CRLF line ends, quoted differently, with the
columns in another order or re-exported as Parquet looked like new data and opened a fresh
budget (issue 36, cases 5 and 6). The *row digest* is a function of the multiset of rows of
the columns the release validates (``medrelease.data.input_schema.schema_columns``), each value as text:

* the columns are taken in name order, so their order in the file does not matter;
* each row is its values joined by U+001F, a missing value written as U+0000 (the input
  schema refuses control characters in these columns, so the joining is unambiguous for any
  extract a release accepts);
* each row's MD5 (128 bits) is split into two 64-bit halves, and each half is summed over
  all rows: sums do not depend on the order of the rows, and the parts of an extract read in
  chunks add up to the whole;
* the digest is the SHA-256 of a version tag, the column names, the row count and the two
  sums.

Numbers are compared as numbers (issue 56, hole 2): in a column the release reads as numbers
(``type: integer`` or ``decimal``, or a dimension with a numeric taxonomy) a plain decimal is
written in one spelling before it is hashed — ``088``, ``88.0``, ``+88``, `` 88 `` and ``٨٨``
are all ``88``, ``0.50`` is ``0.5``, ``-0`` is ``0`` — exactly the values the release's own
parser (``binning``) takes as the same number; anything else, and every text column (codes such
as ``088`` stay text), is hashed as it is written. The version tag did not change: an extract
whose numbers were already written that way keeps the digest earlier versions recorded. An
extract with other spellings also has its *text digest* (every value as written, what earlier
versions took as its row digest) claimed beside it (``ResolvedExtract.claims``), so a ledger
that recorded it under that digest still recognizes a copy.

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

import functools
import hashlib
import logging
import re
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from medrelease.data.binning import NUMERIC_TYPES
from medrelease.data.config import DatasetConfig
from medrelease.data.duckdb_read import duckdb_memory_limit, extract_scan, identifier, literal

LOG = logging.getLogger(__name__)

VERSION = "medrelease-rows-v1"
SEPARATOR = "\x1f"
MISSING = "\x00"
HALF = (1 << 64) - 1

# One spelling per number (``number_text``), the same in Python and in DuckDB's SQL. What the
# release's parser takes as a number (``binning.DECIMAL``: Python's ``\s`` and ``\d``, so any
# white space at the ends and any decimal digit, ``٨٨`` included) is trimmed of the characters
# ``str.strip`` removes and its digits mapped to ASCII before the ASCII pattern is applied.
CANONICAL = re.compile(r"0|-?[1-9][0-9]*(\.[0-9]*[1-9])?|-?0\.[0-9]*[1-9]")
PLAIN_DECIMAL = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)")


@dataclass(frozen=True)
class _Characters:
    whitespace: str  # what str.strip() removes (Python's \s)
    digits: str  # every decimal digit (Python's \d, Unicode category Nd)
    ascii_digits: str  # the value of each, as an ASCII digit
    to_ascii: dict[int, int]


@functools.cache
def _characters() -> _Characters:
    """Built once, when a digest is first taken (a pass over every code point: 0.2 s), so
    that the Unicode tables are Python's own, whichever version runs."""
    codes = [chr(c) for c in range(sys.maxunicode + 1)]
    digits = "".join(c for c in codes if unicodedata.category(c) == "Nd")
    ascii_digits = "".join(str(unicodedata.digit(c)) for c in digits)
    return _Characters("".join(c for c in codes if c.isspace()), digits, ascii_digits,
                       str.maketrans(digits, ascii_digits))


@dataclass(frozen=True)
class RowSums:
    """The order-free sums of an extract's row hashes (they add up across chunks): of the rows
    with numbers in one spelling (``high``, ``low``: the row digest) and of the rows as written
    (``text_high``, ``text_low``: the text digest; equal to the first where every number was
    already written in its one spelling)."""

    rows: int = 0
    high: int = 0
    low: int = 0
    text_high: int = 0
    text_low: int = 0

    def __add__(self, other: RowSums) -> RowSums:
        return RowSums(self.rows + other.rows, self.high + other.high, self.low + other.low,
                       self.text_high + other.text_high, self.text_low + other.text_low)


@dataclass(frozen=True)
class DigestSpec:
    """What the digest covers: its columns (in name order) and those read as numbers."""

    columns: tuple[str, ...]
    numeric: frozenset[str] = frozenset()


def digested_columns(config: DatasetConfig) -> list[str]:
    """The columns the digest covers: those the release validates, in name order."""
    from medrelease.data.input_schema import schema_columns

    return sorted(set(schema_columns(config)))


def numeric_columns(config: DatasetConfig) -> frozenset[str]:
    """The digested columns whose values the release reads as numbers: declared ``integer``
    or ``decimal``, or a dimension whose taxonomy is numeric (its values are parsed and
    binned). A taxonomy that cannot be loaded counts as text here: its release is refused
    anyway, naming it."""
    from medrelease.errors import MedreleaseError

    numeric = {c for c in digested_columns(config) if config.columns[c].type in NUMERIC_TYPES}
    try:
        taxonomies = config.taxonomies
    except (MedreleaseError, OSError, ValueError):
        taxonomies = {}
    numeric |= {c for c in config.dimensions if c in taxonomies and (
        taxonomies[c].kind == "numeric" or taxonomies[c].binning is not None)}
    return frozenset(numeric)


def digest_spec(config: DatasetConfig) -> DigestSpec:
    """The digest's columns and its numeric ones, for ``config``."""
    return DigestSpec(tuple(digested_columns(config)), numeric_columns(config))


def row_digest(config: DatasetConfig, source: Path) -> str | None:
    """The row digest of ``source`` read as ``config`` says, or ``None`` when it cannot be
    parsed (the release's validation then refuses it, naming the problem)."""
    digests = row_digests(config, source)
    return digests[0] if digests else None


def row_digests(config: DatasetConfig, source: Path) -> tuple[str, ...]:
    """The row digest of ``source`` and, when it differs, its text digest (the row digest
    of earlier versions, which a ledger may hold); empty when it cannot be parsed."""
    spec = digest_spec(config)
    sums = _duckdb_sums(config, source, spec)
    if sums is None:
        sums = _row_wise_sums(config, source, spec)
    return () if sums is None else digests_of(list(spec.columns), sums)


def table_digests(source: Path, column_sets: list[list[str]], fmt: str = "csv",
                  delimiter: str = ",", encoding: str = "utf-8") -> tuple[str, ...]:
    """A relational dataset's child table's row digests, one per column set (each sorted by
    name, as ``digested_columns``; values as text): the same rows in another format, line
    ends, quoting or column order give the same digests. Empty when the file cannot be read
    (its validation refuses it then, naming the problem)."""
    import pandas as pd

    wanted = sorted({c for columns in column_sets for c in columns})
    try:
        if fmt == "parquet":
            frame = pd.read_parquet(source, columns=wanted).astype("string")
        else:
            frame = pd.read_csv(source, usecols=wanted, dtype=str, keep_default_na=False,
                                sep=delimiter, encoding=encoding)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        LOG.info("a table could not be read for its row digest (%s)", type(exc).__name__)
        return ()
    frame = frame.mask(frame == "")
    if frame.empty:  # a table without rows: its digest is every such table's (no claim)
        return ()
    out: list[str] = []
    for columns in column_sets:
        columns = sorted(columns)
        out.extend(digests_of(columns, frame_sums(frame, columns)))
    return tuple(dict.fromkeys(out))


def digest_of(columns: list[str], sums: RowSums) -> str:
    """The row digest (numbers in one spelling)."""
    return _digest(columns, sums.rows, sums.high, sums.low)


def digests_of(columns: list[str], sums: RowSums) -> tuple[str, ...]:
    """The row digest, and the text digest after it when the two differ."""
    rows = digest_of(columns, sums)
    text = _digest(columns, sums.rows, sums.text_high, sums.text_low)
    return (rows,) if text == rows else (rows, text)


def _digest(columns: list[str], rows: int, high: int, low: int) -> str:
    text = f"{VERSION}\n{SEPARATOR.join(columns)}\n{rows}:{high}:{low}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def number_text(text: str) -> str:
    """A number's one spelling (``088``, `` +88.0 `` -> ``88``; ``-0.50`` -> ``-0.5``); any
    other text as it is. ``number_sql`` is the same in SQL."""
    if CANONICAL.fullmatch(text):
        return text
    plain = text.strip().translate(_characters().to_ascii)
    if not PLAIN_DECIMAL.fullmatch(plain):
        return text
    sign = "-" if plain.startswith("-") else ""
    whole, _, fraction = plain.lstrip("+-").partition(".")
    whole, fraction = whole.lstrip("0") or "0", fraction.rstrip("0")
    number = whole + ("." + fraction if fraction else "")
    return "0" if number == "0" else sign + number


def canonical_sql(value: str) -> str:
    """SQL: the text ``value`` is a number in its one spelling (``CANONICAL``). Digits alone
    without a leading zero are told by two globs first, twice as fast as the pattern (an
    integer column is mostly that)."""
    return (f"(({value} GLOB '[1-9]*' AND NOT {value} GLOB '*[!0-9]*') OR {value} = '0' "
            f"OR regexp_full_match({value}, {literal(CANONICAL.pattern)}))")


def number_sql(value: str) -> str:
    """``number_text`` of the SQL text expression ``value`` (NULL stays NULL)."""
    chars = _characters()
    plain = f"translate(trim({value}, {literal(chars.whitespace)}), {literal(chars.digits)}, " \
            f"{literal(chars.ascii_digits)})"
    body = f"ltrim({plain}, '+-')"
    whole = f"coalesce(nullif(ltrim(split_part({body}, '.', 1), '0'), ''), '0')"
    fraction = f"rtrim(split_part({body}, '.', 2), '0')"
    number = f"({whole} || CASE WHEN {fraction} = '' THEN '' ELSE '.' || {fraction} END)"
    return (f"CASE WHEN {value} IS NULL THEN NULL "
            f"WHEN {canonical_sql(value)} THEN {value} "
            f"WHEN regexp_full_match({plain}, {literal(PLAIN_DECIMAL.pattern)}) THEN "
            f"CASE WHEN {number} = '0' THEN '0' ELSE "
            f"(CASE WHEN starts_with({plain}, '-') THEN '-' ELSE '' END) || {number} END "
            f"ELSE {value} END")


def row_text_sql(columns: list[str] | tuple[str, ...],
                 numeric: frozenset[str] = frozenset(),
                 spelled: dict[str, str] | None = None) -> str:
    """The SQL expression of a row's text over ``columns`` (in the order given: the digest's
    name order), each value cast to text (a ``numeric`` column's number in its one spelling,
    or the column ``spelled`` names for it, which holds that), missing as U+0000, joined by
    U+001F."""
    def text(column: str) -> str:
        if spelled and column in spelled:
            return spelled[column]
        value = f"CAST({identifier(column)} AS VARCHAR)"
        return number_sql(value) if column in numeric else value

    return f" || chr({ord(SEPARATOR)}) || ".join(
        f"coalesce({text(c)}, chr({ord(MISSING)}))" for c in columns)


SAME = "__medrelease_as_written"


def digest_query(spec: DigestSpec, source: str, rows_as: str = "h", text_as: str = "t") -> str:
    """SQL: every column of the table expression ``source`` and a row's two MD5 numbers,
    ``rows_as`` (numbers in one spelling: the row digest's) and ``text_as`` (as written: the
    text digest's). Each number's spelling is taken once, in an inner query; the text hash
    is computed only for the rows where a number was spelled otherwise (the first elsewhere).
    """
    numeric = [c for c in spec.columns if c in spec.numeric]
    if not numeric:
        hashed = f"md5_number({row_text_sql(spec.columns)})"
        return f"SELECT *, {hashed} AS {rows_as}, {hashed} AS {text_as} FROM {source}"
    spelled = {c: f'"__medrelease_number_{i}"' for i, c in enumerate(numeric)}
    inner = ("SELECT *, " + ", ".join(
        f"{number_sql(f'CAST({identifier(c)} AS VARCHAR)')} AS {name}"
        for c, name in spelled.items()) + f" FROM {source}")
    same = " AND ".join(f"CAST({identifier(c)} AS VARCHAR) IS NOT DISTINCT FROM {name}"
                        for c, name in spelled.items())
    middle = (f"SELECT *, md5_number({row_text_sql(spec.columns, spelled=spelled)}) AS "
              f"{rows_as}, ({same}) AS {SAME} FROM ({inner})")
    return (f"SELECT * EXCLUDE ({', '.join(spelled.values())}, {SAME}), CASE WHEN {SAME} THEN "
            f"{rows_as} ELSE md5_number({row_text_sql(spec.columns)}) END AS {text_as} "
            f"FROM ({middle})")


def hash_halves_sql(hashed: str) -> tuple[str, str]:
    """SQL for the two 64-bit halves, as UBIGINT, of the MD5 ``hashed`` names (an alias bound
    to ``md5_number`` of a row's text)."""
    return f"({hashed} >> 64)::UBIGINT", f"({hashed} & {HALF}::UHUGEINT)::UBIGINT"


def weighted_row_sums(weights: np.ndarray, high: np.ndarray, low: np.ndarray,
                      text_high: np.ndarray | None = None,
                      text_low: np.ndarray | None = None) -> RowSums:
    """The sums of a table of distinct rows each occurring ``weights`` times, given each
    distinct row's hash halves (and its text hash's, the same when not given): what summing
    the hashes of every row gives, exactly.

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

    high_sum, low_sum = total(high), total(low)
    if text_high is None or text_low is None:
        return RowSums(rows, high_sum, low_sum, high_sum, low_sum)
    return RowSums(rows, high_sum, low_sum, total(text_high), total(text_low))


def _duckdb_sums(config: DatasetConfig, source: Path, spec: DigestSpec) -> RowSums | None:
    """One streamed DuckDB pass over the file as the grouped count reads it (same scan)."""
    import duckdb

    scan = extract_scan(config, source, list(spec.columns))
    if scan is None:
        return None
    sums = ", ".join(f"coalesce(sum({half}), 0)::HUGEINT"
                     for name in ("h", "t") for half in hash_halves_sql(name))
    query = f"SELECT count(*)::BIGINT, {sums} FROM ({digest_query(spec, scan)})"
    connection = duckdb.connect(config={"memory_limit": duckdb_memory_limit()})
    try:
        connection.execute("SET enable_progress_bar = false")
        rows, *halves = connection.execute(query).fetchone()
    except Exception as exc:  # DuckDB's message quotes the file; only its kind is kept
        LOG.info("DuckDB declined the extract for its row digest (%s); hashing it row-wise",
                 type(exc).__name__)
        return None
    finally:
        connection.close()
    return RowSums(int(rows), *(int(h) for h in halves))


def _row_wise_sums(config: DatasetConfig, source: Path, spec: DigestSpec) -> RowSums | None:
    """The same sums from the chunks the row-wise pass reads (slower: hashed in Python)."""
    from medrelease.storage.io import iter_chunks

    total = RowSums()
    try:
        for chunk in iter_chunks(config, source):
            if not set(spec.columns) <= set(chunk.columns):
                return None
            total = total + frame_sums(chunk, list(spec.columns), spec.numeric)
    except Exception as exc:  # the release's validation reports it, with file lines
        LOG.info("the extract could not be read for its row digest (%s)", type(exc).__name__)
        return None
    return total


def frame_sums(frame: pd.DataFrame, columns: list[str],
               numeric: frozenset[str] = frozenset()) -> RowSums:
    """The row sums of a frame's ``columns`` (values as text, a ``numeric`` column's numbers
    in their one spelling, missing as U+0000), and of the rows as written."""
    if frame.empty:
        return RowSums()
    written = [frame[c].map(_text, na_action="ignore").fillna(MISSING).astype(str)
               for c in columns]
    texts = [w.map(number_text) if c in numeric else w
             for c, w in zip(columns, written, strict=True)]
    high, low = _hash_sums(_joined(texts))
    if all(t is w for t, w in zip(texts, written, strict=True)) or all(
            t.equals(w) for t, w in zip(texts, written, strict=True)):
        return RowSums(len(frame), high, low, high, low)
    text_high, text_low = _hash_sums(_joined(written))
    return RowSums(len(frame), high, low, text_high, text_low)


def _joined(texts: list[pd.Series]) -> pd.Series:
    return texts[0].str.cat(texts[1:], sep=SEPARATOR) if len(texts) > 1 else texts[0]


def _hash_sums(joined: pd.Series) -> tuple[int, int]:
    high = low = 0
    for text in joined:
        value = int.from_bytes(hashlib.md5(text.encode("utf-8"),
                                           usedforsecurity=False).digest(), "little")
        high += value >> 64
        low += value & HALF
    return high, low


def _text(value: object) -> str:
    """A value as DuckDB casts it to text (the cases a text or integer column holds)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
