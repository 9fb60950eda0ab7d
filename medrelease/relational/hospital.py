"""A generated hospital database with known cross-table effects (the benchmark's ground truth):
patients -> admissions -> diagnoses.

Effects built in, each crossing a foreign key:
* age -> number of admissions: 1 + Poisson(0.15 / 0.45 / 0.9 / 1.4) by age band (18-39, 40-64,
  65-79, 80+), 5 % of patients with none (registered, never admitted);
* a diagnosis -> readmission: an admission with a heart-failure diagnosis (ICD-9 428) is
  readmitted within 30 days with probability 0.35, without one 0.10;
* age -> heart failure and -> number of diagnoses; age -> admission type -> length of stay.
No row is a real person; the generator is seeded.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from medrelease.data.binning import SUPPRESSED
from medrelease.data.taxonomy import from_leaf_paths
from medrelease.relational.schema import RelColumn, RelSchema, RelTable

AGE_BANDS = ("18-39", "40-64", "65-79", "80+")
AGE_SHARE = (0.25, 0.35, 0.25, 0.15)
EXTRA_ADMISSIONS = (0.15, 0.45, 0.9, 1.4)  # Poisson mean of admissions beyond the first
NEVER_ADMITTED = 0.05
INSURANCE = ("Medicare", "Medicaid", "Private", "Self")
ADMISSION_TYPES = ("EMERGENCY", "URGENT", "ELECTIVE")
LOS_BANDS = ("0-2", "3-6", "7-13", "14+")
HEART_FAILURE = "428"
READMISSION = {True: 0.35, False: 0.10}
CODES = {  # ICD-9 3-digit categories and their chapters (a public taxonomy)
    "428": "circulatory", "410": "circulatory", "401": "circulatory",
    "486": "respiratory", "496": "respiratory",
    "250": "endocrine", "244": "endocrine",
    "530": "digestive", "571": "digestive",
    "820": "injury", "850": "injury",
    "285": "other", "V45": "other",
}
# per age band, each code's weight when a diagnosis is drawn (heart failure rises with age)
CODE_WEIGHTS = {
    0: dict(zip(CODES, (0.3, 0.3, 1.0, 1.2, 0.3, 0.8, 0.6, 1.0, 0.6, 1.5, 1.2, 0.6, 0.4),
                strict=True)),
    1: dict(zip(CODES, (0.8, 0.8, 1.6, 1.0, 0.7, 1.3, 0.8, 1.0, 0.8, 0.9, 0.6, 0.7, 0.8),
                strict=True)),
    2: dict(zip(CODES, (1.8, 1.2, 2.0, 1.1, 1.2, 1.5, 0.9, 0.8, 0.7, 0.6, 0.4, 0.9, 1.2),
                strict=True)),
    3: dict(zip(CODES, (2.8, 1.3, 2.0, 1.5, 1.2, 1.3, 1.0, 0.7, 0.5, 1.0, 0.4, 1.2, 1.4),
                strict=True)),
}


def code_taxonomy_column(name: str = "icd9") -> RelColumn:
    """The diagnosis code with its chapter as level 1 (codes are public, the taxonomy too)."""
    codes = list(CODES)
    taxonomy = from_leaf_paths(name, "categorical", codes, [[CODES[c], SUPPRESSED] for c in codes])
    return RelColumn(name, taxonomy)


EFFECTS = (("patients.age_band", "patients.n_admissions"),
           ("admissions.readmitted_30d", "diagnoses.icd9"))


def hospital_schema(max_admissions: int = 4, max_diagnoses: int = 6,
                    with_diagnoses: bool = True, declare_effects: bool = False) -> RelSchema:
    """patients -> admissions (-> diagnoses); L = lcm(1..4) x lcm(1..6) = 720 by default.
    ``declare_effects``: the two built-in effects declared as analyses (measured first)."""
    patients = RelTable("patients", (
        RelColumn.of_values("sex", ["F", "M"]),
        RelColumn.of_values("age_band", AGE_BANDS),
        RelColumn.of_values("insurance", INSURANCE),
    ), key="subject_id")
    admissions = RelTable("admissions", (
        RelColumn.of_values("admission_type", ADMISSION_TYPES),
        RelColumn.of_values("los_band", LOS_BANDS),
        RelColumn.of_values("readmitted_30d", ["no", "yes"]),
    ), key="hadm_id", parent="patients", parent_key="subject_id", max_children=max_admissions)
    diagnoses = RelTable("diagnoses", (
        code_taxonomy_column(),
        RelColumn.of_values("priority", ["primary", "secondary"]),
    ), key="row_id", parent="admissions", parent_key="hadm_id", max_children=max_diagnoses)
    tables = (patients, admissions, diagnoses) if with_diagnoses else (patients, admissions)
    analyses = tuple(a for a in EFFECTS if with_diagnoses or "diagnoses.icd9" not in a) \
        if declare_effects else ()
    return RelSchema(tables, analyses=analyses)


def generate_hospital(patients: int, seed: int = 0) -> dict[str, pd.DataFrame]:
    """The three tables (text columns, as an extract is read), with input keys."""
    rng = np.random.default_rng(seed)
    age = rng.choice(len(AGE_BANDS), size=patients, p=AGE_SHARE)
    sex = rng.choice(["F", "M"], size=patients)
    medicare = np.where(age >= 2, 0.8, 0.05)
    insurance = np.array([rng.choice(INSURANCE, p=_insurance_p(m)) for m in medicare])
    n_adm = 1 + rng.poisson(np.take(EXTRA_ADMISSIONS, age))
    n_adm[rng.random(patients) < NEVER_ADMITTED] = 0
    subject = np.array([f"S{100000 + i}" for i in range(patients)])
    patient_frame = pd.DataFrame({"subject_id": subject, "sex": sex,
                                  "age_band": np.take(AGE_BANDS, age), "insurance": insurance})
    owner = np.repeat(np.arange(patients), n_adm)
    a_age = age[owner]
    emergency_p = np.take((0.45, 0.55, 0.65, 0.75), a_age)
    u = rng.random(owner.size)
    a_type = np.where(u < emergency_p, 0, np.where(u < emergency_p + 0.15, 1, 2))
    los_mean = 1.0 + 0.6 * a_age + np.take((1.0, 0.6, 0.0), a_type)
    los = np.minimum(rng.poisson(los_mean), 3)
    n_diag = 1 + rng.poisson(1.2 + 0.8 * a_age + (a_type == 0))
    hadm = np.array([f"H{200000 + i}" for i in range(owner.size)])
    codes, priority, diag_owner = [], [], []
    has_hf = np.zeros(owner.size, dtype=bool)
    names = list(CODES)
    for i in range(owner.size):
        weights = np.array([CODE_WEIGHTS[int(a_age[i])][c] for c in names])
        k = min(int(n_diag[i]), len(names))
        picked = rng.choice(len(names), size=k, replace=False, p=weights / weights.sum())
        for j, code in enumerate(picked):
            codes.append(names[code])
            priority.append("primary" if j == 0 else "secondary")
            diag_owner.append(i)
        has_hf[i] = HEART_FAILURE in [names[c] for c in picked]
    readmitted = rng.random(owner.size) < np.where(has_hf, READMISSION[True], READMISSION[False])
    admission_frame = pd.DataFrame({
        "hadm_id": hadm, "subject_id": subject[owner],
        "admission_type": np.take(ADMISSION_TYPES, a_type), "los_band": np.take(LOS_BANDS, los),
        "readmitted_30d": np.where(readmitted, "yes", "no")})
    diag_owner_arr = np.asarray(diag_owner, dtype=np.int64)
    diagnosis_frame = pd.DataFrame({
        "row_id": [f"D{300000 + i}" for i in range(diag_owner_arr.size)],
        "hadm_id": hadm[diag_owner_arr], "icd9": codes, "priority": priority})
    return {"patients": patient_frame, "admissions": admission_frame,
            "diagnoses": diagnosis_frame}


def _insurance_p(medicare: float) -> list[float]:
    rest = 1.0 - medicare
    return [medicare, rest * 0.3, rest * 0.6, rest * 0.1]


def write_hospital_dataset(folder: Path, patients: int = 500, seed: int = 0,
                           name: str = "hospital", declare_effects: bool = False) -> Path:
    """The generated hospital as a relational dataset a release reads: its three tables as
    CSV files, flat taxonomy files for the patients' columns, and ``dataset.yaml`` (returned).
    For tests, benchmarks and demonstrations of the product path."""
    folder.mkdir(parents=True, exist_ok=True)
    for table, frame in generate_hospital(patients, seed).items():
        frame.to_csv(folder / f"{table}.csv", index=False)
    flat = {"sex": ["F", "M"], "age_band": list(AGE_BANDS), "insurance": list(INSURANCE)}
    for column, values in flat.items():
        (folder / f"{column}.csv").write_text("".join(f"{v};*\n" for v in values))
    (folder / "icd9.csv").write_text("".join(f"{code};{chapter};*\n"
                                             for code, chapter in CODES.items()))
    config = {
        "name": name, "input": {"path": "patients.csv"},
        "columns": {"subject_id": {"role": "identifier"},
                    **{c: {"role": "dimension", "taxonomy": f"{c}.csv"} for c in flat}},
        "privacy": {"lifetime_epsilon": 10.0, "lifetime_delta": 1e-5, "unit": "subject_id",
                    "unit_noun": "patient"},
        "relational": {
            "tables": [
                {"path": "admissions.csv", "key": "hadm_id", "references": "subject_id",
                 "max_children": 4, "max_children_reviewed": True,
                 "columns": {"admission_type": {"values": list(ADMISSION_TYPES)},
                             "los_band": {"values": list(LOS_BANDS)},
                             "readmitted_30d": {"values": ["no", "yes"]}}},
                {"path": "diagnoses.csv", "parent": "admissions", "key": "row_id",
                 "references": "hadm_id", "max_children": 6, "max_children_reviewed": True,
                 "columns": {"icd9": {"taxonomy": "icd9.csv"},
                             "priority": {"values": ["primary", "secondary"]}}}],
            "analyses": [list(a) for a in EFFECTS] if declare_effects else []},
        "policy": {"mechanisms": ["relational"]},
        "mechanism": {"name": "relational", "params": {"epsilon": 1.0}},
    }
    path = folder / "dataset.yaml"
    path.write_text(json.dumps(config, indent=1))  # JSON is YAML
    return path
