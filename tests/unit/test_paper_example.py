"""The IPA paper's worked example: Table 5 -> Table 6 (generalize) -> Table 7 (suppress, t = 2)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from medrelease.data.aggregate import aggregate
from medrelease.evidence.metrics import information_loss
from medrelease.mechanisms import get_mechanism
from medrelease.mechanisms.base import ReleaseContext
from medrelease.release import cells_to_table, release

from ..conftest import PAPER_TABLE_5

NODE = (1, 0, 1)  # Age 10-year, Gender raw, Zipcode 10,000-wide

TABLE_6 = pd.DataFrame(
    {
        "Age": ["[10-19]"] * 3 + ["[20-29]"] * 3 + ["[60-69]"],
        "Gender": ["M"] * 3 + ["F"] * 3 + ["M"],
        "Zipcode": ["[20000-29999]"] * 3 + ["[30000-39999]"] * 3 + ["[80000-89999]"],
        "Disease": ["Gastritis", "Pneumonia", "Pneumonia", "Anemia", "Anemia", "Diabetes",
                    "Stroke"],
    }
)
TABLE_7 = TABLE_6.copy()
TABLE_7.loc[6, ["Age", "Gender", "Zipcode"]] = "*"


def _sorted(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.astype(str)
    return frame.sort_values(list(frame.columns)).reset_index(drop=True)


def test_table_5_generalizes_to_table_6(paper_config) -> None:
    context = ReleaseContext.from_counts(aggregate(PAPER_TABLE_5, paper_config))
    table = context.lattice.from_finest(NODE)
    codes = context.lattice.class_codes_from_keys(table.class_keys)
    rows = []
    for cell in range(table.cell_keys.size):
        labels = [
            context.lattice.taxonomies[i].labels(NODE[i])[codes[cell, i]] for i in range(3)
        ]
        disease = context.counts.informative["Disease"].iloc[table.inf_codes[cell]]
        rows += [[*labels, disease]] * int(table.counts[cell])
    got = pd.DataFrame(rows, columns=TABLE_6.columns)
    pd.testing.assert_frame_equal(_sorted(got), _sorted(TABLE_6))


def test_single_row_class_is_suppressed_with_t_2(paper_config) -> None:
    """With t = 2 the class <[60-69], M, [80000-89999]> (one row) becomes (*, *, *, Stroke).

    The threshold is noisy; eps_suppression = eps_insertion = 200 make the noise negligible
    (P(wrong decision) < e^-200), so the outcome is the paper's Table 7 exactly.
    """
    mechanism = get_mechanism("ipa-paper")
    params = mechanism.parse_params(
        {"epsilon": 800, "eps_suppression": 200, "eps_insertion": 200, "eps_value": 200,
         "eps_candidates": 200, "suppression_threshold": 2},
    )
    context = ReleaseContext.from_counts(aggregate(PAPER_TABLE_5, paper_config))
    table = context.lattice.from_finest(NODE)
    seeds = np.random.SeedSequence(5).spawn(2)
    cells = mechanism.materialize(context, table, seeds[0], params)
    released = cells_to_table(context, NODE, cells, seeds[1])
    pd.testing.assert_frame_equal(_sorted(released), _sorted(TABLE_7))
    # NCP by hand: Age [10-19] covers 10 of 100 ages, Gender is raw, Zipcode [20000-29999]
    # covers 10,000 of 90,000 codes; six such rows and one suppressed row (NCP 1).
    row_ncp = (10 / 100 + 0 + 10_000 / 90_000) / 3
    parts = information_loss(cells)
    assert parts.ncp == pytest.approx((6 * row_ncp + 1) / 7)
    assert parts.emd == pytest.approx(0.0)
    assert parts.rate == pytest.approx(0.0)


def test_release_api_on_the_example(paper_config) -> None:
    result = release(PAPER_TABLE_5, paper_config, mechanism="ipa-paper", seed=11)
    assert set(result.table.columns) == {"Age", "Gender", "Zipcode", "Disease"}
    assert not result.for_publication and "NOT FOR PUBLICATION" in result.seed_policy
    assert len(result.candidates) == 4 * 2 * 3  # age: raw/10/50/*, gender, zipcode
    # ipa-paper only adds rows and keeps every real informative value.
    assert result.released_rows >= len(PAPER_TABLE_5)
    assert set(PAPER_TABLE_5["Disease"]) <= set(result.table["Disease"])
