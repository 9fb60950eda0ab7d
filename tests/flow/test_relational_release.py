"""A relational release through the product (issue 58): the release flow on a relational
dataset publishes one file per table that join, with the manifest, report and intervals, the
publication audit covers every file, neighbours differ only where the guarantee allows, and a
bad extract (an orphan) is refused with nothing spent or published."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from flows.release import ReleaseRequest, release_flow
from medrelease.data.config import load_config
from medrelease.errors import InputValidationError, MedreleaseError
from medrelease.evidence.audit_publication import compare_neighbours, inspect_folder, value_leaks
from medrelease.privacy.ledger import Ledger
from medrelease.relational.hospital import write_hospital_dataset

pytestmark = pytest.mark.usefixtures("prefect_harness")

PATIENTS = 300


@pytest.fixture
def home(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _release(config: Path, seed: int = 5, **extra) -> dict:
    return release_flow(ReleaseRequest(dataset=str(config), seed=seed,
                                       **{"evaluate": False, **extra}))


def test_a_relational_release_publishes_tables_that_join_and_passes_the_audit(
        home: Path, tmp_path: Path) -> None:
    config = write_hospital_dataset(tmp_path / "hospital", PATIENTS)
    result = _release(config, evaluate=True)
    folder = Path(result["path"])
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted(["TEST-patients.csv", "TEST-patients.parquet",
                            "TEST-admissions.csv", "TEST-admissions.parquet",
                            "TEST-diagnoses.csv", "TEST-diagnoses.parquet",
                            "intervals.csv", "manifest.json", "report.md"])
    patients = pd.read_csv(folder / "TEST-patients.csv", dtype=str)
    admissions = pd.read_csv(folder / "TEST-admissions.csv", dtype=str)
    diagnoses = pd.read_csv(folder / "TEST-diagnoses.csv", dtype=str)
    # referential integrity and the bounds, by construction
    assert admissions["subject_id"].isin(patients["subject_id"]).all()
    assert diagnoses["hadm_id"].isin(admissions["hadm_id"]).all()
    assert admissions["subject_id"].value_counts().max() <= 4
    assert diagnoses["hadm_id"].value_counts().max() <= 6
    assert patients["subject_id"].str.fullmatch(r"patients-\d+").all()
    manifest = result["manifest"]
    statement = manifest["guarantee"]["statement"]
    assert "one patient" in statement and "patients, admissions, diagnoses" in statement
    assert [t["table"] for t in manifest["mechanism_details"]["tables"]] == \
        ["patients", "admissions", "diagnoses"]
    report = (folder / "report.md").read_text()
    assert "The tables and how they join" in report
    assert "`admissions.subject_id` = `patients.subject_id`" in report
    intervals = pd.read_csv(folder / "intervals.csv")
    assert (intervals["lower"] <= intervals["upper"]).all() and len(intervals) > 20
    assert set(intervals["columns"]) >= {"patients.age_band", "patients.n_admissions"}
    assert inspect_folder(folder, load_config(config)) == []
    # no input key in any published byte, decoded or not
    for key in ("S100000", "H200000", "D300000"):
        assert value_leaks(folder, key) == []
    [spend] = Ledger(home / "ledger.sqlite").spends()
    assert spend.status == "released" and spend.epsilon == pytest.approx(1.0)
    # the steward's cross-table evidence, beside the record: never in the published folder
    evidence = json.loads((home / "steward" / "hospital" / folder.name / "evaluation"
                           / "evaluation.json").read_text())
    assert sum(evidence["integrity"].values()) == 0
    assert set(evidence["cross_table"]) == {"admissions", "diagnoses"}
    assert evidence["children_per_parent"]["admissions"]["tvd"] < 0.5


def test_neighbouring_databases_publish_alike_where_the_guarantee_says(
        home: Path, tmp_path: Path, monkeypatch) -> None:
    """D and D' = D + one patient with more admissions and diagnoses than the bounds, the same
    seed: both folders pass the boundary checks, every public field and file schema is the
    same, and nothing of the added patient's keys appears anywhere."""
    base = write_hospital_dataset(tmp_path / "d", PATIENTS)
    added = write_hospital_dataset(tmp_path / "d-plus", PATIENTS)
    folder = added.parent
    patients = pd.read_csv(folder / "patients.csv", dtype=str)
    admissions = pd.read_csv(folder / "admissions.csv", dtype=str)
    diagnoses = pd.read_csv(folder / "diagnoses.csv", dtype=str)
    new_admissions = [f"HX{i}" for i in range(7)]
    patients.loc[len(patients)] = ["SX1", "F", "80+", "Medicare"]
    admissions = pd.concat([admissions, pd.DataFrame({
        "hadm_id": new_admissions, "subject_id": "SX1", "admission_type": "EMERGENCY",
        "los_band": "14+", "readmitted_30d": "yes"})], ignore_index=True)
    diagnoses = pd.concat([diagnoses, pd.DataFrame({
        "row_id": [f"DX{i}" for i in range(70)], "hadm_id": [new_admissions[i % 7]
                                                             for i in range(70)],
        "icd9": "428", "priority": "secondary"})], ignore_index=True)
    for name, frame in (("patients", patients), ("admissions", admissions),
                        ("diagnoses", diagnoses)):
        frame.to_csv(folder / f"{name}.csv", index=False)
    # the same source on both sides, each in its own home: the same lifetime figures
    one = Path(_release(base, seed=9)["path"])
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "other-home"))
    other = Path(_release(added, seed=9)["path"])
    findings = compare_neighbours(one, other, load_config(base))
    # the dataset names differ only by the folder each config lives in (same name "hospital")
    assert [f for f in findings if "manifest.dataset" not in f.where] == []
    for key in ("SX1", "HX0", "DX0"):
        assert value_leaks(other, key) == []


def test_an_orphan_is_refused_with_nothing_spent_or_published(home: Path,
                                                              tmp_path: Path) -> None:
    config = write_hospital_dataset(tmp_path / "h", PATIENTS)
    admissions = pd.read_csv(config.parent / "admissions.csv", dtype=str)
    admissions.loc[0, "subject_id"] = "S999999"
    admissions.loc[1, "subject_id"] = "S999998"
    admissions.to_csv(config.parent / "admissions.csv", index=False)
    with pytest.raises(InputValidationError) as refused:
        _release(config)
    text = str(refused.value)
    assert "2 row(s) reference a subject_id that is not in patients (orphans)" in text
    assert "S999999" not in text
    assert not (home / "test-releases").exists() or not any((home / "test-releases").rglob(
        "manifest.json"))
    ledger = home / "ledger.sqlite"
    assert not ledger.exists() or Ledger(ledger).spends() == []


def test_a_relational_dataset_takes_only_the_relational_mechanism(home: Path,
                                                                  tmp_path: Path) -> None:
    config = write_hospital_dataset(tmp_path / "h", 50)
    data = json.loads(config.read_text())
    data["policy"]["mechanisms"] = ["relational", "aim"]
    config.write_text(json.dumps(data))
    with pytest.raises(MedreleaseError, match="only 'relational' releases it"):
        _release(config, mechanism="aim")


def test_init_check_release_through_the_cli(home: Path, tmp_path: Path, monkeypatch) -> None:
    """As a steward types it: init the three tables (--child/--key), check, release; the
    published tables join and hold no input key."""
    from typer.testing import CliRunner

    from deployments import cli
    from deployments.cli import app
    from medrelease.relational.hospital import generate_hospital

    monkeypatch.setattr(cli.console, "width", 200)
    runner = CliRunner()
    files = tmp_path / "extract"
    files.mkdir()
    for name, frame in generate_hospital(PATIENTS, seed=4).items():
        frame.to_csv(files / f"{name}.csv", index=False)
    out = runner.invoke(app, ["init", str(files / "patients.csv"), "--name", "wards", "--root",
                              str(home / "datasets"), "--child", str(files / "admissions.csv"),
                              "--key", "subject_id", "--child", str(files / "diagnoses.csv"),
                              "--key", "hadm_id"])
    assert out.exit_code == 0, out.output
    monkeypatch.setenv("MEDRELEASE_DATASETS", str(home / "datasets"))
    out = runner.invoke(app, ["check", "wards"])
    assert out.exit_code == 0, out.output
    assert "max_children" in out.output  # drafted from the data: the steward is told to review
    out = runner.invoke(app, ["release", "wards", "--seed", "2", "--epsilon", "2"])
    assert out.exit_code == 0, out.output
    [folder] = (home / "test-releases" / "wards").iterdir()
    admissions = pd.read_csv(folder / "TEST-admissions.csv", dtype=str)
    patients = pd.read_csv(folder / "TEST-patients.csv", dtype=str)
    assert admissions["subject_id"].isin(patients["subject_id"]).all()
    for key in ("S100000", "H200000", "D300000"):
        assert value_leaks(folder, key) == []
