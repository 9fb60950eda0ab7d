"""Bad-input corpus through the release flow: a clear error (or a documented result), never a
partial release, never a ledger spend."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from flows.release import ReleaseRequest, release_flow
from medrelease.errors import MedreleaseError
from medrelease.ledger import Ledger

from .conftest import ROOT

HEADER = ["patient_id", "age", "sex", "length_of_stay", "surgery", "region", "diagnosis"]


pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture
def dataset(tmp_path: Path, monkeypatch) -> Path:
    """The NPS sample's config without a declared diagnosis domain, in a scratch folder."""
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    spec = yaml.safe_load((ROOT / "datasets/nps-sample/dataset.yaml").read_text())
    spec["name"] = "corpus"
    spec["columns"]["diagnosis"] = {"role": "informative"}
    for column in spec["columns"].values():
        if "taxonomy" in column:
            column["taxonomy"] = str((ROOT / "datasets/nps-sample" / column["taxonomy"]).resolve())
    spec["input"]["path"] = str(tmp_path / "extract.csv")
    path = tmp_path / "dataset.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _run(dataset: Path, frame: pd.DataFrame | None = None, text: str | None = None):
    extract = dataset.parent / "extract.csv"
    if frame is not None:
        frame.to_csv(extract, index=False)
    else:
        extract.write_text(text or "")
    return release_flow(ReleaseRequest(dataset=str(dataset), seed=1, batch_size=64))


def _nothing_written(dataset: Path) -> None:
    home = dataset.parent / "home"
    assert Ledger(home / "ledger.sqlite").spends() == []
    for store in ("releases", "test-releases"):
        folder = home / store
        assert not folder.exists() or not any(p.name != "corpus" for p in folder.rglob("*"))


def _rows(n: int, rng: np.random.Generator, diagnoses: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({
        "patient_id": np.arange(n), "age": rng.integers(1, 101, n),
        "sex": rng.choice(["F", "M"], n), "length_of_stay": rng.integers(1, 401, n),
        "surgery": rng.choice(["Y", "N"], n),
        "region": rng.choice([11, 21, 22, 31, 39], n), "diagnosis": rng.choice(diagnoses, n)})


@pytest.mark.parametrize(("text", "message"), [
    ("patient_id;age;sex\n1;2;F\n", "delimiter"),
    (",".join(HEADER) + "\n1,34,F,3,N,11,A1\n1,-5,F,3,N,11,A1\n", "'-5' is not covered"),
    (",".join(HEADER) + "\n1,34,F,100000,N,11,A1\n", "'100000' is not covered"),
    (",".join(HEADER) + "\n1,34,,3,N,11,A1\n", "column 'sex': 1 missing value"),
])
def test_corpus_errors_spend_nothing(dataset: Path, text: str, message: str) -> None:
    with pytest.raises(MedreleaseError, match=message):
        _run(dataset, text=text)
    _nothing_written(dataset)


def test_malformed_taxonomy_is_refused_before_any_spend(dataset: Path) -> None:
    spec = yaml.safe_load(dataset.read_text())
    broken = dataset.parent / "sex.csv"
    broken.write_text("F;*\nF;*\n")  # duplicate leaf
    spec["columns"]["sex"]["taxonomy"] = str(broken)
    dataset.write_text(yaml.safe_dump(spec))
    with pytest.raises(MedreleaseError, match="appears twice"):
        _run(dataset, frame=_rows(50, np.random.default_rng(0), np.array(["A1"])))
    _nothing_written(dataset)


@pytest.mark.parametrize(("n_rows", "n_diagnoses"), [(3000, 1), (3000, 100_000), (40, 30)])
def test_degenerate_tables_release_correctly(dataset: Path, n_rows: int, n_diagnoses: int):
    """One diagnosis, a diagnosis per row, or only tiny classes: a valid (maybe empty) release."""
    rng = np.random.default_rng(n_diagnoses)
    codes = np.array([f"D{i:06d}" for i in range(n_diagnoses)])
    result = _run(dataset, frame=_rows(n_rows, rng, codes))
    manifest = result["manifest"]
    assert manifest["checks"]["passed"] and result["record"]["input_rows"] == n_rows
    released = pd.read_parquet(Path(result["path"]) / "TEST-data.parquet")
    if len(released):  # every released (class, diagnosis) cell meets the threshold
        assert released.astype(str).value_counts().min() >= 2
    if n_diagnoses == 100_000:  # every diagnosis is unique: none may be published
        assert len(released) == 0 or released["diagnosis"].nunique() < 5
