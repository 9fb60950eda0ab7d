"""The bundled MIMIC-III demo as a relational dataset: PATIENTS -> ADMISSIONS -> DIAGNOSES_ICD.

The same vocabularies as ``medrelease.data.mimic`` (the per-admission join of ``mimic-demo``):
the taxonomies in ``taxonomies/mimic`` and blanks read as ``UNKNOWN``; a diagnosis is released
as its ICD-9 chapter (level 2 of ``taxonomies/icd9/icd9.csv``, 19 chapters: the demo's 1,761
diagnoses of 129 admissions of 100 patients cannot carry 17,553 codes) and its priority
(SEQ_NUM 1 is the primary diagnosis). ``max_children``: 2 admissions per patient (as
``mimic-demo``'s ``max_rows_per_unit``), 10 diagnoses per admission (the demo's median is 12;
L = lcm(1, 2) x lcm(1..10) = 5,040).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from medrelease.data.taxonomy import load_taxonomy
from medrelease.errors import InputValidationError
from medrelease.relational.schema import RelColumn, RelSchema, RelTable
from medrelease.settings import project_root

ADMISSION_COLUMNS = {  # released column -> (ADMISSIONS column, taxonomy file)
    "admission_type": ("ADMISSION_TYPE", "admission_type.csv"),
    "insurance": ("INSURANCE", "insurance.csv"),
    "ethnicity": ("ETHNICITY", "ethnicity.csv"),
    "marital_status": ("MARITAL_STATUS", "marital_status.csv"),
    "admission_location": ("ADMISSION_LOCATION", "admission_location.csv"),
}


def taxonomy_folder() -> Path:
    return project_root() / "taxonomies"


def chapters() -> tuple[str, ...]:
    """The ICD-9 chapters (public: the taxonomy's level 2)."""
    icd9 = load_taxonomy(taxonomy_folder() / "icd9" / "icd9.csv", "icd9")
    return tuple(icd9.level_labels[2])


def mimic_schema(max_admissions: int = 2, max_diagnoses: int = 10,
                 with_diagnoses: bool = True) -> RelSchema:
    """patients (gender, died) -> admissions (5 columns + in-hospital death) -> diagnoses."""
    folder = taxonomy_folder() / "mimic"
    patients = RelTable("patients", (
        RelColumn.of_taxonomy("gender", folder / "gender.csv"),
        RelColumn.of_values("expire_flag", ["0", "1"]),
    ), key="subject_id")
    admissions = RelTable("admissions", (
        *(RelColumn.of_taxonomy(name, folder / file, missing="UNKNOWN")
          for name, (_, file) in ADMISSION_COLUMNS.items()),
        RelColumn.of_values("hospital_expire_flag", ["0", "1"]),
    ), key="hadm_id", parent="patients", parent_key="subject_id", max_children=max_admissions)
    diagnoses = RelTable("diagnoses", (
        RelColumn.of_values("chapter", chapters()),
        RelColumn.of_values("priority", ["primary", "secondary"]),
    ), key="row_id", parent="admissions", parent_key="hadm_id", max_children=max_diagnoses)
    return RelSchema((patients, admissions, diagnoses) if with_diagnoses
                     else (patients, admissions))


def mimic_tables(folder: str | Path) -> dict[str, pd.DataFrame]:
    """The three tables as the schema reads them (text; input keys kept for the references)."""
    folder = Path(folder)
    missing = [n for n in ("PATIENTS.csv", "ADMISSIONS.csv", "DIAGNOSES_ICD.csv")
               if not (folder / n).is_file()]
    if missing:
        raise InputValidationError(f"MIMIC-III folder {folder} lacks {', '.join(missing)}")
    read = {"dtype": str, "keep_default_na": False}
    patients = pd.read_csv(folder / "PATIENTS.csv", **read)
    admissions = pd.read_csv(folder / "ADMISSIONS.csv", **read)
    diagnoses = pd.read_csv(folder / "DIAGNOSES_ICD.csv", **read)
    diagnoses = diagnoses[diagnoses["ICD9_CODE"] != ""]
    icd9 = load_taxonomy(taxonomy_folder() / "icd9" / "icd9.csv", "icd9")
    chapter = icd9.labels(2)[icd9.level_codes[2][icd9.encode(diagnoses["ICD9_CODE"])]]
    return {
        "patients": pd.DataFrame({"subject_id": patients["SUBJECT_ID"],
                                  "gender": patients["GENDER"],
                                  "expire_flag": patients["EXPIRE_FLAG"]}),
        "admissions": pd.DataFrame({
            "hadm_id": admissions["HADM_ID"], "subject_id": admissions["SUBJECT_ID"],
            **{name: admissions[source] for name, (source, _) in ADMISSION_COLUMNS.items()},
            "hospital_expire_flag": admissions["HOSPITAL_EXPIRE_FLAG"]}),
        "diagnoses": pd.DataFrame({
            "row_id": diagnoses["ROW_ID"].to_numpy(), "hadm_id": diagnoses["HADM_ID"].to_numpy(),
            "chapter": chapter,
            "priority": (diagnoses["SEQ_NUM"] == "1").map({True: "primary",
                                                           False: "secondary"}).to_numpy()}),
    }
