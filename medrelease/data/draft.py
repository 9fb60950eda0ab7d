"""``medrelease init``: a first dataset config drafted from the table itself.

A steward with a CSV should not have to learn the config format before a first release. One
DuckDB pass reads the file into memory (all columns as text, strictly: a file it cannot parse
is refused with the line and column); per column a handful of aggregates (present values,
distinct values, how many look like whole numbers, decimals, ISO dates or codes, lengths,
spaces) decide its role and its taxonomy:

* an id-like column (named like an id, or unique) is an ``identifier``; the one with the fewest
  ids whose rows repeat becomes the privacy unit;
* free text and very high cardinality are dropped, with the reason;
* whole numbers with few distinct values (flags, small codes: at most ``MAX_VALUE_LIST``) get
  a value list of exactly the values found, not bands (a band 0-2 over a 0/1 flag lets a
  mechanism that draws within bands write a 2);
* other numbers get leaves from the data's minimum to its maximum (no leaf outside them: a
  synthetic age is never below the youngest patient's) and nested round bands above them
  where the range leaves room for any (the reason says how many)
  (1 -> 5 -> 10 -> 20 -> ``*``);
* code-like text (letters and digits, e.g. ICD) gets prefix levels that group something, or
  the shipped ICD-9 taxonomy when every code is an ICD-9 code; dates (ISO, and the common other
  ways: 31/01/2020, 20200131, 31-Jan-2020, 2020-01) get day -> month -> year in the column's
  own format; the rest is flat;
* what a release cannot hold as written is dropped with the reason (issue 55): numbers with an
  exponent, dates with a time of day, values with a line break; an id with blanks or NA is
  never the privacy unit; where no column besides the informative one is left, init says so
  and writes nothing. Whatever is drafted passes ``medrelease check`` and releases with the
  registry's default mechanism (``tests/unit/test_any_table.py``: 200 generated tables);
* a person's id different in every row: one row is one person, in the steward's nouns
  (``row_noun`` = ``unit_noun``: the guarantee protects one patient, without the caveat);
* the informative column's domain is the shipped ICD-9 list where that fits, else the values
  found, in a file whose first line marks it as read from the data (the guarantee says so
  until the steward sets ``domain_reviewed: true``, which this module never writes); every
  dimension taxonomy that lists values found or spans the data's range carries the same mark,
  with the same consequence (``DatasetConfig.taxonomies_read_from_data``);
* ``--analysis`` column lists become ``analyses:`` (a column the table lacks, or one drafted as
  an identifier or dropped, is refused before anything is written); without them the informative
  column against each dimension is suggested, commented out, with an ``impossible:`` example
  and ``expected_rows`` (the row count to two significant digits: a planning figure);
* blanks: a ``(blank)`` category in a dimension; in the informative column ``missing:
  drop_rows`` when they are few, else a ``(blank)`` value of its domain.

A relational dataset (``--child CSV --key COL``, issue 58) is drafted by ``draft_relational``:
the parent table's key is the privacy unit, each child references the earlier table keyed by
its ``--key``, its ``max_children`` is read from the data and flagged for review (see the
section "relational datasets" below).

Everything the module decides from the data is listed for review. Nothing is overwritten. The
console never shows a value of the table (counts, column names and line numbers only).
"""

from __future__ import annotations

import csv
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

from medrelease.data.binning import DECIMAL, NUMERIC_TYPES, WHOLE, canonical_number
from medrelease.data.config import DATASET_NAME, READ_FROM_DATA_MARK
from medrelease.data.duckdb_read import identifier, literal, strict_csv_scan
from medrelease.errors import ConfigError, InputValidationError
from medrelease.settings import project_root

if TYPE_CHECKING:
    import pandas as pd

BLANK = "(blank)"
EXPONENT = r"\s*[+-]?(\d+(\.\d*)?|\.\d+)[eE][+-]\d+\s*"
# What spreadsheets and pandas write for a missing value (medrelease/data/input_schema.py BLANK_LOOKING): a
# privacy unit's id must name someone, so a column holding them is never the unit.
BLANK_MARKERS = ("#n/a", "#n/a n/a", "#na", "-1.#ind", "-1.#qnan", "-nan", "1.#ind", "1.#qnan",
                 "<na>", "n/a", "na", "nan", "nat", "null", "none", "")
CANDIDATE_DELIMITERS = (",", ";", "\t", "|")
ISO_DATE = r"\d{4}-\d{2}-\d{2}"
CODE = r"[A-Za-z]{0,3}[0-9][0-9A-Za-z.]{0,9}"
ID_NAME = re.compile(r"(?i)(^id$|[_\- ]id$|^id[_\- ]|[a-z]Id$|(^|[_\- ])(key|no|nr|number|mrn|"
                     r"ssn)$|^(subject|patient|person|hadm|encounter|visit|case)(_?id)?$)")
MAX_FINE_LEAVES = 200          # a numeric column's finest level: at most about this many bins
MAX_FLAT_VALUES = 500          # more distinct text values than this, and not a code: dropped
# A whole-number column with at most this many distinct values is a flag or a code (0/1, sex
# 1/2, a stage 1..4, a month 1..12): a value list of exactly the values found, not bands. Twelve
# keeps a month; a measurement (an age, a count of days) has more values in any real table.
MAX_VALUE_LIST = 12
MAX_ANALYSIS_COLUMNS = 4       # columns of one declared analysis (AnalysisSpec)
MAX_ANALYSES = 50              # declared analyses (DatasetConfig.analyses)
RELEASED_ROLES = ("dimension", "informative")
MAX_DOMAIN_VALUES = 20_000     # an informative column with more distinct values is refused
LATTICE_LIMIT = 20_000         # the policy's default max_lattice_nodes
FEW_BLANKS = 0.03              # informative blanks up to this share: missing: drop_rows
UNIT_BOUNDS = (1, 2, 3, 4, 5, 10, 20, 50)
UNIT_KEEPS = 0.9               # the smallest bound that keeps this share of the rows
UNIT_NOUNS = (("patient", ("patient", "subject", "person", "pid", "mrn", "member")),
              ("admission", ("admission", "hadm", "stay")), ("visit", ("visit",)),
              ("encounter", ("encounter",)), ("case", ("case",)),
              ("household", ("household",)), ("client", ("client", "customer")))


class DraftError(ConfigError):
    """The table cannot be drafted as asked (the message says what to change)."""


class InformativeNeeded(DraftError):
    """No informative column was named and none can be asked for: the candidates are listed."""

    def __init__(self, message: str, candidates: list[str]) -> None:
        super().__init__(message)
        self.candidates = candidates


@dataclass(frozen=True)
class ColumnProfile:
    """What one pass learned about a column: counts and bounds, never shown as values."""

    name: str
    rows: int
    present: int
    distinct: int
    whole: int           # present values written as whole numbers ("3", "3.0")
    decimal: int         # present values written as plain decimals
    dates: int           # present values that are ISO dates (YYYY-MM-DD)
    codes: int           # present values shaped like codes (letters and digits)
    lettered: int        # present values with a letter
    leading_zero: int    # present values starting with 0 and another digit
    spaced: int          # present values containing a space
    listed: int          # present values holding '|' (a list of items in one cell)
    mean_length: float
    decimal_places: int
    numbers: int         # distinct numeric values (3 and 3.0 are one)
    minimum: float | None
    maximum: float | None
    first_date: date | None
    last_date: date | None
    values: tuple[str, ...] | None = None  # distinct values, when few enough to list
    exponents: int = 0       # present values that are numbers with an exponent (1.2e+05)
    blank_looking: int = 0   # present values that read as a missing-value marker (NA, null)
    controls: int = 0        # present values with a control character (a line break, a tab)
    date_format: str | None = None  # every value a date in this format (besides ISO dates)

    @property
    def blanks(self) -> int:
        return self.rows - self.present

    @property
    def kind(self) -> str:
        """numeric, date, code, text or empty: how the column is written."""
        if not self.present:
            return "empty"
        if self.listed > self.present / 2:
            return "list"
        if self.dates == self.present or self.date_format is not None:
            return "date"
        if self.exponents and self.exponents + self.decimal == self.present:
            return "exponent"
        if self.codes == self.present and (self.lettered or self.leading_zero):
            return "code"
        if self.decimal == self.present:
            return "integer" if self.whole == self.present else "decimal"
        return "text"

    @property
    def unique(self) -> bool:
        return self.present == self.rows and self.distinct == self.rows


@dataclass(frozen=True)
class TableProfile:
    """The table's columns (in file order), rows, delimiter and ids' rows per id."""

    path: Path
    delimiter: str
    rows: int
    columns: tuple[ColumnProfile, ...]
    rows_kept_by_bound: dict[str, dict[int, float]] = field(default_factory=dict)

    def column(self, name: str) -> ColumnProfile:
        return next(c for c in self.columns if c.name == name)


@dataclass
class ColumnDraft:
    """One column of the drafted config and the files it needs."""

    name: str
    role: str
    reason: str
    type: str = "string"
    taxonomy: str | None = None          # file name (relative to the dataset folder)
    domain: str | None = None
    missing: str | None = None
    files: dict[str, str] = field(default_factory=dict)  # file name -> text to write
    read_from_data: bool = False         # its taxonomy or domain lists values found
    levels: int = 0                      # taxonomy height (lattice levels - 1)
    values: list[str] | None = None      # a relational child table's column: listed values


@dataclass
class DatasetDraft:
    """A whole drafted config: what ``write`` puts on disk and what the steward reviews."""

    name: str
    folder: Path
    input_path: str
    delimiter: str
    rows: int
    columns: list[ColumnDraft]
    dataset_missing: str
    unit: str | None
    max_rows_per_unit: int
    unit_noun: str
    row_noun: str
    review: list[str]
    lattice_nodes: int
    analyses: list[list[str]] = field(default_factory=list)  # --analysis, checked

    def yaml_text(self) -> str:
        return _yaml_text(self)

    def files(self) -> dict[str, str]:
        written = {"dataset.yaml": self.yaml_text()}
        for column in self.columns:
            written.update(column.files)
        return written


# -- one pass over the file ---------------------------------------------------------------


def sniff_delimiter(path: Path) -> str:
    """The delimiter that splits the first lines into the same number (>1) of fields."""
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            head = [handle.readline() for _ in range(20)]
    except UnicodeDecodeError:
        return ","  # the parse check names the line and column
    best, fields = ",", 1
    for delimiter in CANDIDATE_DELIMITERS:
        counts = {len(row) for row in csv.reader([line for line in head if line.strip()],
                                                 delimiter=delimiter)}
        if len(counts) == 1 and (count := counts.pop()) > fields:
            best, fields = delimiter, count
    return best


def _header(path: Path, delimiter: str) -> list[str]:
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:
            header = next(csv.reader(handle, delimiter=delimiter), [])
    except (UnicodeDecodeError, csv.Error):
        raise DraftError(f"{path.name}: {locate_parse_problem(path, delimiter)}") from None
    if not header:
        raise DraftError(f"{path.name} is empty: nothing to draft from")
    blank = [i + 1 for i, name in enumerate(header) if not name.strip()]
    if blank:
        raise DraftError(f"{path.name}: line 1, column {blank[0]} has no column name; every "
                         "column needs a name in the header")
    repeated = sorted({n for n in header if header.count(n) > 1})
    if repeated:
        raise DraftError(f"{path.name}: the header repeats column name(s) "
                         f"{', '.join(map(repr, repeated))}; rename them")
    return header


def locate_parse_problem(path: Path, delimiter: str) -> str:
    """Where a CSV first stops being one: line and column, never the text found there."""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                column = len(raw[:exc.start].decode("utf-8", errors="replace")) + 1
                return (f"line {number}, column {column} (character position) is not UTF-8 "
                        "text; save the file as UTF-8")
    with path.open(encoding="utf-8-sig", newline="") as handle:
        reader = csv.reader(handle, delimiter=delimiter, strict=True)
        width = None
        try:
            for fields in reader:
                if width is None:
                    width = len(fields)
                elif fields and len(fields) != width:
                    where = (f"column {width + 1} is one too many" if len(fields) > width
                             else f"columns {len(fields) + 1} to {width} are missing")
                    return (f"line {reader.line_num} has {len(fields)} fields where the "
                            f"header has {width}: {where} (a delimiter {delimiter!r} or a "
                            "quote inside a value?)")
        except csv.Error as exc:
            line = reader.line_num
            return (f"line {line}, column {_field_of_stray_quote(path, line, delimiter)}: "
                    f"{str(exc).split(':')[0]} (quote the whole value, and double a quote "
                    "inside it)")
    return "a line could not be read as CSV (check quotes and the delimiter)"


def _field_of_stray_quote(path: Path, line: int, delimiter: str) -> int:
    """The field (1-based) of a physical line where a quote stands inside an unquoted value."""
    with path.open(encoding="utf-8-sig", newline="") as handle:
        text = next((t for number, t in enumerate(handle, start=1) if number == line), "")
    column, quoted, start = 1, False, True
    for char in text:
        if char == '"':
            if start:
                quoted = True
            elif not quoted:
                return column
            else:
                quoted = False
        elif char == delimiter and not quoted:
            column, start = column + 1, True
            continue
        start = False
    return column


def profile_csv(path: Path, delimiter: str | None = None,
                value_limit: int = MAX_DOMAIN_VALUES) -> TableProfile:
    """Read ``path`` once with DuckDB (strictly, all text) and profile every column."""
    import duckdb

    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        raise DraftError(f"{path} is not a file with content: nothing to draft from")
    delimiter = delimiter or sniff_delimiter(path)
    header = _header(path, delimiter)
    scan = strict_csv_scan(path, header, delimiter, encoding="utf-8")
    connection = duckdb.connect()
    try:
        try:
            connection.execute(f"CREATE TABLE extract AS SELECT * FROM {scan}")
        except duckdb.Error:  # its message quotes the line: only where it is, from Python
            raise DraftError(f"cannot read {path.name} as CSV with delimiter {delimiter!r}: "
                             f"{locate_parse_problem(path, delimiter)}") from None
        rows = connection.execute("SELECT count(*) FROM extract").fetchone()[0]
        if not rows:
            raise DraftError(f"{path.name} has a header but no rows: nothing to draft from")
        stats = connection.execute(
            "SELECT " + ", ".join(_column_stats(n) for n in header) + " FROM extract").fetchone()
        per_column = 20
        profiles = []
        listed = []
        for i, name in enumerate(header):
            part = stats[i * per_column:(i + 1) * per_column]
            profiles.append(_profile(name, rows, part))
            if 0 < part[1] <= value_limit:
                listed.append(name)
        values = _distinct_values(connection, listed)
        profiles = [_with_values(p, values.get(p.name)) for p in profiles]
        bounds = _rows_kept_by_bound(connection, [p for p in profiles if _id_like(p)])
    finally:
        connection.close()
    return TableProfile(path.resolve(), delimiter, rows, tuple(profiles), bounds)


def _column_stats(name: str) -> str:
    q = identifier(name)
    trimmed = f"trim({q})"
    number = f"TRY_CAST(CASE WHEN regexp_full_match({q}, {literal(DECIMAL.pattern[1:-1])}) " \
             f"THEN {trimmed} END AS DOUBLE)"
    is_date = f"(regexp_full_match({q}, {literal(ISO_DATE)}) AND " \
              f"try_strptime({q}, '%Y-%m-%d') IS NOT NULL)"
    places = (f"max(CASE WHEN contains({trimmed}, '.') THEN "
              f"length(rtrim(split_part({trimmed}, '.', 2), '0')) ELSE 0 END)")
    return ", ".join([
        f"count({q})", f"count(DISTINCT {q})",
        f"count_if(regexp_full_match({q}, {literal(WHOLE.pattern[1:-1])}))",
        f"count_if(regexp_full_match({q}, {literal(DECIMAL.pattern[1:-1])}))",
        f"count_if({is_date})",
        f"count_if(regexp_full_match({q}, {literal(CODE)}))",
        f"count_if(regexp_matches({q}, '[A-Za-z]'))",
        f"count_if(regexp_matches({q}, '^0[0-9]'))",
        f"count_if(contains({q}, ' '))", f"count_if(contains({q}, '|'))",
        f"coalesce(avg(length({q})), 0)", places,
        f"count(DISTINCT {number})", f"min({number})", f"max({number})",
    ]) + (f", min(CASE WHEN {is_date} THEN {q} END), max(CASE WHEN {is_date} THEN {q} END)"
          f", count_if(regexp_full_match({q}, {literal(EXPONENT)}))"
          f", count_if(lower({trimmed}) IN ({', '.join(literal(v) for v in BLANK_MARKERS)}))"
          f", count_if(regexp_matches({q}, '[\\x00-\\x1f\\x7f]'))")


def _profile(name: str, rows: int, part: tuple) -> ColumnProfile:
    (present, distinct, whole, decimal, dates, codes, lettered, leading_zero, spaced, listed,
     mean_length, places, numbers, minimum, maximum, first, last, exponents, blank_looking,
     controls) = part
    # (DuckDB's count_if over a column of blanks is NULL, not 0)
    whole, decimal, dates, codes, lettered, leading_zero, spaced, listed = (
        int(n or 0) for n in (whole, decimal, dates, codes, lettered, leading_zero, spaced,
                              listed))
    return ColumnProfile(name, rows, present, distinct, whole, decimal, dates, codes, lettered,
                         leading_zero, spaced, listed, float(mean_length), int(places or 0),
                         int(numbers), minimum, maximum,
                         date.fromisoformat(first) if dates == present and first else None,
                         date.fromisoformat(last) if dates == present and last else None,
                         exponents=int(exponents or 0),
                         blank_looking=int(blank_looking or 0), controls=int(controls or 0))


def _with_values(profile: ColumnProfile, values: list[str] | None) -> ColumnProfile:
    if values is None:
        return profile
    fields = {**profile.__dict__, "values": tuple(sorted(values))}
    if profile.dates < profile.present and (found := date_format_of(values)) is not None:
        fields["date_format"], fields["first_date"], fields["last_date"] = found
    return ColumnProfile(**fields)


# Dates as stewards' files write them (ISO dates are found by the profile's own pass); the
# first format every distinct value parses in wins, day before month where both read.
DATE_FORMATS = ("%d/%m/%Y", "%m/%d/%Y", "%Y/%m/%d", "%d.%m.%Y", "%d-%m-%Y", "%Y%m%d",
                "%d-%b-%Y", "%d %b %Y", "%b %d %Y", "%Y-%m")
DATE_SHAPE = re.compile(r"^(\d{1,4}[-/. ]\d{1,2}[-/. ]\d{2,4}|\d{8}|\d{1,2}[- ][A-Za-z]{3}[- ]"
                        r"\d{4}|[A-Za-z]{3} \d{1,2} \d{4}|\d{4}-\d{2})$")
FIRST_YEAR, LAST_YEAR = 1800, 2200
DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[ T]\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?\s*$")


def date_format_of(values: Sequence[str]) -> tuple[str, date, date] | None:
    """The format every one of ``values`` is a date in (a year between 1800 and 2200), with
    the first and last date; None when no format reads them all. Text is matched as written:
    a taxonomy drafted from it lists every day in this format."""
    from datetime import datetime

    texts = [str(v) for v in values]
    if not texts or not all(DATE_SHAPE.match(t) for t in texts):
        return None
    for fmt in DATE_FORMATS:
        days = []
        for text in texts:
            try:
                day = datetime.strptime(text, fmt).date()
            except ValueError:
                break
            if not FIRST_YEAR <= day.year <= LAST_YEAR or day.strftime(fmt) != text:
                break  # (a value written otherwise than the format writes it: 1/2/2020)
            days.append(day)
        else:
            return fmt, min(days), max(days)
    return None


def _distinct_values(connection, names: list[str]) -> dict[str, list[str]]:
    if not names:
        return {}
    lists = connection.execute(
        "SELECT " + ", ".join(f"list(DISTINCT {identifier(n)})" for n in names)
        + " FROM extract").fetchone()
    return {n: [v for v in values if v is not None] for n, values in zip(names, lists,
                                                                          strict=True)}


def _rows_kept_by_bound(connection, ids: list[ColumnProfile]) -> dict[str, dict[int, float]]:
    """Per id-like column whose rows repeat: the share of rows each candidate bound keeps."""
    kept: dict[str, dict[int, float]] = {}
    for profile in ids:
        if profile.distinct >= profile.present:
            continue
        q = identifier(profile.name)
        sums = ", ".join(f"sum(least(n, {m}))" for m in UNIT_BOUNDS)
        row = connection.execute(
            f"SELECT sum(n), {sums} FROM (SELECT count(*) AS n FROM extract WHERE {q} IS NOT "
            f"NULL GROUP BY {q})").fetchone()
        kept[profile.name] = {m: float(row[i + 1]) / float(row[0])
                              for i, m in enumerate(UNIT_BOUNDS)}
    return kept


# -- decisions ------------------------------------------------------------------------------


def _id_like(profile: ColumnProfile) -> bool:
    """Named like an id with many values, or unique (and not a measurement or a date)."""
    if profile.kind in ("decimal", "date", "empty", "list", "exponent") or _date_times(profile):
        return False
    named = bool(ID_NAME.search(profile.name)) and profile.distinct > max(20, profile.rows // 50)
    unique = profile.unique and profile.rows >= 20 and profile.spaced == 0
    if profile.kind == "integer" and not named:
        # all-different whole numbers are a measurement (an income), not an id, unless they
        # run one after the other (row numbers)
        return unique and profile.minimum is not None and profile.maximum is not None and \
            profile.maximum - profile.minimum + 1 == profile.distinct
    return named or unique


def _free_text_reason(profile: ColumnProfile) -> str | None:
    if profile.kind != "text":
        return None
    if profile.spaced > profile.present / 2 and profile.distinct > max(20, profile.present / 4):
        return "free text (most values have spaces, most are different)"
    if profile.mean_length > 40:
        return "free text (long values)"
    if profile.distinct > MAX_FLAT_VALUES:
        return (f"{profile.distinct:,} distinct values: too many for a taxonomy drafted "
                "without knowing the column (write one by hand to keep it)")
    if profile.values is not None and any(_unfit_leaf(v) for v in profile.values):
        return "values a taxonomy file cannot hold (';' or spaces around the value)"
    return None


def _unfit_leaf(value: str) -> bool:
    return ";" in value or value != value.strip() or value.startswith("#")


def round_widths() -> list[Decimal]:
    """1, 2, 5 times the powers of ten, from 10^-6 to 10^15."""
    return [Decimal(m).scaleb(k) for k in range(-6, 16) for m in (1, 2, 5)]


def _nested_widths(resolution: Decimal, span: float, most: int = 3) -> list[Decimal]:
    """Round widths above the leaves', each a multiple of the one below (so bands nest):
    5x the leaves' first, then at least 2x, while a band is narrower than the data's range."""
    widths: list[Decimal] = []
    current = resolution
    for width in round_widths():
        if len(widths) == most or width >= Decimal(str(span)):
            break
        factor = 5 if not widths else 2
        if width >= current * factor and width % current == 0:
            widths.append(width)
            current = width
    return widths


def _number_text(value: Decimal) -> str:
    text = f"{value.normalize():f}"
    return text


def _read_from_data_header(column: str, what: str) -> str:
    """The first lines of a taxonomy ``init`` filled from the data: the marker the config looks
    for (``DatasetConfig.taxonomies_read_from_data``: the guarantee then says so) and what the
    steward does about it. Comment lines, read by both taxonomy loaders as such."""
    return (f"{READ_FROM_DATA_MARK} by medrelease init ({what} in column {column!r}).\n"
            "# Until a steward reviews this file and sets domain_reviewed: true on the column, "
            "the guarantee says its values were taken from the data.\n")


def numeric_taxonomy(profile: ColumnProfile, most: int = 3
                     ) -> tuple[str, int, Decimal, Decimal]:
    """A YAML numeric taxonomy whose leaves run from the data's minimum to its maximum, with
    nested round bands above them, marked as read from the data.

    No leaf lies outside the values found, so a mechanism that draws leaves (``aim``) never
    writes an age below the youngest patient's; the range is the data's, which is why the file
    is marked (the guarantee says so until the steward reviews it). Leaves are the whole
    numbers themselves over a short range, else bins of a round resolution (at most about
    ``MAX_FINE_LEAVES``): the first starts at the minimum; when the maximum is not on the
    bins' grid, the last leaf is the top-coded ``[x+]`` from the last grid point below it (a
    whole bin there would reach past the maximum, and a bin cannot stop at it). Bands sit on
    round edges (cut at both ends) when the minimum lies on the resolution's grid, else they
    count from the minimum (bands must be unions of bins). Returns the text, the number of
    levels below ``*``, and the leaves' span (lower, upper exclusive; the maximum when
    top-coded)."""
    low, high = Decimal(str(profile.minimum)), Decimal(str(profile.maximum))
    decimal = profile.kind == "decimal"
    span = max(float(high - low), 1e-6 if decimal else 1.0)
    finest = Decimal(1).scaleb(-profile.decimal_places) if decimal else Decimal(1)
    # (never bins of exactly 1 for decimals: from a whole minimum the taxonomy would take them
    # for whole numbers and refuse every decimal)
    resolution = next(w for w in round_widths()
                      if w >= finest and Decimal(str(span)) / w <= MAX_FINE_LEAVES
                      and not (decimal and w == 1))
    widths = _nested_widths(resolution, span, most)
    anchor = Decimal(0) if low % resolution == 0 else low
    last = low + ((high - low) // resolution) * resolution  # the grid point below the maximum
    binned = resolution != 1 or decimal or bool(profile.blanks)
    edges = "round edges" if anchor == 0 else "edges counted from the smallest value"
    top = (f"; the last leaf, [{_number_text(last)}+], holds the largest values"
           if last < high else "")
    lines = [_read_from_data_header(profile.name, "the smallest to the largest value found")
             + f"# Leaves: {'bins of ' + _number_text(resolution) if binned else 'the values'} "
             f"from the smallest value found to the largest{top}; bands of "
             f"{', '.join(_number_text(w) for w in widths) or 'none'} on {edges}. Widen the "
             "domain to what any such table could hold, or confirm it.",
             f"attribute: {_yaml_key(profile.name)}",
             f"domain: {{min: {_number_text(low)}, max: {_number_text(high)}}}"]
    if binned:
        lines.append(f"resolution: {_number_text(resolution)}")
    if last < high:
        lines.append(f"top_code: {_number_text(last)}")
    if profile.blanks:
        lines.append(f"missing: {_yaml_scalar(BLANK)}")
    lines.append("levels:" if widths else "levels: []")
    lines += [f"  - {{width: {_number_text(w)}, anchor: {_number_text(anchor)}}}"
              for w in widths]
    return "\n".join(lines) + "\n", len(widths) + 1, low, (
        last + resolution if last == high else high)


def numeric_reason(kind: str, levels: int) -> str:
    """What a numeric column's taxonomy is, in words that match it: leaves alone when no band
    fits above them (issue 55: "nested round bands" was said of a column that got none)."""
    if levels <= 1:
        return (f"{kind}s: leaves from the smallest to the largest value found, no bands "
                "above them")
    return (f"{kind}s: leaves from the smallest to the largest value found, {levels - 1} "
            f"band level{'s' if levels > 2 else ''} above them")


def value_list_taxonomy(profile: ColumnProfile) -> tuple[str, int]:
    """A flag or a small code (few whole numbers): exactly the values found, as the file writes
    them (matched as text), one leaf each, then ``*``; marked as read from the data. Sorted as
    numbers, so 2 comes before 10."""
    values = sorted(profile.values or (), key=lambda v: (Decimal(v), v))
    lines = [f"{v};*" for v in values]
    if profile.blanks:
        lines.append(f"{BLANK};*")
    return (_read_from_data_header(profile.name, f"the {len(values)} values found")
            + "\n".join(lines) + "\n", 1)


def _icd9_leaves() -> frozenset[str]:
    path = project_root() / "taxonomies" / "icd9" / "icd9.csv"
    return frozenset(line.split(";", 1)[0].strip()
                     for line in path.read_text(encoding="utf-8").splitlines() if line.strip())


def _is_icd9(profile: ColumnProfile) -> bool:
    return (profile.kind == "code" and profile.values is not None
            and set(profile.values) <= _icd9_leaves())


def code_taxonomy(profile: ColumnProfile) -> tuple[str, int]:
    """Prefix levels for codes: the code, its first three characters, its first, ``*``; a
    prefix level that groups nothing (codes of three characters: S01, S02) or everything
    (one first letter) is left out, as it would only add lattice nodes. A prefix written like
    a code of the column gets a ``*`` (``A*``: the codes starting with A), so no label is two
    things."""
    codes = list(profile.values or ())
    levels: list[list[str]] = []
    previous = len(set(codes))
    for width in (3, 1):
        prefixes = [c[:width] for c in codes]
        distinct = len(set(prefixes))
        if 1 < distinct < previous:
            taken = set(codes).union(*(set(level) for level in levels))
            if taken & set(prefixes):
                prefixes = [f"{p}*" for p in prefixes]
            levels.append(prefixes)
            previous = distinct
    lines = [";".join([c, *(level[i] for level in levels), "*"]) for i, c in enumerate(codes)]
    if profile.blanks:
        lines.append(";".join([BLANK] * (len(levels) + 1)) + ";*")
    header = _read_from_data_header(profile.name, f"the {len(codes)} codes found")
    return header + "\n".join(lines) + "\n", len(levels) + 1


def date_taxonomy(profile: ColumnProfile) -> tuple[str, int]:
    """Every day of whole five-year spans around the dates found: day -> month -> year. Each
    day is written as the column writes its dates (``date_format``: 31/01/2020, 20200131,
    ...), its month and year as ISO (2020-01, 2020); a column of months (2020-01) gets month ->
    year."""
    assert profile.first_date is not None and profile.last_date is not None
    fmt = profile.date_format or "%Y-%m-%d"
    first = date(profile.first_date.year // 5 * 5, 1, 1)
    last = date(profile.last_date.year // 5 * 5 + 4, 12, 31)
    lines = []
    monthly = "%d" not in fmt
    day = first
    while day <= last:
        iso = day.isoformat()
        if monthly:
            lines.append(f"{day.strftime(fmt)};{iso[:4]};*")
            day = date(day.year + (day.month == 12), day.month % 12 + 1, 1)
            continue
        lines.append(f"{day.strftime(fmt)};{iso[:7]};{iso[:4]};*")
        day += timedelta(days=1)
    if profile.blanks:
        lines.append(";".join([BLANK] * (2 if monthly else 3)) + ";*")
    return "\n".join(lines) + "\n", 2 if monthly else 3


def _format_words(fmt: str) -> str:
    """A date format as a steward reads it (%d/%m/%Y -> DD/MM/YYYY)."""
    for code, words in (("%d", "DD"), ("%m", "MM"), ("%Y", "YYYY"), ("%b", "Mon")):
        fmt = fmt.replace(code, words)
    return fmt


def flat_taxonomy(profile: ColumnProfile) -> tuple[str, int]:
    """Categories as found, one leaf each, then ``*``; marked as read from the data."""
    lines = [f"{v};*" for v in profile.values or ()]
    if profile.blanks:
        lines.append(f"{BLANK};*")
    header = _read_from_data_header(profile.name, f"the {len(profile.values or ())} values found")
    return header + "\n".join(lines) + "\n", 1


def _file_stem(name: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_").lower()
    return stem or "column"


def unique_stems(names: Sequence[str]) -> dict[str, str]:
    """A file stem per column, distinct: two names may reduce to one stem (``Größe`` and
    ``grö_e``, or any two non-Latin names to ``column``), and one file would then serve two
    columns; ``dataset`` is the config's own file. A clash gets the column's position."""
    stems: dict[str, str] = {}
    used = {"dataset"}
    for position, name in enumerate(names, start=1):
        stem = _file_stem(name)
        if stem in used:
            stem = f"{stem}_{position}"
        while stem in used:
            stem = f"{stem}_"
        used.add(stem)
        stems[name] = stem
    return stems


def _relative(target: Path, folder: Path) -> str:
    """Relative when the file is near the dataset folder (they move together), else absolute
    (a path climbing out of the whole tree reads as a puzzle)."""
    try:
        relative = os.path.relpath(target, folder)
    except ValueError:  # another drive
        return str(target)
    return relative if relative.count("..") <= 3 else str(target)


def _value_list(profile: ColumnProfile) -> bool:
    """Whole numbers with at most ``MAX_VALUE_LIST`` distinct spellings, each one a taxonomy
    line can hold as it is (no spaces around it): a flag or a code, listed, not banded."""
    return (profile.kind == "integer" and profile.values is not None
            and profile.distinct <= MAX_VALUE_LIST
            and not any(_unfit_leaf(v) for v in profile.values))


def _dimension(profile: ColumnProfile, folder: Path, stem: str | None = None) -> ColumnDraft:
    kind, stem = profile.kind, stem or _file_stem(profile.name)
    missing = BLANK if profile.blanks else None
    # (``type: integer`` lets the (blank) category blanks become through, as ``decimal`` does:
    # medrelease/data/input_schema.py, issue 55)
    declared = kind
    if _is_icd9(profile) and not profile.blanks:
        icd9 = project_root() / "taxonomies" / "icd9" / "icd9.csv"
        return ColumnDraft(profile.name, "dimension", "ICD-9 codes: the shipped ICD-9 "
                           "taxonomy (public)", taxonomy=_relative(icd9, folder), levels=3)
    if _value_list(profile):
        text, levels = value_list_taxonomy(profile)
        return ColumnDraft(profile.name, "dimension", f"{profile.distinct} whole-number values "
                           "(a flag or a code): the values found, no bands",
                           type=declared, taxonomy=f"{stem}.csv", missing=missing,
                           files={f"{stem}.csv": text}, levels=levels, read_from_data=True)
    if kind in ("integer", "decimal"):
        text, levels, *_ = numeric_taxonomy(profile)
        return ColumnDraft(profile.name, "dimension", numeric_reason(kind, levels),
                           type=declared, taxonomy=f"{stem}.yaml", missing=missing,
                           files={f"{stem}.yaml": text}, levels=levels, read_from_data=True)
    if kind == "date":
        text, levels = date_taxonomy(profile)
        fmt = profile.date_format or "%Y-%m-%d"
        shape = "months: month -> year" if "%d" not in fmt else "dates: day -> month -> year"
        return ColumnDraft(profile.name, "dimension", shape + (
            f" (written {_format_words(fmt)})" if fmt != "%Y-%m-%d" else ""),
                           taxonomy=f"{stem}.csv", missing=missing,
                           files={f"{stem}.csv": text}, levels=levels)
    if kind == "code":
        text, levels = code_taxonomy(profile)
        return ColumnDraft(profile.name, "dimension", "codes: prefix levels (first three "
                           "characters, first character)", taxonomy=f"{stem}.csv",
                           missing=missing, files={f"{stem}.csv": text}, levels=levels,
                           read_from_data=True)
    text, levels = flat_taxonomy(profile)
    return ColumnDraft(profile.name, "dimension", f"{len(profile.values or ())} categories: "
                       "flat", taxonomy=f"{stem}.csv", missing=missing,
                       files={f"{stem}.csv": text}, levels=levels, read_from_data=True)


def _informative(profile: ColumnProfile, folder: Path,
                 stem: str | None = None) -> tuple[ColumnDraft, str]:
    """The informative column (its domain file) and the dataset-wide missing-value rule."""
    if not profile.present:
        raise DraftError(f"column {profile.name!r} has no values (every row is blank): it "
                         "cannot be the informative column; name another")
    if profile.values is None or profile.distinct > MAX_DOMAIN_VALUES:
        raise DraftError(f"column {profile.name!r} has more than {MAX_DOMAIN_VALUES:,} "
                         "distinct values: too many to be the informative column; name another")
    if any(_unfit_leaf(v) for v in profile.values) or profile.controls:
        raise DraftError(f"column {profile.name!r} has values with spaces around them, "
                         "starting with '#' or holding a control character (a line break), "
                         "which a domain file cannot hold; clean the column or name another")
    stem = stem or _file_stem(profile.name)
    many_blanks = profile.blanks > FEW_BLANKS * profile.rows
    missing = BLANK if profile.blanks and many_blanks else None
    rule = "drop_rows" if profile.blanks and not many_blanks else "reject"
    if _is_icd9(profile):
        icd9 = project_root() / "taxonomies" / "icd9" / "icd9.csv"
        codes = sorted(_icd9_leaves()) + ([BLANK] if missing else [])
        text = ("# the ICD-9 code list shipped with medrelease (taxonomies/icd9/icd9.csv): "
                "public, not read from the data\n" + "\n".join(codes) + "\n")
        return ColumnDraft(profile.name, "informative", "ICD-9 codes: the shipped code list",
                           taxonomy=_relative(icd9, folder), domain=f"{stem}_domain.txt",
                           missing=missing, files={f"{stem}_domain.txt": text}), rule
    kind = profile.kind if profile.kind in NUMERIC_TYPES else "string"
    found = list(profile.values)
    if kind != "string":  # one spelling per number, as the engine compares them (type: ...)
        found = sorted({str(canonical_number(v)) for v in found}, key=Decimal)
    values = found + ([BLANK] if missing else [])
    text = (f"{READ_FROM_DATA_MARK} by medrelease init ({len(found)} values found "
            f"in column {profile.name!r}).\n# Until a steward reviews this list and sets "
            "domain_reviewed: true on the column, the guarantee says the set of values was "
            "taken from the data.\n" + "\n".join(values) + "\n")
    return ColumnDraft(profile.name, "informative", "the informative column (as named)"
                       + ("; numbers: 3 and 3.0 are one value" if kind != "string" else ""),
                       type=kind, domain=f"{stem}_domain.txt", missing=missing,
                       files={f"{stem}_domain.txt": text}, read_from_data=True), rule


def informative_candidates(profile: TableProfile) -> list[str]:
    """Columns that could be the informative one: listed, text or codes, few enough values."""
    return [c.name for c in profile.columns
            if not _id_like(c) and _free_text_reason(c) is None and c.kind != "empty"
            and c.values is not None and c.kind not in ("date",)]


# Nouns of things a row can be one of that are also privacy units (a person, a household);
# an admission, a visit or a case is an event: a table of them is not one row per person.
ONE_ROW_NOUNS = ("patient", "household", "client")


def _one_row_each(profile: TableProfile, ids: list[str]) -> str | None:
    """The noun of a person-like id column whose every row holds a different id (one row per
    person), else None."""
    for name in ids:
        column = profile.column(name)
        noun = noun_for(name, "")
        if noun in ONE_ROW_NOUNS and column.present == column.rows == column.distinct:
            return noun
    return None


def _ids_named(profile: TableProfile, ids: list[str], noun: str) -> str:
    return next(repr(c) for c in ids if noun_for(c, "") == noun
                and profile.column(c).distinct == profile.column(c).rows)


def noun_for(column: str, fallback: str) -> str:
    """What one unit (or row) is, in words, from a column's name; ``fallback`` when nothing
    fits (so a table of households never says 'patient')."""
    lowered = column.lower()
    for noun, stems in UNIT_NOUNS:
        if any(stem in lowered for stem in stems):
            return noun
    return fallback


def _drop_reason(column: ColumnProfile) -> str | None:
    """Why a column that is not an id cannot be released as written (it is dropped, with this
    reason), or None: a dimension can be drafted for it."""
    if column.kind == "empty":
        return "no values"
    if column.controls:
        return (f"{column.controls:,} value(s) hold a control character (a line break, a tab), "
                "which the input check refuses in a released column")
    if column.kind == "exponent":
        return ("numbers written with an exponent (such as 1.2e+05), which the input check "
                "does not read as numbers: write them as plain decimals to release this column")
    if _date_times(column):
        return ("dates with a time of day: too fine to release as written; keep the date alone "
                "(YYYY-MM-DD) to release it by day, month and year")
    if column.kind == "list":
        return ("a list of items in one cell ('|'): declare it set_valued with an item taxonomy "
                "by hand (diffgen releases it)")
    return _free_text_reason(column)


def draft_dataset(profile: TableProfile, name: str, root: Path, informative: str | None = None,
                  unit: str | None = None,
                  analyses: Sequence[str | Sequence[str]] = ()) -> DatasetDraft:
    """Decide every column's role, taxonomy and domain, the missing-value rule, the unit, the
    nouns and the declared analyses (``analyses``: column lists, or ``"a,b"`` texts as
    ``--analysis`` gives them); nothing is written (``write_draft``)."""
    if not DATASET_NAME.match(name):
        raise DraftError(f"dataset name {name!r}: use lower-case letters, digits, '-' or '_' "
                         "(at most 64), it becomes a folder name")
    folder = root / name
    names = [c.name for c in profile.columns]
    for given, what in ((informative, "--informative"), (unit, "--unit")):
        if given is not None and given != "row" and given not in names:
            raise DraftError(f"{what} {given!r} is not a column of {profile.path.name} "
                             f"(columns: {', '.join(names)})")
    if informative is None:
        candidates = informative_candidates(profile)
        raise InformativeNeeded(
            "name the informative column (the one released as it is, e.g. a diagnosis) with "
            f"--informative; candidates: {', '.join(candidates) or 'none found'}", candidates)
    review: list[str] = []
    drafts: list[ColumnDraft] = []
    rule = "reject"
    stems = unique_stems(names)
    for column in profile.columns:
        if column.name == informative:
            draft, rule = _informative(column, folder, stems[column.name])
        elif column.name == unit or _id_like(column):
            draft = ColumnDraft(column.name, "identifier", "an id: never released"
                                + (" (rows repeat per id)" if column.distinct < column.present
                                   else " (one row each)"))
        elif (reason := _drop_reason(column)) is not None:
            draft = ColumnDraft(column.name, "drop", reason)
        else:
            draft = _dimension(column, folder, stems[column.name])
        drafts.append(draft)
    if not any(d.role == "dimension" for d in drafts):
        others = "; ".join(f"{d.name!r}: {d.role}, {d.reason}" for d in drafts
                           if d.role != "informative") or "the table has no other column"
        raise DraftError("no column can be a dimension, and a release needs at least one "
                         f"besides the informative column ({others}); nothing was written")
    declared = _declared_analyses(analyses, drafts, profile.path.name)
    chosen_unit, bound = _unit(profile, drafts, unit, review)
    lattice = _fit_lattice(drafts, profile, review)
    _review_notes(profile, drafts, rule, review)
    row_ids = [d.name for d in drafts if d.role == "identifier" and d.name != chosen_unit]
    row_noun = next((noun_for(c, "") for c in row_ids if noun_for(c, "")), "row")
    unit_noun = noun_for(chosen_unit, "unit") if chosen_unit else "row"
    if chosen_unit is None and (one := _one_row_each(profile, row_ids)) is not None:
        # a person-like id with one row each: one row is one person, in the steward's nouns
        row_noun = unit_noun = one
        review.append(f"one row per {one}: the ids of {_ids_named(profile, row_ids, one)} are "
                      f"all different, so row_noun and unit_noun are both {one!r} and the "
                      f"guarantee protects one {one}; if a {one} can have several rows, "
                      "declare privacy.unit (and max_rows_per_unit) instead")
    elif row_noun == unit_noun:
        row_noun = "row"
    return DatasetDraft(
        name=name, folder=folder, input_path=_relative(profile.path, folder),
        delimiter=profile.delimiter, rows=profile.rows, columns=drafts, dataset_missing=rule,
        unit=chosen_unit, max_rows_per_unit=bound, unit_noun=unit_noun, row_noun=row_noun,
        review=review, lattice_nodes=lattice, analyses=declared)


def _declared_analyses(asked: Sequence[str | Sequence[str]], drafts: list[ColumnDraft],
                       file: str) -> list[list[str]]:
    """The ``--analysis`` column lists, each held to what was drafted, so that the config
    passes its own check: a column the table lacks, or one drafted as an identifier or
    dropped (never released, so no analysis can hold it), is refused in one sentence naming
    it and its drafted role, before anything is written."""
    by_name = {d.name: d for d in drafts}
    declared: list[list[str]] = []
    for given in asked:
        parts = given.split(",") if isinstance(given, str) else list(given)
        columns = [str(c).strip() for c in parts if str(c).strip()]
        if not columns:
            raise DraftError("--analysis names no column: give the columns of one table "
                             "researchers need, separated by commas (e.g. --analysis "
                             "treatment,outcome); nothing was written")
        for column in columns:
            draft = by_name.get(column)
            if draft is None:
                raise DraftError(f"--analysis: {column!r} is not a column of {file} (columns: "
                                 f"{', '.join(by_name)}); nothing was written")
            if draft.role not in RELEASED_ROLES:
                raise DraftError(f"--analysis: {column!r} is drafted as {draft.role} "
                                 f"({draft.reason}), and an analysis holds only released "
                                 "columns (dimension or informative); nothing was written")
        if len(set(columns)) != len(columns) or len(columns) > MAX_ANALYSIS_COLUMNS:
            raise DraftError(f"--analysis {','.join(columns)}: name each column once, at most "
                             f"{MAX_ANALYSIS_COLUMNS} columns; nothing was written")
        if columns not in declared:
            declared.append(columns)
    if len(declared) > MAX_ANALYSES:
        raise DraftError(f"{len(declared)} analyses: at most {MAX_ANALYSES}; nothing was "
                         "written")
    return declared


def _names_everyone(column: ColumnProfile) -> bool:
    """Every row holds an id that names someone (no blank, no NA or null): what the input
    check asks of a privacy unit's column."""
    return column.blanks == 0 and column.blank_looking == 0


def _date_times(column: ColumnProfile) -> bool:
    """Every value a date with a time of day (2020-01-31 12:30:00, or with a 'T')."""
    return column.values is not None and bool(column.values) and all(
        DATE_TIME.match(v) for v in column.values)


def _unit(profile: TableProfile, drafts: list[ColumnDraft], asked: str | None,
          review: list[str]) -> tuple[str | None, int]:
    """The privacy unit: as asked, else the id with the fewest ids whose rows repeat."""
    if asked == "row":
        return None, 1
    if asked is not None and not _names_everyone(column := profile.column(asked)):
        raise DraftError(f"--unit {asked!r}: {column.blanks + column.blank_looking} "
                         "row(s) have a blank id or a missing-value marker (NA, null, ...), and "
                         "every row must name its unit; clean the column, or use --unit row; "
                         "nothing was written")
    if asked is None:
        repeating = [d.name for d in drafts if d.role == "identifier"
                     and d.name in profile.rows_kept_by_bound]
        unnamed = [n for n in repeating if not _names_everyone(profile.column(n))]
        for name in unnamed:
            review.append(f"{name!r} repeats per id but some rows have a blank id or a "
                          "missing-value marker, so it cannot be the privacy unit (every row "
                          "must name its unit): the guarantee protects one row")
        repeating = [n for n in repeating if n not in unnamed]
        if not repeating:
            return None, 1
        asked = min(repeating, key=lambda n: profile.column(n).distinct)
        review.append(f"privacy unit: {asked!r} (rows repeat per id), so the guarantee "
                      f"protects one {noun_for(asked, 'unit')} and all their rows; "
                      "--unit row protects one row instead")
    kept = profile.rows_kept_by_bound.get(asked)
    if kept is None:
        return asked, 1
    bound = next((m for m in UNIT_BOUNDS if kept[m] >= UNIT_KEEPS), UNIT_BOUNDS[-1])
    review.append(f"max_rows_per_unit: {bound} (keeps {kept[bound]:.0%} of the rows; chosen "
                  "from the data: a public parameter, set it from what you know of the "
                  "source)")
    return asked, bound


def _fit_lattice(drafts: list[ColumnDraft], profile: TableProfile, review: list[str]) -> int:
    """Fewer numeric levels until the lattice fits the policy's default node limit."""
    dims = [d for d in drafts if d.role == "dimension"]
    nodes = math.prod(d.levels + 1 for d in dims)
    while nodes > LATTICE_LIMIT:
        numeric = [d for d in dims if (d.taxonomy or "").endswith(".yaml") and d.levels > 1]
        if not numeric:
            review.append(f"the lattice has {nodes:,} nodes, over the default limit "
                          f"{LATTICE_LIMIT:,}: aim (the default here) never walks it, but "
                          "ipa, histogram and kanon are refused until you drop some columns "
                          "(role: drop) or coarsen their taxonomies (or raise "
                          "policy.max_lattice_nodes: they then score every node)")
            break
        tallest = max(numeric, key=lambda d: d.levels)
        text, tallest.levels, *_ = numeric_taxonomy(profile.column(tallest.name),
                                                    most=tallest.levels - 2)
        tallest.files = {tallest.taxonomy or "": text}
        tallest.reason = numeric_reason(profile.column(tallest.name).kind, tallest.levels)
        nodes = math.prod(d.levels + 1 for d in dims)
    return nodes


def _review_notes(profile: TableProfile, drafts: list[ColumnDraft], rule: str,
                  review: list[str]) -> None:
    for draft in drafts:
        column = profile.column(draft.name)
        if draft.role == "informative" and draft.read_from_data:
            found = column.numbers if draft.type in NUMERIC_TYPES else column.distinct
            review.append(f"{draft.domain}: the {found} values found in "
                          f"{draft.name!r}, read from the data; the guarantee says so until "
                          "you check the list is what any such table could hold and set "
                          "domain_reviewed: true")
        elif draft.read_from_data and (draft.taxonomy or "").endswith(".yaml"):
            review.append(f"{draft.taxonomy}: bands from the smallest to the largest value "
                          f"found in {draft.name!r}, read from the data; the guarantee says so "
                          "until you widen the domain to what any such table could hold (or "
                          "confirm it) and set domain_reviewed: true")
        elif draft.read_from_data:
            review.append(f"{draft.taxonomy}: lists the values found in {draft.name!r}, read "
                          "from the data; a value only this table holds is disclosed if "
                          "released: add the values any such table could hold, remove rare "
                          "ones, then set domain_reviewed: true (the guarantee says so until "
                          "then)")
        if column.kind in NUMERIC_TYPES and column.numbers < column.distinct \
                and draft.role in RELEASED_ROLES:
            how = (f"one value each (type: {draft.type}: the domain and the release write "
                   "each number one way)" if draft.role == "informative"
                   else "each spelling its own value (a value list matches text)"
                   if (draft.taxonomy or "").endswith(".csv")
                   else "one leaf each in its numeric taxonomy")
            review.append(f"{draft.name!r}: {column.distinct - column.numbers} number(s) "
                          f"written in more than one way (as 3 and 3.0): {how}")
        if column.blanks and draft.role in ("dimension", "informative"):
            how = (f"the category {BLANK!r}" if draft.missing else
                   "their rows are dropped (missing: drop_rows)")
            review.append(f"{draft.name!r}: {column.blanks} blank value(s): {how}")
        if draft.role == "drop":
            review.append(f"{draft.name!r} dropped: {draft.reason}")


# -- writing --------------------------------------------------------------------------------


def _yaml_scalar(text: str) -> str:
    import json

    return json.dumps(text, ensure_ascii=False)


def _yaml_key(text: str) -> str:
    """A column name as a YAML key that reads back as the same text (``_yaml_word``): ``no``,
    ``null`` or ``on`` unquoted would read as False, None or True."""
    return _yaml_word(text)


def _yaml_text(draft: DatasetDraft) -> str:
    width = max(len(_yaml_key(c.name)) for c in draft.columns) + 1
    lines = [
        f"# Drafted by medrelease init from {Path(draft.input_path).name} ({draft.rows:,} "
        "rows). Review every line marked",
        "# 'read from the data' before a release that matters; `medrelease check "
        f"{draft.name}` validates it.",
        f"name: {draft.name}",
        f"description: {_yaml_scalar('drafted by medrelease init; describe the table here')}",
        "input:",
        f"  path: {_yaml_scalar(draft.input_path)}",
        "  format: csv",
        f"  delimiter: {_yaml_scalar(draft.delimiter)}",
        "columns:",
    ]
    for column in draft.columns:
        spec = [f"role: {column.role}"]
        if column.type != "string":
            spec.append(f"type: {column.type}")
        if column.taxonomy:
            spec.append(f"taxonomy: {_yaml_scalar(column.taxonomy)}")
        if column.domain:
            spec.append(f"domain: {_yaml_scalar(column.domain)}")
        if column.missing:
            spec.append(f"missing: {_yaml_scalar(column.missing)}")
        note = column.reason + ("; read from the data" if column.read_from_data else "")
        lines.append(f"  {(_yaml_key(column.name) + ':').ljust(width)} {{{', '.join(spec)}}}"
                     f"  # {note}")
    if draft.dataset_missing == "drop_rows":
        lines += ["# Blank informative values are few: their rows are dropped (at most "
                  "drop_limit of the rows,", "# else the release is refused)."]
    else:
        lines.append("# A blank where no 'missing:' category is declared refuses the release.")
    lines.append(f"missing: {draft.dataset_missing}")
    lines += ["privacy:",
              "  lifetime_epsilon: 10.0   # the source's lifetime budget (fixed in the ledger "
              "at the first spend)",
              "  lifetime_delta: 1.0e-5"]
    if draft.unit:
        lines += [f"  unit: {_yaml_key(draft.unit)}",
                  f"  max_rows_per_unit: {draft.max_rows_per_unit}   # chosen from the data: "
                  "review"]
    lines += [f"  unit_noun: {_yaml_scalar(draft.unit_noun)}",
              f"  row_noun: {_yaml_scalar(draft.row_noun)}",
              "# No mechanism named: the registry's rule picks one (medrelease check shows "
              "which)."]
    lines += _analyses_lines(draft)
    lines += ["# Review before publishing: uncomment to have every release built into a staging "
              "area with its",
              "# evidence and wait for a steward's approve / reject (in the Prefect UI, or "
              "'medrelease release'",
              "# asks); nothing is published before it, and the spend counts either way.",
              "# review: required",
              "# review_timeout_hours: 168   # left open this long: the run ends 'Not published'"]
    return "\n".join(lines) + "\n"


def _yaml_word(text: str) -> str:
    """A column name as a YAML plain word where it reads back as the same text, else quoted
    (``no``, ``on`` or ``1`` would read as a boolean or a number)."""
    import yaml

    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_\-]*", text) and yaml.safe_load(text) == text:
        return text
    return _yaml_scalar(text)


def _flow_list(columns: Sequence[str]) -> str:
    return "[" + ", ".join(_yaml_word(c) for c in columns) + "]"


def two_significant_digits(count: int) -> int:
    """A count rounded to two significant digits (3,141 -> 3,100): a planning figure, not the
    table's size to the row."""
    if count < 100:
        return count
    scale = 10 ** (len(str(count)) - 2)
    return (count + scale // 2) // scale * scale


def _analyses_lines(draft: DatasetDraft) -> list[str]:
    """``analyses:`` as declared with ``--analysis``, else the informative column against each
    dimension, commented out; then an ``impossible:`` example and ``expected_rows``, commented
    out (what each does is said above it, so the steward decides with the file open)."""
    dimensions = [c.name for c in draft.columns if c.role == "dimension"]
    informative = next(c.name for c in draft.columns if c.role == "informative")
    lines = ["# Analyses: the tables researchers came for (e.g. the outcome by treatment: "
             "- [treatment, outcome];",
             "# at a coarser taxonomy level: - {columns: [age, outcome], levels: {age: 1}}). "
             "Declared, aim measures",
             "# them first with a share of its budget, every release says how it serves them, "
             "and the publication",
             "# verdict judges the release on them."]
    if draft.analyses:
        lines += ["analyses:", *(f"  - {_flow_list(a)}" for a in draft.analyses)]
    else:
        lines += ["# Uncomment those researchers need (or draft with medrelease init "
                  "--analysis a,b):", "# analyses:",
                  *(f"#   - {_flow_list([d, informative])}" for d in dimensions)]
    lines += ["# Combinations of values no real row can hold (values: leaves or taxonomy labels "
              "of any level); aim",
              "# rejects such rows when it samples, so no released row holds one. For example:",
              "# impossible:",
              f"#   - {{when: {{{_yaml_word(dimensions[0])}: [VALUE], "
              f"{_yaml_word(informative)}: [VALUE, VALUE]}}, reason: \"why no real row holds "
              "this\"}",
              "# The number of rows you expect an extract to have, for choosing epsilon before "
              "spending",
              "# (medrelease check --epsilon); drafted from this file's rows, to two "
              "significant digits:",
              f"# expected_rows: {two_significant_digits(draft.rows)}   # check this: it is a "
              "planning figure, never read by a release"]
    return lines


def write_draft(draft: DatasetDraft) -> list[Path]:
    """Write the config and its files; refuses, before writing anything, when any exists."""
    targets = {draft.folder / name: text for name, text in draft.files().items()}
    existing = [p for p in targets if p.exists()]
    if existing:
        raise DraftError(f"{draft.folder} already holds {', '.join(p.name for p in existing)}: "
                         "init never overwrites; pick another --name or remove them")
    draft.folder.mkdir(parents=True, exist_ok=True)
    for path, text in targets.items():
        with path.open("x", encoding="utf-8") as handle:  # "x": never over a file
            handle.write(text)
    return list(targets)


def init_dataset(csv_path: Path, name: str, root: Path, informative: str | None = None,
                 unit: str | None = None, delimiter: str | None = None,
                 analyses: Sequence[str | Sequence[str]] = ()) -> DatasetDraft:
    """Profile, draft and write (the CLI asks for the informative column first, if it can)."""
    if (root / name / "dataset.yaml").exists():
        raise DraftError(f"{root / name / 'dataset.yaml'} exists: init never overwrites a "
                         "config; pick another --name")
    draft = draft_dataset(profile_csv(csv_path, delimiter), name, root, informative, unit,
                          analyses)
    write_draft(draft)
    return draft


# -- relational datasets (issue 58) ---------------------------------------------------------
#
# ``medrelease init PARENT.csv --name N --child CHILD.csv --key COL [--child ... --key ...]``:
# the parent table (one row per patient) and the tables that reference it, one or more levels
# deep. Each ``--key`` goes with the ``--child`` at its position: it names the child's column
# that references an earlier table, and the earlier table whose column of that name holds
# distinct values is the child's parent (the nearest one before it, when several do); the first
# ``--key`` is the parent table's key, the privacy unit. A child referenced by a later one gets
# that column as its own ``key``. Each child's ``max_children`` is read from the data (the
# ``MAX_CHILDREN_PERCENTILE``th percentile of its rows per parent row) and flagged for review
# as ``max_rows_per_unit`` is; its columns are a list of the values found (few) or a taxonomy
# file as init drafts one; ids, keys and references are left out.

MAX_CHILDREN_PERCENTILE = 95   # max_children drafted: this percentile of rows per parent row
MAX_CHILDREN_LIMIT = 1000      # ChildTableSpec.max_children's largest
MAX_TABLE_NAME = 40            # config.TABLE_NAME


@dataclass
class ChildDraft:
    """One child table of a drafted relational config, and how its numbers were read."""

    name: str
    file_name: str
    path: str                    # as written in the YAML (relative to the dataset folder)
    delimiter: str
    rows: int
    parent: str
    references: str
    named: bool                  # the table's name is not its file's stem: written as 'name:'
    columns: list[ColumnDraft]   # released: a list of values or a taxonomy file each
    left_out: list[ColumnDraft]  # not released, each with its reason
    key: str | None = None       # its own key (a later table references it)
    percentile: int = 1          # the MAX_CHILDREN_PERCENTILE-th percentile of rows per parent
    max_children: int = 1
    kept: float = 1.0            # share of its referencing rows max_children keeps
    lowered_from: int | None = None  # max_children lowered so that its chain's scale fits
    counts: tuple[int, ...] = ()     # rows per parent row (parents with any), for the share

    @property
    def max_children_note(self) -> str:
        """How max_children was drafted, in words (the YAML comment and the review line)."""
        found = (f"read from the data: the {MAX_CHILDREN_PERCENTILE}th percentile of "
                 f"{self.name} rows per {self.parent} row (over the {self.parent} rows that "
                 "have any)")
        kept = f"it keeps {self.kept:.0%} of the {self.name} rows"
        if self.lowered_from is None:
            return f"{found}; {kept}"
        return (f"{found} is {self.lowered_from}, lowered to {self.max_children}: the product "
                "of lcm(1..max_children) along a chain of tables must stay within 2^32 (the "
                f"counts' exact range); {kept}")


@dataclass
class RelationalDraft:
    """A drafted relational config: the parent table's columns (as ``DatasetDraft``'s), its
    key (the privacy unit) and the child tables; ``write_draft`` writes it."""

    name: str
    folder: Path
    input_path: str
    delimiter: str
    rows: int
    root: str
    root_named: bool
    key: str
    unit_noun: str
    columns: list[ColumnDraft]
    tables: list[ChildDraft]
    folders: list[str]
    review: list[str]

    def yaml_text(self) -> str:
        return _relational_yaml_text(self)

    def files(self) -> dict[str, str]:
        written = {"dataset.yaml": self.yaml_text()}
        for column in self.columns + [c for t in self.tables for c in t.columns]:
            written.update(column.files)
        return written


def _table_name(path: Path, used: set[str]) -> tuple[str, bool]:
    """A table's name from its file (``config.table_name_of``: the stem, lower-case), made a
    valid table name (letters, digits, '_', a letter first) and distinct; whether it differs
    from the stem (then the YAML names it)."""
    from medrelease.data.config import RESERVED_TABLE_NAMES, TABLE_NAME, table_name_of

    stem = table_name_of(str(path))
    name = re.sub(r"[^a-z0-9_]+", "_", stem).strip("_")
    if not name or not name[0].isalpha():
        name = f"t_{name}".rstrip("_")
    name = name[:MAX_TABLE_NAME]
    if name in RESERVED_TABLE_NAMES:  # a release folder's own files
        name = f"{name}_table"
    base, number = name, 2
    while name in used:
        suffix = f"_{number}"
        name, number = base[:MAX_TABLE_NAME - len(suffix)] + suffix, number + 1
    assert TABLE_NAME.match(name)
    used.add(name)
    return name, name != stem


def _key_column(profile: TableProfile, column: str) -> pd.Series:
    """One column of a file as the relational check compares keys (``schema._key_text``):
    text, stripped, a blank missing."""
    import pandas as pd

    try:
        frame = pd.read_csv(profile.path, usecols=[column], dtype=str, keep_default_na=False,
                            sep=profile.delimiter, encoding="utf-8-sig")
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise DraftError(f"{profile.path.name}: column {column!r} cannot be read "
                         f"({type(exc).__name__})") from None
    text = frame[column].astype("string").str.strip()
    return text.mask(text == "")


def _repeats(values: pd.Series) -> tuple[int, int]:
    """(rows without a value, rows repeating a value another row has)."""
    return int(values.isna().sum()), int(values.dropna().duplicated().sum())


def _nearest_rank(counts: Sequence[int], percent: int) -> int:
    """The ``percent``-th percentile of ``counts`` by nearest rank (a value of them)."""
    ordered = sorted(counts)
    return ordered[max(0, math.ceil(percent / 100 * len(ordered)) - 1)] if ordered else 1


def _kept_share(counts: Sequence[int], bound: int) -> float:
    total = sum(counts)
    return sum(min(c, bound) for c in counts) / total if total else 1.0


def scale_limit(columns_per_table: Sequence[int] = ()) -> int:
    """The largest scale of a chain of tables (the product of lcm(1..max_children) along it,
    ``RelSchema.scale``) that the schema accepts (``schema.MAX_SCALE``: counts stay exact in
    float64). The scale does not move the noise for one patient (every measurement is
    calibrated at rho / L^2 for a patient of weight L), so nothing else bounds it.
    ``columns_per_table`` is kept for callers; it does not enter."""
    from medrelease.relational.schema import MAX_SCALE

    return MAX_SCALE


def _fit_scale(tables: list[ChildDraft], limit: int) -> None:
    """Lower the largest max_children of a chain (root -> ... -> leaf table) until the chain's
    scale (the product of lcm(1..max_children) along it) is at most ``limit``; on a plateau of
    the lcm the largest value that fits is kept."""
    by_name = {t.name: t for t in tables}
    for leaf in tables:
        if any(t.parent == leaf.name for t in tables):
            continue
        chain = [leaf]
        while chain[0].parent in by_name:
            chain.insert(0, by_name[chain[0].parent])
        while math.prod(math.lcm(*range(1, t.max_children + 1)) for t in chain) > limit \
                and any(t.max_children > 1 for t in chain):
            top = max(chain, key=lambda t: t.max_children)
            if top.lowered_from is None:
                top.lowered_from = top.max_children
            top.max_children -= 1
    for table in tables:
        table.kept = _kept_share(table.counts, table.max_children)


def _relational_drop_reason(column: ColumnProfile) -> str | None:
    if column.kind == "list":
        return ("a list of items in one cell ('|'): a relational dataset releases items as the "
                "rows of a child table")
    return _drop_reason(column)


def _few_values(column: ColumnProfile) -> bool:
    """A child table's column released as a list of the values found (``values:``): at most
    ``MAX_VALUE_LIST`` of them, each one a value the check matches as it is written."""
    return (column.values is not None and 0 < column.distinct <= MAX_VALUE_LIST
            and column.kind != "date" and not any(_unfit_leaf(v) for v in column.values))


def _listed_values(column: ColumnProfile) -> list[str]:
    values = list(column.values or ())
    if column.kind in NUMERIC_TYPES:
        values.sort(key=lambda v: (Decimal(v.strip()), v))
    if column.blanks and BLANK not in values:
        values.append(BLANK)
    return values


def _child_columns(profile: TableProfile, table: str, never: set[str], folder: Path,
                   stems: dict[str, str]) -> tuple[list[ColumnDraft], list[ColumnDraft]]:
    """A child table's released columns and the ones left out (ids, keys and references,
    what no release can hold as written), each with its reason."""
    released: list[ColumnDraft] = []
    left_out: list[ColumnDraft] = []
    for column in profile.columns:
        if column.name in never:
            left_out.append(ColumnDraft(column.name, "drop", "a key or a reference of the "
                                        "tables: never released"))
        elif _id_like(column):
            left_out.append(ColumnDraft(column.name, "drop", "an id: never released"))
        elif (reason := _relational_drop_reason(column)) is not None:
            left_out.append(ColumnDraft(column.name, "drop", reason))
        elif _few_values(column):
            values = _listed_values(column)
            released.append(ColumnDraft(
                column.name, "dimension", f"{column.distinct} value(s) found: listed",
                missing=BLANK if column.blanks else None, values=values,
                read_from_data=True))
        else:
            released.append(_dimension(column, folder, stems[f"{table}.{column.name}"]))
    return released, left_out


def _parent_columns(profile: TableProfile, key: str, keys: set[str], folder: Path,
                    stems: dict[str, str]) -> list[ColumnDraft]:
    """The parent table's columns: its key the identifier, other ids identifiers too, what
    cannot be released dropped, the rest dimensions as init drafts them."""
    drafts = []
    for column in profile.columns:
        if column.name == key:
            drafts.append(ColumnDraft(column.name, "identifier", "the parent table's key: the "
                                      "privacy unit, never released"))
        elif column.name in keys or _id_like(column):
            drafts.append(ColumnDraft(column.name, "identifier", "an id: never released"))
        elif (reason := _relational_drop_reason(column)) is not None:
            drafts.append(ColumnDraft(column.name, "drop", reason))
        else:
            drafts.append(_dimension(column, folder, stems[column.name]))
    return drafts


def _input_folders(paths: Sequence[Path], folder: Path) -> list[str]:
    """The folders the tables' files lie in, when they are not all in the parent's (the
    config's input folders then list every one, the parent's first)."""
    folders: list[Path] = []
    for path in paths:
        if not any(path.parent == f or path.parent.is_relative_to(f) for f in folders):
            folders.append(path.parent)
    return [] if len(folders) == 1 else [_relative(f, folder) for f in folders]


def draft_relational(parent: TableProfile, children: Sequence[tuple[TableProfile, str]],
                     name: str, root: Path) -> RelationalDraft:
    """A relational dataset's config from its parent table and its child tables, each with
    the column that references an earlier table (``--child CSV --key COL``, in order; see the
    section's comment for the rule); nothing is written (``write_draft``)."""
    if not DATASET_NAME.match(name):
        raise DraftError(f"dataset name {name!r}: use lower-case letters, digits, '-' or '_' "
                         "(at most 64), it becomes a folder name")
    if not children:
        raise DraftError("a relational dataset needs at least one --child table")
    folder = root / name
    used: set[str] = set()
    root_name, root_named = _table_name(parent.path, used)
    key = children[0][1]
    header = [c.name for c in parent.columns]
    if key not in header:
        raise DraftError(f"--key {key!r} (the first one: the parent table's key) is not a "
                         f"column of {parent.path.name} (columns: {', '.join(header)}); nothing "
                         "was written")
    cache: dict[tuple[str, str], pd.Series] = {}

    def values(table: str, profile: TableProfile, column: str) -> pd.Series:
        if (table, column) not in cache:
            cache[(table, column)] = _key_column(profile, column)
        return cache[(table, column)]

    blank, repeated = _repeats(values(root_name, parent, key))
    if blank or repeated:
        raise DraftError(
            f"--key {key!r}: the parent table's key names one {noun_for(key, 'patient')} per "
            "row, but in "
            f"{parent.path.name} " + " and ".join(
                part for part in (f"{repeated} row(s) repeat a {key} another row has"
                                  if repeated else "",
                                  f"{blank} row(s) have none" if blank else "") if part)
            + f"; give the parent table with one row per {noun_for(key, 'patient')}, or "
            "another --key; nothing was written")
    profiles: dict[str, TableProfile] = {root_name: parent}
    own_key: dict[str, str | None] = {root_name: key}
    review = [f"privacy unit: {key!r}, the key of {root_name} (one row each): the guarantee "
              f"protects one {noun_for(key, 'patient')} with all their rows in every table"]
    tables: list[ChildDraft] = []
    for profile, reference in children:
        table, named = _table_name(profile.path, used)
        columns = [c.name for c in profile.columns]
        if reference not in columns:
            raise DraftError(f"--child {profile.path.name} --key {reference}: it has no column "
                             f"{reference!r} (columns: {', '.join(columns)}); nothing was "
                             "written")
        parent_name = _parent_of(profile, reference, tables, root_name, own_key, profiles,
                                 values)
        own_key[parent_name] = reference
        if parent_name != root_name:
            next(t for t in tables if t.name == parent_name).key = reference
        refs = values(table, profile, reference)
        parent_keys = set(values(parent_name, profiles[parent_name], reference).dropna())
        matched = refs.notna() & refs.isin(parent_keys)
        counts = tuple(int(n) for n in refs[matched].value_counts().to_numpy())
        blanks, orphans = int(refs.isna().sum()), int((refs.notna() & ~matched).sum())
        if blanks or orphans:
            review.append(f"{profile.path.name}: " + " and ".join(
                part for part in (f"{orphans} row(s) reference a {reference} that is not in "
                                  f"{parent_name} (orphans)" if orphans else "",
                                  f"{blanks} row(s) have no {reference}" if blanks else "")
                if part) + ": medrelease check lists them and a release refuses the extract "
                "until they are fixed")
        percentile = min(max(_nearest_rank(counts, MAX_CHILDREN_PERCENTILE), 1),
                         MAX_CHILDREN_LIMIT)
        tables.append(ChildDraft(
            name=table, file_name=profile.path.name, path=_relative(profile.path, folder),
            delimiter=profile.delimiter, rows=profile.rows, parent=parent_name,
            references=reference, named=named, columns=[], left_out=[],
            percentile=percentile, max_children=percentile, counts=counts))
        profiles[table] = profile
        own_key[table] = None
    keys = {key} | {t.references for t in tables}
    names = [c.name for c in parent.columns] + [f"{t.name}.{c.name}" for t in tables
                                                for c in profiles[t.name].columns]
    stems = unique_stems(names)
    columns = _parent_columns(parent, key, keys, folder, stems)
    if not any(c.role == "dimension" for c in columns):
        others = "; ".join(f"{c.name!r}: {c.role}, {c.reason}" for c in columns)
        raise DraftError(f"{parent.path.name}: no column besides the key can be released, and "
                         "the parent table needs at least one (e.g. a sex or a birth year) "
                         f"({others}); nothing was written")
    _review_notes(parent, columns, "reject", review)
    for table in tables:
        table.columns, table.left_out = _child_columns(profiles[table.name], table.name, keys,
                                                       folder, stems)
        if not table.columns:
            reasons = "; ".join(f"{c.name!r}: {c.reason}" for c in table.left_out)
            raise DraftError(f"{table.file_name}: no column can be released, and each table "
                             f"releases at least one ({reasons}); nothing was written")
    _fit_scale(tables, scale_limit([sum(c.role == "dimension" for c in columns)]
                                   + [len(t.columns) for t in tables]))
    for table in tables:
        review.append(f"{table.name}: max_children {table.max_children}, "
                      f"{table.max_children_note}. A public parameter: set it from what you "
                      "know of the source, then set max_children_reviewed: true")
        _child_review_notes(table, profiles[table.name], review)
    return RelationalDraft(
        name=name, folder=folder, input_path=_relative(parent.path, folder),
        delimiter=parent.delimiter, rows=parent.rows, root=root_name, root_named=root_named,
        key=key, unit_noun=noun_for(key, "patient"), columns=columns, tables=tables,
        folders=_input_folders([parent.path] + [profiles[t.name].path for t in tables], folder),
        review=review)


def _parent_of(profile: TableProfile, reference: str, tables: list[ChildDraft],
               root_name: str, own_key: dict[str, str | None],
               profiles: dict[str, TableProfile],
               values: Callable[[str, TableProfile, str], pd.Series]) -> str:
    """The table ``--key reference`` names: the parent table when it is its key (the first
    ``--key``), else the nearest earlier table whose column of that name has a distinct value
    in every row and that no other column already keys."""
    if reference == own_key[root_name]:
        return root_name
    why: list[str] = []
    if reference in [c.name for c in profiles[root_name].columns]:
        why.append(f"{root_name}'s key is {own_key[root_name]} (the first --key)")
    for candidate in [t.name for t in reversed(tables)]:
        earlier = profiles[candidate]
        if reference not in [c.name for c in earlier.columns] or reference == next(
                t.references for t in tables if t.name == candidate):
            continue
        blank, repeated = _repeats(values(candidate, earlier, reference))
        if own_key[candidate] not in (None, reference):
            why.append(f"{candidate} is already keyed by {own_key[candidate]}")
        elif blank or repeated:
            why.append(f"in {candidate}, " + " and ".join(
                part for part in (f"{repeated} row(s) repeat a {reference} another row has"
                                  if repeated else "",
                                  f"{blank} row(s) have none" if blank else "") if part))
        else:
            return candidate
    raise DraftError(
        f"--child {profile.path.name} --key {reference}: no earlier table has {reference!r} "
        "as its key (a column with a distinct value in every row"
        + (f"; {'; '.join(why)}" if why else "") + "); list a child after the table it "
        "references, and give as --key the column they share; nothing was written")


def _child_review_notes(table: ChildDraft, profile: TableProfile, review: list[str]) -> None:
    for column in table.columns:
        found = profile.column(column.name)
        if column.values is not None:
            review.append(f"{table.name}.{column.name}: the {found.distinct} value(s) found, "
                          "listed in dataset.yaml (read from the data): a value only this "
                          "table holds is disclosed if released; add the values any such "
                          "table could hold, remove rare ones, then set domain_reviewed: true "
                          "(until then the guarantee says so)")
        elif column.read_from_data:
            review.append(f"{column.taxonomy}: {table.name}.{column.name}'s values or range, "
                          "read from the data: a value only this table holds is disclosed if "
                          "released; widen it to what any such table could hold, remove rare "
                          "ones, then set domain_reviewed: true on the column")
        if found.blanks:
            review.append(f"{table.name}.{column.name}: {found.blanks} blank value(s): the "
                          f"category {BLANK!r}")
    for column in table.left_out:
        if column.reason != "a key or a reference of the tables: never released":
            review.append(f"{table.name}.{column.name} left out: {column.reason}")


def _relational_yaml_text(draft: RelationalDraft) -> str:
    files = ", ".join(f"{t.file_name} ({t.rows:,} rows)" for t in draft.tables)
    lines = [
        f"# Drafted by medrelease init from {Path(draft.input_path).name} ({draft.rows:,} "
        f"rows) and its child table(s) {files}.",
        "# Review every line marked 'read from the data' before a release that matters; "
        f"`medrelease check {draft.name}` validates it.",
        f"name: {draft.name}",
        f"description: {_yaml_scalar('drafted by medrelease init; describe the tables here')}",
        "input:",
        f"  path: {_yaml_scalar(draft.input_path)}",
        "  format: csv",
        f"  delimiter: {_yaml_scalar(draft.delimiter)}",
    ]
    if draft.folders:
        lines.append("  # every table's file is read from these folders only")
        lines.append("  folders: [" + ", ".join(_yaml_scalar(f) for f in draft.folders) + "]")
    lines.append(f"# The parent table ({draft.root}): one row per {draft.unit_noun}, keyed by "
                 f"{draft.key}.")
    lines.append("columns:")
    lines += _column_lines(draft.columns, "  ")
    lines += ["privacy:",
              "  lifetime_epsilon: 10.0   # the source's lifetime budget (fixed in the ledger "
              "at the first spend)",
              "  lifetime_delta: 1.0e-5",
              f"  unit: {_yaml_key(draft.key)}   # the parent table's key: its rows in every "
              "table are protected together",
              f"  unit_noun: {_yaml_scalar(draft.unit_noun)}",
              "relational:"]
    if draft.root_named:
        lines.append(f"  name: {draft.root}   # the parent table's name")
    lines.append("  tables:")
    for table in draft.tables:
        lines.append(f"    - path: {_yaml_scalar(table.path)}")
        if table.named:
            lines.append(f"      name: {table.name}")
        if table.parent != draft.root:
            lines.append(f"      parent: {table.parent}")
        lines.append(f"      references: {_yaml_key(table.references)}")
        if table.key:
            lines.append(f"      key: {_yaml_key(table.key)}   # referenced by a table below")
        if table.delimiter != ",":
            lines.append(f"      delimiter: {_yaml_scalar(table.delimiter)}")
        lines.append(f"      # max_children: {table.max_children_note}. A public parameter: "
                     "review it, then set max_children_reviewed: true")
        lines.append(f"      max_children: {table.max_children}   # chosen from the data: "
                     "review")
        lines.append("      columns:")
        lines += _column_lines(table.columns, "        ")
    dimension = next(c.name for c in draft.columns if c.role == "dimension")
    first = draft.tables[0]
    lines += ["  # Analyses: the tables researchers need across tables, as <table>.<column> "
              "(a count of a child",
              "  # table's rows: <table>.n_<child>); measured first. Uncomment and edit:",
              "  # analyses:",
              f"  #   - [{draft.root}.{dimension}, {first.name}.{first.columns[0].name}]",
              f"  #   - [{draft.root}.{dimension}, {draft.root}.n_{first.name}]",
              "# The relational mechanism releases synthetic patients with their rows in every "
              "table, fresh keys.",
              "mechanism:",
              "  name: relational",
              "policy:",
              "  mechanisms: [relational]",
              "# Review before publishing: uncomment to have every release built into a staging "
              "area with its",
              "# evidence and wait for a steward's approve / reject; nothing is published "
              "before it.",
              "# review: required"]
    return "\n".join(lines) + "\n"


def _column_lines(columns: list[ColumnDraft], indent: str) -> list[str]:
    """One line per column: a parent's role and file, or a child's values or taxonomy."""
    width = max(len(_yaml_key(c.name)) for c in columns) + 1
    lines = []
    for column in columns:
        spec = []
        if indent == "  ":  # the parent table's columns (ColumnSpec)
            spec.append(f"role: {column.role}")
            if column.type != "string":
                spec.append(f"type: {column.type}")
        if column.values is not None:
            spec.append("values: [" + ", ".join(_yaml_scalar(v) for v in column.values) + "]")
        if column.taxonomy:
            spec.append(f"taxonomy: {_yaml_scalar(column.taxonomy)}")
        if column.missing:
            spec.append(f"missing: {_yaml_scalar(column.missing)}")
        if indent != "  " and column.read_from_data and column.values is not None:
            spec.append("from_data: true")  # the guarantee says so until domain_reviewed
        note = column.reason + ("; read from the data" if column.read_from_data else "")
        lines.append(f"{indent}{(_yaml_key(column.name) + ':').ljust(width)} "
                     f"{{{', '.join(spec)}}}  # {note}")
    return lines


def init_relational(parent_csv: Path, children: Sequence[tuple[Path, str]], name: str,
                    root: Path, delimiter: str | None = None) -> RelationalDraft:
    """Profile every table, draft and write a relational config (``medrelease init PARENT.csv
    --child CHILD.csv --key COL ...``)."""
    if (root / name / "dataset.yaml").exists():
        raise DraftError(f"{root / name / 'dataset.yaml'} exists: init never overwrites a "
                         "config; pick another --name")
    draft = draft_relational(profile_csv(parent_csv, delimiter),
                             [(profile_csv(path, delimiter), key) for path, key in children],
                             name, root)
    write_draft(draft)
    return draft


__all__ = ["BLANK", "DatasetDraft", "DraftError", "InformativeNeeded", "InputValidationError",
           "RelationalDraft", "draft_dataset", "draft_relational", "init_dataset",
           "init_relational", "profile_csv", "write_draft"]
