"""Output checks: a Great Expectations suite built for the release at hand.

The suite's value sets depend on the chosen lattice node, so it is built per release from
``OutputExpectations``; its JSON and results go to the steward record (``checks.json``), and the
public manifest lists the checks in words that name no input-derived value. Checks:
* the table's columns are exactly the declared released columns (nothing undeclared leaks);
* every dimension value is a label of the chosen node's level, or ``*``;
* informative values lie within the input's domain;
* the row count lies within the bound the mechanism implies;
* suppressed rows are ``*`` on every dimension (a plain pandas check beside the suite: GX's
  row-condition expectations need a SQL source).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from medrelease.data.taxonomy import SUPPRESSED
from medrelease.storage.released_rows import ROWS, ReleasedRows

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")


@dataclass(frozen=True)
class OutputExpectations:
    columns: list[str]
    dimension_labels: dict[str, list[str]]
    informative_domain: dict[str, list[Any]]
    min_rows: int
    max_rows: int
    fully_suppressed_levels: dict[str, bool] = field(default_factory=dict)
    public_domain: bool = False
    # The released nodes' '*' patterns (columns at the top level), one per node: ipa's ladder
    # releases rows at coarser nodes. None: the one node of ``fully_suppressed_levels``.
    star_patterns: list[list[str]] | None = None

    def public_phrasing(self) -> list[str]:
        """The checks in words that name no value computed from the input (for the manifest).

        The value sets and the row bound themselves stay in the steward record: they come from
        true counts and, without a declared domain, from the input's informative values.
        """
        lines = [f"the columns are exactly: {', '.join(self.columns)}"]
        if self.dimension_labels:
            lines += ["every dimension value is a label of its taxonomy at the chosen node's "
                      "level, or '*'; none is missing",
                      "a row's '*' values are those of a released node (chosen node or a "
                      "ladder rung), or it is '*' on every dimension (suppressed rows)"]
        if self.informative_domain:
            where = ("the declared public domain" if self.public_domain
                     else "the values the input holds")
            lines.append(f"every informative value lies in {where}")
        lines.append("the number of rows lies within the bound the mechanism implies")
        return lines


@dataclass(frozen=True)
class CheckReport:
    success: bool
    results: list[dict[str, Any]]
    suite: dict[str, Any]
    public: list[str] = field(default_factory=list)

    def failures(self) -> list[dict[str, Any]]:
        return [r for r in self.results if not r["success"]]




def build_suite(expect: OutputExpectations, name: str = "release-output"):
    """The suite, on the released *cell table*: one row per distinct released row, with its
    number of rows in ``__rows`` (so the checks cost distinct rows, not released rows)."""
    import great_expectations as gx

    suite = gx.ExpectationSuite(name=name)
    suite.add_expectation(gx.expectations.ExpectTableColumnsToMatchSet(
        column_set=[*expect.columns, ROWS], exact_match=True))
    for column, labels in expect.dimension_labels.items():
        suite.add_expectation(gx.expectations.ExpectColumnValuesToBeInSet(
            column=column, value_set=sorted(set(labels) | {SUPPRESSED})))
        suite.add_expectation(gx.expectations.ExpectColumnValuesToNotBeNull(column=column))
    for column, domain in expect.informative_domain.items():
        suite.add_expectation(gx.expectations.ExpectColumnValuesToBeInSet(
            column=column, value_set=sorted({str(v) for v in domain})))  # cells hold text
    suite.add_expectation(gx.expectations.ExpectColumnSumToBeBetween(
        column=ROWS, min_value=expect.min_rows, max_value=expect.max_rows))
    return suite


def cell_table(table: pd.DataFrame) -> pd.DataFrame:
    """The released table as distinct rows with their counts (missing values kept)."""
    return ReleasedRows.from_frame(table).cell_table()


def check_release(released: ReleasedRows | pd.DataFrame, expect: OutputExpectations
                  ) -> CheckReport:
    """Run the suite on the released table's cell table (and the suppressed-row check).

    Unexpected counts are distinct released rows for value checks, rows for the rest."""
    if isinstance(released, pd.DataFrame):
        released = ReleasedRows.from_frame(released)
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    batch = (
        context.data_sources.add_pandas("release")
        .add_dataframe_asset("table")
        .add_batch_definition_whole_dataframe("whole")
    )
    suite = context.suites.add(build_suite(expect))
    definition = context.validation_definitions.add(
        gx.ValidationDefinition(data=batch, suite=suite, name="release-output")
    )
    frame = released.cell_table()
    outcome = definition.run(batch_parameters={"dataframe": frame})
    results = [
        {
            "check": r.expectation_config.type,
            "column": r.expectation_config.kwargs.get("column"),
            "success": bool(r.success),
            "unexpected": _unexpected(r.result),
        }
        for r in outcome.results
    ]
    results.append(_suppressed_rows_all_star(frame, expect))
    suite_json = suite.to_json_dict()
    return CheckReport(all(r["success"] for r in results), results, suite_json,
                       expect.public_phrasing())


def _unexpected(result: dict[str, Any]) -> Any:
    if "unexpected_count" in result:
        return {"count": _plain(result.get("unexpected_count")),
                "examples": [str(v) for v in (result.get("partial_unexpected_list") or [])[:3]]}
    return _plain(result.get("observed_value"))


def _plain(value: Any) -> Any:
    """numpy scalars (GX reports sums of the count column as such) as Python numbers."""
    return value.item() if isinstance(value, np.generic) else value


def _suppressed_rows_all_star(frame: pd.DataFrame, expect: OutputExpectations) -> dict[str, Any]:
    """A row that is '*' on a dimension not generalized to '*' must be '*' everywhere."""
    dims = list(expect.dimension_labels)
    patterns = expect.star_patterns
    if patterns is None:
        patterns = [[c for c in dims if expect.fully_suppressed_levels.get(c)]]
    if not dims or frame.empty:
        return {"check": "suppressed_rows_all_star", "column": None, "success": True,
                "unexpected": None}
    stars = frame[dims].eq(SUPPRESSED).to_numpy()
    allowed = np.array([[c in p for c in dims] for p in [*patterns, dims]])
    matches = (stars[:, None, :] == allowed[None, :, :]).all(axis=2).any(axis=1)
    rows = int(frame[ROWS].to_numpy()[~matches].sum())
    return {"check": "suppressed_rows_all_star", "column": None, "success": rows == 0,
            "unexpected": {"count": rows}}
