"""An NPS-like patient table with the IPA paper's schema, for demos, tests and benchmarks.

The Korean National Patient Sample the paper uses is not public; this generator reproduces its
shape: age 1-100, sex, length of stay 1-400 (heavy-tailed), surgery yes/no, one of 16 region
codes, and a diagnosis drawn from a Zipf-like distribution over thousands of codes. Columns are
mildly dependent (older patients stay longer and have more surgery) so utility measurements have
something to preserve. Generation is vectorized and can be chunked for very large tables.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

REGIONS = np.array([11, 21, 22, 23, 24, 25, 26, 31, 32, 33, 34, 35, 36, 37, 38, 39])
REGION_WEIGHTS = np.array([19, 7, 5, 5, 3, 3, 2, 25, 3, 3, 4, 4, 5, 6, 4, 2], dtype=float)
COLUMNS = ["patient_id", "age", "sex", "length_of_stay", "surgery", "region", "diagnosis"]


def diagnosis_codes(n_codes: int) -> np.ndarray:
    """Synthetic ICD-like codes: a letter and three digits (A000 ... ), most frequent first."""
    letters = np.array(list("ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
    idx = np.arange(n_codes)
    return np.char.add(letters[(idx // 1000) % 26], np.char.zfill((idx % 1000).astype(str), 3))


def generate_nps(
    n_rows: int, seed: int | None = None, n_diagnoses: int = 2500, zipf_exponent: float = 1.1,
    start_id: int = 0,
) -> pd.DataFrame:
    """``n_rows`` synthetic admissions (``seed`` for reproducibility)."""
    if n_rows < 0:
        raise ValueError("n_rows must be non-negative")
    rng = np.random.default_rng(seed)
    age_young = rng.integers(1, 40, n_rows)
    age_old = np.clip(np.rint(rng.normal(62, 17, n_rows)), 1, 100).astype(np.int64)
    age = np.where(rng.random(n_rows) < 0.35, age_young, age_old)
    sex = np.where(rng.random(n_rows) < 0.52, "F", "M")
    base_stay = rng.lognormal(mean=1.2 + age / 80.0, sigma=1.0, size=n_rows)
    length_of_stay = np.clip(np.ceil(base_stay), 1, 400).astype(np.int64)
    surgery = np.where(rng.random(n_rows) < 0.15 + age / 400.0, "Y", "N")
    region = rng.choice(REGIONS, size=n_rows, p=REGION_WEIGHTS / REGION_WEIGHTS.sum())
    ranks = np.arange(1, n_diagnoses + 1, dtype=float)
    weights = ranks ** -zipf_exponent
    codes = diagnosis_codes(n_diagnoses)
    diagnosis = codes[rng.choice(n_diagnoses, size=n_rows, p=weights / weights.sum())]
    return pd.DataFrame(
        {
            "patient_id": np.arange(start_id, start_id + n_rows, dtype=np.int64),
            "age": age,
            "sex": sex,
            "length_of_stay": length_of_stay,
            "surgery": surgery,
            "region": region,
            "diagnosis": diagnosis,
        }
    )
