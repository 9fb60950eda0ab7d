"""Issue 36, cases 5-7: the content a source has spent on is its parsed rows, not its bytes,
and what is hashed is what is read.

Each dataset here is a copy of nps-sample's YAML with its own ``privacy.source`` reading the
first 3,000 rows of the sample (the issue's set-up), released with ``histogram`` (one noisy
draw: the fastest release that charges the ledger).
"""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import pandas as pd
import pytest
import yaml

from flows.release import ReleaseRequest, release_flow
from medrelease.data.config import load_config
from medrelease.privacy.ledger import Ledger
from medrelease.storage.io import file_sha256

from ..conftest import ROOT, sample_spec_in

SAMPLE = ROOT / "datasets" / "nps-sample"


@pytest.fixture
def home(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture(scope="module")
def rows() -> pd.DataFrame:
    """The first 3,000 rows of the sample, as text."""
    return pd.read_csv(SAMPLE / "nps_sample.csv", dtype=str, nrows=3000)


def _dataset(folder: Path, name: str, source: str, frame: pd.DataFrame | None = None,
             input_name: str = "extract.csv") -> Path:
    """nps-sample's YAML under ``folder`` with its own name and source, reading
    ``input_name`` (written from ``frame`` as plain CSV when given)."""
    spec = sample_spec_in(folder)
    spec.update(name=name, mechanism={"name": "histogram", "params": {"epsilon": 1.0}})
    spec["privacy"]["source"] = source
    spec["input"] = {"path": input_name,
                     "format": "parquet" if input_name.endswith(".parquet") else "csv"}
    spec.pop("schedule", None)
    if frame is not None:
        frame.to_csv(folder / input_name, index=False)
    (folder / "dataset.yaml").write_text(yaml.safe_dump(spec))
    return folder / "dataset.yaml"


def _spends(home: Path) -> int:
    ledger = home / "ledger.sqlite"
    return len(Ledger(ledger).spends()) if ledger.is_file() else 0


def _published(home: Path, dataset: str) -> list[Path]:
    folder = home / "releases" / dataset
    return [p for p in folder.iterdir() if not p.name.startswith(".")] if folder.is_dir() else []


# -- the row digest -------------------------------------------------------------------------

def test_the_row_digest_ignores_format_line_ends_quoting_column_and_row_order(
        tmp_path: Path, rows: pd.DataFrame, monkeypatch) -> None:
    """One digest for the same rows as plain CSV, CRLF, every field quoted with the columns
    reversed, shuffled, Parquet (typed columns) and latin-1 text (the row-wise reader DuckDB
    leaves it to); another for one changed value."""
    from medrelease.data.content import row_digest

    monkeypatch.setenv("MEDRELEASE_INPUT_ROOTS", str(tmp_path))
    config = load_config(_dataset(tmp_path / "ds", "content", "content", rows))
    plain = tmp_path / "ds" / "extract.csv"
    variants = {"crlf.csv": plain.read_bytes().replace(b"\n", b"\r\n")}
    for name, data in variants.items():
        (tmp_path / name).write_bytes(data)
    rows[list(reversed(rows.columns))].to_csv(tmp_path / "quoted.csv", index=False,
                                               quoting=csv.QUOTE_ALL)
    rows.sample(frac=1.0, random_state=7).to_csv(tmp_path / "shuffled.csv", index=False)
    rows.to_csv(tmp_path / "latin.csv", index=False, encoding="latin-1")
    pd.read_csv(plain).to_parquet(tmp_path / "typed.parquet")  # age, region: int64
    expected = row_digest(config, plain)
    assert expected is not None and len(expected) == 64
    for name in ("crlf.csv", "quoted.csv", "shuffled.csv", "typed.parquet"):
        assert row_digest(config, tmp_path / name) == expected, name
    latin = config.model_copy(update={"input": config.input.model_copy(
        update={"encoding": "latin-1"})})
    assert row_digest(latin, tmp_path / "latin.csv") == expected
    changed = rows.copy()
    changed.loc[0, "surgery"] = "Y" if changed.loc[0, "surgery"] == "N" else "N"
    changed.to_csv(tmp_path / "changed.csv", index=False)
    assert row_digest(config, tmp_path / "changed.csv") != expected


def test_the_count_takes_the_row_digest_bit_for_bit(tmp_path: Path, rows: pd.DataFrame,
                                                    monkeypatch) -> None:
    """A release that counts a one-file extract takes its row digest from the grouped
    count's own pass (one read of the file): the digest of ``row_digest``'s pass, bit for bit,
    for plain, CRLF, quoted with the columns reversed, shuffled and missing values, the groups
    fetched whole or in batches. A Parquet file's typed columns are left to the digest's own
    pass (grouping typed values may merge values whose texts differ)."""
    from medrelease.data import grouped_input
    from medrelease.data.content import digest_of, digested_columns, row_digest
    from medrelease.data.extract import resolve_extract
    from medrelease.data.grouped_input import grouped_count

    monkeypatch.setenv("MEDRELEASE_INPUT_ROOTS", str(tmp_path))
    config = load_config(_dataset(tmp_path / "ds", "content", "content", rows))
    plain = tmp_path / "ds" / "extract.csv"
    (tmp_path / "crlf.csv").write_bytes(plain.read_bytes().replace(b"\n", b"\r\n"))
    rows[list(reversed(rows.columns))].to_csv(tmp_path / "quoted.csv", index=False,
                                               quoting=csv.QUOTE_ALL)
    rows.sample(frac=1.0, random_state=7).to_csv(tmp_path / "shuffled.csv", index=False)
    holes = rows.copy()
    holes.loc[::97, "surgery"] = None
    holes.loc[::89, "age"] = None
    holes.to_csv(tmp_path / "missing.csv", index=False)
    dropping = config.model_copy(update={"missing": "drop_rows", "drop_limit": 0.5})
    cases = [(config, plain), *((config, tmp_path / n) for n in
                                ("crlf.csv", "quoted.csv", "shuffled.csv")),
             (dropping, tmp_path / "missing.csv")]

    def from_the_count(cfg, path) -> str:
        sums = grouped_count(cfg, path, row_sums=True).row_sums
        assert sums is not None, path.name
        return digest_of(digested_columns(cfg), sums)

    for cfg, path in cases:
        assert from_the_count(cfg, path) == row_digest(cfg, path), path.name
    assert row_digest(dropping, tmp_path / "missing.csv") != row_digest(config, plain)
    monkeypatch.setattr(grouped_input, "WHOLE_FETCH_MAX_BYTES", 0)
    monkeypatch.setattr(grouped_input, "GROUP_BATCH", 97)
    for cfg, path in cases:
        assert from_the_count(cfg, path) == row_digest(cfg, path), ("in batches", path.name)
    pd.read_csv(plain).to_parquet(tmp_path / "typed.parquet")
    assert grouped_count(config, tmp_path / "typed.parquet", row_sums=True).row_sums is None
    # resolved for a count, the extract's claims wait for it
    extract = resolve_extract(config, rows_by_count=True)
    try:
        assert extract.files[0].rows_sha256 is None
        for reading in ("claims", "rows_digest"):  # neither is read before the count
            with pytest.raises(RuntimeError, match="taken by its count"):
                getattr(extract, reading)
        counted = extract.counted(from_the_count(config, extract.files[0].read_from))
        assert counted.claims[1] == "rows:" + row_digest(config, plain)
    finally:
        extract.discard()


def test_weighted_row_sums_are_the_sums_over_every_row() -> None:
    """The distinct rows' weighted sums equal the plain sums over the rows they stand for,
    exactly, at the edges of the 64-bit halves and with large counts."""
    import numpy as np

    from medrelease.data.content import weighted_row_sums

    rng = np.random.default_rng(5)
    edges = np.array([0, 1, 2**16 - 1, 2**16, 2**63, 2**64 - 1], dtype=np.uint64)
    high = np.concatenate([edges, rng.integers(0, 2**64 - 1, 500, dtype=np.uint64,
                                               endpoint=True)])
    low = high[::-1].copy()
    weights = np.concatenate([[1, 2**31, 3, 2**40, 1, 7],
                              rng.integers(1, 2**20, 500)]).astype(np.int64)
    sums = weighted_row_sums(weights, high, low)
    assert sums.rows == sum(int(w) for w in weights)
    assert sums.high == sum(int(w) * int(h) for w, h in zip(weights, high, strict=True))
    assert sums.low == sum(int(w) * int(v) for w, v in zip(weights, low, strict=True))
    for beyond in ([2**46], [2**62] * 3, [2**63 - 1, 2**63 - 1, 2], [-1]):  # int64 wraps
        with pytest.raises(ValueError):
            weighted_row_sums(np.array(beyond, dtype=np.int64), high[:len(beyond)],
                              low[:len(beyond)])


# -- case 5: the same rows in another file are the same content ------------------------------

@pytest.mark.usefixtures("prefect_harness")
def test_the_same_rows_with_crlf_or_as_parquet_are_charged_to_their_first_source(
        home: Path, tmp_path: Path, rows: pd.DataFrame) -> None:
    """Before: the CRLF copy and the Parquet re-export were charged to new sources (the
    content key was the file's bytes). Now both are refused before any spend, nothing of them
    is published, and the byte hash and the row digest are both claimed by the first."""
    first = _dataset(tmp_path / "a", "copy-a", "hospital-a", rows)
    result = release_flow(ReleaseRequest(dataset=str(first), evaluate=False))
    extract = tmp_path / "a" / "extract.csv"
    crlf = _dataset(tmp_path / "b", "copy-b", "hospital-b")
    (tmp_path / "b" / "extract.csv").write_bytes(extract.read_bytes().replace(b"\n", b"\r\n"))
    parquet = _dataset(tmp_path / "c", "copy-c", "hospital-c", input_name="extract.parquet")
    pd.read_csv(extract).to_parquet(tmp_path / "c" / "extract.parquet")
    spends = _spends(home)
    for config, dataset in ((crlf, "copy-b"), (parquet, "copy-c")):
        state = release_flow(ReleaseRequest(dataset=str(config), evaluate=False),
                             return_state=True)
        assert state.name == "Refused", (dataset, state.message)
        assert "already charged to source 'hospital-a'" in state.message
        assert "the same rows" in state.message and "Nothing was spent" in state.message
        assert _spends(home) == spends and not _published(home, dataset)
    with Ledger(home / "ledger.sqlite")._connect() as conn:
        claims = dict(conn.execute("SELECT sha256, source FROM content_claims").fetchall())
    record = result["record"]
    assert claims[file_sha256(extract)] == "hospital-a" == claims["rows:"
                                                                  + record["input_rows_sha256"]]
    # steward data: the digest is in the steward record, never in the published folder
    assert record["input_rows_sha256"] not in "".join(
        p.read_text(errors="replace") for p in Path(result["path"]).rglob("*") if p.is_file())


# -- case 6: identical content in two partitions ---------------------------------------------

@pytest.mark.usefixtures("prefect_harness")
def test_two_partitions_with_the_same_rows_are_refused_before_any_spend(
        home: Path, tmp_path: Path, rows: pd.DataFrame) -> None:
    """Before: one partition and its CRLF-converted copy were accepted ("6,000 in" from 3,000
    rows). Now: refused as identical content, nothing spent, nothing published."""
    config = _dataset(tmp_path / "parts", "parted", "parted", input_name="part-*.csv")
    rows.to_csv(tmp_path / "parts" / "part-1.csv", index=False)
    (tmp_path / "parts" / "part-2.csv").write_bytes(
        (tmp_path / "parts" / "part-1.csv").read_bytes().replace(b"\n", b"\r\n"))
    state = release_flow(ReleaseRequest(dataset=str(config), evaluate=False),
                         return_state=True)
    assert state.name == "Refused", state.message
    assert "part-1.csv and part-2.csv have identical content (the same rows" in state.message
    assert _spends(home) == 0 and not _published(home, "parted")


# -- case 7: what is hashed is what is read --------------------------------------------------

class _ReplaceWhenResolved(logging.Handler):
    """The issue's attack, deterministically: when the run logs "request resolved", another
    source's file is moved over the extract (``mv``), before any step has read it."""

    def __init__(self, other: Path, extract: Path) -> None:
        super().__init__()
        self.other, self.extract, self.done = other, extract, False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.done and record.getMessage().startswith("request resolved"):
            self.other.replace(self.extract)
            self.done = True


@pytest.mark.usefixtures("prefect_harness")
def test_a_file_replaced_after_resolution_is_not_what_the_run_reads(
        home: Path, tmp_path: Path, rows: pd.DataFrame) -> None:
    """Before: the rows of the file moved in after the hash were released, and the charge
    named hash A. Now the run reads the snapshot taken (and hashed) at resolution: A's 3,000
    rows are released and claimed, the other source's 2,000 rows are neither read nor
    claimed, and the snapshot is gone when the run ends."""
    config = _dataset(tmp_path / "a", "swapped", "hospital-a", rows)
    extract = tmp_path / "a" / "extract.csv"
    hash_a = file_sha256(extract)
    other = tmp_path / "a" / "other-source.csv"
    rows.iloc[1000:].to_csv(other, index=False)
    hash_b = file_sha256(other)
    hook = _ReplaceWhenResolved(other, extract)
    logger = logging.getLogger("prefect.task_runs")  # where tasks' run loggers write
    level = logger.level
    logger.addHandler(hook)
    logger.setLevel(logging.INFO)
    try:
        result = release_flow(ReleaseRequest(dataset=str(config), evaluate=False))
    finally:
        logger.removeHandler(hook)
        logger.setLevel(level)
    assert hook.done and file_sha256(extract) == hash_b  # the swap did happen mid-run
    record = result["record"]
    assert record["input_sha256"] == hash_a and record["input_rows"] == 3000
    with Ledger(home / "ledger.sqlite")._connect() as conn:
        claims = {row[0] for row in conn.execute("SELECT sha256 FROM content_claims")}
    assert hash_a in claims and hash_b not in claims
    snapshots = home / "steward" / "snapshots"
    assert not snapshots.exists() or not any(snapshots.iterdir())


@pytest.mark.usefixtures("prefect_harness")
def test_a_refusal_names_the_extract_not_its_snapshot(home: Path, tmp_path: Path) -> None:
    """The readers read the snapshot; a steward is told about the file they put there."""
    config = _dataset(tmp_path / "empty", "empty", "empty")
    (tmp_path / "empty" / "extract.csv").write_text("")
    state = release_flow(ReleaseRequest(dataset=str(config), evaluate=False), return_state=True)
    assert state.name == "Refused", state.message
    assert f"input file {tmp_path / 'empty' / 'extract.csv'} is empty" in state.message
    assert "snapshots" not in state.message and _spends(home) == 0
