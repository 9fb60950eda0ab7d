"""An NPS-like patient table with the IPA paper's schema, for demos, tests and benchmarks.

The Korean National Patient Sample the paper uses is not public; this generator reproduces its
shape: age 1-100, sex, length of stay 1-400 (heavy-tailed), surgery yes/no, one of 16 region
codes, and a diagnosis over thousands of ICD-like codes (a letter for the chapter, three digits).

The diagnosis depends on the patient the way admissions do, so a release has joint structure to
keep (a table whose diagnosis is independent of everything else is matched by shuffling columns,
and no benchmark on it can show more): the chapter (letter) depends on the 10-year age band, on
sex (one chapter is female-only, as pregnancy is) and on the length of stay; within a chapter
the codes are Zipf-like, and surgical admissions favour other codes than medical ones. The
effects are fixed (a constant seed), the draws follow ``seed``. Generation is vectorized.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

REGIONS = np.array([11, 21, 22, 23, 24, 25, 26, 31, 32, 33, 34, 35, 36, 37, 38, 39])
REGION_WEIGHTS = np.array([19, 7, 5, 5, 3, 3, 2, 25, 3, 3, 4, 4, 5, 6, 4, 2], dtype=float)
COLUMNS = ["patient_id", "age", "sex", "length_of_stay", "surgery", "region", "diagnosis"]
CHAPTERS = 20               # letters A..T
FEMALE_ONLY_CHAPTER = 14    # 'O', as ICD's pregnancy chapter
EFFECTS_SEED = 20200517     # the dependence structure is part of the generator, not of a draw


def codes_per_chapter(n_codes: int) -> int:
    return max(1, -(-n_codes // CHAPTERS))


def diagnosis_codes(n_codes: int) -> np.ndarray:
    """ICD-like codes: the chapter's letter and three digits (A000 ... T124 for 2,500 codes)."""
    letters = np.array(list("ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
    per = codes_per_chapter(n_codes)
    idx = np.arange(n_codes)
    return np.char.add(letters[(idx // per) % 26], np.char.zfill((idx % per).astype(str), 3))


def _chapter_probabilities(chapters: int) -> np.ndarray:
    """P(chapter | age band, sex, stay class): shape (10 bands, 2 sexes, 3 stay classes, chapters).
    A Zipf-like base, an age-band effect that moves mass between chapters with age, a sex effect,
    and a long-stay effect."""
    effects = np.random.default_rng(EFFECTS_SEED)
    base = -1.0 * np.log(np.arange(1, chapters + 1))
    peak = effects.uniform(0, 9, chapters)                     # the age band a chapter peaks at
    bands = np.arange(10)[:, None]
    age = -((bands - peak[None, :]) ** 2) / 8.0                # (10, chapters)
    sex = effects.normal(0, 0.5, (2, chapters))
    if chapters > FEMALE_ONLY_CHAPTER:
        sex[1, FEMALE_ONLY_CHAPTER] = -np.inf                  # index 1 = male
    stay = np.stack([np.zeros(chapters), effects.normal(0, 0.6, chapters),
                     effects.normal(0, 1.2, chapters)])       # (3, chapters)
    logits = (base[None, None, None, :] + age[:, None, None, :] + sex[None, :, None, :]
              + stay[None, None, :, :])
    weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True)


def _draw_categories(rng: np.random.Generator, cdf: np.ndarray, group: np.ndarray) -> np.ndarray:
    """One category per row from its group's cumulative distribution (rows x categories)."""
    u = rng.random(group.size)
    out = np.empty(group.size, dtype=np.int64)
    for g in np.unique(group):
        rows = np.flatnonzero(group == g)
        out[rows] = np.searchsorted(cdf[g], u[rows], side="right")
    return np.minimum(out, cdf.shape[1] - 1)


def generate_diagnosis(rng: np.random.Generator, age: np.ndarray, male: np.ndarray,
                       length_of_stay: np.ndarray, surgery: np.ndarray, n_diagnoses: int,
                       zipf_exponent: float) -> np.ndarray:
    """Diagnosis codes (indices into ``diagnosis_codes``) given each admission's attributes."""
    per = codes_per_chapter(n_diagnoses)
    chapters = -(-n_diagnoses // per)
    probs = _chapter_probabilities(chapters)
    band = np.minimum(age // 10, 9)
    stay = (length_of_stay > 7).astype(np.int64) + (length_of_stay > 30)
    group = (band * 2 + male) * 3 + stay
    chapter = _draw_categories(rng, np.cumsum(probs.reshape(-1, chapters), axis=1), group)
    within = np.minimum(per, n_diagnoses - chapter * per)      # the last chapter may be short
    ranks = np.arange(1, per + 1, dtype=float) ** -zipf_exponent
    cdf = np.cumsum(ranks) / ranks.sum()
    rank = np.searchsorted(cdf, rng.random(age.size), side="right")
    code = np.where(surgery, (rank + per // 2) % per, rank)    # surgical stays: other codes
    return chapter * per + code % within


REPEAT_ADMISSIONS = (0.55, 0.20, 0.12, 0.08, 0.05)  # P(a patient has 1, 2, 3, 4, 5 admissions)


def generate_nps(
    n_rows: int, seed: int | None = None, n_diagnoses: int = 2500, zipf_exponent: float = 1.1,
    start_id: int = 0, repeat_admissions: bool = False,
) -> pd.DataFrame:
    """``n_rows`` synthetic admissions (``seed`` for reproducibility). With
    ``repeat_admissions`` a patient has 1-5 admissions (``REPEAT_ADMISSIONS``), sharing sex and
    region and ageing by at most two years; otherwise every row is its own patient."""
    if n_rows < 0:
        raise ValueError("n_rows must be non-negative")
    if n_diagnoses < 1:
        raise ValueError("n_diagnoses must be at least 1")
    rng = np.random.default_rng(seed)
    age_young = rng.integers(1, 40, n_rows)
    age_old = np.clip(np.rint(rng.normal(62, 17, n_rows)), 1, 100).astype(np.int64)
    age = np.where(rng.random(n_rows) < 0.35, age_young, age_old)
    male = rng.random(n_rows) >= 0.52
    base_stay = rng.lognormal(mean=1.2 + age / 80.0, sigma=1.0, size=n_rows)
    length_of_stay = np.clip(np.ceil(base_stay), 1, 400).astype(np.int64)
    surgery = rng.random(n_rows) < 0.15 + age / 400.0
    region = rng.choice(REGIONS, size=n_rows, p=REGION_WEIGHTS / REGION_WEIGHTS.sum())
    codes = diagnosis_codes(n_diagnoses)
    diagnosis = codes[generate_diagnosis(rng, age, male.astype(np.int64), length_of_stay,
                                         surgery, n_diagnoses, zipf_exponent)]
    patient = np.arange(n_rows, dtype=np.int64)
    if repeat_admissions:
        sizes = rng.choice(np.arange(1, 6), size=n_rows, p=REPEAT_ADMISSIONS)
        patient = np.repeat(np.arange(n_rows, dtype=np.int64), sizes)[:n_rows]
        first = np.searchsorted(patient, patient)  # each patient's first admission
        male, region = male[first], region[first]
        age = np.minimum(100, age[first] + (np.arange(n_rows) - first).clip(0, 2))
    return pd.DataFrame(
        {
            "patient_id": start_id + patient,
            "age": age,
            "sex": np.where(male, "M", "F"),
            "length_of_stay": length_of_stay,
            "surgery": np.where(surgery, "Y", "N"),
            "region": region,
            "diagnosis": diagnosis,
        }
    )
