"""The published intervals hold as often as they say (issues 35 and 54): a small-scale copy of
``benchmarks/coverage.py`` over the rows of the ``intervals.csv`` each release would publish,
failing when a kind's coverage falls below 90 % (a family's simultaneous coverage too)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from medrelease.data.aggregate import aggregate
from medrelease.data.config import load_config
from medrelease.evidence.coverage import (
    Table,
    Tally,
    run_aim,
    run_histogram,
    run_ipa,
    tally_rows,
    write_planted_dataset,
)

RUNS = 20
pytestmark = pytest.mark.xdist_group("coverage")  # one worker builds the module's tables


@pytest.fixture(scope="module")
def small_table(nps_config, nps_sample) -> Table:
    rows = nps_sample.head(6000)
    return Table("nps-6000", nps_config, aggregate(rows, nps_config), rows, None)


@pytest.fixture(scope="module")
def planted_table(tmp_path_factory) -> Table:
    config = load_config(write_planted_dataset(tmp_path_factory.mktemp("planted"),
                                               common=100))
    frame = pd.read_csv(config.input_path, dtype=str)
    return Table("planted", config, aggregate(frame, config), frame, None)


def _runs(runner, table: Table, runs: int = RUNS) -> Tally:
    tally = Tally()
    for run in range(runs):
        tally.merge(runner(table, 1.0, 100 + run))
    return tally


@pytest.mark.slow
@pytest.mark.parametrize("runner", [run_ipa, run_histogram], ids=["ipa", "histogram"])
def test_count_and_total_rows_cover_their_truth(small_table: Table, runner) -> None:
    tally = _runs(runner, small_table)
    assert tally.stated["count"] > 200, "too few published cells to measure coverage"
    for kind in ("count", "total", "total, simultaneous"):
        assert tally.share(kind) >= 0.90, (kind, tally.share(kind))
    # and not vacuous: a cell's interval is a few rows wide, not the whole range
    assert np.mean(tally.widths["count"]) < 30


def test_the_planted_total_covers_where_selection_biases_the_release(planted_table) -> None:
    """Every class holds the planted value at ipa's threshold: the published cells' noise is
    biased upwards, and the value's total row still covers its truth."""
    tally = _runs(run_ipa, planted_table)
    assert tally.share("total") >= 0.90 and tally.share("count") >= 0.90
    assert tally.stated["total"] == 2 * RUNS


@pytest.mark.slow
def test_aim_marginal_rows_cover_their_truth(small_table: Table) -> None:
    tally = _runs(run_aim, small_table, 4)
    assert tally.stated["marginal"] > 2000
    assert tally.share("marginal") >= 0.90, tally.share("marginal")
    assert tally.share("marginal, simultaneous") >= 0.75  # 4 families: one miss allowed


def test_coverage_counts_a_miss() -> None:
    """The tally is not a constant: an interval that misses is counted as a miss, and a
    family with one miss is a simultaneous miss."""
    rows = pd.DataFrame({"what": ["count", "count", "total", "total"], "columns": ["a"] * 4,
                         "cell": list("wxyz"), "released": [5, 5, 9, 9],
                         "lower": [3, 3, 8, 8], "upper": [7, 7, 10, 10],
                         "level": [0.95] * 4, "holds": ["per estimate"] * 2
                         + ["simultaneous"] * 2})
    tally = tally_rows(rows, np.array([4, 9, 9, 11]))
    assert tally.share("count") == 0.5
    assert tally.share("total, simultaneous") == 0.0 and tally.stated["total, simultaneous"] == 1
