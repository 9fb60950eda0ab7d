"""Taxonomy files: both formats, NCP by hand, and the errors a steward sees."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from medrelease.data.taxonomy import load_taxonomy, numeric_levels
from medrelease.errors import InputValidationError, TaxonomyError

from ..conftest import ROOT, SHARED


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


def _generic_numeric(low: int, high: int, rules: list[dict]):
    """The integer taxonomy built the slow, generic way: each value's interval labels by hand,
    then ``from_leaf_paths`` (its tree check included)."""
    from medrelease.data.taxonomy import from_leaf_paths

    def start(rule: dict, v: int) -> int:
        if "cuts" in rule:
            return max(low, max(c for c in rule["cuts"] if c <= v))
        anchor = rule.get("anchor", low)
        return max(low, anchor + (v - anchor) // rule["width"] * rule["width"])

    levels = []
    for rule in rules:
        starts = sorted({start(rule, v) for v in range(low, high + 1)})
        levels.append([(s, (starts[i + 1] - 1) if i + 1 < len(starts) else high)
                       for i, s in enumerate(starts)])
    paths, bounds = [], []
    for v in range(low, high + 1):
        own = [next((a, b) for a, b in level if a <= v <= b) for level in levels]
        paths.append([f"[{a}-{b}]" for a, b in own] + ["*"])
        bounds.append([*own, (low, high)])
    return from_leaf_paths("x", "numeric", list(range(low, high + 1)), paths, bounds=bounds)


@pytest.mark.parametrize(("low", "high", "rules"), [
    (0, 99, [{"width": 10}, {"width": 50}]),                        # the paper's age
    (10000, 10999, [{"width": 100, "anchor": 0}, {"width": 500, "anchor": 0}]),  # its zipcode
    (3, 47, [{"width": 5, "anchor": 1}, {"width": 10, "anchor": 1}, {"width": 20, "anchor": 1}]),
    (-12, 30, [{"width": 7, "anchor": 0}]),
    (5, 5, [{"width": 1}]),
    (0, 120, [{"cuts": [0, 18, 40, 65, 90]}, {"cuts": [-5, 65]}]),  # cuts below the domain
])
def test_integer_levels_are_the_tree_the_generic_builder_makes(low, high, rules) -> None:
    """numeric_levels builds nested interval levels from arrays (the generic per-leaf way took
    0.7 s for a 90,000-value zipcode domain, every run); the result is field for field the
    taxonomy ``from_leaf_paths`` makes from the same intervals."""
    fast = numeric_levels("x", low, high, rules)
    slow = _generic_numeric(low, high, rules)
    assert fast.kind == slow.kind and fast.leaves == slow.leaves
    assert fast.level_labels == slow.level_labels
    for ours, theirs in zip(fast.level_codes, slow.level_codes, strict=True):
        assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)
    for ours, theirs in zip(fast.level_leaf_counts, slow.level_leaf_counts, strict=True):
        assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)
    for (lo, hi), (slo, shi) in zip(fast.level_bounds, slow.level_bounds, strict=True):
        assert np.array_equal(lo, slo) and np.array_equal(hi, shi)
    with pytest.raises(TaxonomyError, match=r"'\[0-4\]' at level 1 has two parents, '\[0-2\]' and '\[3-5\]'"):
        numeric_levels("x", 0, 10, [{"width": 5}, {"width": 3}])  # not nested: still refused
