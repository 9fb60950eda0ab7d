"""DiffGen on Adult (../shared/data/adult): budget, leaf partitions, release shape."""

from __future__ import annotations

import math

import numpy as np
import pytest

from medrelease.data.config import find_config
from medrelease.data.input_schema import validate_input
from medrelease.errors import ParameterError
from medrelease.mechanisms import get_mechanism
from medrelease.mechanisms.diffgen import _score, _split_scores
from medrelease.release import release
from medrelease.storage.io import read_input


@pytest.fixture(scope="module")
def adult():
    config = find_config("adult")
    return config, validate_input(read_input(config), config)


@pytest.mark.parametrize("score", ["max", "infogain"])
def test_budget_steps_sum_to_epsilon(adult, score) -> None:
    config, frame = adult
    result = release(frame.head(3000), config, mechanism="diffgen",
                     params={"epsilon": 0.8, "specializations": 6, "score": score}, seed=1)
    assert math.isclose(result.epsilon_spent, 0.8, rel_tol=1e-9)
    steps = {s.step: s.epsilon for s in result.budget_steps}
    # one numeric predictor (age): eps' = 0.8 / (2 (1 + 2*6))
    assert steps["initial split points"] == pytest.approx(0.8 / 26)
    assert steps["leaf counts"] == pytest.approx(0.4)
    assert result.guarantee.proven and result.guarantee.delta == 0
    assert list(result.table.columns) == [*config.dimensions, "salary-class"]
    assert set(result.table["salary-class"]) <= {"<=50K", ">50K"}


def test_every_leaf_partition_is_released_with_noise(adult) -> None:
    config, frame = adult
    impl = get_mechanism("diffgen")
    params = impl.parse_params({"epsilon": 50.0, "specializations": 3, "n_numeric": 1})
    table, summary = impl.release_frame(frame.head(1000), config, params,
                                        np.random.default_rng(2))
    assert summary["cells"] == summary["leaf_partitions"] * 2
    assert summary["leaf_partitions"] == math.prod(len(v) for v in summary["cut"].values())
    # With a large eps the noisy counts are close to the truth: about 1,000 rows.
    assert abs(len(table) - 1000) < 0.05 * 1000 + 4 * summary["cells"] * math.exp(-25)


def test_scores_by_hand() -> None:
    table = np.array([[30.0, 10.0], [5.0, 15.0]])  # two children x two classes
    assert _score(table, "max") == 45.0
    parent = -(35 / 60 * math.log2(35 / 60) + 25 / 60 * math.log2(25 / 60))
    child = (40 / 60) * -(0.75 * math.log2(0.75) + 0.25 * math.log2(0.25)) + \
        (20 / 60) * -(0.25 * math.log2(0.25) + 0.75 * math.log2(0.75))
    assert _score(table, "infogain") == pytest.approx(parent - child)
    per_leaf = np.array([[5.0, 0.0], [5.0, 0.0], [0.0, 5.0]])
    assert _split_scores(per_leaf, "max").tolist() == [10.0, 15.0]


def test_diffgen_needs_one_class_column(nps_config, nps_sample) -> None:
    with pytest.raises(ParameterError, match="exactly one column with role 'class'"):
        release(nps_sample.head(100), nps_config, mechanism="diffgen")


def test_every_call_draws_with_its_share_of_a_declared_step(adult, monkeypatch) -> None:
    """The privacy map drives DiffGen's noise: the exponential-mechanism calls and the leaf
    counts use the declared steps' epsilons (a step spread evenly over its rounds), whatever
    the parameters would say."""
    import medrelease.mechanisms.diffgen as diffgen

    config, frame = adult
    used: list[float] = []
    real_em, real_laplace = diffgen.exponential_mechanism, diffgen.discrete_laplace
    monkeypatch.setattr(diffgen, "exponential_mechanism",
                        lambda rng, scores, eps, *a, **k: used.append(eps) or real_em(
                            rng, scores, eps, *a, **k))
    monkeypatch.setattr(diffgen, "discrete_laplace",
                        lambda rng, eps, size: used.append(("leaves", eps)) or real_laplace(
                            rng, eps, size))
    result = release(frame.head(3000), config, mechanism="diffgen",
                     params={"epsilon": 0.8, "specializations": 4}, seed=2)
    steps = {s.step: s.epsilon for s in result.budget_steps}
    assert set(result.details["budget_steps_drawn"].values()) == {"drawn"}
    calls = [e for e in used if not isinstance(e, tuple)]
    assert set(calls) <= {steps["initial split points"] / 1, steps["specializations"] / 4,
                          steps["split points / emptiness tests"] / 4}
    assert [e for e in used if isinstance(e, tuple)] == [("leaves", steps["leaf counts"])]
