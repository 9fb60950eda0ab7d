"""Release invariants on random small tables and taxonomies (hypothesis)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from medrelease.data.aggregate import aggregate_frame
from medrelease.data.taxonomy import SUPPRESSED, from_leaf_paths, numeric_levels
from medrelease.mechanisms import MECHANISMS, get_mechanism, uses_lattice
from medrelease.release import release_from_counts


@st.composite
def small_releases(draw):
    n_values = draw(st.integers(1, 8))
    n_groups = draw(st.integers(1, n_values))
    leaves = [f"c{i}" for i in range(n_values)]
    groups = [f"g{draw(st.integers(0, n_groups - 1))}" for _ in leaves]
    categorical = from_leaf_paths("cat", "categorical", leaves, [[g, SUPPRESSED] for g in groups])
    low = draw(st.integers(0, 50))
    high = low + draw(st.integers(0, 40))
    width = draw(st.integers(1, 20))
    numeric = numeric_levels("num", low, high, [{"width": width}])
    n_rows = draw(st.integers(1, 80))
    n_inf = draw(st.integers(1, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    frame = pd.DataFrame(
        {
            "cat": rng.choice(leaves, n_rows),
            "num": rng.integers(low, high + 1, n_rows),
            "inf": rng.choice([f"d{i}" for i in range(n_inf)], n_rows),
        }
    )
    counts = aggregate_frame(frame, ["cat", "num"], ["inf"], (categorical, numeric))
    mechanism = draw(st.sampled_from(sorted(m for m in MECHANISMS if uses_lattice(m))))
    epsilon = draw(st.sampled_from([0.1, 1.0, 5.0]))
    seed = draw(st.integers(0, 10_000))
    return frame, counts, mechanism, epsilon, seed


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_releases())
@pytest.mark.slow
def test_release_invariants(case) -> None:
    frame, counts, mechanism, epsilon, seed = case
    params = {"k": 3, "max_suppression": 1.0} if mechanism == "kanon" else {"epsilon": epsilon}
    result = release_from_counts(counts, mechanism, params, seed=seed, batch_size=3)

    # IL parts of every candidate and of the release lie in [0, 1].
    for part in ("ncp", "emd", "rate"):
        assert result.candidates[part].between(0, 1).all(), part
        assert 0 <= getattr(result.released_il, part) <= 1
    assert math.isclose(result.candidates["selection_probability"].sum(), 1.0)

    # Every released dimension value sits at the chosen node's level or is '*'.
    for i, column in enumerate(counts.dimensions):
        taxonomy = counts.taxonomies[i]
        levels = {result.node[column]} | {rung[column] for rung in
                                           result.details.get("ladder", [])}  # ipa's ladder
        allowed = {label for level in levels for label in taxonomy.level_labels[level]}
        allowed |= {SUPPRESSED}
        assert set(result.table[column].astype(str)) <= allowed
        assert result.node[column] == result.candidates.loc[result.node_index,
                                                             f"level_{column}"]
    # Informative values are the input's, raw; undeclared columns are absent.
    assert set(result.table["inf"]) <= set(frame["inf"])
    assert list(result.table.columns) == ["cat", "num", "inf"]

    # The budget steps add up to the stated guarantee (syntactic models spend nothing).
    if result.guarantee.epsilon is None:
        assert result.budget_steps == []
    else:
        assert math.isclose(result.epsilon_spent, epsilon, rel_tol=1e-9)
        assert math.isclose(math.fsum(s.delta for s in result.budget_steps),
                            result.guarantee.delta, rel_tol=1e-9)

    if mechanism == "ipa":
        impl = get_mechanism("ipa")
        tau_cells, tau_sup = impl.thresholds(impl.parse_params(result.params))
        if len(result.table):
            sizes = result.table.astype(str).value_counts()
            assert sizes.min() >= min(tau_cells, tau_sup)
    elif mechanism == "ipa-paper":
        assert len(result.table) >= len(frame)  # the paper only ever adds rows
    elif mechanism == "kanon" and len(result.table):
        sizes = result.table[["cat", "num"]].astype(str).value_counts()
        assert sizes.min() >= 3


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_releases(), st.integers(2, 6), st.sampled_from(["strict", "relaxed"]))
def test_mondrian_invariants(case, k, variant) -> None:
    frame, counts, _, _, seed = case
    from medrelease.mechanisms.mondrian import Mondrian, MondrianParams

    if counts.n_rows < k:
        return
    table, parts = Mondrian().release_counts(counts, MondrianParams(k=k, variant=variant),
                                             np.random.default_rng(seed))
    assert len(table) == len(frame)
    assert table[["cat", "num"]].astype(str).value_counts().min() >= k
    assert sorted(table["inf"]) == sorted(frame["inf"])
    assert 0 <= parts.ncp <= 1
