"""The input schema, built from a dataset config with pandera.

Columns arrive as text (``medrelease.io``); the schema checks, per declared column, that values
are present when the missing-value policy says so, that integer columns hold whole numbers, and
that every dimension value is covered by its taxonomy. Validation is lazy so one run reports
every problem, grouped per column and check, with the values and the first row numbers.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pandera.pandas as pa
from pandera.errors import SchemaErrors

from medrelease.config import DatasetConfig
from medrelease.errors import InputValidationError, format_rows
from medrelease.taxonomy import Taxonomy

MAX_VALUES_SHOWN = 5


def _whole_number(series: pd.Series) -> pd.Series:
    numbers = pd.to_numeric(series, errors="coerce")
    return series.isna() | (numbers.notna() & (np.floor(numbers) == numbers))


def _covered_by(taxonomy: Taxonomy):
    if taxonomy.kind == "numeric":
        low, high = int(taxonomy.leaves[0]), int(taxonomy.leaves[-1])

        def covered(series: pd.Series) -> pd.Series:
            numbers = pd.to_numeric(series, errors="coerce")
            return series.isna() | numbers.isna() | ((numbers >= low) & (numbers <= high))

        return covered
    return _one_of(taxonomy.leaves)


def _one_of(values) -> object:
    """Check: each (present) value is one of ``values``, compared as text."""
    allowed = pd.Index([str(v) for v in values], dtype="string")

    def check(series: pd.Series) -> pd.Series:
        return series.isna() | series.astype("string").isin(allowed)

    return check


def _items_covered_by(taxonomy: Taxonomy, separator: str):
    """Every item of a set-valued cell must be a leaf of the item taxonomy (blank = no items)."""
    leaves = pd.Index(taxonomy.leaves, dtype="string")

    def covered(series: pd.Series) -> pd.Series:
        items = series.astype("string").str.split(separator, regex=False).explode().str.strip()
        bad = items.notna() & (items != "") & ~items.isin(leaves)
        return ~bad.groupby(level=0).any().reindex(series.index, fill_value=False)

    return covered


def input_schema(config: DatasetConfig) -> pa.DataFrameSchema:
    """The pandera schema of a dataset's extract (undeclared columns are allowed and ignored)."""
    nullable = config.missing == "drop_rows"
    columns: dict[str, pa.Column] = {}
    for name in config.dimensions + config.informative:
        spec = config.columns[name]
        checks = []
        if spec.type == "integer":
            checks.append(pa.Check(_whole_number, error="is not a whole number"))
        if spec.role == "informative" and spec.domain:
            checks.append(pa.Check(_one_of(config.informative_domain or []),
                                   error=f"is not in its declared domain ({spec.domain})"))
        if spec.role == "dimension":
            taxonomy = config.taxonomies[name]
            checks.append(pa.Check(_covered_by(taxonomy),
                                   error=f"is not covered by its taxonomy ({taxonomy.source})"))
        columns[name] = pa.Column(checks=checks, nullable=nullable, required=True)
    for name in config.class_columns:
        allowed_classes = config.columns[name].values
        if allowed_classes:
            columns[name] = pa.Column(checks=[pa.Check(
                _one_of(allowed_classes),
                error="is not one of the class values declared in the dataset config")],
                nullable=nullable, required=True)
    for name in config.set_valued:
        taxonomy = config.taxonomies[name]
        columns[name] = pa.Column(
            checks=[pa.Check(_items_covered_by(taxonomy, config.columns[name].separator or ""),
                             error=f"holds an item not covered by its item taxonomy "
                                   f"({taxonomy.source})")],
            nullable=True, required=True)
    return pa.DataFrameSchema(
        columns,
        checks=[pa.Check(lambda frame: len(frame) > 0, error="the table has no rows")],
        strict=False,
        name=f"input:{config.name}",
    )


def validate_input(frame: pd.DataFrame, config: DatasetConfig) -> pd.DataFrame:
    """Validate; raise ``InputValidationError`` listing columns, values and first rows."""
    if frame.empty:
        raise InputValidationError(
            "the input has no data rows (empty file or header only): nothing to release"
        )
    try:
        return input_schema(config).validate(frame, lazy=True)
    except SchemaErrors as exc:
        problems, lines = _describe(exc.failure_cases)
        raise InputValidationError(
            f"input does not match dataset config {config.name!r}:\n" + "\n".join(lines), problems
        ) from None


def _describe(cases: pd.DataFrame) -> tuple[list[dict], list[str]]:
    problems: list[dict] = []
    lines: list[str] = []
    cases = cases.copy()
    cases["check"] = cases["check"].astype(str)
    for (column, check), group in cases.groupby(["column", "check"], sort=False, dropna=False):
        if check == "column_in_dataframe":
            missing = ", ".join(repr(v) for v in group["failure_case"].astype(str))
            lines.append(f"  missing column(s): {missing}")
            problems.append({"column": str(group["failure_case"].iloc[0]),
                             "problem": "missing column"})
            continue
        if check == "not_nullable":
            rows = sorted(int(i) for i in group["index"].dropna())
            lines.append(f"  column {column!r}: {len(rows)} missing value(s), first at row(s) "
                         f"{format_rows(rows)}")
            problems.append({"column": column, "problem": "missing value", "rows": len(rows),
                             "first_rows": [r + 1 for r in rows[:MAX_VALUES_SHOWN]]})
            continue
        if pd.isna(column):
            lines.append(f"  {check}")
            problems.append({"column": None, "problem": check})
            continue
        per_value = group.groupby(group["failure_case"].astype(str), sort=False)["index"]
        for shown, (value, rows) in enumerate(per_value):
            if shown == MAX_VALUES_SHOWN:
                lines.append(f"  column {column!r}: ... and {per_value.ngroups - shown} more "
                             f"value(s) that {check}")
                break
            row_list = sorted(int(i) for i in rows.dropna())
            lines.append(f"  column {column!r}: value {value!r} {check}: {len(row_list)} row(s), "
                         f"first at row(s) {format_rows(row_list)}")
            problems.append({"column": column, "value": value, "problem": check,
                             "rows": len(row_list),
                             "first_rows": [r + 1 for r in row_list[:MAX_VALUES_SHOWN]]})
    return problems, lines
