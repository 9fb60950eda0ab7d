"""The relational release as a product piece (issue 58): the config's ``relational:`` section,
the plan (guarantee and budget from the tables), the output checks on broken tables, the
published file names, and ``intervals.csv``'s ``released`` column re-derived from the released
tables themselves."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from medrelease.data.config import load_config
from medrelease.errors import ConfigError, MedreleaseError
from medrelease.mechanisms import default_mechanism
from medrelease.privacy.publication import published_file_names
from medrelease.refusals import plan_for_config
from medrelease.relational.hospital import generate_hospital, write_hospital_dataset
from medrelease.release import Inputs, choose
from medrelease.stages import InProcess
from schemas.output import relational_checks


@pytest.fixture(scope="module")
def hospital(tmp_path_factory) -> Path:
    return write_hospital_dataset(tmp_path_factory.mktemp("hospital"), 400)


@pytest.fixture(scope="module")
def released(hospital: Path):
    config = load_config(hospital)
    plan = plan_for_config(config, "relational", {"epsilon": 1.0, "iters": 50,
                                                  "final_iters": 100}, seed=3)
    frames = generate_hospital(400)
    chosen, _ = choose(Inputs(tables=frames), config, plan, InProcess())
    return config, plan, chosen


def _edited(path: Path, edit) -> Path:
    data = json.loads(path.read_text())
    edit(data)
    copy = path.parent / "edited.yaml"
    copy.write_text(json.dumps(data))
    return copy


def test_the_config_declares_the_tables_and_refuses_what_cannot_be_released(
        hospital: Path) -> None:
    config = load_config(hospital)
    schema = config.relational_schema
    assert [t.name for t in schema.tables] == ["patients", "admissions", "diagnoses"]
    assert schema.table("diagnoses").parent == "admissions"
    assert schema.root.key == "subject_id" and default_mechanism(config) == "relational"
    problems = {
        "needs privacy.unit": lambda d: d["privacy"].pop("unit"),
        "same name": lambda d: d["relational"]["tables"][1].update(name="admissions"),
        "not both": lambda d: d["relational"]["tables"][0]["columns"]["los_band"].update(
            taxonomy="x.csv"),
        "max_rows_per_unit at 1": lambda d: d["privacy"].update(max_rows_per_unit=2),
    }
    for said, edit in problems.items():
        with pytest.raises(ConfigError, match=said):
            load_config(_edited(hospital, edit))


def test_the_plan_names_every_table_and_spends_what_it_states(hospital: Path) -> None:
    config = load_config(hospital)
    plan = plan_for_config(config, "relational", {"epsilon": 2.0}, seed=None)
    relation = plan.guarantee.neighbouring
    assert relation.startswith("add/remove one patient (one row of patients, by subject_id)")
    assert "(patients, admissions, diagnoses)" in relation and "at most 6 diagnoses" in relation
    assert sum(s.epsilon for s in plan.budget_steps) == pytest.approx(2.0)
    assert plan.kind == "relational" and plan.guarantee.proven
    with pytest.raises(MedreleaseError, match="only 'relational' releases it"):
        plan_for_config(config, "aim", {}, seed=None)
    with pytest.raises(MedreleaseError, match="one table"):
        plan_for_config(load_config(Path("datasets/nps-sample/dataset.yaml")), "relational",
                        {}, seed=None)


def test_the_output_checks_catch_broken_tables(released) -> None:
    config, _, chosen = released
    assert relational_checks(config, chosen).success
    broken = {
        "references_resolve": lambda t: t["admissions"].assign(
            subject_id=["patients-999999", *t["admissions"]["subject_id"][1:]]),
        "keys_distinct_and_fresh": lambda t: t["admissions"].assign(
            hadm_id=["H200000", *t["admissions"]["hadm_id"][1:]]),
        "children_within_max_children": lambda t: t["admissions"].assign(
            subject_id=t["admissions"]["subject_id"].iloc[0]),
    }
    for check, edit in broken.items():
        tables = {k: v.copy() for k, v in chosen.data_tables.items()}
        tables["admissions"] = edit(tables)
        chosen.data_tables, original = tables, chosen.data_tables
        try:
            report = relational_checks(config, chosen)
        finally:
            chosen.data_tables = original
        failed = {r["check"] for r in report.results if not r["success"]}
        assert check in failed, (check, failed)


def test_one_pair_of_files_per_table() -> None:
    assert published_file_names(True, ("intervals.csv",), ("patients", "admissions"))[:4] == [
        "TEST-patients.parquet", "TEST-patients.csv", "TEST-admissions.parquet",
        "TEST-admissions.csv"]


def test_intervals_released_is_the_released_tables_own_figure(released) -> None:
    """Re-derived from the released tables alone: a patients-only marginal counts patients
    (their column, or their number of admissions); the interval is whole patients around the
    noisy measurement."""
    _, _, chosen = released
    intervals = chosen.tables["intervals.csv"]
    patients = chosen.data_tables["patients"]
    admissions = chosen.data_tables["admissions"]
    by_sex = intervals[intervals["columns"] == "patients.sex"].drop_duplicates("cell")
    counts = patients["sex"].value_counts()
    for cell, figure in zip(by_sex["cell"], by_sex["released"], strict=True):
        assert figure == counts.get(cell, 0)
    per_patient = admissions["subject_id"].value_counts().reindex(
        patients["subject_id"], fill_value=0)
    count_rows = intervals[intervals["columns"] == "patients.n_admissions"].drop_duplicates(
        "cell")
    for cell, figure in zip(count_rows["cell"], count_rows["released"], strict=True):
        assert figure == int((per_patient == int(cell)).sum())
    assert (intervals["lower"] <= intervals["upper"]).all()
    assert np.isin(intervals["what"], ["marginal"]).all()
    assert not intervals.empty and isinstance(intervals, pd.DataFrame)


def test_a_copy_of_a_child_table_under_another_config_meets_its_claims(hospital: Path,
                                                                       tmp_path: Path) -> None:
    """The review's double budget: a child table converted to CRLF and drafted as a one-table
    dataset of another source. Its row digest (the columns that config reads) is one of the
    relational extract's claims, so the ledger refuses the second source."""
    from medrelease.data.extract import resolve_extract

    config = load_config(hospital)
    extract = resolve_extract(config)
    try:
        claims = set(extract.claims)
    finally:
        extract.discard()
    copy = tmp_path / "copy"
    copy.mkdir()
    text = (hospital.parent / "admissions.csv").read_text()
    (copy / "admissions.csv").write_text(text.replace("\n", "\r\n"))
    for column in ("admission_type", "los_band", "readmitted_30d"):
        values = sorted(set(pd.read_csv(copy / "admissions.csv", dtype=str)[column]))
        (copy / f"{column}.csv").write_text("".join(f"{v};*\n" for v in values))
    (copy / "dataset.yaml").write_text(json.dumps({
        "name": "admonly", "input": {"path": "admissions.csv"},
        "columns": {"hadm_id": {"role": "identifier"}, "subject_id": {"role": "identifier"},
                    **{c: {"role": "dimension", "taxonomy": f"{c}.csv"}
                       for c in ("admission_type", "los_band", "readmitted_30d")}},
        "privacy": {"lifetime_epsilon": 1.0, "unit": "subject_id", "max_rows_per_unit": 3}}))
    single = resolve_extract(load_config(copy / "dataset.yaml"))
    try:
        assert single.files[0].sha256 not in claims  # other bytes (CRLF) ...
        assert set(single.claims) & claims            # ... the same rows: claimed
    finally:
        single.discard()


def test_what_cannot_be_released_as_declared_is_refused_before_anything_is_read(
        hospital: Path) -> None:
    cases = {
        "none of data, intervals": lambda d: d["relational"]["tables"][0].update(
            name="intervals"),
        "named like the count": lambda d: d["columns"].update(
            n_admissions={"role": "dimension", "taxonomy": "sex.csv"}),
        "two columns": lambda d: d["relational"]["tables"][0].update(key="subject_id"),
    }
    for said, edit in cases.items():
        with pytest.raises(ConfigError, match=said):
            load_config(_edited(hospital, edit)).relational_schema  # noqa: B018
    with pytest.raises(ConfigError, match="replace the parent table alone"):
        load_config(hospital).table_files(str(hospital.parent / "other.csv"))
    config = load_config(_edited(hospital, lambda d: d["mechanism"]["params"].update(
        chain_shares=[1.0, 2.0, 3.0])))  # three shares for two models
    with pytest.raises(MedreleaseError, match="chain_shares needs 2"):
        plan_for_config(config, "relational", dict(config.mechanism.params), seed=None)
    with pytest.raises(MedreleaseError, match="below the samplers' floor"):  # a tiny share
        plan_for_config(load_config(hospital), "relational",
                        {"epsilon": 1.0, "chain_shares": [1e-12, 1.0]}, seed=None)


def test_the_guarantee_says_what_was_read_from_the_data(hospital: Path) -> None:
    """Values init listed from the data and a max_children not marked reviewed: the
    guarantee names them until the steward marks them reviewed."""
    def drafted(data: dict) -> None:
        data["relational"]["tables"][0]["columns"]["los_band"]["from_data"] = True
        data["relational"]["tables"][1]["max_children_reviewed"] = False

    config = load_config(_edited(hospital, drafted))
    label = plan_for_config(config, "relational", {}, seed=None).guarantee.label
    assert "admissions.los_band" in label and "max_children of diagnoses" in label
    reviewed = load_config(hospital)
    label = plan_for_config(reviewed, "relational", {}, seed=None).guarantee.label
    assert "from the data" not in label and "max_children" not in label


def test_a_child_table_without_rows_claims_nothing(hospital: Path, tmp_path: Path) -> None:
    """A header-only table's bytes and digest are every such table's: claiming them would tie
    two unrelated sources together (the second review)."""
    import shutil

    from medrelease.data.extract import resolve_extract

    folder = tmp_path / "empty"
    shutil.copytree(hospital.parent, folder)
    (folder / "diagnoses.csv").write_text("row_id,hadm_id,icd9,priority\n")
    extract = resolve_extract(load_config(folder / "dataset.yaml"))
    try:
        empty = extract.files[2]
        assert not empty.claimed and empty.sha256 not in extract.claims
        assert extract.files[1].sha256 in extract.claims
    finally:
        extract.discard()
