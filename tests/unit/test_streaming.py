"""Chunked aggregation equals the one-pass aggregation."""

from __future__ import annotations

import numpy as np

from medrelease.data.aggregate import aggregate, aggregate_chunks
from medrelease.storage.io import counting_positions, iter_chunks, read_input

from ..conftest import PAPER_TABLE_5


def _same(a, b) -> None:
    assert a.n_rows == b.n_rows
    la = dict(zip(a.informative.iloc[:, 0], range(len(a.informative)), strict=True))
    lb = list(b.informative.iloc[:, 0])
    # Compare (dimension codes, informative value) -> count, independent of code order.
    da = {(tuple(d), a.informative.iloc[i, 0]): c
          for d, i, c in zip(a.dimension_codes(), a.inf_codes(), a.counts, strict=True)}
    db = {(tuple(d), lb[i]): c
          for d, i, c in zip(b.dimension_codes(), b.inf_codes(), b.counts, strict=True)}
    assert da == db and set(la) == set(lb)


def test_chunks_equal_one_pass_with_declared_domain(nps_config) -> None:
    whole = aggregate(read_input(nps_config), nps_config)
    streamed = aggregate_chunks(iter_chunks(nps_config, rows_per_chunk=3_000), nps_config)
    assert np.array_equal(whole.cell_keys, streamed.cell_keys)
    assert np.array_equal(whole.counts, streamed.counts) and streamed.public_domain


def test_chunks_equal_one_pass_with_observed_values(paper_config) -> None:
    chunks = [PAPER_TABLE_5.iloc[i:i + 2] for i in range(0, 7, 2)]
    _same(aggregate(PAPER_TABLE_5, paper_config), aggregate_chunks(chunks, paper_config))


def test_parquet_row_groups_stream_with_file_row_numbers(nps_config, tmp_path) -> None:
    import pytest

    from medrelease.data.input_schema import validate_input
    from medrelease.errors import InputValidationError

    frame = read_input(nps_config).astype(str)
    parquet = tmp_path / "extract.parquet"
    frame.to_parquet(parquet, row_group_size=4_000)
    whole = aggregate(frame, nps_config)
    streamed = aggregate_chunks(iter_chunks(nps_config, parquet, rows_per_chunk=3_000),
                                nps_config)
    assert np.array_equal(whole.cell_keys, streamed.cell_keys)
    assert np.array_equal(whole.counts, streamed.counts)
    bad = frame.copy()
    bad.loc[10_500, "sex"] = "X"
    bad.to_parquet(parquet)
    with (pytest.raises(InputValidationError, match=r"first at row 10501"),
          counting_positions(nps_config, parquet)):
        for chunk in iter_chunks(nps_config, parquet, rows_per_chunk=3_000):
            validate_input(chunk, nps_config)


def test_value_counts_by_equals_pandas_value_counts_on_text() -> None:
    import pandas as pd

    from medrelease.data.aggregate import class_sizes, value_counts_by

    rng = np.random.default_rng(3)
    n = 5_000
    frame = pd.DataFrame({
        "a": rng.choice(["x", "y", None, "z"], n),
        "b": pd.Categorical(rng.choice(["[1-5]", "*", "7"], n), categories=["[1-5]", "7", "*"]),
        "c": rng.choice(np.array([1, "1", 2.5, np.nan], dtype=object), n),
        "d": rng.integers(0, 400, n),
    })
    frame.loc[::97, "b"] = np.nan
    for columns in (["a"], ["a", "b"], ["b", "c", "d"], ["a", "b", "c", "d"]):
        ours = value_counts_by(frame, columns)
        ours = {tuple(r[:-1]): r[-1] for r in ours.itertuples(index=False, name=None)}
        theirs = frame[columns].astype(str).value_counts()
        theirs = {(k if isinstance(k, tuple) else (k,)): v for k, v in theirs.items()}
        assert ours == theirs, columns
        # the risk figures' shortcut: the same sizes without the text ("1" and 1 merge)
        assert sorted(class_sizes(frame, columns)) == sorted(ours.values()), columns
