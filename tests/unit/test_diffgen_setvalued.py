"""DiffGen with a set-valued predictor: emptiness test, spurious children, budget, MIMIC demo."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from medrelease.data.config import config_from_dict, find_config
from medrelease.data.input_schema import validate_input
from medrelease.data.mimic import admissions_table
from medrelease.data.taxonomy import load_taxonomy
from medrelease.errors import InputValidationError, ParameterError
from medrelease.evidence.classification import accuracies, split
from medrelease.mechanisms import get_mechanism
from medrelease.mechanisms.setvalued import (
    SetCut,
    emptiness_threshold,
    encode_item_sets,
)
from medrelease.privacy.randomness import discrete_laplace_tail, tail_binomial
from medrelease.privacy.unit_cut import unit_cut_epsilon
from medrelease.release import release

MIMIC = Path(__file__).resolve().parents[3] / "shared" / "data" / "mimic-iii-demo"


@pytest.fixture
def items_config(tmp_path):
    """Items a1, a2 (group A) and b1, b2 (group B); one relational predictor; a class."""
    (tmp_path / "items.csv").write_text("a1;A;*\na2;A;*\nb1;B;*\nb2;B;*\n")
    (tmp_path / "sex.csv").write_text("F;*\nM;*\n")
    return config_from_dict({
        "name": "items", "input": {"path": "x.csv"},
        "columns": {
            "sex": {"role": "dimension", "taxonomy": "sex.csv"},
            "codes": {"role": "set_valued", "separator": "|", "taxonomy": "items.csv"},
            "outcome": {"role": "class", "values": ["no", "yes"]},
        },
        "privacy": {"lifetime_epsilon": 100.0},
    }, tmp_path)


def _items_table(n: int, seed: int = 0) -> pd.DataFrame:
    """The outcome is 'yes' exactly when a record has an item of group A."""
    rng = np.random.default_rng(seed)
    choice = rng.integers(0, 3, n)  # 0: A only, 1: B only, 2: A and B
    codes = np.where(choice == 0, "a1", np.where(choice == 1, "b2", "a2|b1"))
    return pd.DataFrame({
        "sex": rng.choice(["F", "M"], n),
        "codes": codes,
        "outcome": np.where(choice == 1, "no", "yes"),
    })


def test_threshold_is_the_smallest_that_bounds_spurious_children() -> None:
    for k, eps, spurious in [(2, 1.0, 1.0), (19, 0.05, 1.0), (19, 0.05, 10.0), (200, 0.1, 0.5)]:
        t = emptiness_threshold(k, eps, spurious)
        children = 2**k - 1
        assert children * discrete_laplace_tail(eps, t) <= spurious
        assert t == 1 or children * discrete_laplace_tail(eps, t - 1) > spurious


@pytest.mark.slow
def test_binomial_beyond_int64_has_the_right_mean() -> None:
    rng = np.random.default_rng(3)
    eps = 0.5
    threshold = emptiness_threshold(70, eps, 2.0)  # about 2 passes among 2^70 - 1 children
    p = discrete_laplace_tail(eps, threshold)
    mean = (2**70 - 1) * p
    draws = [tail_binomial(rng, 2**70 - 1, eps, threshold) for _ in range(1500)]
    assert abs(np.mean(draws) - mean) < 4 * math.sqrt(mean / 1500)
    small = [tail_binomial(rng, 7, eps, 1) for _ in range(3000)]
    p1 = discrete_laplace_tail(eps, 1)
    assert abs(np.mean(small) - 7 * p1) < 4 * math.sqrt(7 * p1 * (1 - p1) / 3000)


@pytest.mark.slow
def test_empty_children_pass_the_test_as_often_as_the_noise_says(items_config) -> None:
    """Children no record has must still appear with P(Z >= threshold), or the output leaks."""
    taxonomy = load_taxonomy(items_config.resolve("items.csv"), "codes")
    _, sets = encode_item_sets(pd.Series(["a1"] * 50), "|", taxonomy)
    eps, spurious = 0.5, 0.9
    threshold = emptiness_threshold(2, eps, spurious)
    rng = np.random.default_rng(11)
    trials, seen_b = 3000, 0
    for _ in range(trials):
        cut = SetCut(taxonomy)
        assign = cut.initial(sets)
        groups = cut.groups((taxonomy.height, 0), sets, assign)
        cut.specialize(groups, np.array([50]), eps, spurious, rng, assign)
        labels = {cut.label(v) for v in range(2, len(cut.values))}
        seen_b += "B" in labels   # {B} has no record
        assert {cut.label(int(v)) for v in assign} <= {"A", "*"}
    expected = discrete_laplace_tail(eps, threshold)
    assert abs(seen_b / trials - expected) < 4 * math.sqrt(expected * (1 - expected) / trials)


def test_set_valued_release_learns_from_item_groups(items_config) -> None:
    table = _items_table(6000)
    train, test = split(table, 0.3, seed=0)
    result = release(train, items_config, mechanism="diffgen",
                     params={"epsilon": 1.0, "specializations": 4}, seed=5)
    assert math.isclose(result.epsilon_spent, 1.0, rel_tol=1e-9)
    assert list(result.table.columns) == ["sex", "codes", "outcome"]
    steps = result.details["set_specializations"]
    assert steps and steps[0]["node"] == "*" and steps[0]["children_kept"] >= 2
    impl = get_mechanism("diffgen")
    acc = accuracies(train, test, ["sex", "codes"], "outcome", result.table,
                     lambda t: impl.generalize(t, items_config, result.details), {"codes": "|"})
    assert acc.baseline == 1.0
    assert acc.release > acc.lower_bound + 0.2


def test_generalized_item_sets_are_true_generalizations(items_config) -> None:
    table = _items_table(3000, seed=1)
    result = release(table, items_config, mechanism="diffgen",
                     params={"epsilon": 2.0, "specializations": 4}, seed=2)
    impl = get_mechanism("diffgen")
    general = impl.generalize(table, items_config, result.details)
    taxonomy = items_config.taxonomies["codes"]
    parent = {leaf: taxonomy.level_labels[1][taxonomy.level_codes[1][i]]
              for i, leaf in enumerate(taxonomy.leaves)}
    for items, label in zip(table["codes"], general["codes"], strict=True):
        nodes = set(label.split("|"))
        for item in items.split("|"):
            assert {item, parent[item], "*"} & nodes, (items, label)
        for node in nodes:  # every node covers one of the record's items
            assert node == "*" or any(node in (i, parent[i]) for i in items.split("|"))


def test_other_mechanisms_refuse_set_valued_columns(items_config) -> None:
    with pytest.raises(ParameterError, match=r"cannot release set-valued column.*'codes'"):
        release(_items_table(50), items_config, mechanism="ipa")


def test_uncovered_item_is_named(items_config) -> None:
    table = _items_table(20)
    table.loc[7, "codes"] = "a1|zz9"
    with pytest.raises(InputValidationError, match=r"codes.*item not covered") as err:
        validate_input(table, items_config)
    assert "a1|zz9" not in str(err.value) and "data row 8" in str(err.value)  # value-free


@pytest.mark.skipif(not MIMIC.is_dir(), reason="MIMIC-III demo not beside the checkout")
def test_mimic_demo_release() -> None:
    config = find_config("mimic-demo")
    table = validate_input(admissions_table(MIMIC), config)
    assert len(table) == 129
    result = release(table, config, params={"epsilon": 1.0, "specializations": 5}, seed=4)
    assert math.isclose(result.epsilon_spent, 1.0, rel_tol=1e-9)
    assert list(result.table.columns) == [*config.dimensions, "icd9_codes", "died_in_hospital"]
    steps = {s.step: s.epsilon for s in result.budget_steps}
    # DiffGen's own budget is epsilon less the unit cut's count (a unit is declared)
    own = 1.0 - unit_cut_epsilon(1.0, config.unit_column)
    assert steps["split points / emptiness tests"] == pytest.approx(5 * own / 20)


def test_class_domain_must_be_declared(tmp_path) -> None:
    (tmp_path / "sex.csv").write_text("F;*\nM;*\n")
    config = config_from_dict({
        "name": "nodomain", "input": {"path": "x.csv"},
        "columns": {"sex": {"role": "dimension", "taxonomy": "sex.csv"},
                    "outcome": {"role": "class"}},
        "privacy": {"lifetime_epsilon": 10.0}}, tmp_path)
    table = pd.DataFrame({"sex": ["F", "M"] * 10, "outcome": ["no"] * 19 + ["rare"]})
    with pytest.raises(ParameterError, match=r"public values declared"):
        release(table, config, mechanism="diffgen", seed=1)
