"""Output checks: a Great Expectations suite built for the release at hand.

The suite's value sets depend on the chosen lattice node, so it is built per release from
``OutputExpectations``; its JSON and results go to the steward record (``checks.json``), and the
public manifest lists the checks in words that name no input-derived value.

The suite is data (``suite_spec``: Great Expectations' own expectation types and arguments) and
the release gate evaluates it with pandas (``check_release``), because importing Great
Expectations costs 2.5-2.7 s per run, and a served run is a fresh process each time; the same
suite runs under Great Expectations itself in ``check_release_with_gx``, and a test holds the two
to the same results on passing and failing tables. Checks:
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

from medrelease.data.config import DatasetConfig
from medrelease.data.taxonomy import SUPPRESSED
from medrelease.errors import MedreleaseError
from medrelease.mechanisms import capabilities, output_columns
from medrelease.mechanisms.base import ReleaseContext
from medrelease.plan import CheckReport, MaterializedRelease
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
    # '*' may appear (generalized rows); False for synthetic rows, drawn at the taxonomies'
    # leaves: the check is then stricter and its words say so
    star_allowed: bool = True

    def public_phrasing(self) -> list[str]:
        """The checks in words that name no value computed from the input (for the manifest).

        The value sets and the row bound themselves stay in the steward record: they come from
        true counts and, without a declared domain, from the input's informative values.
        """
        lines = [f"the columns are exactly: {', '.join(self.columns)}"]
        if self.dimension_labels and not self.star_allowed:
            lines.append("every dimension value is a leaf label of its taxonomy (synthetic rows "
                         "are drawn at the finest level, never '*'); none is missing")
        elif self.dimension_labels:
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


SUITE_NAME = "release-output"


def suite_spec(expect: OutputExpectations) -> list[dict[str, Any]]:
    """The suite as Great Expectations expectation configs (type and kwargs), on the released
    *cell table*: one row per distinct released row, with its number of rows in ``__rows`` (so
    the checks cost distinct rows, not released rows)."""
    spec: list[dict[str, Any]] = [{"type": "expect_table_columns_to_match_set", "kwargs": {
        "column_set": [*expect.columns, ROWS], "exact_match": True}}]
    for column, labels in expect.dimension_labels.items():
        spec.append({"type": "expect_column_values_to_be_in_set", "kwargs": {
            "column": column,
            "value_set": sorted(set(labels) | ({SUPPRESSED} if expect.star_allowed else set()))}})
        spec.append({"type": "expect_column_values_to_not_be_null", "kwargs": {"column": column}})
    for column, domain in expect.informative_domain.items():
        spec.append({"type": "expect_column_values_to_be_in_set", "kwargs": {
            "column": column, "value_set": sorted({str(v) for v in domain})}})  # cells hold text
    spec.append({"type": "expect_column_sum_to_be_between", "kwargs": {
        "column": ROWS, "min_value": expect.min_rows, "max_value": expect.max_rows}})
    return spec


def build_suite(expect: OutputExpectations, name: str = SUITE_NAME):
    """The same suite as a Great Expectations ``ExpectationSuite`` (imports GX: not on the
    release's hot path)."""
    import great_expectations as gx

    suite = gx.ExpectationSuite(name=name)
    for entry in suite_spec(expect):
        kind = "".join(part.title() for part in entry["type"].split("_"))
        suite.add_expectation(getattr(gx.expectations, kind)(**entry["kwargs"]))
    return suite


def cell_table(table: pd.DataFrame) -> pd.DataFrame:
    """The released table as distinct rows with their counts (missing values kept)."""
    return ReleasedRows.from_frame(table).cell_table()


def check_release(released: ReleasedRows | pd.DataFrame, expect: OutputExpectations
                  ) -> CheckReport:
    """The suite evaluated with pandas on the released table's cell table (and the
    suppressed-row check): what Great Expectations reports for it, without its import.

    Unexpected counts are distinct released rows for value checks, rows for the rest."""
    if isinstance(released, pd.DataFrame):
        released = ReleasedRows.from_frame(released)
    frame = released.cell_table()
    spec = suite_spec(expect)
    results = [_evaluate(entry, frame) for entry in spec]
    results.append(_suppressed_rows_all_star(frame, expect))
    suite_json = {"name": SUITE_NAME, "expectations": spec,
                  "evaluated_by": "pandas (the same results as Great Expectations, tested)"}
    return CheckReport(all(r["success"] for r in results), results, suite_json,
                       expect.public_phrasing())


def _evaluate(entry: dict[str, Any], frame: pd.DataFrame) -> dict[str, Any]:
    """One expectation as Great Expectations evaluates it on a pandas frame (nulls are not
    'unexpected' for a value set; the first 3 unexpected values, in row order)."""
    kind, kwargs = entry["type"], entry["kwargs"]
    column = kwargs.get("column")
    out = {"check": kind, "column": column}
    if kind == "expect_table_columns_to_match_set":
        observed = list(frame.columns)
        return {**out, "success": set(observed) == set(kwargs["column_set"]),
                "unexpected": observed}
    if kind == "expect_column_sum_to_be_between":
        total = _plain(frame[column].sum())
        return {**out, "success": kwargs["min_value"] <= total <= kwargs["max_value"],
                "unexpected": total}
    if column not in frame.columns:
        return {**out, "success": False, "unexpected": {"count": None, "examples": []}}
    values = frame[column]
    if kind == "expect_column_values_to_not_be_null":
        bad = values[values.isna()]
    elif isinstance(values.dtype, pd.CategoricalDtype):  # each category checked once
        allowed = np.append(values.cat.categories.isin(kwargs["value_set"]), True)
        bad = values[~allowed[values.cat.codes.to_numpy()]]  # code -1 (null): the last entry
    else:
        present = values[values.notna()]
        bad = present[~present.isin(kwargs["value_set"])]
    return {**out, "success": bad.empty,
            "unexpected": {"count": int(bad.size), "examples": [str(v) for v in bad[:3]]}}


def check_release_with_gx(released: ReleasedRows | pd.DataFrame, expect: OutputExpectations
                          ) -> CheckReport:
    """The suite run by Great Expectations itself (the reference ``check_release`` matches)."""
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


class OutputCheckError(MedreleaseError):
    """The release failed its output checks; it is not published."""


def expectations_for(config: DatasetConfig, context: ReleaseContext | None,
                     chosen: MaterializedRelease, mechanism: str = "") -> OutputExpectations:
    if context is None:  # no lattice: columns and row count; values are intervals or pseudonyms
        return OutputExpectations(
            columns=output_columns(config, mechanism),
            dimension_labels={}, informative_domain={},
            min_rows=chosen.row_bounds[0], max_rows=chosen.row_bounds[1])
    nodes = chosen.nodes or (chosen.node,)  # ipa's ladder: the labels of every rung
    taxonomies = context.counts.taxonomies  # (aim's context never builds a lattice)
    labels = {
        column: sorted({label for node in nodes for label in taxonomies[i].level_labels[node[i]]})
        for i, column in enumerate(context.counts.dimensions)
    }
    informative = {
        column: context.counts.informative[column].tolist()
        for column in context.counts.informative.columns
    }
    synthetic = bool(mechanism) and capabilities(mechanism).kind == "synthetic"
    return OutputExpectations(
        columns=list(context.counts.dimensions) + list(context.counts.informative.columns),
        star_allowed=not synthetic,  # synthetic rows are drawn at the leaves: never '*'

        dimension_labels=labels,
        informative_domain=informative,
        min_rows=chosen.row_bounds[0],
        max_rows=chosen.row_bounds[1],
        public_domain=context.counts.public_domain,
        fully_suppressed_levels={
            column: all(node[i] == taxonomies[i].height for node in nodes)
            for i, column in enumerate(context.counts.dimensions)
        },
        star_patterns=[[c for i, c in enumerate(context.counts.dimensions)
                        if node[i] == taxonomies[i].height] for node in nodes],
    )


def relational_checks(config: DatasetConfig, chosen: MaterializedRelease) -> CheckReport:
    """A relational release's output checks, from the released tables and the config alone:
    per table the suite above (its columns exactly its key, its reference and its released
    columns; every value a leaf of its taxonomy, none missing), then the tables together:
    keys distinct and fresh (``<table>-<n>``, never an input key), every reference naming a
    released parent row, no parent with more rows than its table's ``max_children``, between
    one patient and the public ceiling."""
    schema = config.relational_schema
    results: list[dict[str, Any]] = []
    suites: dict[str, Any] = {}
    words: list[str] = []
    tables = chosen.data_tables
    for table in schema.tables:
        frame = tables.get(table.name)
        if frame is None:
            results.append({"check": "table_released", "column": table.name, "success": False,
                            "unexpected": None})
            continue
        keys = [c for c in (table.key, table.parent_key) if c]
        expect = OutputExpectations(
            columns=[*keys, *table.column_names],
            dimension_labels={c.name: list(c.taxonomy.level_labels[0]) for c in table.columns},
            informative_domain={}, min_rows=0, max_rows=2 ** 62, star_allowed=False)
        report = check_release(frame, expect)
        results += [{**r, "column": f"{table.name}.{r['column']}" if r.get("column")
                     else table.name} for r in report.results
                    if r["check"] != "suppressed_rows_all_star"]
        suites[table.name] = report.suite
        if table.key:
            key = frame[table.key].astype(str)
            fresh = key.str.fullmatch(rf"{table.name}-[0-9]+")
            results.append({"check": "keys_distinct_and_fresh", "column": f"{table.name}."
                            f"{table.key}", "success": bool(key.is_unique and fresh.all()),
                            "unexpected": {"count": int((~fresh).sum()
                                                        + key.duplicated().sum())}})
        if table.parent is not None:
            parent = schema.table(table.parent)
            parent_keys = tables.get(parent.name, pd.DataFrame({parent.key: []}))[parent.key]
            ref = frame[table.parent_key]
            orphans = int((~ref.isin(set(parent_keys))).sum())
            results.append({"check": "references_resolve", "column": f"{table.name}."
                            f"{table.parent_key}", "success": orphans == 0,
                            "unexpected": {"count": orphans}})
            over = int((ref.value_counts() > int(table.max_children or 0)).sum())
            results.append({"check": "children_within_max_children", "column": table.name,
                            "success": over == 0, "unexpected": {"count": over}})
            words.append(f"{table.name}: every {table.parent_key} names a released row of "
                         f"{parent.name}, at most {table.max_children} per row of "
                         f"{parent.name}")
    patients = len(tables.get(schema.root.name, ()))
    low, high = chosen.row_bounds
    results.append({"check": "patients_between", "column": schema.root.name,
                    "success": low <= patients <= high, "unexpected": {"count": patients}})
    public = ["each table's columns are exactly its key, its reference and its released "
              "columns; every value is a leaf label of its taxonomy or declared values (never "
              "'*'); none is missing",
              "keys are distinct and fresh (<table>-<n>), never an input key", *words,
              "the number of patients lies between 1 and the public ceiling max_patients"]
    return CheckReport(all(r["success"] for r in results), results,
                       {"name": SUITE_NAME, "tables": suites}, public)


def checked_output(config: DatasetConfig, context: ReleaseContext | None,
                 chosen: MaterializedRelease, mechanism: str = "") -> CheckReport:
    """The output suite for this release, run; a failure raises ``OutputCheckError`` (nothing
    is published)."""
    report = (relational_checks(config, chosen) if chosen.data_tables else
              check_release(chosen.rows, expectations_for(config, context, chosen, mechanism)))
    if not report.success:
        failed = "; ".join(
            f"{r['check']}{'(' + r['column'] + ')' if r['column'] else ''}: {r['unexpected']}"
            for r in report.failures()
        )
        raise OutputCheckError(f"release failed its output checks, nothing published: {failed}")
    return report
