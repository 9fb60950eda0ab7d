"""Re-identification risk of a released table on its dimension (quasi-identifier) columns.

For every mechanism, DP or not: the share of rows that are unique on the released dimensions,
the smallest class (the k achieved), and prosecutor risk — an attacker who knows a target is in
the table and knows their quasi-identifiers picks one of the matching rows, so the risk for a
row is 1 / (size of its class): the maximum, and the mean over rows.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from medrelease.data.aggregate import class_sizes
from medrelease.evidence.text_codes import text_codes


def risk_report(table: pd.DataFrame, dimensions: list[str],
                weights: np.ndarray | None = None) -> dict[str, float | int]:
    """Risk figures of a table of rows (``weights``: the rows each row stands for)."""
    columns = [c for c in dimensions if c in table.columns]
    rows = len(table) if weights is None else int(np.sum(weights))
    if table.empty or not columns:
        return _no_classes(rows)
    return risk_of_sizes(class_sizes(table, columns, weights), rows)


def risk_of_cells(cells: pd.DataFrame, dimensions: list[str], rows_column: str
                  ) -> dict[str, float | int]:
    """The same figures from distinct rows and their counts (``rows_column``): no row expanded."""
    columns = [c for c in dimensions if c in cells.columns]
    rows = int(cells[rows_column].sum()) if len(cells) else 0
    if rows == 0 or not columns:
        return _no_classes(rows)
    sizes = cells.groupby(columns, observed=True, dropna=False, sort=False)[rows_column].sum()
    return risk_of_sizes(sizes[sizes > 0].to_numpy(), rows)


def _no_classes(rows: int) -> dict[str, float | int]:
    return {"rows": rows, "classes": 0, "unique_row_share": 0.0, "smallest_class": 0,
            "k_achieved": 0, "prosecutor_risk_max": 0.0, "prosecutor_risk_mean": 0.0}


def risk_of_sizes(sizes: np.ndarray, rows: int) -> dict[str, float | int]:
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


def frequency_attack(raw: pd.DataFrame, columns: list[str]) -> dict[str, float]:
    """Expected share re-identified by matching ciphertexts to plaintexts by frequency rank.

    A keyed deterministic mapping keeps every value's frequency, so an attacker who knows the
    plaintext frequencies (census tables, an earlier extract) decodes a value exactly when its
    frequency is unique in its column, and with probability 1/g when g values share it. A record
    is re-identified when all its quasi-identifier values are decoded. Computed from the input
    alone, which is exact for any frequency-preserving bijection (pseudonymization is one).
    """
    if raw.empty or not columns:
        return {"records_reidentified_share": 0.0}
    record_p = np.ones(len(raw))
    out: dict[str, float] = {}
    for column in columns:
        values = raw[column].astype(str)
        counts = values.value_counts()
        ties = values.map(counts).map(counts.value_counts())   # values sharing that frequency
        record_p *= (1.0 / ties).to_numpy(dtype=float)
        # one value per tie group is decoded in expectation
        out[f"values_decoded_share:{column}"] = float(counts.nunique() / max(len(counts), 1))
    out["records_reidentified_share"] = float(record_p.mean())
    return out


def synthetic_match_risk(frame: pd.DataFrame, weights: np.ndarray | None,
                         released: pd.DataFrame, columns: list[str]) -> dict[str, float | int]:
    """Risk figures that fit synthetic rows (EVALUATION.md): no released row is a patient, so
    class sizes and prosecutor risk say nothing; what can go wrong is a synthetic row that
    reproduces a real record that is unique in the input.

    ``unique_match_share``: released rows identical, on every released column, to an input
    row that no other input row shares. ``baseline_share``: the same share expected of rows
    drawn independently from the input's own 1-way marginals (a release that knows no
    combination at all): sum over the input's unique records u of prod_i p_i(u_i). A synthetic
    release near the baseline reproduces unique records no more often than chance does.
    """
    columns = [c for c in columns if c in frame.columns and c in released.columns]
    rows = len(released)
    if not columns or rows == 0 or frame.empty:
        return {"released_rows": rows, "unique_input_records": 0, "unique_match_share": 0.0,
                "baseline_share": 0.0}
    w = (np.ones(len(frame), dtype=np.int64) if weights is None
         else np.asarray(weights, dtype=np.int64))
    total = float(w.sum())
    # Each row's combination as one integer on both sides (a column's texts coded alike on
    # both), from codes: no row's text is formed (5 s at 1,361,000 rows as text group-bys).
    input_keys = np.zeros(len(frame), dtype=np.int64)
    released_keys = np.zeros(rows, dtype=np.int64)
    span = 1
    input_codes: list[np.ndarray] = []
    for column in columns:
        codes_in, texts_in = text_codes(frame[column])
        codes_out, texts_out = text_codes(released[column])
        shared, distinct = pd.factorize(np.concatenate([texts_in, texts_out]))
        size = len(distinct) + 1  # the last code: a missing value
        in_shared = np.append(shared[:len(texts_in)], size - 1)[codes_in]
        out_shared = np.append(shared[len(texts_in):], size - 1)[codes_out]
        input_codes.append(in_shared)
        if span * size >= 2**62:  # renumber the combinations seen so far densely
            dense, seen = pd.factorize(np.concatenate([input_keys, released_keys]))
            input_keys, released_keys = dense[:len(frame)], dense[len(frame):]
            span = len(seen)
        input_keys = input_keys * size + in_shared
        released_keys = released_keys * size + out_shared
        span *= size
    key_of_row, input_combinations = pd.factorize(input_keys)
    per_key = np.bincount(key_of_row, weights=w, minlength=len(input_combinations))
    unique = per_key == 1
    found = pd.Index(input_combinations).get_indexer(released_keys)  # -1: not in the input
    share = float(np.append(unique, False)[found].mean())
    # the input's unique records (one input row each) and their 1-way probabilities
    single = np.flatnonzero(unique[key_of_row] & (w == 1))
    probability = np.ones(single.size)
    for codes in input_codes:
        p = np.bincount(codes, weights=w) / total
        probability *= p[codes[single]]
    return {"released_rows": rows, "unique_input_records": int(unique.sum()),
            "unique_match_share": share, "baseline_share": float(probability.sum())}
