"""A generated cohort whose truths are known: a treatment effect, a death rate that climbs with a
lab band, a combination that cannot occur and a rare value (tests and benchmarks/analyses.py).

One row per person: age (18-95, older on average), sex, a treatment arm ``rx`` (the outcome
rate is 0.40 on ``obs`` and 0.55 on ``lev``), ``creat`` (a creatinine band; the death rate is
about 0.26 / 0.31 / 0.64 / 0.83 from ``normal`` to ``severe``), ``death`` (0/1) and ``cause``
(``none`` for every person alive — a cause for a person alive is impossible — else a cause of
death, one of them, ``poisoning``, held by exactly ``RARE_ROWS`` people).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

ARMS = ("obs", "lev")
OUTCOME_RATE = {"obs": 0.40, "lev": 0.55}
CREAT_BANDS = ("normal", "raised", "high", "severe")
CREAT_SHARES = (0.45, 0.30, 0.15, 0.10)
DEATH_RATE = {"normal": 0.26, "raised": 0.31, "high": 0.64, "severe": 0.83}
CAUSES = ("cancer", "heart", "infection", "renal", "other")
CAUSE_SHARES = (0.35, 0.30, 0.15, 0.12, 0.08)
RARE_CAUSE = "poisoning"
RARE_ROWS = 3


def generate_cohort(rows: int = 8000, seed: int = 0) -> pd.DataFrame:
    """``rows`` people with the effects above (exactly ``RARE_ROWS`` rows of the rare cause)."""
    rng = np.random.default_rng(seed)
    age = np.clip(np.rint(rng.normal(60, 14, rows)), 18, 95).astype(np.int64)
    sex = rng.choice(np.array([1, 2]), rows)
    rx = rng.choice(np.array(ARMS), rows)
    outcome = (rng.random(rows) < np.vectorize(OUTCOME_RATE.get)(rx)).astype(np.int64)
    creat = rng.choice(np.array(CREAT_BANDS), rows, p=CREAT_SHARES)
    death = (rng.random(rows) < np.vectorize(DEATH_RATE.get)(creat)).astype(np.int64)
    cause = np.full(rows, "none", dtype=object)
    dead = np.flatnonzero(death == 1)
    cause[dead] = rng.choice(np.array(CAUSES, dtype=object), dead.size, p=CAUSE_SHARES)
    cause[rng.choice(dead, RARE_ROWS, replace=False)] = RARE_CAUSE
    frame = pd.DataFrame({"patient_id": np.arange(1, rows + 1), "age": age, "sex": sex,
                          "rx": rx, "outcome": outcome, "creat": creat, "death": death,
                          "cause": cause})
    for column, values in OTHER_COLUMNS.items():  # what a real cohort also holds
        frame.insert(len(frame.columns) - 1, column, rng.choice(np.array(values), rows))
    return frame


# Columns with no planted effect, as a real extract has (lab bands, codes, years): they take
# their share of aim's rounds, so an effect nobody declared competes with them for budget.
OTHER_COLUMNS = {
    "bili": ("low", "normal", "high", "very high"),
    "alb": ("low", "normal", "high"),
    "stage": ("1", "2", "3", "4"),
    "nodes": tuple(str(n) for n in range(11)),
    "year": tuple(str(y) for y in range(1995, 2006)),
    "region": tuple(f"R{r:02d}" for r in range(1, 9)),
}


ANALYSES = ("[rx, outcome]", "[creat, death]")
IMPOSSIBLE = ('{when: {death: ["0"], cause: [cancer, heart, infection, renal, other, '
              'poisoning]}, reason: "a cause of death for a person alive"}')


def write_cohort_dataset(folder: Path, frame: pd.DataFrame, name: str = "cohort",
                         analyses: bool = True, impossible: bool = True,
                         epsilon: float = 1.0) -> Path:
    """``frame`` (``generate_cohort``'s) as a dataset for ``aim``: age in 5- and 10-year bands,
    the small codes as value lists, ``cause`` the informative column with a declared domain;
    the declared analyses and the impossible combination optional (to compare)."""
    folder.mkdir(parents=True, exist_ok=True)
    frame.to_csv(folder / "cohort.csv", index=False)
    (folder / "age.yaml").write_text(
        "domain: {min: 18, max: 95}\nlevels:\n  - {width: 5, anchor: 0}\n"
        "  - {width: 10, anchor: 0}\n")
    for column, values in (("sex", ("1", "2")), ("rx", ARMS), ("outcome", ("0", "1")),
                           ("creat", CREAT_BANDS), ("death", ("0", "1")),
                           *OTHER_COLUMNS.items()):
        (folder / f"{column}.csv").write_text("".join(f"{v};*\n" for v in values))
    others = "".join(f"  {c}: {{role: dimension, taxonomy: {c}.csv}}\n"
                     for c in OTHER_COLUMNS if c in frame.columns)
    (folder / "cause.txt").write_text("\n".join(("none", *CAUSES, RARE_CAUSE)) + "\n")
    declared = ("analyses:\n" + "".join(f"  - {a}\n" for a in ANALYSES)) if analyses else ""
    rules = f"impossible:\n  - {IMPOSSIBLE}\n" if impossible else ""
    (folder / "dataset.yaml").write_text(textwrap.dedent(f"""\
        name: {name}
        input: {{path: cohort.csv}}
        columns:
          patient_id: {{role: identifier}}
          age: {{role: dimension, type: integer, taxonomy: age.yaml}}
          sex: {{role: dimension, type: integer, taxonomy: sex.csv}}
          rx: {{role: dimension, taxonomy: rx.csv}}
          outcome: {{role: dimension, type: integer, taxonomy: outcome.csv}}
          creat: {{role: dimension, taxonomy: creat.csv}}
          death: {{role: dimension, type: integer, taxonomy: death.csv}}
        """) + others + textwrap.dedent(f"""\
          cause: {{role: informative, domain: cause.txt, domain_reviewed: true}}
        privacy: {{lifetime_epsilon: 100, unit: patient_id, max_rows_per_unit: 1}}
        mechanism: {{name: aim, params: {{epsilon: {epsilon}}}}}
        expected_rows: {len(frame)}
        """) + declared + rules)
    return folder / "dataset.yaml"
