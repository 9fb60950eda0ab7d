"""Generated tables of every shape ``medrelease init`` meets in the wild (issue 55): what the
property test drafts, checks and releases, what reproduces the issue's four tables, and what
``benchmarks/cli_timing.py`` times. Nothing here is real data.

A table is a frame of text cells (``None``: a blank) with an informative column. The column
kinds are those steward tables hold: flags and small codes, measurements of any magnitude and
precision (negative ones too), blanks in numeric columns, dates written in the common ways,
booleans, numeric-looking codes with leading zeros, ICD-like codes, categories (unicode ones
too), ids (unique, or repeating per person), free text, constant and empty columns; column
names with spaces, quotes, unicode, punctuation or YAML's words (``no``, ``null``).
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

WORDS = ("pain", "fever", "cough", "chest", "acute", "mild", "severe", "follow", "up", "left",
         "right", "since", "days", "week", "após", "hôpital", "München")
CATEGORIES = ("north", "south", "east", "west", "Zürich", "São Paulo", "東京", "Ærø", "O'Brien",
              "a-b", "x/y", "5th")
DATE_FORMATS = ("%Y-%m-%d", "%d/%m/%Y", "%m/%d/%Y", "%Y/%m/%d", "%d.%m.%Y", "%Y%m%d",
                "%Y-%m-%d %H:%M:%S", "%d-%b-%Y", "%b %d %Y", "%Y-%m")
BOOLEANS = (("True", "False"), ("true", "false"), ("TRUE", "FALSE"), ("yes", "no"), ("Y", "N"),
            ("T", "F"))
ODD_NAMES = ("âge", "Größe (cm)", "blood pressure", 'say "hi"', "x;y", "#count", "1st visit",
             "no", "null", "on", "ключ", "名前", "a.b", "weight[kg]", "  padded  ", "O'Neil",
             "tab\tname", "%", "Ünïcödé ✓", "a,b")


@dataclass(frozen=True)
class Table:
    """A generated table: its text cells, the informative column, and a name for logs."""

    frame: pd.DataFrame
    informative: str
    shape: str

    def write(self, path: Path) -> Path:
        """As a steward's CSV: UTF-8, comma-separated, quoted where needed, blanks empty."""
        self.frame.to_csv(path, index=False, quoting=csv.QUOTE_MINIMAL, na_rep="")
        return path


def _blanks(rng: np.random.Generator, values: np.ndarray, share: float) -> np.ndarray:
    out = np.asarray(values, dtype=object).copy()
    if share > 0 and out.size:
        out[rng.random(out.size) < share] = None
    return out


def _decimal_text(rng: np.random.Generator, rows: int) -> np.ndarray:
    """Measurements of any magnitude (10^-4 to 10^6) and precision (0-4 places), sometimes
    negative, sometimes written with trailing zeros or as whole numbers ("3" beside "3.5")."""
    scale = 10.0 ** rng.integers(-4, 7)
    places = int(rng.integers(0, 5))
    centre = rng.choice([0.0, scale, 10 * scale])
    values = rng.normal(centre, scale, rows)
    if rng.random() < 0.5:
        values = np.abs(values)
    values = np.round(values, places)
    text = np.array([f"{v:.{places}f}" for v in values], dtype=object)
    if places and rng.random() < 0.3:  # a few written without their decimals
        whole = rng.random(rows) < 0.2
        text[whole] = [str(int(np.rint(v))) for v in values[whole]]
    return text


def _integer_text(rng: np.random.Generator, rows: int) -> np.ndarray:
    low = int(rng.choice([0, 1, -50, 1900, -1_000_000, 10_000]))
    span = int(rng.choice([13, 40, 100, 400, 5000, 10**6]))
    return np.array([str(v) for v in rng.integers(low, low + span, rows)], dtype=object)


def _dates(rng: np.random.Generator, rows: int) -> np.ndarray:
    fmt = str(rng.choice(DATE_FORMATS))
    start = date(int(rng.integers(1950, 2020)), 1, 1)
    days = rng.integers(0, int(rng.choice([30, 400, 3000])), rows)
    return np.array([(start + timedelta(days=int(d))).strftime(fmt) for d in days], dtype=object)


def _ids(rng: np.random.Generator, rows: int, repeating: bool) -> np.ndarray:
    prefix = str(rng.choice(["P", "ID-", "", "pt_"]))
    people = max(1, rows // 3) if repeating else rows
    numbers = rng.integers(0, people, rows) if repeating else rng.permutation(rows)
    return np.array([f"{prefix}{n + 100000}" for n in numbers], dtype=object)


def _codes(rng: np.random.Generator, rows: int) -> np.ndarray:
    letters = np.array(list("ABCJKZ"))
    return np.array([f"{rng.choice(letters)}{rng.integers(0, 40):02d}.{rng.integers(0, 4)}"
                     for _ in range(rows)], dtype=object)


def _leading_zeros(rng: np.random.Generator, rows: int) -> np.ndarray:
    width = int(rng.integers(3, 6))
    return np.array([f"{v:0{width}d}" for v in rng.integers(0, int(rng.choice([30, 800])),
                                                            rows)], dtype=object)


def _categories(rng: np.random.Generator, rows: int) -> np.ndarray:
    """A few categories (unicode and punctuation among them), unevenly common."""
    chosen = rng.choice(np.array(CATEGORIES, dtype=object), int(rng.integers(2, 7)),
                        replace=False)
    return chosen[rng.choice(chosen.size, rows, p=rng.dirichlet(np.ones(chosen.size)))]


def _free_text(rng: np.random.Generator, rows: int) -> np.ndarray:
    return np.array([" ".join(rng.choice(WORDS, int(rng.integers(3, 9)))) + f" {i}"
                     for i in range(rows)], dtype=object)


KINDS: dict[str, Callable[[np.random.Generator, int], np.ndarray]] = {
    "flag": lambda rng, n: np.array([str(v) for v in rng.integers(0, 2, n)], dtype=object),
    "stage": lambda rng, n: np.array([str(v) for v in rng.integers(1, 6, n)], dtype=object),
    "integer": _integer_text,
    "decimal": _decimal_text,
    "date": _dates,
    "boolean": lambda rng, n: np.array(
        BOOLEANS[int(rng.integers(len(BOOLEANS)))], dtype=object)[rng.integers(0, 2, n)],
    "zero-padded code": _leading_zeros,
    "code": _codes,
    "category": lambda rng, n: _categories(rng, n),
    "unique id": lambda rng, n: _ids(rng, n, False),
    "repeating id": lambda rng, n: _ids(rng, n, True),
    "free text": _free_text,
    "constant": lambda rng, n: np.full(n, "same", dtype=object),
    "empty": lambda rng, n: np.full(n, None, dtype=object),
    "exponent": lambda rng, n: np.array([f"{v:.2e}" for v in rng.normal(0, 1e5, n)],
                                        dtype=object),
    "date-time": lambda rng, n: np.array(
        [f"2021-0{rng.integers(1, 10)}-1{rng.integers(0, 10)} {rng.integers(0, 24):02d}:"
         f"{rng.integers(0, 60):02d}:00" for _ in range(n)], dtype=object),
    "multi-line": lambda rng, n: np.array(
        [f"line {rng.integers(0, 3)}\nmore" for _ in range(n)], dtype=object),
    "NA ids": lambda rng, n: np.where(rng.random(n) < 0.05, "NA", _ids(rng, n, True)),
}
INFORMATIVE_KINDS = ("category", "flag", "stage", "boolean", "code")
BLANKABLE = ("flag", "stage", "integer", "decimal", "date", "boolean", "zero-padded code",
             "code", "category")


def _names(rng: np.random.Generator, count: int) -> list[str]:
    """Column names: mostly plain, some odd (unicode, spaces, quotes, YAML words), distinct."""
    names: list[str] = []
    for i in range(count):
        odd = rng.random() < 0.3
        name = str(rng.choice(ODD_NAMES)) if odd else f"col_{i}"
        while name in names:
            name = f"{name}_{i}"
        names.append(name)
    return names


ROW_COUNTS = (1, 2, 3, 7, 30, 120, 400, 1500)
WIDTHS = (1, 2, 3, 5, 8, 14, 25, 40)
WIDTH_SHARES = (.04, .14, .16, .2, .18, .14, .08, .06)


def random_table(seed: int, max_rows: int = 1500, max_columns: int = 40) -> Table:
    """One table of a random shape: 1 to 1,500 rows (often few), 1 to 40 columns (often few),
    each column of a random kind, blanks in some; an informative column of a kind init can
    draft a domain for. ``max_rows`` / ``max_columns`` cap the shape (a draw above the cap
    takes the cap), so a quick test can keep to small tables with the same kinds."""
    rng = np.random.default_rng(seed)
    rows = min(int(rng.choice(ROW_COUNTS)), max_rows)
    width = min(int(rng.choice(WIDTHS, p=WIDTH_SHARES)), max_columns)
    names = _names(rng, width)
    columns: dict[str, np.ndarray] = {}
    kinds: list[str] = []
    informative = names[int(rng.integers(width))]
    for name in names:
        kind = (str(rng.choice(INFORMATIVE_KINDS)) if name == informative
                else str(rng.choice(list(KINDS))))
        values = KINDS[kind](rng, rows)
        if kind in BLANKABLE and rng.random() < 0.3:
            values = _blanks(rng, values, float(rng.choice([0.001, 0.02, 0.2])))
        columns[name] = values
        kinds.append(kind)
    frame = pd.DataFrame(columns, columns=names)
    return Table(frame, informative, f"seed {seed}: {rows} rows, {width} columns "
                                     f"({', '.join(sorted(set(kinds)))})")


# -- the four tables, generated (issue 55) -------------------------------------------


def ages_below_one(rows: int = 15_000, seed: int = 1) -> Table:
    """Tests where some ages are below one year (0.1 ... 0.9) among whole years."""
    rng = np.random.default_rng(seed)
    age = np.clip(np.rint(rng.gamma(2, 20, rows)), 1, 99).astype(int).astype(str).astype(object)
    small = rng.choice(rows, rows // 8, replace=False)
    age[small] = [f"0.{d}" for d in rng.integers(1, 10, small.size)]
    frame = pd.DataFrame({"age": age, "sex": rng.choice(["F", "M"], rows),
                          "ward": rng.choice(["a", "b", "c"], rows),
                          "result": rng.choice(["positive", "negative"], rows)})
    return Table(frame, "result", "ages below one year")


def blank_integer_year(rows: int = 26_000, seed: int = 2) -> Table:
    """Crash occupants: an integer year column with one blank, and two integer clinical
    columns with blanks."""
    rng = np.random.default_rng(seed)
    year = rng.integers(1990, 2021, rows).astype(str).astype(object)
    year[int(rng.integers(rows))] = None
    frame = pd.DataFrame({
        "model_year": year,
        "speed_limit": _blanks(rng, rng.integers(20, 130, rows).astype(str), 0.01),
        "heart_rate": _blanks(rng, rng.integers(40, 180, rows).astype(str), 0.05),
        "seat": rng.choice(["front", "rear", "middle"], rows),
        "injury": rng.choice(["none", "minor", "serious", "fatal"], rows, p=[.5, .3, .15, .05])})
    return Table(frame, "injury", "a blank in an integer year")


def wide_survey(rows: int = 20_000, columns: int = 20, continuous: int = 9,
                seed: int = 3) -> Table:
    """A survey: ``continuous`` continuous columns (log incomes, scores; three decimals) and
    categorical ones up to ``columns``, the last the informative one."""
    rng = np.random.default_rng(seed)
    data: dict[str, np.ndarray] = {}
    base = rng.normal(0, 1, rows)
    for i in range(continuous):
        values = 10 + base * rng.uniform(0.2, 1) + rng.normal(0, 1, rows)
        data[f"score_{i}"] = np.array([f"{v:.3f}" for v in values], dtype=object)
    for i in range(columns - continuous - 1):
        levels = int(rng.integers(2, 8))
        data[f"q{i}"] = np.array([f"answer {k}" for k in range(levels)],
                                 dtype=object)[rng.integers(0, levels, rows)]
    data["satisfied"] = np.where(base + rng.normal(0, 1, rows) > 0, "yes", "no").astype(object)
    return Table(pd.DataFrame(data), "satisfied", f"a {columns}-column survey")


def cohort_table(rows: int = 8_000, columns: int = 15, seed: int = 4) -> Table:
    """A cohort: a person id, ages and lab values, stages, flags and codes, an outcome."""
    rng = np.random.default_rng(seed)
    data: dict[str, np.ndarray] = {
        "person_id": np.array([f"C{i:06d}" for i in rng.permutation(rows)], dtype=object),
        "age": rng.integers(18, 96, rows).astype(str).astype(object),
        "creatinine": np.array([f"{v:.1f}" for v in rng.gamma(4, 0.3, rows)], dtype=object),
        "bmi": np.array([f"{v:.1f}" for v in rng.normal(27, 5, rows)], dtype=object),
        "sex": rng.choice(["F", "M"], rows).astype(object),
        "stage": rng.integers(1, 5, rows).astype(str).astype(object),
    }
    extra = columns - len(data) - 1
    for i in range(extra):
        if i % 3 == 0:
            data[f"flag_{i}"] = rng.integers(0, 2, rows).astype(str).astype(object)
        elif i % 3 == 1:
            data[f"site_{i}"] = np.array([f"S{k:02d}" for k in rng.integers(0, 9, rows)],
                                         dtype=object)
        else:
            data[f"grade_{i}"] = rng.choice(["low", "mid", "high"], rows).astype(object)
    data["outcome"] = rng.choice(["alive", "dead"], rows, p=[.8, .2]).astype(object)
    return Table(pd.DataFrame(data), "outcome", f"a {columns}-column cohort")


__all__ = ["KINDS", "Table", "ages_below_one", "blank_integer_year", "cohort_table",
           "random_table", "wide_survey"]
