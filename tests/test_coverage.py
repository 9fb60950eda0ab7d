"""The published 95 % intervals hold about 95 % of the time (issue 35): a small-scale copy of
``benchmarks/coverage.py`` that fails when coverage falls below 90 % (aim's bounds:
``tests/test_aim_error_bars.py``)."""

from __future__ import annotations

import pytest

from medrelease.data.aggregate import aggregate
from medrelease.evidence.coverage import Table, Tally, run_histogram, run_ipa

RUNS = 25
pytestmark = pytest.mark.xdist_group("coverage")  # one worker builds the module's table


@pytest.fixture(scope="module")
def small_table(nps_config, nps_sample) -> Table:
    rows = nps_sample.head(6000)
    return Table("nps-6000", nps_config, aggregate(rows, nps_config), rows, None)


@pytest.mark.parametrize("runner", [run_ipa, run_histogram], ids=["ipa", "histogram"])
def test_stated_count_intervals_cover_the_true_counts(small_table: Table, runner) -> None:
    tally = Tally()
    for run in range(RUNS):
        tally.merge(runner(small_table, 1.0, 100 + run))
    cells = next(kind for kind in tally.stated if kind.startswith("cells"))
    assert tally.stated[cells] > 200, "too few published cells to measure coverage"
    assert tally.share(cells) >= 0.90, (cells, tally.share(cells))
    assert tally.share("value totals") >= 0.90, tally.share("value totals")
    # and not vacuous: a cell's interval is a few rows wide, not the whole range
    assert sum(tally.widths[cells]) / len(tally.widths[cells]) < 30


def test_coverage_counts_a_miss() -> None:
    """The tally is not a constant: an interval that misses is counted as a miss."""
    import numpy as np

    tally = Tally()
    tally.add("cells", np.array([True, False, True, True]))
    assert tally.share("cells") == 0.75
