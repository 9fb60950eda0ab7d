"""Baselines: full-domain k-anonymity (optimal, pruned == exhaustive) and the noisy histogram."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from medrelease.data.aggregate import aggregate, aggregate_frame
from medrelease.data.taxonomy import SUPPRESSED, from_leaf_paths, numeric_levels
from medrelease.errors import ParameterError
from medrelease.mechanisms import get_mechanism
from medrelease.mechanisms.base import ReleaseContext
from medrelease.release import release, release_from_counts


def _context(seed: int, n_rows: int) -> ReleaseContext:
    rng = np.random.default_rng(seed)
    leaves = [f"c{i}" for i in range(6)]
    cat = from_leaf_paths("cat", "categorical", leaves,
                          [[f"g{i % 2}", SUPPRESSED] for i in range(6)])
    num = numeric_levels("num", 0, 39, [{"width": 5}, {"width": 20}])
    frame = pd.DataFrame({"cat": rng.choice(leaves, n_rows),
                          "num": rng.integers(0, 40, n_rows),
                          "inf": rng.choice(["a", "b", "c"], n_rows)})
    return ReleaseContext.from_counts(
        aggregate_frame(frame, ["cat", "num"], ["inf"], (cat, num)))


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 300), st.integers(2, 12),
       st.sampled_from([0.0, 0.05, 0.2]))
def test_kanon_pruned_search_finds_the_exhaustive_optimum(seed, n_rows, k, max_suppression):
    context = _context(seed, n_rows)
    kanon = get_mechanism("kanon")
    params = kanon.parse_params({"k": k, "max_suppression": max_suppression})
    try:
        exhaustive, all_nodes = kanon.optimal_node(context, params, exhaustive=True)
    except ParameterError:
        with pytest.raises(ParameterError):
            kanon.optimal_node(context, params)
        return
    pruned, evaluated = kanon.optimal_node(context, params)
    assert pruned == exhaustive
    assert len(evaluated) <= len(all_nodes)


def test_kanon_release_is_k_anonymous(nps_config, nps_sample) -> None:
    result = release(nps_sample, nps_config, mechanism="kanon",
                     params={"k": 10, "max_suppression": 0.05})
    sizes = result.table[list(nps_config.dimensions)].astype(str).value_counts()
    assert sizes.min() >= 10
    assert result.guarantee.epsilon is None and not result.guarantee.proven
    assert "no differential privacy" in result.guarantee.label
    assert result.budget_steps == []
    assert len(result.table) >= 0.95 * len(nps_sample)
    assert set(result.table["diagnosis"]) <= set(nps_sample["diagnosis"])


def test_histogram_includes_empty_cells_and_is_dp_with_public_domain(nps_config) -> None:
    table = pd.DataFrame({"patient_id": [1, 2], "age": [30, 31], "sex": ["F", "F"],
                          "length_of_stay": [3, 3], "surgery": ["N", "N"], "region": [11, 11],
                          "diagnosis": ["A000", "A001"]})
    node = {"age": 3, "sex": 1, "length_of_stay": 3, "surgery": 1, "region": 3}
    counts = aggregate(table, nps_config)
    assert counts.public_domain and counts.n_inf == 2500
    context = ReleaseContext.from_counts(counts)
    hist = get_mechanism("histogram")
    params = hist.parse_params({"epsilon": 1.0, "node": node, "public_domain": True})
    cells = hist.materialize(context, context.lattice.from_finest(tuple(node.values())),
                             np.random.SeedSequence(1), params)
    # 2,500 diagnosis cells at the top node: two hold a row, the rest are empty but noised.
    empty_released = cells.released_counts[cells.true_counts == 0]
    assert (cells.true_counts > 0).sum() == 2
    assert empty_released.size > 100 and empty_released.sum() > 100
    result = release_from_counts(counts, "histogram", {"epsilon": 1.0, "node": node}, seed=2)
    assert result.guarantee.proven and result.epsilon_spent == 1.0
    assert set(result.table["age"].astype(str)) == {"*"}
    assert set(result.table["diagnosis"]) - {"A000", "A001"}  # noise rows from empty cells


def test_histogram_refuses_domains_over_the_cell_limit(nps_config, nps_sample) -> None:
    node = {"age": 0, "sex": 0, "length_of_stay": 0, "surgery": 0, "region": 0}
    with pytest.raises(ParameterError, match=r"cells .*over the cell limit 5,000,000"):
        release(nps_sample.head(100), nps_config, mechanism="histogram", params={"node": node})
    with pytest.raises(ParameterError, match="needs a level for each"):
        release(nps_sample.head(100), nps_config, mechanism="histogram",
                params={"node": {"age": 1}})


def test_histogram_without_public_domain_says_so(paper_config) -> None:
    from tests.conftest import PAPER_TABLE_5

    result = release(PAPER_TABLE_5, paper_config, mechanism="histogram", seed=3)
    assert not result.guarantee.proven
    assert "not DP" in result.guarantee.label


@pytest.mark.parametrize("variant", ["strict", "relaxed"])
def test_mondrian_partitions_are_k_anonymous(nps_config, nps_sample, variant) -> None:
    result = release(nps_sample.head(4000), nps_config, mechanism="mondrian",
                     params={"k": 7, "variant": variant}, seed=1)
    sizes = result.table[list(nps_config.dimensions)].astype(str).value_counts()
    assert sizes.min() >= 7
    assert len(result.table) == 4000
    assert sorted(result.table["diagnosis"]) == sorted(nps_sample.head(4000)["diagnosis"])
    assert "no differential privacy" in result.guarantee.label
    assert 0 < result.released_il.ncp < 1


def test_mondrian_known_answer(tmp_path) -> None:
    (tmp_path / "age.yaml").write_text("domain: {min: 1, max: 8}\nlevels: [{width: 4}]\n")
    (tmp_path / "d.yaml").write_text(
        "name: tiny\ninput: {path: x.csv}\ncolumns:\n"
        "  age: {role: dimension, type: integer, taxonomy: age.yaml}\n"
        "  dx: {role: informative}\nprivacy: {lifetime_epsilon: 1}\n")
    from medrelease.data.config import load_config

    table = pd.DataFrame({"age": [1, 2, 3, 4, 5, 6, 7, 8], "dx": list("abcdefgh")})
    result = release(table, load_config(tmp_path / "d.yaml"), mechanism="mondrian",
                     params={"k": 2}, seed=0)
    got = result.table.sort_values("dx")["age"].tolist()
    assert got == ["[1-2]", "[1-2]", "[3-4]", "[3-4]", "[5-6]", "[5-6]", "[7-8]", "[7-8]"]


def test_pseudonymization_is_keyed_deterministic_and_normalized(tmp_path) -> None:
    from medrelease.mechanisms.pseudonymize import pseudonymize_frame

    frame = pd.DataFrame({"age": ["39", "50", "39", "28"], "sex": ["M", "F", "M", "F"],
                          "salary": ["<=50K", ">50K", "<=50K", "<=50K"]})
    for method in ("aes", "hmac"):
        one = pseudonymize_frame(frame, ["age", "sex"], ["salary"], b"key-one", method)
        again = pseudonymize_frame(frame, ["age", "sex"], ["salary"], b"key-one", method)
        other = pseudonymize_frame(frame, ["age", "sex"], ["salary"], b"key-two", method)
        pd.testing.assert_frame_equal(one, again)
        assert not one["age"].equals(other["age"])
        assert one["age"].between(0, 1).all() and {one["age"].min(), one["age"].max()} == {0, 1}
        assert one.loc[0, "age"] == one.loc[2, "age"] != one.loc[1, "age"]  # equal stays equal
        assert one["salary"].tolist() == frame["salary"].tolist()  # class label kept
    with pytest.raises(ParameterError, match="empty"):
        pseudonymize_frame(frame, ["age"], [], b"", "aes")
