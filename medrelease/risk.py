"""Re-identification risk of a released table on its dimension (quasi-identifier) columns.

For every mechanism, DP or not: the share of rows that are unique on the released dimensions,
the smallest class (the k achieved), and prosecutor risk — an attacker who knows a target is in
the table and knows their quasi-identifiers picks one of the matching rows, so the risk for a
row is 1 / (size of its class): the maximum, and the mean over rows.
"""

from __future__ import annotations

import pandas as pd


def risk_report(table: pd.DataFrame, dimensions: list[str]) -> dict[str, float | int]:
    columns = [c for c in dimensions if c in table.columns]
    if table.empty or not columns:
        return {"rows": len(table), "classes": 0, "unique_row_share": 0.0,
                "smallest_class": 0, "k_achieved": 0, "prosecutor_risk_max": 0.0,
                "prosecutor_risk_mean": 0.0}
    sizes = table[columns].astype(str).value_counts(sort=False)
    rows = len(table)
    smallest = int(sizes.min())
    return {
        "rows": rows,
        "classes": len(sizes),
        "unique_row_share": float((sizes == 1).sum() / rows),
        "smallest_class": smallest,
        "k_achieved": smallest,
        "prosecutor_risk_max": 1.0 / smallest,
        "prosecutor_risk_mean": float(len(sizes) / rows),
    }
