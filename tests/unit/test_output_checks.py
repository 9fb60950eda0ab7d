"""The output checks run on the released cell table (distinct rows with counts) and still catch
every kind of bad release row by row: each broken table below fails exactly its check."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from schemas.output import ROWS, OutputExpectations, cell_table, check_release

EXPECT = OutputExpectations(
    columns=["age", "sex", "diagnosis"],
    dimension_labels={"age": ["[0-49]", "[50-99]"], "sex": ["F", "M"]},
    informative_domain={"diagnosis": ["A001", "B002"]},
    min_rows=900, max_rows=1_100,
    fully_suppressed_levels={"age": False, "sex": False},
)


def _good(n: int = 1_000) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    table = pd.DataFrame({
        "age": pd.Categorical(rng.choice(["[0-49]", "[50-99]", "*"], n),
                              categories=["[0-49]", "[50-99]", "*"]),
        "sex": pd.Categorical(rng.choice(["F", "M"], n), categories=["F", "M", "*"]),
        "diagnosis": rng.choice(["A001", "B002"], n).astype(object)})
    table.loc[table["age"] == "*", "sex"] = "*"  # suppressed rows are '*' everywhere
    return table


def _failed(table: pd.DataFrame) -> set[str]:
    report = check_release(table, EXPECT)
    return {r["check"] + (f"({r['column']})" if r["column"] else "") for r in report.failures()}


def test_a_clean_release_passes_and_is_checked_on_its_cells() -> None:
    import json

    table = _good()
    cells = cell_table(table)
    assert len(cells) < 20 and cells[ROWS].sum() == len(table)
    assert _failed(table) == set()
    json.dumps(check_release(table, EXPECT).results)  # the steward record stores them as JSON


def _with(column: str, value, rows=slice(0, 3)) -> pd.DataFrame:
    table = _good().astype({"age": object, "sex": object})
    table.loc[table.index[rows], column] = value
    return table


@pytest.mark.parametrize("broken, check", [
    (lambda: _with("age", "[0-9]"), "expect_column_values_to_be_in_set(age)"),
    (lambda: _with("sex", None), "expect_column_values_to_not_be_null(sex)"),
    (lambda: _with("diagnosis", "Z999"), "expect_column_values_to_be_in_set(diagnosis)"),
    (lambda: _good().assign(patient_id=1), "expect_table_columns_to_match_set"),
    (lambda: _good(1_200), "expect_column_sum_to_be_between(__rows)"),
    (lambda: _with("sex", "*", rows=_good()["age"].ne("*").to_numpy()), "suppressed_rows_all_star"),
])
def test_each_broken_release_fails_its_check(broken, check: str) -> None:
    assert check in _failed(broken())


@pytest.mark.parametrize("make", [
    _good,
    lambda: _with("age", "[0-9]"),
    lambda: _with("sex", None),
    lambda: _with("diagnosis", "Z999", rows=slice(0, 40)),
    lambda: _good().assign(patient_id=1),
    lambda: _good(1_200),
])
@pytest.mark.slow
def test_the_gate_gives_what_great_expectations_gives_for_the_same_suite(make) -> None:
    """The release gate evaluates the suite with pandas (no 2.5 s import per run); Great
    Expectations, run on the same suite and cell table, reports the same outcome."""
    from schemas.output import check_release_with_gx

    table = make()
    ours, theirs = check_release(table, EXPECT), check_release_with_gx(table, EXPECT)

    def outcome(report):
        return [(r["check"], r["column"], r["success"],
                 r["unexpected"]["count"] if isinstance(r["unexpected"], dict)
                 else (sorted(r["unexpected"]) if isinstance(r["unexpected"], list)
                       else r["unexpected"])) for r in report.results]

    assert outcome(ours) == outcome(theirs)
    assert ours.success == theirs.success


def test_categorical_cells_are_checked_as_their_values() -> None:
    """Cells held as categories (a synthetic release's) are checked category by category:
    the same outcome, counts and examples (in row order) as the same cells as text."""
    from medrelease.storage.released_rows import ReleasedRows

    table = _with("diagnosis", "Z999", rows=slice(0, 40))
    table.loc[table.index[50:53], "diagnosis"] = None
    cells = table.drop_duplicates().reset_index(drop=True)
    counts = np.arange(1, len(cells) + 1)
    as_text = ReleasedRows(cells.astype(object), counts, np.random.SeedSequence(0))
    as_categories = ReleasedRows(cells.astype("category"), counts, np.random.SeedSequence(0))
    ours = check_release(as_categories, EXPECT)
    assert ours.results == check_release(as_text, EXPECT).results
    in_set = next(r for r in ours.failures()
                  if r["check"] == "expect_column_values_to_be_in_set")
    assert in_set["column"] == "diagnosis" and set(in_set["unexpected"]["examples"]) == {"Z999"}
    assert in_set["unexpected"]["count"] == cells["diagnosis"].eq("Z999").sum() > 0
