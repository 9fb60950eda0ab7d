"""What ``medrelease init`` drafts for flags, codes and numbers, and what it says about it
(issue 53): a 0/1 flag or a small code is a value list of exactly the values found, never a
band a mechanism could draw a 2 from; numeric leaves run from the data's minimum to its maximum;
every taxonomy read from the data is marked so, and every release's guarantee says so until the
steward sets ``domain_reviewed: true``; ``--analysis`` declares the tables researchers came
for."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from deployments.cli import app
from medrelease.data.config import READ_FROM_DATA_MARK, find_config
from medrelease.data.draft import (
    MAX_VALUE_LIST,
    ColumnProfile,
    numeric_taxonomy,
    two_significant_digits,
)
from medrelease.data.taxonomy import load_taxonomy

from ..flow import test_init_check
from ..flow.test_init_check import WIDE, _init

# test_init_check's fixtures: a MEDRELEASE_HOME per test, and a console wide enough to read
home = test_init_check.home
wide_console = test_init_check.wide_console

FLAGS_AND_CODES = {"death": ["0", "1"], "sex": ["1", "2"], "stage": ["1", "2", "3", "4"]}


def cohort(path: Path, rows: int = 600, seed: int = 11) -> pd.DataFrame:
    """A cohort as a user study had one: a patient id repeated per patient, a 0/1 death flag,
    sex 1/2, a stage code 1..4, an age 18..95, a decimal lab value, a treatment, an outcome and
    a free-text note."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({
        "patient_id": [f"P{p:04d}" for p in rng.integers(1, rows // 2, rows)],
        "age": rng.integers(18, 96, rows),
        "creatinine": np.round(rng.uniform(0.43, 3.9, rows), 2),
        "death": rng.choice([0, 1], rows, p=[0.8, 0.2]),
        "sex": rng.choice([1, 2], rows),
        "stage": rng.integers(1, 5, rows),
        "treatment": rng.choice(["drug", "placebo"], rows),
        "outcome": rng.choice(["better", "same", "worse"], rows),
        "notes": [f"seen on ward {i} today" for i in range(rows)],
    })
    frame.loc[0, "age"], frame.loc[1, "age"] = 18, 95
    frame.to_csv(path, index=False)
    return frame


def _values(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    assert lines[0].startswith(READ_FROM_DATA_MARK), lines[0]
    return [line.split(";")[0] for line in lines if not line.startswith("#")]


def test_flags_and_codes_are_value_lists_and_bands_stay_within_the_data(tmp_path: Path,
                                                                          home: Path) -> None:
    frame = cohort(tmp_path / "cohort.csv")
    root = home / "datasets"
    drafted = _init(tmp_path / "cohort.csv", "cohort", root, "--informative", "outcome")
    assert drafted.exit_code == 0, drafted.output
    folder = root / "cohort"
    spec = yaml.safe_load((folder / "dataset.yaml").read_text())["columns"]
    for column, found in FLAGS_AND_CODES.items():
        assert spec[column] == {"role": "dimension", "type": "integer",
                                "taxonomy": f"{column}.csv"}
        assert _values(folder / f"{column}.csv") == found  # exactly the values found
    assert spec["treatment"]["taxonomy"] == "treatment.csv"
    assert _values(folder / "treatment.csv") == ["drug", "placebo"]

    config = find_config("cohort")
    age = config.taxonomies["age"]
    assert (folder / "age.yaml").read_text().startswith(READ_FROM_DATA_MARK)
    assert (age.leaves[0], age.leaves[-1]) == (frame["age"].min(), frame["age"].max())
    assert all(frame["age"].min() <= leaf <= frame["age"].max() for leaf in age.leaves)
    low, high = Fraction(str(frame["creatinine"].min())), Fraction(str(frame["creatinine"].max()))
    lab = config.taxonomies["creatinine"]
    assert lab.binning is not None and lab.binning.low == low  # the first bin starts there
    starts = [Fraction(Decimal(label.strip("[").split("-")[0].rstrip("+]")))
              for label in lab.level_labels[0]]
    assert all(low <= start <= high for start in starts)  # no leaf outside [min, max]
    assert config.taxonomies_read_from_data == ["age", "creatinine", "death", "sex", "stage",
                                                "treatment"]
    checked = CliRunner().invoke(app, ["check", "cohort"], env=WIDE)
    assert checked.exit_code == 0 and "no problems" in checked.output, checked.output
    assert "the values of 'age', 'creatinine', 'death', 'sex', 'stage' and 'treatment' were " \
        "taken from the data" in " ".join(checked.output.replace("│", " ").split())


def test_blanks_and_two_spellings_in_a_flag_still_pass_check(tmp_path: Path,
                                                               home: Path) -> None:
    """A flag with blanks and a number written two ways, an age with blanks: the value list
    holds each spelling and a (blank) leaf, both columns keep ``type: integer`` (issue 55: the
    input check lets a column's missing category through in an integer column as in a
    decimal one; issue 53 had left the type out instead), so check passes with no edit."""
    rng = np.random.default_rng(2)
    frame = pd.DataFrame({"age": rng.integers(18, 96, 400).astype(object),
                          "death": rng.choice(["0", "1", "1.0"], 400).astype(object),
                          "outcome": rng.choice(["a", "b"], 400)})
    frame.loc[rng.choice(400, 12, replace=False), "death"] = None
    frame.loc[rng.choice(400, 12, replace=False), "age"] = None
    frame.to_csv(tmp_path / "blanks.csv", index=False)
    assert _init(tmp_path / "blanks.csv", "blanks", home / "datasets", "--informative",
                 "outcome").exit_code == 0
    folder = home / "datasets" / "blanks"
    assert _values(folder / "death.csv") == ["0", "1", "1.0", "(blank)"]
    spec = yaml.safe_load((folder / "dataset.yaml").read_text())["columns"]
    assert spec["death"]["type"] == spec["age"]["type"] == "integer"
    assert spec["death"]["missing"] == spec["age"]["missing"] == "(blank)"
    checked = CliRunner().invoke(app, ["check", "blanks"], env=WIDE)
    assert checked.exit_code == 0 and "no problems" in checked.output, checked.output


def test_analysis_is_written_and_suggested_otherwise(tmp_path: Path, home: Path) -> None:
    cohort(tmp_path / "cohort.csv", rows=1234)
    root = home / "datasets"
    declared = _init(tmp_path / "cohort.csv", "declared", root, "--informative", "outcome",
                     "--analysis", "treatment,outcome", "--analysis", " death, stage ,outcome")
    assert declared.exit_code == 0, declared.output
    spec = yaml.safe_load((root / "declared" / "dataset.yaml").read_text())
    assert spec["analyses"] == [["treatment", "outcome"], ["death", "stage", "outcome"]]
    assert [a.columns for a in find_config("declared").analyses] == spec["analyses"]
    assert "treatment × outcome" in declared.output

    suggested = _init(tmp_path / "cohort.csv", "suggested", root, "--informative", "outcome")
    assert suggested.exit_code == 0, suggested.output
    text = (root / "suggested" / "dataset.yaml").read_text()
    spec = yaml.safe_load(text)
    assert "analyses" not in spec and "impossible" not in spec and "expected_rows" not in spec
    assert "\n#   - [treatment, outcome]\n" in text and "\n#   - [age, outcome]\n" in text
    assert "aim measures" in text and "\n# impossible:\n" in text
    assert "\n# expected_rows: 1200   # check this: it is a planning figure, never read by a " \
           "release\n" in text
    # the commented-out lines, uncommented, are a config check accepts
    uncommented = text.replace("# analyses:", "analyses:").replace("#   - [", "  - [")
    (root / "suggested" / "dataset.yaml").write_text(
        uncommented.replace("# expected_rows:", "expected_rows:"))
    config = find_config("suggested")
    assert len(config.analyses) == len(config.dimensions) and config.expected_rows == 1200


@pytest.mark.parametrize(("column", "words"), [
    ("nope", "is not a column of cohort.csv"),
    ("patient_id", "is drafted as identifier"),
    ("notes", "is drafted as drop"),
])
def test_an_analysis_of_an_unreleased_column_is_refused(tmp_path: Path, home: Path,
                                                        column: str, words: str) -> None:
    cohort(tmp_path / "cohort.csv", rows=200)
    refused = _init(tmp_path / "cohort.csv", "cohort", home / "datasets", "--informative",
                    "outcome", "--analysis", f"treatment,{column}")
    assert refused.exit_code == 1
    said = " ".join(refused.output.split())
    assert f"'{column}' {words}" in said and "nothing was written" in said, said
    assert not (home / "datasets" / "cohort").exists()


def test_a_release_says_which_taxonomies_were_read_from_the_data(tmp_path: Path,
                                                                  home: Path) -> None:
    """The engine path (``medrelease.release``): aim's synthetic rows hold only the values
    found (no death = 2, no age below the youngest), and the guarantee names every column
    whose taxonomy was read from the data until the steward reviews it."""
    from medrelease.data.input_schema import validate_input
    from medrelease.release import release
    from medrelease.storage.io import read_input

    frame = cohort(tmp_path / "cohort.csv")
    assert _init(tmp_path / "cohort.csv", "cohort", home / "datasets", "--informative",
                 "outcome", "--analysis", "treatment,outcome").exit_code == 0
    config = find_config("cohort")
    extract = validate_input(read_input(config), config)
    result = release(extract, config, "aim", {"epsilon": 0.5}, seed=5)
    for column, found in FLAGS_AND_CODES.items():
        assert set(result.table[column].astype(str)) <= set(found), column
    ages = result.table["age"].astype(int)
    assert ages.min() >= frame["age"].min() and ages.max() <= frame["age"].max()
    statement = result.guarantee.statement()
    assert "the values of 'age', 'creatinine', 'death', 'sex', 'stage' and 'treatment' were " \
           "taken from the data" in statement
    assert "the set of values of 'outcome' was taken from the data" in statement

    path = home / "datasets" / "cohort" / "dataset.yaml"
    reviewed = path.read_text()
    for column in ("age", "creatinine", "death", "sex", "stage"):
        reviewed = reviewed.replace(f'taxonomy: "{column}.csv"}}',
                                    f'taxonomy: "{column}.csv", domain_reviewed: true}}')
        reviewed = reviewed.replace(f'taxonomy: "{column}.yaml"}}',
                                    f'taxonomy: "{column}.yaml", domain_reviewed: true}}')
    path.write_text(reviewed)
    config = find_config("cohort")
    assert config.taxonomies_read_from_data == ["treatment"]
    statement = release(extract, config, "ipa", {"epsilon": 0.5}, seed=5).guarantee.statement()
    assert "the values of 'treatment' were taken from the data (its taxonomy file" in statement
    assert "'stage'" not in statement


def _profile(kind: str, low: float, high: float, places: int = 0, blanks: int = 0,
             values: tuple[str, ...] | None = None) -> ColumnProfile:
    present = 100
    return ColumnProfile("x", present + blanks, present, 50, present if kind == "integer" else 0,
                         present, 0, 0, 0, 0, 0, 0, 3.0, places, 50, low, high, None, None,
                         values)


@pytest.mark.parametrize(("kind", "low", "high", "places", "blanks"), [
    ("integer", 18, 95, 0, 0),       # the values themselves, round bands cut at both ends
    ("integer", 18, 95, 0, 3),       # the same, binned, with a (blank) leaf
    ("integer", 7, 1234, 0, 0),      # bins of 10 from 7 (off the grid): bands count from 7
    ("decimal", 0.43, 3.9, 2, 0),    # bins of 0.02 from an on-grid minimum, top-coded
    ("decimal", 14.3, 42.5, 1, 0),   # bins of 0.2 from an off-grid minimum
    ("decimal", -3.5, 160.0, 1, 0),  # a span needing bins of 1: never read as whole numbers
])
def test_numeric_leaves_run_from_the_minimum_to_the_maximum(tmp_path: Path, kind: str,
                                                            low: float, high: float,
                                                            places: int, blanks: int) -> None:
    text, levels, lower, upper = numeric_taxonomy(_profile(kind, low, high, places, blanks))
    assert text.startswith(READ_FROM_DATA_MARK)
    path = tmp_path / "x.yaml"
    path.write_text(text)
    taxonomy = load_taxonomy(path, "x")  # loads: the bands nest, the marker is a comment
    assert taxonomy.height == levels
    assert lower == Decimal(str(low)) and upper >= Decimal(str(high))
    found = pd.Series([str(low), str(high), str((low + high) / 2)])
    if kind == "integer":
        found = pd.Series([str(int(low)), str(int(high)), str(int((low + high) // 2))])
    assert (taxonomy.encode(found) >= 0).all()  # the smallest and the largest are covered
    if taxonomy.binning is None:
        assert (taxonomy.leaves[0], taxonomy.leaves[-1]) == (low, high)
    else:
        assert taxonomy.binning.low == Fraction(str(low))
        assert taxonomy.binning.low + (taxonomy.binning.n_regular - 1) \
            * taxonomy.binning.resolution <= Fraction(str(high))  # no bin starts past the max


def test_counts_and_thresholds() -> None:
    assert [two_significant_digits(n) for n in (7, 99, 1234, 1250, 3141, 56789, 999_999)] == \
        [7, 99, 1200, 1300, 3100, 57000, 1_000_000]
    assert MAX_VALUE_LIST == 12
