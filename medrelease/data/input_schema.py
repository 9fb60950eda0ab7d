"""The input schema, built from a dataset config with pandera.

Columns arrive as text (``medrelease.storage.io``); the schema checks, per declared column, that values
hold no control characters, are present when the missing-value policy says so, that integer
columns hold whole numbers written as such (``34``, not ``1e1`` or ``41.99999999999999999``),
decimal columns plain decimals, and that every dimension value is covered by its taxonomy.
Validation is lazy so one run reports every problem, grouped per column and check, with counts
and the first file lines — never the values themselves (``InputValidationError``); example
values go only to the steward-only log.
"""

from __future__ import annotations

import unicodedata

import numpy as np
import pandas as pd
import pandera.pandas as pa
from pandera.errors import SchemaErrors

from medrelease.data.aggregate import canonical_informative_numbers
from medrelease.data.binning import DECIMAL, WHOLE
from medrelease.data.config import DatasetConfig
from medrelease.data.taxonomy import NOT_WHOLE, Taxonomy
from medrelease.errors import InputValidationError, format_rows, position_numbers

CONTROL = r"[\x00-\x1f\x7f]"
NOT_DECIMAL = "are not plain decimal numbers (e.g. 0.8; no exponents)"
CONTROL_CHARS = "contain control characters (NUL, tab, line breaks...): refused, not escaped"
# Text that names no one: what spreadsheets and pandas write for a missing value (pandas'
# default missing-value strings, and NaT), compared after trimming spaces, in any case. As a
# unit id it would merge every such row into one "patient" (or, read as missing elsewhere,
# into none), so the unit's bound would not hold.
BLANK_LOOKING = frozenset({"", "#n/a", "#n/a n/a", "#na", "-1.#ind", "-1.#qnan", "-nan",
                           "1.#ind", "1.#qnan", "<na>", "n/a", "na", "nan", "nat",
                           "null", "none"})
BLANK_IDS = ("look blank or like a missing-value marker (only spaces, NaN, NULL, None, N/A, "
             "NA...): every row must name its unit")
# An id that looks like another one is another unit to the bound: ``123`` and ``123`` + a
# zero-width space are one patient to a reader and two to the release (each kept its own m
# rows). Refused: characters that draw nothing or look like a space — formats (zero-width
# spaces and joiners, direction marks, the byte-order mark, tag characters), every space but
# U+0020, line and paragraph separators, private-use and unassigned code points, variation
# selectors, the Hangul fillers and the blank Braille pattern — and an id not in Unicode NFC
# (``e`` + a combining accent is ``é`` written another way).
INVISIBLE_CATEGORIES = frozenset({"Cf", "Zs", "Zl", "Zp", "Co", "Cn", "Cs"})
INVISIBLE_EXTRA = frozenset({0x115F, 0x1160, 0x3164, 0xFFA0, 0x2800, *range(0xFE00, 0xFE10),
                             *range(0xE0100, 0xE01F0)})
INVISIBLE_IDS = ("contain invisible characters (zero-width spaces or joiners, direction marks, "
                 "non-breaking or other special spaces, ...) or are not in Unicode NFC: an id "
                 "that looks like another would count as another unit")


def _matches(pattern: str):
    def check(series: pd.Series) -> pd.Series:
        return series.isna() | series.astype("string").str.match(pattern).fillna(False)

    return check


def _is_invisible_id(text: str) -> bool:
    """Whether an id holds a character that draws nothing or looks like a space (but U+0020),
    or is not in NFC (``INVISIBLE_CATEGORIES``, ``INVISIBLE_EXTRA``)."""
    return any(ord(c) in INVISIBLE_EXTRA or (c != " " and unicodedata.category(c)
                                             in INVISIBLE_CATEGORIES) for c in text) \
        or unicodedata.normalize("NFC", text) != text


def _visible_id(series: pd.Series) -> pd.Series:
    """Check: a present unit id holds no invisible character and is in NFC. Only ids with a
    character beyond ASCII are looked at one by one (ASCII holds none but the control
    characters, refused by their own check), each distinct id once."""
    text = series.astype("string")
    ok = pd.Series(True, index=series.index)
    odd = text.notna() & ~text.str.isascii().fillna(True)
    if odd.any():
        codes, uniques = pd.factorize(text[odd])
        bad = pd.array([_is_invisible_id(str(u)) for u in uniques], dtype=bool)
        ok[odd] = ~bad[codes]
    return ok


def _names_someone(series: pd.Series) -> pd.Series:
    """Check: a present unit id is not blank-looking (``BLANK_LOOKING``)."""
    trimmed = series.astype("string").str.strip().str.lower()
    return series.isna() | ~trimmed.isin(BLANK_LOOKING).fillna(False)


def _no_control_characters(series: pd.Series) -> pd.Series:
    return series.isna() | ~series.astype("string").str.contains(CONTROL, regex=True).fillna(False)


def _covered_by(taxonomy: Taxonomy):
    """A hand-written coverage check where pandera has none (bands, numeric ranges of text
    values); ``None`` for a list of leaves, which ``_one_of`` checks."""
    if taxonomy.binning is not None:
        binning = taxonomy.binning

        def binned(series: pd.Series) -> pd.Series:
            return pd.Series(binning.covered(series), index=series.index) | ~binning.parse_ok(
                series)  # malformed values are reported by the number-form check

        return binned
    if taxonomy.kind == "numeric":
        low, high = int(taxonomy.leaves[0]), int(taxonomy.leaves[-1])

        def covered(series: pd.Series) -> pd.Series:
            numbers = pd.to_numeric(series, errors="coerce")
            return series.isna() | numbers.isna() | ((numbers >= low) & (numbers <= high))

        return covered
    return None


def _one_of(values, error: str) -> pa.Check:
    """Check: each (present) value is one of ``values``, compared as text. Not pandera's own
    ``isin``, which compares values as typed: a Parquet extract's integer codes (``11``) are
    not the text leaves (``"11"``) of the taxonomy that a CSV's same rows pass (measured: the
    same rows as Parquet were refused; tests/flow/test_content_identity.py)."""
    allowed = pd.Index([str(v) for v in values], dtype="string")

    def check(series: pd.Series) -> pd.Series:
        return series.isna() | series.astype("string").isin(allowed)

    return pa.Check(check, error=error)


def _items_covered_by(taxonomy: Taxonomy, separator: str):
    """Every item of a set-valued cell must be a leaf of the item taxonomy (blank = no items)."""
    leaves = pd.Index(taxonomy.leaves, dtype="string")

    def covered(series: pd.Series) -> pd.Series:
        items = series.astype("string").str.split(separator, regex=False).explode().str.strip()
        bad = items.notna() & (items != "") & ~items.isin(leaves)
        return ~bad.groupby(level=0).any().reindex(series.index, fill_value=False)

    return covered


def _form_checks(config: DatasetConfig, name: str) -> list[pa.Check]:
    """How a value must be written: no control characters; integers and decimals as such."""
    spec = config.columns[name]
    checks = [pa.Check(_no_control_characters, error=CONTROL_CHARS)]
    taxonomy = config.taxonomies.get(name)
    whole = spec.type == "integer" or (taxonomy is not None and taxonomy.kind == "numeric")
    if whole:  # (the missing category passes, as in a decimal column: one rule for both)
        checks.append(pa.Check(_skip_label(_matches(WHOLE.pattern), spec.missing),
                               error=NOT_WHOLE))
    elif spec.type == "decimal" or (taxonomy is not None and taxonomy.binning is not None):
        pattern = WHOLE if taxonomy is not None and taxonomy.binning and \
            taxonomy.binning.whole else DECIMAL
        checks.append(pa.Check(_skip_label(_matches(pattern.pattern), spec.missing),
                               error=NOT_WHOLE if pattern is WHOLE else NOT_DECIMAL))
    return checks


def _skip_label(check, label: str | None):
    """A number-form check that lets the column's declared missing category through: a blank
    in a numeric column becomes that category (``fill_missing_categories``, before the checks),
    which is no number, in an integer column as in a decimal one (issue 55: ``type: integer``
    refused the ``(blank)`` a decimal column accepted)."""
    if label is None:
        return check

    def wrapped(series: pd.Series) -> pd.Series:
        return check(series) | (series.astype("string") == label).fillna(False)

    return wrapped


def schema_columns(config: DatasetConfig) -> list[str]:
    """The columns the input schema checks, in its order."""
    return (config.dimensions + config.informative + config.class_columns + config.set_valued
            + ([config.unit_column] if config.unit_column else []))


def input_schema(config: DatasetConfig) -> pa.DataFrameSchema:
    """The pandera schema of a dataset's extract (undeclared columns are allowed and ignored)."""
    nullable = config.missing == "drop_rows"
    columns: dict[str, pa.Column] = {}
    for name in config.dimensions + config.informative:
        spec = config.columns[name]
        checks = _form_checks(config, name)
        if spec.role == "informative" and spec.domain:
            checks.append(_one_of(config.informative_domain or [],
                                  error="are not in its declared domain "
                                        f"({spec.domain.rsplit('/', 1)[-1]})"))
        if spec.role == "dimension":
            taxonomy = config.taxonomies[name]
            where = taxonomy.source.rsplit("/", 1)[-1]
            error = f"are not covered by its taxonomy ({where})"
            covered = _covered_by(taxonomy)
            checks.append(_one_of(taxonomy.leaves, error) if covered is None
                          else pa.Check(covered, error=error))
        columns[name] = pa.Column(checks=checks, nullable=nullable or spec.missing is not None,
                                  required=True)
    for name in config.class_columns:
        allowed_classes = config.columns[name].values
        checks = [pa.Check(_no_control_characters, error=CONTROL_CHARS)]
        if allowed_classes:
            checks.append(_one_of(allowed_classes, error="are not one of the class values the "
                                                         "config declares"))
        columns[name] = pa.Column(checks=checks, nullable=nullable, required=True)
    if config.unit_column is not None:  # every row must say whose it is, or it cannot be bounded
        columns[config.unit_column] = pa.Column(
            checks=[pa.Check(_no_control_characters, error=CONTROL_CHARS),
                    pa.Check(_names_someone, error=BLANK_IDS),
                    pa.Check(_visible_id, error=INVISIBLE_IDS)], nullable=False,
            required=True)
    for name in config.set_valued:
        taxonomy = config.taxonomies[name]
        columns[name] = pa.Column(
            checks=[pa.Check(_no_control_characters, error=CONTROL_CHARS),
                    pa.Check(_items_covered_by(taxonomy, config.columns[name].separator or ""),
                             error="hold an item not covered by its item taxonomy "
                                   f"({taxonomy.source.rsplit('/', 1)[-1]})")],
            nullable=True, required=True)
    return pa.DataFrameSchema(
        columns,
        checks=[pa.Check(lambda frame: len(frame) > 0, error="the table has no rows")],
        strict=False,
        name=f"input:{config.name}",
    )


def fill_missing_categories(frame: pd.DataFrame, config: DatasetConfig) -> pd.DataFrame:
    """Missing values of a dimension with a declared ``missing:`` label become that category."""
    labels = {c: s.missing for c, s in config.columns.items()
              if s.missing is not None and c in frame.columns}
    return frame.fillna(labels) if labels else frame


def validate_input(frame: pd.DataFrame, config: DatasetConfig) -> pd.DataFrame:
    """Validate; raise ``InputValidationError`` naming columns, problems, counts and lines."""
    if frame.empty:
        raise InputValidationError(
            "the input has no data rows (empty file or header only): nothing to release"
        )
    frame = canonical_informative_numbers(fill_missing_categories(frame, config), config)
    try:
        return input_schema(config).validate(frame, lazy=True)
    except SchemaErrors as exc:
        problems, lines = _describe(exc.failure_cases)
        raise InputValidationError(
            f"input does not match dataset config {config.name!r}:\n" + "\n".join(lines), problems
        ) from None


def _describe(cases: pd.DataFrame) -> tuple[list[dict], list[str]]:
    """One line per (column, check): how many distinct values and rows, and the first lines."""
    problems: list[dict] = []
    lines: list[str] = []
    cases = cases.copy()
    cases["check"] = cases["check"].astype(str)
    for (column, check), group in cases.groupby(["column", "check"], sort=False, dropna=False):
        if check == "column_in_dataframe":
            missing = ", ".join(repr(v) for v in group["failure_case"].astype(str))
            lines.append(f"  missing declared column(s): {missing}")
            problems.append({"column": str(group["failure_case"].iloc[0]),
                             "problem": "missing column"})
            continue
        rows = sorted(int(i) for i in group["index"].dropna())
        if check == "not_nullable":
            lines.append(f"  column {column!r}: {len(rows)} missing value(s), first at "
                         f"{format_rows(rows)}")
            problems.append({"column": column, "problem": "missing value", "rows": len(rows),
                             "first_positions": position_numbers(rows)})
            continue
        if pd.isna(column):
            lines.append(f"  {check}")
            problems.append({"column": None, "problem": check})
            continue
        values = group["failure_case"].astype(str)
        lines.append(f"  column {column!r}: {values.nunique()} distinct value(s) {check}, in "
                     f"{len(rows)} row(s), first at {format_rows(rows)}")
        problems.append({"column": column, "problem": check, "rows": len(rows),
                         "distinct_values": int(values.nunique()),
                         "first_positions": position_numbers(rows),
                         "values": values.drop_duplicates().head(10).tolist()})
    return problems, lines


def missing_rows(frame: pd.DataFrame, columns: list[str]) -> np.ndarray:
    """Positions (0-based) of rows with a missing value in any of ``columns``."""
    return np.flatnonzero(frame[columns].isna().any(axis=1).to_numpy())
