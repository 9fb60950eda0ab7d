"""Taxonomy files: both formats, NCP by hand, and the errors a steward sees."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from medrelease.data.taxonomy import load_taxonomy, numeric_levels
from medrelease.errors import InputValidationError, TaxonomyError

from .conftest import ROOT, SHARED


def test_arx_adult_hierarchy_levels_and_labels() -> None:
    tax = load_taxonomy(SHARED / "data/adult/adult_hierarchy_education.csv", "education")
    assert tax.height == 3
    assert tax.labels(tax.height).tolist() == ["*"]
    bachelors = tax.encode(pd.Series(["Bachelors"]))[0]
    assert tax.labels(1)[tax.level_codes[1][bachelors]] == "Undergraduate"
    assert tax.labels(2)[tax.level_codes[2][bachelors]] == "Higher education"


def test_numeric_levels_match_the_paper_lattice() -> None:
    age = load_taxonomy(ROOT / "taxonomies/nps/age.yaml", "age")
    stay = load_taxonomy(ROOT / "taxonomies/nps/length_of_stay.yaml", "length_of_stay")
    region = load_taxonomy(ROOT / "taxonomies/nps/region.csv", "region")
    assert (age.height, stay.height, region.height) == (3, 3, 3)
    assert age.labels(1).tolist()[:3] == ["[1-9]", "[10-19]", "[20-29]"]
    assert age.labels(2).tolist() == ["[1-29]", "[30-59]", "[60-89]", "[90-100]"]
    assert stay.labels(1).tolist() == ["[1-1]", "[2-4]", "[5-9]", "[10-29]", "[30-400]"]
    assert stay.labels(2).tolist() == ["[1-1]", "[2-400]"]
    assert region.labels(1).tolist() == ["11", "[21-26]", "[31-39]"]
    assert region.labels(2).tolist() == ["11", "[21-39]"]


def test_ncp_by_hand() -> None:
    # Domain 1..100 (100 leaves): a 10-wide interval covers 10 leaves -> 0.1; raw -> 0; * -> 1.
    age = numeric_levels("age", 1, 100, [{"width": 10, "anchor": 0}, {"width": 30, "anchor": 0}])
    ages = pd.Series([25, 1, 100])
    leaf = age.encode(ages)
    assert age.ncp(0)[leaf].tolist() == [0.0, 0.0, 0.0]
    assert age.ncp(1)[age.level_codes[1][leaf]].tolist() == pytest.approx([0.10, 0.09, 0.0])
    # [1-29] has 29 leaves, [90-100] has 11.
    assert age.ncp(2)[age.level_codes[2][leaf]].tolist() == pytest.approx([0.29, 0.29, 0.11])
    assert age.ncp(3).tolist() == [1.0]
    # Categorical: ARX marital status, "spouse not present" covers 5 of 7 values.
    marital = load_taxonomy(SHARED / "data/adult/adult_hierarchy_marital-status.csv", "m")
    code = marital.level_codes[1][marital.encode(pd.Series(["Divorced"]))[0]]
    assert marital.labels(1)[code] == "spouse not present"
    assert marital.ncp(1)[code] == pytest.approx(5 / 7)


def test_uncovered_value_names_column_counts_and_rows_never_the_values() -> None:
    age = load_taxonomy(ROOT / "taxonomies/nps/age.yaml", "age")
    with pytest.raises(InputValidationError) as err:
        age.encode(pd.Series([5, 130, 7, 130, 0]))
    message = str(err.value)
    assert "column 'age'" in message and "2 distinct value(s)" in message
    assert "3 row(s)" in message and "rows 2, 4, 5" in message
    assert "130" not in message  # values go to the steward log only
    [problem] = err.value.problems
    assert set(problem["values"]) == {"130", "0"} and problem["first_positions"] == [2, 4, 5]


def test_categorical_uncovered_and_non_numbers() -> None:
    sex = load_taxonomy(ROOT / "taxonomies/nps/sex.csv", "sex")
    with pytest.raises(InputValidationError, match=r"(?s)column 'sex'.*not covered") as err:
        sex.encode(pd.Series(["F", "X"]))
    assert "'X'" not in str(err.value) and err.value.problems[0]["values"] == ["X"]
    stay = load_taxonomy(ROOT / "taxonomies/nps/length_of_stay.yaml", "length_of_stay")
    for bad in (["3", "three"], ["2.5"], ["1e1"], ["41.99999999999999999"]):
        with pytest.raises(InputValidationError, match="whole number"):
            stay.encode(pd.Series(bad))
    assert list(stay.encode(pd.Series(["4", "4.0", " 7"]))) == [3, 3, 6]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("a;x;*\nb;y\n", "different numbers of levels"),
        ("a;x;*\na;x;*\n", "appears twice"),
        ("a;x;top\nb;x;top\n", "last level must be '\\*'"),
        ("a;x;p;*\nb;x;q;*\n", "two parents"),
        ("a;b;*\nb;a;*\n", "cycle"),
        ("", "empty"),
    ],
)
def test_malformed_arx_files(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(TaxonomyError, match=message):
        load_taxonomy(path, "attr")


def test_malformed_numeric_rules(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("domain: {min: 0, max: 10}\nlevels:\n  - {width: 5}\n  - {width: 3}\n")
    with pytest.raises(TaxonomyError, match="two parents"):
        load_taxonomy(path, "x")
    path.write_text("levels: []\n")
    with pytest.raises(TaxonomyError, match="domain"):
        load_taxonomy(path, "x")
    with pytest.raises(TaxonomyError, match="not found"):
        load_taxonomy(tmp_path / "missing.yaml", "x")


def test_codes_are_consistent_tree() -> None:
    tax = load_taxonomy(ROOT / "taxonomies/nps/region.csv", "region")
    for level in range(tax.height):
        up = np.zeros(tax.cardinality(level), dtype=int) - 1
        for leaf in range(tax.n_leaves):
            code, parent = tax.level_codes[level][leaf], tax.level_codes[level + 1][leaf]
            assert up[code] in (-1, parent)
            up[code] = parent
