"""The sound ipa's selection score U: sensitivity one weight unit, monotone, on neighbours.

U_g = sum over cells of w(E) * max(0, n_c - tau + 1). For a table D and D + x, at every node
g: 0 <= U_g(D + x) - U_g(D) <= w(class of x at g) <= 2^16. Checked on random tables, on rows
that open a new cell, and on cells sitting at tau - 2, tau - 1, tau and tau + 1 rows.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from medrelease.data.aggregate import aggregate
from medrelease.data.config import DatasetConfig
from medrelease.mechanisms.base import ReleaseContext
from medrelease.mechanisms.ipa import IPA, WEIGHT_SCALE, class_weights, selection_score
from medrelease.plan import PublicFacts
from medrelease.release import plan_release, release_from_counts

TAU = 4  # the cells' threshold the score is computed with (any tau >= 2)


def _table(rng: np.random.Generator, n: int) -> pd.DataFrame:
    return pd.DataFrame({
        "Age": rng.integers(0, 100, n), "Gender": rng.choice(["M", "F"], n),
        "Zipcode": rng.choice([10001, 23512, 24231, 31891, 80061, 99999], n),
        "Disease": rng.choice(["Flu", "Anemia", "Stroke", "Gastritis"], n, p=[.5, .3, .15, .05]),
    })


def _scores(table: pd.DataFrame, config: DatasetConfig) -> dict[tuple, int]:
    context = ReleaseContext.from_counts(aggregate(table, config))
    return {t.node: selection_score(context, t, TAU)
            for t in context.lattice.iter_tables(context.lattice.dfs_order())}


def _weight_of_row(table: pd.DataFrame, row: pd.DataFrame, config: DatasetConfig) -> dict:
    """w(class of the row) at every node (the bound on that node's change)."""
    context = ReleaseContext.from_counts(aggregate(pd.concat([table, row]), config))
    single = ReleaseContext.from_counts(aggregate(row, config))
    out = {}
    for t in single.lattice.iter_tables(single.lattice.dfs_order()):
        out[t.node] = int(class_weights(context, t.node, t.class_keys)[0])
    return out


def _check_neighbours(table: pd.DataFrame, row: pd.DataFrame, config: DatasetConfig) -> None:
    without = _scores(table, config)
    with_row = _scores(pd.concat([table, row], ignore_index=True), config)
    weights = _weight_of_row(table, row, config)
    assert without.keys() == with_row.keys()
    for node, before in without.items():
        change = with_row[node] - before
        assert 0 <= change <= weights[node] <= WEIGHT_SCALE, (node, change, weights[node])


@pytest.mark.parametrize("seed", range(12))
def test_adding_or_removing_a_row_moves_every_score_by_at_most_one_weight(paper_config,
                                                                         seed: int) -> None:
    rng = np.random.default_rng(seed)
    table = _table(rng, int(rng.integers(5, 120)))
    if seed % 3 == 0:  # a row that opens a brand-new cell at the finest node
        row = pd.DataFrame({"Age": [3], "Gender": ["F"], "Zipcode": [99999],
                            "Disease": ["Rare-" + str(seed)]})
    elif seed % 3 == 1:  # a copy of an existing row (its cells grow)
        row = table.sample(1, random_state=seed)
    else:  # removing a row = adding it to the smaller table
        row = table.iloc[[0]]
        table = table.iloc[1:]
    _check_neighbours(table.reset_index(drop=True), row.reset_index(drop=True), paper_config)


@pytest.mark.parametrize("size", [TAU - 2, TAU - 1, TAU, TAU + 1])
def test_a_cell_at_the_threshold_changes_by_its_weight_or_nothing(paper_config, size: int) -> None:
    row = pd.DataFrame({"Age": [40], "Gender": ["M"], "Zipcode": [23512], "Disease": ["Flu"]})
    other = _table(np.random.default_rng(size), 30)
    other = other[other["Age"] != 40]  # the row's cell holds exactly ``size`` rows
    table = pd.concat([row] * size + [other], ignore_index=True)
    context = ReleaseContext.from_counts(aggregate(table, paper_config))
    bottom = context.lattice.bottom()
    before = selection_score(context, bottom, TAU)
    after_context = ReleaseContext.from_counts(aggregate(pd.concat([table, row]), paper_config))
    after = selection_score(after_context, after_context.lattice.bottom(), TAU)
    weight = _weight_of_row(table, row, paper_config)[bottom.node]
    grows = size + 1 >= TAU  # f(n) = max(0, n - tau + 1) grows only from n = tau - 1 on
    assert after - before == (weight if grows else 0)
    _check_neighbours(table, row, paper_config)


def test_the_selection_is_monotone_with_one_weight_unit(paper_config) -> None:
    plan = plan_release("ipa", {"epsilon": 1.0}, 1, seed=1)
    scores, sensitivity, monotone = IPA().selection_utility([], plan.params)
    assert sensitivity == WEIGHT_SCALE and monotone and scores.size == 0


def test_the_sample_chooses_the_top_scored_node_almost_surely(nps_config, nps_sample) -> None:
    counts = aggregate(nps_sample, nps_config)
    result = release_from_counts(counts, "ipa", {"epsilon": 1.0}, seed=4,
                                 facts=PublicFacts.of(nps_config))
    candidates = result.candidates
    top = candidates.loc[candidates["score"].idxmax()]
    assert top["selection_probability"] > 0.99
    assert result.node_index == int(top["index"])
    assert candidates["selection_probability"].max() == top["selection_probability"]


@pytest.mark.slow
@pytest.mark.parametrize("tau", [2, 25, 400])
def test_the_fast_node_summary_equals_the_noise_free_release_summarized(nps_config, nps_sample,
                                                                       tau: int) -> None:
    """score_node's summary, computed from the roll-up alone, is the summary of the noise-free
    release built cell by cell, at every node of the sample's lattice."""
    from medrelease.mechanisms.base import summarize
    from medrelease.mechanisms.ipa import _noise_free, noise_free_summary

    context = ReleaseContext.from_counts(aggregate(nps_sample, nps_config))
    for table in context.lattice.iter_tables(context.lattice.dfs_order()):
        fast = noise_free_summary(context, table, tau)
        slow = summarize(context.lattice.index(table.node), table.node,
                         _noise_free(context, table, tau))
        assert fast.score == selection_score(context, table, tau)
        for name in ("index", "node", "height", "classes", "suppressed_classes",
                     "suppressed_rows", "noise_rows", "released_rows", "feasible"):
            assert getattr(fast, name) == getattr(slow, name), (table.node, name)
        for name in ("ncp", "emd", "rate", "il"):
            assert getattr(fast, name) == pytest.approx(getattr(slow, name), abs=1e-12)
