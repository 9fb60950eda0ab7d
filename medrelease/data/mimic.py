"""The MIMIC-III demo joined per admission, like DiffGen's MIMIC experiment.

One row per hospital admission, with its patient (``subject_id``, the privacy unit of
``mimic-demo``, never released): gender (PATIENTS), ethnicity, marital status, insurance,
admission type, religion, admission location (ADMISSIONS), the set of ICD-9 codes
(DIAGNOSES_ICD, joined with ``|``) and the class: in-hospital death (HOSPITAL_EXPIRE_FLAG).
Blank categorical values become ``UNKNOWN`` so they are a value of their own, not a gap.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from medrelease.errors import InputValidationError

PREDICTORS = ["gender", "ethnicity", "marital_status", "insurance", "admission_type",
              "religion", "admission_location"]
ITEM_SEPARATOR = "|"


def admissions_table(folder: str | Path) -> pd.DataFrame:
    folder = Path(folder)
    missing = [n for n in ("ADMISSIONS.csv", "PATIENTS.csv", "DIAGNOSES_ICD.csv")
               if not (folder / n).is_file()]
    if missing:
        raise InputValidationError(f"MIMIC-III folder {folder} lacks {', '.join(missing)}")
    admissions = pd.read_csv(folder / "ADMISSIONS.csv", dtype=str, keep_default_na=False)
    patients = pd.read_csv(folder / "PATIENTS.csv", dtype=str, keep_default_na=False)
    diagnoses = pd.read_csv(folder / "DIAGNOSES_ICD.csv", dtype=str, keep_default_na=False)
    codes = (diagnoses[diagnoses["ICD9_CODE"] != ""]
             .groupby("HADM_ID")["ICD9_CODE"]
             .agg(lambda c: ITEM_SEPARATOR.join(sorted(set(c)))))
    table = admissions.merge(patients[["SUBJECT_ID", "GENDER"]], on="SUBJECT_ID", how="left")
    out = pd.DataFrame({
        "subject_id": table["SUBJECT_ID"],
        "hadm_id": table["HADM_ID"],
        "gender": table["GENDER"],
        "ethnicity": table["ETHNICITY"],
        "marital_status": table["MARITAL_STATUS"],
        "insurance": table["INSURANCE"],
        "admission_type": table["ADMISSION_TYPE"],
        "religion": table["RELIGION"],
        "admission_location": table["ADMISSION_LOCATION"],
        "icd9_codes": table["HADM_ID"].map(codes).fillna(""),
        "died_in_hospital": table["HOSPITAL_EXPIRE_FLAG"].map({"0": "no", "1": "yes"}),
    })
    for column in PREDICTORS:
        out[column] = out[column].replace("", "UNKNOWN").fillna("UNKNOWN")
    return out


def write_admissions(folder: str | Path, target: str | Path) -> int:
    """Write the per-admission table as CSV (atomically: a partial file never has the name)."""
    table = admissions_table(folder)
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    table.to_csv(partial, index=False)
    os.replace(partial, target)
    write_relational(folder, target.parent / "relational")
    return len(table)


def write_relational(folder: str | Path, target: Path) -> dict[str, int]:
    """The same demo as three related tables (``mimic-relational``'s input): patients,
    admissions, diagnoses (each diagnosis as its ICD-9 chapter and priority), one CSV each,
    written atomically."""
    from medrelease.relational.mimic import mimic_tables

    target.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, frame in mimic_tables(folder).items():
        partial = target / f".{name}.csv.partial"
        frame.to_csv(partial, index=False)
        os.replace(partial, target / f"{name}.csv")
        out[name] = len(frame)
    return out
