"""The evaluation counted on per-column codes gives the numbers the row-wise text version gave.

``accuracy.py`` (the informative column's counts, pooled rows and rates) and
``risk.synthetic_match_risk`` once formed every row's text (``astype(str)``) and grouped it:
18 s at 1,361,000 rows. They now count on codes (``text_codes``). The replaced functions are
kept below as the reference; on the NPS sample against releases of every kind (raw values as
text, integers, categories; generalized labels and '*', whose spreads are fractions) every
number is the same to the last bit, not approximately. The workload yardstick's narrower
marginals, now summed from wider ones, equal each marginal measured on its own.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from medrelease.data.aggregate import aggregate
from medrelease.data.taxonomy import SUPPRESSED
from medrelease.evidence import accuracy
from medrelease.evidence.accuracy import RATE_MIN_ROWS, RATE_VALUES_MAX, RateRow, rate_level
from medrelease.evidence.evaluation import InputRows
from medrelease.evidence.risk import synthetic_match_risk
from medrelease.evidence.text_codes import MISSING, text_codes
from medrelease.evidence.workload import Yardstick
from tests.unit.test_workload import nps_releases

# -- the replaced row-wise text version (reference) -------------------------------------------


def reference_value_counts(values: pd.Series, weights: np.ndarray | None) -> pd.Series:
    text = values.astype(str).to_numpy()
    series = pd.Series(np.ones(len(text), dtype=np.int64) if weights is None
                       else np.asarray(weights, dtype=np.int64), index=text)
    return series.groupby(level=0, sort=False).sum()


def reference_informative(frame, weights, released, config):
    column = config.informative[0]
    before = reference_value_counts(frame[column], weights)
    after = reference_value_counts(released[column], None)
    dims = [d for d in config.dimensions if d in released.columns]
    suppressed = (released[dims].astype(str).to_numpy() == SUPPRESSED).all(axis=1)
    pooled = reference_value_counts(released.loc[suppressed, column], None)
    values = sorted(set(before.index) | set(after.index),
                    key=lambda v: (-int(before.get(v, 0)), -int(after.get(v, 0)), v))
    counts = [(v, int(before.get(v, 0)), int(after.get(v, 0)), int(pooled.get(v, 0)))
              for v in values]
    shown = [v for v, n, _, _ in counts if n][:RATE_VALUES_MAX]
    rows = []
    w = np.ones(len(frame)) if weights is None else np.asarray(weights, dtype=np.float64)
    inf_in = frame[column].astype(str).to_numpy()
    inf_out = released[column].astype(str).to_numpy()
    for dim in dims:
        taxonomy = config.taxonomies[dim]
        level = rate_level(taxonomy)
        groups = taxonomy.level_labels[level]
        group_in = taxonomy.level_codes[level][taxonomy.encode(frame[dim].astype(str))]
        joint_in = np.zeros((len(groups), len(shown)))
        for j, value in enumerate(shown):
            hit = inf_in == value
            joint_in[:, j] = np.bincount(group_in[hit], weights=w[hit], minlength=len(groups))
        spread = {}
        for label in pd.unique(released[dim].astype(str)):
            mask = taxonomy.leaf_mask(str(label))
            spread[label] = (np.bincount(taxonomy.level_codes[level][mask],
                                         minlength=len(groups)) / mask.sum() if mask.sum()
                             else np.zeros(len(groups)))
        pairs = pd.DataFrame({"label": released[dim].astype(str).to_numpy(), "value": inf_out})
        pairs = pairs[pairs["value"].isin(shown)]
        joint_out = np.zeros((len(groups), len(shown)))
        for (label, value), n in pairs.groupby(["label", "value"], sort=False).size().items():
            joint_out[:, shown.index(value)] += n * spread[label]
        rows_out = np.zeros(len(groups))
        for label, n in released[dim].astype(str).value_counts(sort=False).items():
            rows_out += n * spread[label]
        rows_in = np.bincount(group_in, weights=w, minlength=len(groups))
        for g, label in enumerate(groups):
            if rows_in[g] < RATE_MIN_ROWS:
                continue
            for j, value in enumerate(shown):
                rate_out = joint_out[g, j] / rows_out[g] if rows_out[g] > 0 else float("nan")
                rows.append(RateRow(dim, str(label), value, float(joint_in[g, j] / rows_in[g]),
                                    float(rate_out), int(rows_in[g])))
    rows.sort(key=lambda r: -abs(r.difference) if math.isfinite(r.difference) else -2.0)
    return counts, rows


def reference_match_risk(frame, weights, released, columns):
    w = (np.ones(len(frame), dtype=np.int64) if weights is None
         else np.asarray(weights, dtype=np.int64))
    both = pd.concat([frame[columns].astype(str), released[columns].astype(str)],
                     ignore_index=True)
    keys = both.groupby(columns, sort=False, observed=True).ngroup().to_numpy()
    input_keys, released_keys = keys[:len(frame)], keys[len(frame):]
    per_key = np.bincount(input_keys, weights=w, minlength=int(keys.max()) + 1)
    unique = per_key == 1
    single = np.flatnonzero(unique[input_keys] & (w == 1))
    probability = np.ones(single.size)
    for column in columns:
        codes, uniques = pd.factorize(frame[column].astype(str).to_numpy())
        probability *= (np.bincount(codes, weights=w, minlength=len(uniques))
                        / float(w.sum()))[codes[single]]
    return {"released_rows": len(released), "unique_input_records": int(unique.sum()),
            "unique_match_share": float(unique[released_keys].mean()),
            "baseline_share": float(probability.sum())}


# -- the tests ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def releases(nps_config, nps_sample) -> dict[str, pd.DataFrame]:
    """Releases of every kind the evaluation reads, as Parquet hands them over too
    (text as categories, integers as integers)."""
    counts = aggregate(nps_sample, nps_config)
    made = nps_releases(nps_sample, counts)
    columns = list(made["shuffled"].columns)
    rows = nps_sample[columns].sample(frac=0.7, random_state=3).reset_index(drop=True)
    made["raw rows"] = rows
    made["categories"] = rows.astype({c: "category" for c in columns if rows[c].dtype == object})
    made["generalized categories"] = made["generalized"].astype(
        {c: "category" for c in columns}).reset_index(drop=True)
    return made


def test_text_codes_are_the_text_of_every_row() -> None:
    values = {
        "integers": pd.Series([3, 1, 3, 20]),
        "floats with a gap": pd.Series([1.5, np.nan, 1.5, 2.0]),
        "objects, 1 and '1' one text": pd.Series([1, "1", "a", None, "a"], dtype=object),
        "text": pd.Series(["b", None, "a", "b"], dtype="str"),
        "categories, unused and missing": pd.Series(
            pd.Categorical(["x", None, "y", "x"], categories=["z", "x", "y"])),
        "integer categories": pd.Series(pd.Categorical([10, 2, 10])),
    }
    for name, series in values.items():
        codes, texts = text_codes(series)
        as_text = series.astype(str)
        assert np.array_equal(codes == MISSING, as_text.isna().to_numpy()), name
        present = codes != MISSING
        assert list(texts[codes[present]]) == list(as_text[present]), name
        assert len(set(texts)) == len(texts) == as_text.nunique(), name


@pytest.mark.slow
def test_informative_accuracy_equals_the_row_wise_text_version(nps_config, nps_sample,
                                                              releases) -> None:
    counts = aggregate(nps_sample, nps_config)
    given = InputRows.from_counts(counts, nps_config)
    inputs = {"rows": (nps_sample, None), "counts": (given.table, given.weights)}
    pooled = 0
    for (kind, (frame, weights)), (name, released) in itertools.product(inputs.items(),
                                                                        releases.items()):
        info = accuracy._informative(frame, weights, released, nps_config, "", {})
        counts_ref, rates_ref = reference_informative(frame, weights, released, nps_config)
        assert [(v.value, v.input, v.released, v.pooled) for v in info.values] == counts_ref, \
            (kind, name)
        got = [(r.dimension, r.group, r.value, r.input_rate, r.released_rate, r.group_rows)
               for r in info.rates]
        want = [(r.dimension, r.group, r.value, r.input_rate, r.released_rate, r.group_rows)
                for r in rates_ref[:len(info.rates)]]
        assert len(info.rates) == min(len(rates_ref), accuracy.RATE_ROWS_SHOWN)
        assert np.array_equal(np.asarray([g[3:5] for g in got]),
                              np.asarray([w[3:5] for w in want]), equal_nan=True), (kind, name)
        assert [g[:3] + g[5:] for g in got] == [w[:3] + w[5:] for w in want], (kind, name)
        pooled += sum(v.pooled for v in info.values)
    assert pooled > 0  # the generalized releases pool rows under an all-'*' class


def test_synthetic_match_risk_equals_the_row_wise_text_version(nps_config, nps_sample,
                                                              releases) -> None:
    counts = aggregate(nps_sample, nps_config)
    given = InputRows.from_counts(counts, nps_config)
    columns = [c for c in nps_config.declared if c in releases["raw rows"].columns]
    matched = 0.0
    for name, released in releases.items():
        for frame, weights in ((nps_sample, None), (given.table, given.weights)):
            got = synthetic_match_risk(frame, weights, released, columns)
            assert got == reference_match_risk(frame, weights, released, columns), name
            matched += got["unique_match_share"]
    assert matched > 0  # some released rows are unique input records


@pytest.mark.slow
def test_marginals_summed_from_wider_ones_equal_each_measured_alone(nps_config, nps_sample,
                                                                    releases) -> None:
    columns = list(releases["shuffled"].columns)
    taxonomies = accuracy._taxonomies(nps_config, columns)
    for name in ("generalized", "categories"):
        released = releases[name]
        for released_weights in (None, np.full(len(released), 0.5)):  # whole, then fractions
            yardstick = Yardstick.from_rows(nps_sample[columns], released[columns], taxonomies,
                                            released_weights=released_weights)
            alone = {c: yardstick.tvd(c) for c in yardstick.marginals(max_way=3)}
            assert yardstick.marginals(max_way=3) == alone, name
            assert len(alone) == 41


def test_text_codes_keep_values_apart_that_print_apart() -> None:
    """0.0 and -0.0, or the objects 1, 1.0 and True, are one value to ``pd.factorize`` but
    different texts: the codes follow the text, as ``astype(str)`` does."""
    from medrelease.evidence.text_codes import text_codes

    for values in (pd.Series([0.0, -0.0, 1.0, np.nan]),
                   pd.Series([1, 1.0, True, None, "1"], dtype=object),
                   pd.Series(["a", "b", None, "a"]), pd.Series([3, 1, 3])):
        codes, texts = text_codes(values)
        got = [texts[c] if c >= 0 else None for c in codes]
        assert got == [None if pd.isna(v) else str(v) for v in values]
