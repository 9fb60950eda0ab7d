"""``medrelease init`` drafts a relational dataset (issue 58: a parent table and its child
tables, ``--child CSV --key COL`` in order) that loads, builds its schema and passes ``medrelease
check``; ``check`` reads a relational extract as the release does and names every problem of
its tables (orphans, repeated keys, values no taxonomy covers, missing files) in a sentence of
its own, with counts and never a value."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from deployments.cli import app
from medrelease.checkup import check_dataset
from medrelease.data.config import load_config
from medrelease.data.draft import ChildDraft, _fit_scale, scale_limit

from ..conftest import ROOT
from ..flow import test_init_check
from ..flow.test_init_check import WIDE

# test_init_check's fixtures: a MEDRELEASE_HOME per test, and a console wide enough to read
home = test_init_check.home
wide_console = test_init_check.wide_console

SECRET = "SECRETWARD"    # a value of the tables no console line or finding may show
ORPHAN = "P9999"         # the corrupted copy's admission of a patient who is not there
ALIEN = "SECRETSEX"      # the corrupted copy's value no taxonomy covers


def hospital(folder: Path, seed: int = 5) -> dict[str, pd.DataFrame]:
    """Three related tables: patients (a unique id), their admissions (a unique id of their
    own, 1 to 3 per patient, two patients 9) and the admissions' diagnoses (1 to 6 each, a
    few 15): the 95th percentiles lie below the largest counts."""
    rng = np.random.default_rng(seed)
    patients = pd.DataFrame({
        "patient_id": [f"P{i:04d}" for i in range(60)],
        "sex": rng.choice(["F", "M"], 60),
        "birth_year": rng.integers(1930, 2001, 60),
        "smoker": rng.choice([0, 1], 60),
    })
    per_patient = rng.integers(1, 4, 60)
    per_patient[[10, 20]] = 9
    admissions = pd.DataFrame({
        "adm_id": [f"A{i:05d}" for i in range(int(per_patient.sum()))],
        "patient_id": np.repeat(patients["patient_id"].to_numpy(), per_patient),
    })
    n = len(admissions)
    admissions["type"] = rng.choice(["elective", "emergency", "urgent"], n)
    wards = [f"ward {w}" for w in "ABCDEFGHIJKLMNO"] + [SECRET]
    admissions["ward"] = rng.choice(wards, n).astype(object)
    admissions.loc[rng.choice(n, 4, replace=False), "ward"] = None
    admissions["los"] = rng.integers(1, 41, n)
    per_admission = rng.integers(1, 7, n)
    per_admission[:4] = 15
    diagnoses = pd.DataFrame({
        "diag_row": np.arange(1, int(per_admission.sum()) + 1),
        "adm_id": np.repeat(admissions["adm_id"].to_numpy(), per_admission),
    })
    m = len(diagnoses)
    diagnoses["patient_id"] = diagnoses["adm_id"].map(admissions.set_index("adm_id")
                                                      ["patient_id"])
    diagnoses["code"] = rng.choice(["A01", "B20", "C34", "E11", "I10", "J45"], m)
    diagnoses["priority"] = rng.choice(["primary", "secondary"], m)
    tables = {"patients": patients, "admissions": admissions, "diagnoses": diagnoses}
    for name, frame in tables.items():
        frame.to_csv(folder / f"{name}.csv", index=False)
    return tables


def nearest_rank(counts: pd.Series, percent: int = 95) -> int:
    return int(np.percentile(counts.to_numpy(), percent, method="inverted_cdf"))


def _init(folder: Path, name: str, root: Path, *extra: str):
    return CliRunner().invoke(app, [
        "init", str(folder / "patients.csv"), "--name", name, "--root", str(root),
        "--child", str(folder / "admissions.csv"), "--key", "patient_id",
        "--child", str(folder / "diagnoses.csv"), "--key", "adm_id", *extra], env=WIDE)


@pytest.fixture
def drafted(tmp_path: Path, home: Path) -> tuple[Path, dict[str, pd.DataFrame], str]:
    data = tmp_path / "extract"
    data.mkdir()
    tables = hospital(data)
    result = _init(data, "hospital", home / "datasets")
    assert result.exit_code == 0, result.output
    return home / "datasets" / "hospital" / "dataset.yaml", tables, result.output


def test_init_drafts_the_tables_their_references_and_bounds(drafted) -> None:
    path, tables, output = drafted
    config = load_config(path)
    schema = config.relational_schema
    assert [(t.name, t.parent, t.key, t.parent_key) for t in schema.tables] == [
        ("patients", None, "patient_id", None),
        ("admissions", "patients", "adm_id", "patient_id"),
        ("diagnoses", "admissions", None, "adm_id")]
    assert config.privacy.unit == "patient_id" and config.privacy.unit_noun == "patient"
    assert config.mechanism.name == "relational" and config.policy.mechanisms == ["relational"]
    roles = {c: s.role for c, s in config.columns.items()}
    assert roles == {"patient_id": "identifier", "sex": "dimension", "birth_year": "dimension",
                     "smoker": "dimension"}
    children = {t.table: t for t in config.relational.tables}
    # released columns: ids, keys and references are left out; few values listed, the rest
    # a taxonomy file as init drafts one
    assert set(children["admissions"].columns) == {"type", "ward", "los"}
    assert set(children["diagnoses"].columns) == {"code", "priority"}
    assert children["admissions"].columns["type"].values == ["elective", "emergency", "urgent"]
    ward = children["admissions"].columns["ward"]
    assert ward.taxonomy and ward.missing == "(blank)"
    # max_children: the 95th percentile of rows per parent row, flagged as max_rows_per_unit
    per_patient = tables["admissions"]["patient_id"].value_counts()
    per_admission = tables["diagnoses"]["adm_id"].value_counts()
    assert children["admissions"].max_children == nearest_rank(per_patient) == 3
    assert children["diagnoses"].max_children == nearest_rank(per_admission) == 6
    assert per_patient.max() == 9 and per_admission.max() == 15
    kept = np.minimum(per_patient, 3).sum() / per_patient.sum()
    assert f"it keeps {kept:.0%} of the admissions rows" in path.read_text()
    assert not any(t.max_children_reviewed for t in children.values())
    text = path.read_text()
    lines = text.splitlines()
    for number in [i for i, line in enumerate(lines) if line.strip().startswith("max_children:")]:
        assert "read from the data: the 95th percentile" in lines[number - 1], lines[number - 1]
        assert "max_children_reviewed: true" in lines[number - 1]
        assert lines[number].endswith("# chosen from the data: review")
    assert "max_children_reviewed" not in yaml.safe_load(text)["relational"]["tables"][0]
    assert output.count("max_children_reviewed: true") == 2
    assert SECRET not in output


def test_check_passes_on_the_draft_and_flags_its_bounds(drafted) -> None:
    _, tables, _ = drafted
    result = CliRunner().invoke(app, ["check", "hospital"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "no problems" in result.output
    assert (f"patients 60, admissions {len(tables['admissions'])}, "
            f"diagnoses {len(tables['diagnoses']):,} rows") in result.output
    assert re.search(r"review: table admissions: max_children \d+ is not marked reviewed",
                     result.output)
    assert SECRET not in result.output


def _said(findings) -> list[str]:
    return [f"{f.stage}: {f.problem}" for f in findings]


def test_check_names_every_problem_of_a_corrupted_copy(drafted) -> None:
    path, tables, _ = drafted
    folder = Path(load_config(path).input_path).parent
    patients = tables["patients"].copy()
    patients.loc[3, "sex"] = ALIEN
    pd.concat([patients, patients.iloc[[7]]]).to_csv(folder / "patients.csv", index=False)
    admissions = tables["admissions"].copy()
    admissions.loc[len(admissions)] = ["A99999", ORPHAN, "urgent", "ward A", 3]
    admissions.to_csv(folder / "admissions.csv", index=False)
    diagnoses = tables["diagnoses"].copy()
    diagnoses.loc[5, "adm_id"] = ""
    diagnoses.to_csv(folder / "diagnoses.csv", index=False)
    report = check_dataset("hospital")
    said = _said(report.findings)
    expected = [
        r"^input patients.csv: table patients: 1 row\(s\) repeat a patient_id another row has",
        r"^input patients.csv: table patients, column sex: 1 row\(s\) hold a value its taxonomy "
        r"does not cover$",
        r"^input admissions.csv: table admissions: 1 row\(s\) reference a patient_id that is not "
        r"in patients \(orphans\)$",
        r"^input diagnoses.csv: table diagnoses: 1 row\(s\) have no adm_id",
    ]
    for pattern in expected:
        assert sum(bool(re.search(pattern, s)) for s in said) == 1, (pattern, said)
    assert len(said) == len(expected), said
    assert not any(v in s for s in said for v in (ALIEN, ORPHAN, "A99999", SECRET))
    assert all(s.count(". ") == 0 for s in said), said  # one sentence each
    assert report.table_rows == {} and report.release  # (the plan is still shown)
    result = CliRunner().invoke(app, ["check", "hospital"], env=WIDE)
    assert result.exit_code == 1 and "4 problem(s) in hospital" in result.output
    assert not any(v in result.output for v in (ALIEN, ORPHAN, "A99999", SECRET))
    # a missing table file: named, with every other table's file that is missing too
    (folder / "admissions.csv").unlink()
    (folder / "diagnoses.csv").unlink()
    missing = _said(check_dataset("hospital").findings)
    assert len(missing) == 2 and all("admissions.csv" in s or "diagnoses.csv" in s
                                     for s in missing), missing


def test_init_refuses_keys_it_cannot_follow(tmp_path: Path, home: Path) -> None:
    tables = hospital(tmp_path)
    root = home / "datasets"
    base = ["init", str(tmp_path / "patients.csv"), "--root", str(root)]
    runner = CliRunner()
    # one --key per --child
    result = runner.invoke(app, [*base, "--name", "a", "--child", str(tmp_path / "admissions.csv")],
                           env=WIDE)
    assert result.exit_code == 1 and "one --key per --child" in result.output
    # the parent table's key names one row each: the repeated rows are counted
    doubled = pd.concat([tables["patients"], tables["patients"].iloc[:3]])
    doubled.to_csv(tmp_path / "twice.csv", index=False)
    result = runner.invoke(app, ["init", str(tmp_path / "twice.csv"), "--root", str(root),
                                 "--name", "b", "--child", str(tmp_path / "admissions.csv"),
                                 "--key", "patient_id"], env=WIDE)
    assert result.exit_code == 1, result.output
    assert "3 row(s) repeat a patient_id" in " ".join(result.output.split())
    # a grandchild's --key must be an earlier table's distinct column
    result = runner.invoke(app, [*base, "--name", "c",
                                 "--child", str(tmp_path / "diagnoses.csv"), "--key", "patient_id",
                                 "--child", str(tmp_path / "admissions.csv"), "--key", "adm_id"],
                           env=WIDE)
    assert result.exit_code == 1, result.output
    assert "no earlier table has 'adm_id' as its key" in " ".join(result.output.split())
    assert not (root / "a").exists() and not (root / "b").exists() and not (root / "c").exists()


def test_a_drafted_bound_is_lowered_until_the_schema_accepts_it() -> None:
    """The MIMIC demo's shape: 95th percentiles 2 admissions per patient and 24 diagnoses per
    admission; 2 x lcm(1..24) is above 2^32 (the counts' exact range), so 24 is lowered to the
    largest value that fits (22: lcm(1..23) = lcm(1..24) / 2 is still too large)."""
    def child(name: str, parent: str, percentile: int) -> ChildDraft:
        return ChildDraft(name=name, file_name=f"{name}.csv", path=f"{name}.csv",
                          delimiter=",", rows=1, parent=parent, references="k", named=False,
                          columns=[], left_out=[], percentile=percentile,
                          max_children=percentile, counts=(1, percentile))

    admissions, diagnoses = child("admissions", "patients", 2), child("diagnoses",
                                                                       "admissions", 24)
    _fit_scale([admissions, diagnoses], scale_limit([2, 6, 2]))
    assert (admissions.max_children, diagnoses.max_children) == (2, 22)
    assert diagnoses.lowered_from == 24 and admissions.lowered_from is None
    assert "is 24, lowered to 22" in diagnoses.max_children_note


MIMIC = ROOT / "var" / "mimic-demo" / "relational"


@pytest.mark.skipif(not (MIMIC / "diagnoses.csv").is_file(),
                    reason="the MIMIC demo's tables: run 'medrelease prepare-mimic' first")
def test_check_on_the_mimic_demo_and_a_corrupted_copy(tmp_path: Path, home: Path,
                                                      monkeypatch) -> None:
    assert check_dataset("mimic-relational").findings == []
    data = tmp_path / "data"
    data.mkdir()
    patients = pd.read_csv(MIMIC / "patients.csv", dtype=str, keep_default_na=False)
    patients.loc[0, "gender"] = ALIEN
    pd.concat([patients, patients.iloc[[1, 2]]]).to_csv(data / "patients.csv", index=False)
    admissions = pd.read_csv(MIMIC / "admissions.csv", dtype=str, keep_default_na=False)
    admissions.loc[0, "subject_id"] = "99999999"
    admissions.to_csv(data / "admissions.csv", index=False)
    shutil.copy(MIMIC / "diagnoses.csv", data / "diagnoses.csv")
    source = ROOT / "datasets" / "mimic-relational"
    spec = yaml.safe_load((source / "dataset.yaml").read_text())
    spec["name"] = "mimic-corrupted"
    spec["input"]["path"] = str(data / "patients.csv")
    for column in spec["columns"].values():
        if "taxonomy" in column:
            column["taxonomy"] = str((source / column["taxonomy"]).resolve())
    for table in spec["relational"]["tables"]:
        table["path"] = str(data / Path(table["path"]).name)
        for column in table["columns"].values():
            if "taxonomy" in column:
                column["taxonomy"] = str((source / column["taxonomy"]).resolve())
    roots = tmp_path / "datasets"
    (roots / "mimic-corrupted").mkdir(parents=True)
    (roots / "mimic-corrupted" / "dataset.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.setenv("MEDRELEASE_DATASETS", str(roots))
    said = _said(check_dataset("mimic-corrupted").findings)
    assert said == [
        "input patients.csv: table patients: 2 row(s) repeat a subject_id another row has (keys "
        "must be distinct)",
        "input patients.csv: table patients, column gender: 1 row(s) hold a value its taxonomy "
        "does not cover",
        "input admissions.csv: table admissions: 1 row(s) reference a subject_id that is not in "
        "patients (orphans)"], said
    assert not any(ALIEN in s or "99999999" in s for s in said)
