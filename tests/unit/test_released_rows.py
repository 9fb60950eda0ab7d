"""Released rows streamed in row groups: same multiset, uniform order, memory that follows cells."""

from __future__ import annotations

import io
import itertools
import tracemalloc
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from medrelease.storage.released_rows import ReleasedRows, shuffled_cell_groups
from medrelease.storage.store import neutralise_formulas, write_data_files


def _cells(n_cells: int, seed: int = 0) -> tuple[pd.DataFrame, np.ndarray]:
    rng = np.random.default_rng(seed)
    cells = pd.DataFrame({
        "age": pd.Categorical.from_codes(rng.integers(0, 3, n_cells),
                                         categories=["[0-39]", "[40-79]", "*"]),
        "diagnosis": np.array([f"=D{i}" if i % 7 == 0 else f"D{i}" for i in range(n_cells)],
                              dtype=object),
    })
    return cells, rng.integers(1, 40, n_cells)


def _expanded(cells: pd.DataFrame, counts: np.ndarray) -> pd.DataFrame:
    """The in-memory expansion the flow used to build: every cell repeated by its count."""
    return cells.take(np.repeat(np.arange(len(cells)), counts)).reset_index(drop=True)


def _multiset(frame: pd.DataFrame) -> Counter:
    return Counter(map(tuple, frame.astype(str).to_numpy()))


@pytest.mark.parametrize("size", [1, 7, 1000, 10**6])
def test_streamed_files_hold_the_released_multiset_in_the_in_memory_order(tmp_path, size):
    cells, counts = _cells(60)
    rows = ReleasedRows(cells, counts, np.random.SeedSequence(5))
    parquet, csv = tmp_path / "data.parquet", tmp_path / "data.csv"
    write_data_files(rows, parquet, csv, size=size)

    in_memory = rows.to_frame()
    written = pd.read_parquet(parquet)
    assert len(written) == counts.sum()
    pd.testing.assert_frame_equal(written.astype(str), in_memory.astype(str))
    assert _multiset(written) == _multiset(_expanded(cells, counts))
    whole_csv = io.StringIO()
    neutralise_formulas(in_memory).to_csv(whole_csv, index=False)
    assert csv.read_text(encoding="utf-8") == whole_csv.getvalue()
    assert "'=D0" in whole_csv.getvalue()  # formula text neutralised in the CSV only
    assert (written["diagnosis"] == "=D0").any()


def test_group_size_does_not_change_the_rows_only_how_they_are_cut():
    cells, counts = _cells(30)
    seed = np.random.SeedSequence(9)
    groups = list(ReleasedRows(cells, counts, seed).group_indices(11))
    assert all(g.size == 11 for g in groups[:-1]) and 0 < groups[-1].size <= 11
    assert np.bincount(np.concatenate(groups), minlength=len(cells)).tolist() == counts.tolist()


def test_the_order_is_a_uniform_arrangement_of_the_multiset():
    """Multiset {a, a, b, c}: 12 arrangements, each with probability 1/12, also when the
    rows are drawn two at a time (chi-square, 6,000 draws, fixed seeds: cannot flake)."""
    counts = np.array([2, 1, 1])
    draws = 6000
    seen = Counter(
        tuple(np.concatenate(list(shuffled_cell_groups(counts, np.random.SeedSequence(s), 1,
                                                       block=2))))
        for s in range(draws))
    arrangements = set(itertools.permutations([0, 0, 1, 2]))
    assert set(seen) == arrangements
    expected = draws / len(arrangements)
    chi2 = sum((seen[a] - expected) ** 2 / expected for a in arrangements)
    assert chi2 < 31.3  # 99.9th percentile of chi-square with 11 degrees of freedom


def test_an_empty_release_writes_files_with_the_columns_and_no_rows(tmp_path):
    cells, _ = _cells(3)
    rows = ReleasedRows(cells, np.zeros(3, dtype=np.int64), np.random.SeedSequence(1))
    write_data_files(rows, tmp_path / "d.parquet", tmp_path / "d.csv")
    assert list(pd.read_parquet(tmp_path / "d.parquet").columns) == ["age", "diagnosis"]
    assert (tmp_path / "d.csv").read_text(encoding="utf-8").strip() == "age,diagnosis"


def test_a_materialized_table_is_written_as_it_is(tmp_path):
    frame = pd.DataFrame({"x": ["b", "a", "+1x", "a"], "y": [1, 2, 3, 4]})
    write_data_files(ReleasedRows.from_frame(frame), tmp_path / "d.parquet", tmp_path / "d.csv",
                     size=3)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "d.parquet"), frame)
    assert (tmp_path / "d.csv").read_text(encoding="utf-8") == (
        neutralise_formulas(frame).to_csv(index=False))


def test_cell_table_counts_rows_without_expanding_them():
    cells, counts = _cells(50)
    rows = ReleasedRows(cells, counts, np.random.SeedSequence(2))
    table = rows.cell_table().astype({"age": str})
    expected = ReleasedRows.from_frame(_expanded(cells, counts)).cell_table().astype({"age": str})
    key = ["age", "diagnosis"]
    pd.testing.assert_frame_equal(table.sort_values(key).reset_index(drop=True),
                                  expected.sort_values(key).reset_index(drop=True),
                                  check_dtype=False)


def test_cell_table_of_distinct_or_repeated_cells_is_the_grouping() -> None:
    """Distinct cells are their own cell table (no grouping run); cells that repeat, with a
    missing value among them, are grouped as before: both equal pandas' grouping exactly
    (dtypes, order, counts)."""
    rng = np.random.default_rng(4)
    cells = pd.DataFrame({
        "age": pd.Categorical.from_codes(rng.integers(-1, 3, 400),
                                         categories=["[0-39]", "[40-79]", "*"]),
        "sex": pd.Series(rng.choice(["F", "M", None], 400), dtype=object),
        "stay": rng.integers(0, 4, 400),
    })
    distinct = cells.drop_duplicates().reset_index(drop=True)
    as_text = distinct.astype({"sex": "str"})
    for table in (distinct, as_text, cells, cells.astype({"sex": "str"})):
        counts = rng.integers(1, 9, len(table))
        grouped = table.assign(__rows=counts).groupby(
            list(table.columns), observed=True, dropna=False, sort=False)["__rows"].sum()
        got = ReleasedRows(table, counts, np.random.SeedSequence(1)).cell_table()
        pd.testing.assert_frame_equal(got, grouped.reset_index(), check_exact=True)
    assert len(distinct) < len(cells)


def test_writing_memory_follows_the_cells_not_the_rows(tmp_path, monkeypatch):
    """Four times the rows over the same 40 cells: the peak allocation while writing stays
    about the same (one shuffled block and one row group at a time), where writing every row
    at once (block and group = all rows) takes several times more."""
    cells, _ = _cells(40)

    def peak(rows_per_cell: int, size: int) -> int:
        rows = ReleasedRows(cells, np.full(40, rows_per_cell), np.random.SeedSequence(3))
        name = tmp_path / f"{rows_per_cell}-{size}"
        tracemalloc.start()
        write_data_files(rows, name.with_suffix(".parquet"), name.with_suffix(".csv"), size=size)
        top = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert len(pd.read_parquet(name.with_suffix(".parquet"))) == 40 * rows_per_cell
        return top

    monkeypatch.setattr("medrelease.storage.released_rows.SHUFFLE_BLOCK", 20_000)
    one, four = peak(1_250, 20_000), peak(5_000, 20_000)
    assert four < 1.5 * one, (one, four)
    monkeypatch.setattr("medrelease.storage.released_rows.SHUFFLE_BLOCK", 200_000)
    assert peak(5_000, 200_000) > 3 * four


def test_a_value_with_a_line_break_is_written_as_pandas_writes_it(tmp_path):
    """Quoted line breaks defeat the one-line-per-distinct-row shortcut: the writer notices and
    writes the groups with pandas; the file is still the whole table's CSV."""
    cells = pd.DataFrame({"age": ["*", "[0-39]"], "note": ["two\nlines", 'say "hi", =1']})
    rows = ReleasedRows(cells, np.array([3, 2]), np.random.SeedSequence(4))
    write_data_files(rows, tmp_path / "d.parquet", tmp_path / "d.csv", size=2)
    expected = neutralise_formulas(rows.to_frame()).to_csv(index=False)
    assert (tmp_path / "d.csv").read_text(encoding="utf-8") == expected
    assert pd.read_csv(tmp_path / "d.csv")["note"].tolist().count("two\nlines") == 3
