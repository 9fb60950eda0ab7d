"""The DuckDB input side gives the row-wise count table key for key, and declines (so the
row-wise pass reports, with file lines) whatever it does not read identically."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from medrelease.data.aggregate import aggregate_chunks
from medrelease.data.config import load_config
from medrelease.data.grouped_input import grouped_count_table
from medrelease.data.input_schema import validate_input
from medrelease.errors import InputValidationError
from medrelease.storage.io import counting_positions, iter_chunks

from ..conftest import ROOT

HEADER = "age,sex,length_of_stay,surgery,region,diagnosis\n"


def _row_wise(config, path: Path, rows_per_chunk: int = 7):
    """Today's reference: validate each chunk, fold it into the count table."""
    with counting_positions(config, path):
        return aggregate_chunks((validate_input(c, config) for c in
                                 iter_chunks(config, path, rows_per_chunk) if len(c)), config)


def _assert_same(a, b) -> None:
    assert np.array_equal(a.cell_keys, b.cell_keys) and np.array_equal(a.counts, b.counts)
    assert a.informative.equals(b.informative)
    assert (a.n_rows, a.dropped_rows, a.public_domain) == (b.n_rows, b.dropped_rows,
                                                           b.public_domain)


def _nps_like(tmp_path: Path, text: str | bytes, **overrides):
    """A copy of nps-sample's config reading ``text`` (with config ``overrides``)."""
    folder = tmp_path / "ds"
    shutil.copytree(ROOT / "datasets" / "nps-sample", folder, dirs_exist_ok=True)
    spec = yaml.safe_load((folder / "dataset.yaml").read_text())
    data = folder / "extract.csv"
    data.write_bytes(text if isinstance(text, bytes) else text.encode())
    spec["input"]["path"] = data.name
    original = ROOT / "datasets" / "nps-sample"
    for column in spec["columns"].values():  # the project's taxonomies, by absolute path
        for key in ("taxonomy", "domain"):
            if key in column and column[key].startswith(".."):
                column[key] = str((original / column[key]).resolve())
    for key, value in overrides.items():
        target = spec
        *parents, last = key.split(".")
        for part in parents:
            target = target[part]
        target[last] = value
    (folder / "dataset.yaml").write_text(yaml.safe_dump(spec))
    return load_config(folder / "dataset.yaml"), data


def test_nps_sample_counts_equal_the_row_wise_pass(nps_config) -> None:
    path = nps_config.input_path
    grouped = grouped_count_table(nps_config, path)
    assert grouped is not None
    _assert_same(grouped, _row_wise(nps_config, path, 3_000))


def test_streamed_batches_give_the_table_of_the_whole_fetch(nps_config, monkeypatch) -> None:
    """A large extract's groups arrive in batches (here of 997 groups, so the sample's arrive
    in many), a small one's at once: the same count table either way."""
    from medrelease.data import grouped_input

    whole = grouped_count_table(nps_config, nps_config.input_path)
    monkeypatch.setattr(grouped_input, "WHOLE_FETCH_MAX_BYTES", 0)
    monkeypatch.setattr(grouped_input, "GROUP_BATCH", 997)
    _assert_same(grouped_count_table(nps_config, nps_config.input_path), whole)


def test_observed_informative_values_get_the_same_codes(paper_config) -> None:
    grouped = grouped_count_table(paper_config, paper_config.input_path)
    assert grouped is not None and not grouped.public_domain
    _assert_same(grouped, _row_wise(paper_config, paper_config.input_path))


def test_parquet_counts_equal_the_row_wise_pass(nps_config, tmp_path: Path) -> None:
    frame = pd.read_csv(nps_config.input_path, dtype=str)
    parquet = tmp_path / "extract.parquet"
    frame.to_parquet(parquet, row_group_size=4_000)
    grouped = grouped_count_table(nps_config, parquet)
    assert grouped is not None
    _assert_same(grouped, _row_wise(nps_config, parquet, 3_000))


ROWS = "34,F,3,N,11,A001\n35,M,12,Y,21,B002\n"
# name -> extract text; each is read identically by both paths, or declined by DuckDB's.
FILES = {
    "plain": HEADER + ROWS * 3,
    "crlf": (HEADER + ROWS * 2).replace("\n", "\r\n"),
    "bom": "\ufeff" + HEADER + ROWS,
    "blank lines": HEADER + ROWS + "\n\n" + ROWS,
    "quoted": HEADER + '"34","F",3,N,"11","A001"\n' + ROWS,
    "quoted comma (undeclared column)": "note," + HEADER + '"a, b",' + ROWS.split("\n")[0]
                                        + "\n",
    "no final newline": HEADER + ROWS.rstrip("\n"),
    "spaces kept": HEADER + "34,F,3,N,11, A001\n",
    "short row": HEADER + ROWS + "36,F,3\n",
    "long row": HEADER + ROWS + "36,F,3,N,11,A001,extra\n",
    "bad value in the last row": HEADER + ROWS * 5 + "36,X,3,N,11,A001\n",
    "missing value": HEADER + ROWS + "36,,3,N,11,A001\n",
    "not a number": HEADER + ROWS + "3e1,F,3,N,11,A001\n",
    "control character": HEADER + ROWS + "36,F,3,N,11,A0\x0701\n",
    "latin-1 bytes": (HEADER + ROWS).encode() + "36,F,3,N,11,A001\xe9\n".encode("latin-1"),
    "header only": HEADER,
    "semicolons": (HEADER + ROWS).replace(",", ";"),
    "repeated header": "age," + HEADER + "1," + ROWS.split("\n")[0] + "\n",
    "unterminated quote": HEADER + ROWS + '36,F,3,N,11,"A001\n',
}


READ_BY_DUCKDB = {"plain", "crlf", "bom", "blank lines", "quoted",
                  "quoted comma (undeclared column)", "no final newline"}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FILES))
def test_tricky_files_are_read_identically_or_declined(tmp_path: Path, name: str) -> None:
    config, data = _nps_like(tmp_path, FILES[name])
    grouped = grouped_count_table(config, data)
    try:
        expected = _row_wise(config, data)
    except InputValidationError:
        assert grouped is None, "DuckDB accepted what the row-wise pass refuses"
        return
    assert grouped is not None or name not in READ_BY_DUCKDB, "a clean file was declined"
    if grouped is not None:
        _assert_same(grouped, expected)


@pytest.mark.parametrize("policy", ["drop_rows", "category"])
def test_missing_value_policies_count_the_same(tmp_path: Path, policy: str) -> None:
    text = HEADER + ROWS * 40 + "36,,3,N,11,A001\n37,F,,Y,21,B002\n"
    overrides = ({"missing": "drop_rows", "drop_limit": 0.5} if policy == "drop_rows" else
                 {"columns.sex.missing": "U"})
    if policy == "category":
        text = HEADER + ROWS * 40 + "36,,3,N,11,A001\n"
    config, data = _nps_like(tmp_path, text, **overrides)
    if policy == "category":  # a sex taxonomy with a leaf for the missing values
        (data.parent / "sex.csv").write_text("F;*\nM;*\nU;*\n")
        config, data = _nps_like(tmp_path, text, **overrides,
                                 **{"columns.sex.taxonomy": "sex.csv"})
    try:
        expected = _row_wise(config, data)
    except InputValidationError as exc:
        pytest.fail(f"the row-wise pass refused the fixture: {exc}")
    grouped = grouped_count_table(config, data)
    assert grouped is not None
    _assert_same(grouped, expected)
    assert grouped.dropped_rows == (2 if policy == "drop_rows" else 0)


@pytest.mark.slow
@pytest.mark.parametrize("declared_domain", [True, False])
def test_files_aggregated_apart_merge_to_the_table_of_all_rows(tmp_path: Path,
                                                               declared_domain: bool) -> None:
    """An extract in four files (each with values the others lack), aggregated file by file
    and merged, equals the one-file count table key for key, with or without a declared
    informative domain (without one, informative codes are re-derived from the union)."""
    from medrelease.data.aggregate import merge_count_tables

    sample = pd.read_csv(ROOT / "datasets/nps-sample/nps_sample.csv", dtype=str).drop(
        columns="patient_id").sort_values("diagnosis")  # files see different diagnoses
    overrides = {} if declared_domain else {"columns.diagnosis": {"role": "informative"}}
    config, whole = _nps_like(tmp_path, sample.to_csv(index=False), **overrides)
    size = -(-len(sample) // 4)
    chunks = [sample.iloc[start:start + size] for start in range(0, len(sample), size)]
    parts = []
    for number, chunk in enumerate(chunks):
        part = whole.parent / f"part-{number}.csv"
        chunk.to_csv(part, index=False)
        parts.append(grouped_count_table(config, part))
    assert [p.n_rows for p in parts] == [len(c) for c in chunks]
    assert len({len(p.informative) for p in parts}) > 1 or declared_domain
    merged = merge_count_tables(parts)
    assert merged.public_domain == declared_domain
    _assert_same(merged, grouped_count_table(config, whole))


def test_a_pattern_names_the_files_of_one_extract(tmp_path: Path) -> None:
    config, whole = _nps_like(tmp_path, HEADER + "30,M,3,N,11,A063\n")
    for name in ("b.csv", "a.csv", ".hidden.csv"):
        (whole.parent / name).write_text(HEADER)
    files = config.extract_files(str(whole.parent / "[ab].csv"))
    assert [f.name for f in files] == ["a.csv", "b.csv"]
    assert config.extract_files(str(whole)) == [whole]
    with pytest.raises(InputValidationError, match="no file matches the input pattern"):
        config.extract_files(str(whole.parent / "none-*.csv"))
    from medrelease.errors import ConfigError

    with pytest.raises(ConfigError, match="only the file name may hold a pattern"):
        config.extract_files(str(whole.parent / "*" / "x.csv"))


def test_a_memory_limit_too_small_for_duckdb_is_lifted_not_a_fall_back(nps_config, monkeypatch,
                                                                        caplog) -> None:
    """1MB is too little to group the sample: DuckDB runs out, the grouping runs again without
    the limit and still gives the row-wise count table (not the slow row-wise pass)."""
    import logging

    monkeypatch.setenv("MEDRELEASE_DUCKDB_MEMORY", "1MB")
    with caplog.at_level(logging.INFO, logger="medrelease.data.grouped_input"):
        grouped = grouped_count_table(nps_config, nps_config.input_path)
    assert "needed more than 1MB" in caplog.text
    assert grouped is not None
    _assert_same(grouped, _row_wise(nps_config, nps_config.input_path, 3_000))
