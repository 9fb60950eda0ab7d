"""Risk measures by hand."""

from __future__ import annotations

import pandas as pd
import pytest

from medrelease.evidence.risk import risk_report


def test_risk_by_hand() -> None:
    table = pd.DataFrame({"age": ["[10-19]"] * 3 + ["[20-29]"] * 2 + ["*"],
                          "sex": ["M"] * 3 + ["F"] * 2 + ["*"], "dx": list("abcdef")})
    risk = risk_report(table, ["age", "sex"])
    assert risk["classes"] == 3 and risk["smallest_class"] == 1 == risk["k_achieved"]
    assert risk["unique_row_share"] == pytest.approx(1 / 6)
    assert risk["prosecutor_risk_max"] == 1.0
    assert risk["prosecutor_risk_mean"] == pytest.approx(3 / 6)  # (3*1/3 + 2*1/2 + 1)/6
    assert risk_report(table.iloc[:0], ["age"])["rows"] == 0
