"""The workload yardstick: TVD of marginals on raw (leaf) domains.

Checked against a dense brute force (every released label expanded to its leaf set, p and q over
the full product domain) on small random tables with every kind of label, under every plan the
yardstick can take; and ``workload_error`` against the implementation it replaced.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from medrelease.data.aggregate import CountTable, aggregate, aggregate_frame
from medrelease.data.taxonomy import Taxonomy, from_leaf_paths, numeric_levels
from medrelease.evidence import workload
from medrelease.evidence.workload import (
    Yardstick,
    marginal_name,
    rows_kept_share,
    workload_error,
)

# -- small tables with every kind of label ---------------------------------------------------

AGE = numeric_levels("age", 0, 11, [{"width": 3}, {"width": 6}])
# Level 1 is not contiguous in leaf order (a+c, b+d, ...): that column is never swept.
COLOR = from_leaf_paths("color", "categorical", list("abcdefgh"),
                        [[pair, "low" if pair < "e" else "high", "*"]
                         for pair in ["ac", "bd", "ac", "bd", "eg", "fh", "eg", "fh"]])
SEX = from_leaf_paths("sex", "categorical", ["F", "M"], [["*"], ["*"]])
DX_VALUES = ["flu", "cold", "cough", "rash", "burn"]
DX_DOMAIN = ["flu", "cold", "cough", "rash", "burn", "gout"]  # 'gout' never in the input
DX = from_leaf_paths("dx", "categorical", DX_DOMAIN,
                     [["airway", "*"], ["airway", "*"], ["airway", "*"], ["skin", "*"],
                      ["skin", "*"], ["joint", "*"]])
TAXONOMIES: dict[str, Taxonomy | None] = {"color": COLOR, "age": AGE, "sex": SEX, "dx": None}
DOMAINS = {"dx": DX_DOMAIN}

LABELS = {
    # leaves as ints and text, every level, '*', intervals that are no level's (overlapping,
    # one leaf wide, reaching past the domain), a bare integer outside, unknown text
    "age": [3, 7, "0", "11", "[0-2]", "[6-8]", "[0-5]", "[6-11]", "*", "[2-7]", "[1-4]",
            "[4-9]", "[0-0]", "[10-20]", "99", "[50-60]", "old"],
    "color": [*"abcdefgh", "ac", "fh", "low", "high", "*", "purple", "[1-2]"],
    "sex": ["F", "M", "*", "X"],
    "dx": [*DX_VALUES, "gout", "*", "airway", "fever"],
}


def random_input(rng: np.random.Generator, rows: int) -> pd.DataFrame:
    return pd.DataFrame({
        "age": rng.integers(0, 12, rows),
        "color": rng.choice(list("abcdefgh"), rows),
        "sex": rng.choice(["F", "M"], rows),
        "dx": rng.choice(DX_VALUES, rows, p=[0.4, 0.3, 0.15, 0.1, 0.05]),
    })


def random_release(rng: np.random.Generator, frame: pd.DataFrame, rows: int) -> pd.DataFrame:
    """Some true rows, some generalized ones, some with any label at all."""
    picked = frame.sample(n=rows, replace=True, random_state=int(rng.integers(1 << 30)))
    out = picked.astype(object).reset_index(drop=True)
    for column, labels in LABELS.items():
        replace = rng.random(rows) < 0.5
        out.loc[replace, column] = rng.choice(np.asarray(labels, dtype=object), replace.sum())
    return out


# -- the dense brute force ------------------------------------------------------------------

def label_masks(column: str, labels: pd.Series, leaves: list[str]) -> np.ndarray:
    """(rows, leaves): which leaves each released label covers, explicitly."""
    taxonomy = TAXONOMIES[column]
    masks = {}
    for label in labels.astype(str).unique():
        if taxonomy is not None:
            masks[label] = taxonomy.leaf_mask(label)
        elif label == "*":
            masks[label] = np.ones(len(leaves), dtype=bool)
        else:
            masks[label] = np.asarray(leaves) == label
    return np.array([masks[label] for label in labels.astype(str)]).reshape(len(labels), -1)


def brute_force_tvd(frame: pd.DataFrame, released: pd.DataFrame, columns: tuple[str, ...],
                    weights: np.ndarray | None = None,
                    released_weights: np.ndarray | None = None) -> float:
    """1/2 L1 between dense p and q over the full product of leaf domains, plus the released
    mass whose labels cover no leaf."""
    leaves = {}
    for column in columns:
        taxonomy = TAXONOMIES[column]
        if taxonomy is not None:
            leaves[column] = list(taxonomy.level_labels[0])
        else:
            seen = list(dict.fromkeys(frame[column].astype(str)))
            leaves[column] = seen + [v for v in DOMAINS.get(column, []) if v not in seen]
    weights = np.ones(len(frame)) if weights is None else np.asarray(weights, dtype=float)
    released_weights = (np.ones(len(released)) if released_weights is None
                        else np.asarray(released_weights, dtype=float))
    total = released_weights.sum()
    if total == 0:
        return 1.0
    p = np.zeros(tuple(len(leaves[c]) for c in columns))
    index = tuple(np.array([leaves[c].index(str(v)) for v in frame[c]]) for c in columns)
    np.add.at(p, index, weights)
    masks = [label_masks(c, released[c], leaves[c]) for c in columns]
    covers = np.all([m.any(axis=1) for m in masks], axis=0)
    outside = released_weights[~covers].sum()
    spread = [m / np.maximum(m.sum(axis=1, keepdims=True), 1) for m in masks]
    letters = "ijk"[:len(columns)]
    q = np.einsum(",".join(["r", *(f"r{x}" for x in letters)]) + "->" + letters,
                  np.where(covers, released_weights, 0.0), *spread)
    return 0.5 * (np.abs(p / p.sum() - q / total).sum() + outside / total)


# -- forcing each plan ----------------------------------------------------------------------

PLANS = ["auto", "scan", "expand", "sweep-first-scan", "sweep-first-expand",
         "sweep-last-scan", "sweep-last-expand"]


def forced(plan: str, swept: list[int | None]):
    """A ``_choose_plan`` that takes the named plan (sweeping when some column can be), noting
    the swept column of each marginal in ``swept``."""
    def choose(support, groups):
        sweep = None
        if plan.startswith("sweep"):
            columns = workload._sweep_columns(support, groups)
            if columns:
                sweep = columns[0] if "first" in plan else columns[-1]
        swept.append(sweep)
        limit = 0.0 if plan.endswith("scan") else float("inf")
        return workload._plan(support, groups, sweep, expand_limit=limit)
    return choose


def column_sets(columns: list[str], max_way: int = 3) -> list[tuple[str, ...]]:
    return [c for k in range(1, max_way + 1) for c in itertools.combinations(columns, k)]


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("seed", range(3))
def test_tvd_equals_the_dense_brute_force(seed: int, plan: str, monkeypatch) -> None:
    swept: list[int | None] = []
    if plan != "auto":
        monkeypatch.setattr(workload, "_choose_plan", forced(plan, swept))
    rng = np.random.default_rng(seed)
    frame = random_input(rng, 80)
    released = random_release(rng, frame, 120)
    weights = rng.integers(1, 4, len(frame))
    released_weights = rng.integers(0, 5, len(released))
    yardstick = Yardstick.from_rows(frame, released, TAXONOMIES, weights=weights,
                                    released_weights=released_weights, domains=DOMAINS)
    marginals = yardstick.marginals(3)
    assert list(marginals) == column_sets(list(TAXONOMIES))
    for columns, value in marginals.items():
        expected = brute_force_tvd(frame, released, columns, weights, released_weights)
        assert value == pytest.approx(expected, abs=1e-12), (columns, plan)
    if plan.startswith("sweep"):
        assert any(k is not None for k in swept)


def test_fractional_released_weights_and_many_overlapping_intervals() -> None:
    rng = np.random.default_rng(7)
    frame = random_input(rng, 60)
    low = rng.integers(0, 12, 200)
    high = np.minimum(low + rng.integers(0, 6, 200), 11)
    released = frame.sample(n=200, replace=True, random_state=1).astype(object)
    released["age"] = [f"[{a}-{b}]" for a, b in zip(low, high, strict=True)]
    released_weights = rng.random(200)
    yardstick = Yardstick.from_rows(frame, released, TAXONOMIES,
                                    released_weights=released_weights, domains=DOMAINS)
    for columns in column_sets(list(TAXONOMIES)):
        expected = brute_force_tvd(frame, released, columns, None, released_weights)
        assert yardstick.tvd(columns) == pytest.approx(expected, abs=1e-12), columns


def test_released_weights_stand_for_repeated_rows() -> None:
    rng = np.random.default_rng(3)
    frame = random_input(rng, 50)
    released = random_release(rng, frame, 40)
    repeats = rng.integers(0, 4, len(released))
    expanded = released.loc[released.index.repeat(repeats)].reset_index(drop=True)
    counted = Yardstick.from_rows(frame, released, TAXONOMIES, released_weights=repeats,
                                  domains=DOMAINS).marginals(3)
    rows = Yardstick.from_rows(frame, expanded, TAXONOMIES, domains=DOMAINS).marginals(3)
    assert counted == pytest.approx(rows, abs=1e-12)


# -- constructors agree ---------------------------------------------------------------------

def counts_of(frame: pd.DataFrame, domain: list[str] | None = None) -> CountTable:
    return aggregate_frame(frame, ["color", "age", "sex"], ["dx"], (COLOR, AGE, SEX), domain)


@pytest.mark.parametrize("domain", [None, DX_DOMAIN])
def test_from_counts_and_from_rows_agree(domain: list[str] | None) -> None:
    rng = np.random.default_rng(11)
    frame = random_input(rng, 70)
    released = random_release(rng, frame, 90)
    counts = Yardstick.from_counts(counts_of(frame, domain), released)
    rows = Yardstick.from_rows(frame, released, TAXONOMIES,
                               domains={"dx": domain} if domain else None)
    assert counts.columns == rows.columns == ("color", "age", "sex", "dx")
    assert counts.marginals(3) == pytest.approx(rows.marginals(3), abs=1e-12)


def test_an_informative_taxonomy_reads_generalized_informative_labels() -> None:
    rng = np.random.default_rng(5)
    frame = random_input(rng, 70)
    released = random_release(rng, frame, 90)
    counts = Yardstick.from_counts(counts_of(frame, DX_DOMAIN), released, informative_taxonomy=DX)
    rows = Yardstick.from_rows(frame, released, {**TAXONOMIES, "dx": DX})
    assert counts.marginals(3) == pytest.approx(rows.marginals(3), abs=1e-12)
    # 'airway' now covers flu, cold and cough instead of lying outside the domain
    flat = Yardstick.from_counts(counts_of(frame, DX_DOMAIN), released)
    assert counts.tvd(("dx",)) < flat.tvd(("dx",))


# -- the extremes ---------------------------------------------------------------------------

def test_identical_release_is_zero_and_empty_or_foreign_is_one() -> None:
    rng = np.random.default_rng(2)
    frame = random_input(rng, 60)
    same = Yardstick.from_rows(frame, frame.sample(frac=1.0, random_state=0), TAXONOMIES)
    assert max(same.marginals(3).values()) == pytest.approx(0.0, abs=1e-15)
    empty = Yardstick.from_rows(frame, frame.iloc[:0], TAXONOMIES)
    assert set(empty.marginals(3).values()) == {1.0}
    zero = Yardstick.from_rows(frame, frame, TAXONOMIES, released_weights=np.zeros(len(frame)))
    assert zero.tvd(("age", "dx")) == 1.0
    foreign = frame.assign(dx="fever")
    assert Yardstick.from_rows(frame, foreign, TAXONOMIES).tvd(("age", "dx")) == 1.0
    assert Yardstick.from_rows(frame, foreign, TAXONOMIES).tvd(("age",)) == 0.0


def test_names_and_bad_column_sets() -> None:
    assert marginal_name(("age", "diagnosis")) == "age × diagnosis"
    frame = random_input(np.random.default_rng(0), 10)
    yardstick = Yardstick.from_rows(frame, frame, TAXONOMIES)
    for bad in [(), ("age", "age"), ("height",)]:
        with pytest.raises(ValueError):
            yardstick.tvd(bad)


# -- workload_error against the implementation it replaced ----------------------------------

def reference_workload_error(counts: CountTable, released: pd.DataFrame) -> workload.WorkloadError:
    """The pre-Yardstick implementation (level labels only, pandas merges), kept as an oracle."""
    dims = counts.dimensions
    codes = counts.dimension_codes()
    source = pd.DataFrame(codes, columns=[f"d{i}" for i in range(codes.shape[1])])
    source["inf"] = counts.inf_codes()
    source["n"] = counts.counts
    columns = {}
    for i, (name, taxonomy) in enumerate(zip(dims, counts.taxonomies, strict=True)):
        index: dict[str, tuple[int, int]] = {}
        for level, labels in enumerate(taxonomy.level_labels):
            for code, label in enumerate(labels):
                index.setdefault(str(label), (level, code))
        looked = np.array([index[v] for v in released[name].astype(str)], dtype=np.int64)
        columns[f"l{i}"], columns[f"c{i}"] = looked[:, 0], looked[:, 1]
    names = list(counts.informative.columns)
    known = counts.informative.astype(str).reset_index(drop=True)
    known["inf"] = np.arange(len(known))
    merged = released[names].astype(str).reset_index(drop=True).merge(known, on=names, how="left")
    columns["inf"] = merged["inf"].fillna(-1).astype(np.int64).to_numpy()
    frame = pd.DataFrame(columns)
    groups = frame.groupby(list(frame.columns), sort=False).size().rename("n").reset_index()

    def tvd(positions: tuple[int, ...]) -> float:
        keys = [f"d{i}" for i in positions] + ["inf"]
        p = source.groupby(keys, sort=False)["n"].sum().reset_index()
        p["p"] = p["n"] / p["n"].sum()
        total = groups["n"].sum()
        q_at = np.zeros(len(p))
        level_cols = [f"l{i}" for i in positions]
        code_cols = [f"c{i}" for i in positions] + ["inf"]
        marg = groups.groupby(level_cols + code_cols, sort=False)["n"].sum().reset_index()
        for levels, part in marg.groupby(level_cols, sort=False):
            spread = part["n"].to_numpy(dtype=np.float64) / total
            probe = pd.DataFrame({"inf": p["inf"].to_numpy()})
            for i, level in zip(positions, levels, strict=True):
                taxonomy = counts.taxonomies[i]
                spread = spread / taxonomy.level_leaf_counts[level][part[f"c{i}"].to_numpy()]
                probe[f"c{i}"] = taxonomy.level_codes[level][p[f"d{i}"].to_numpy()]
            hit = probe.merge(part[code_cols].assign(w=spread), on=code_cols, how="left")["w"]
            q_at += hit.fillna(0.0).to_numpy()
        return float(0.5 * (np.abs(p["p"].to_numpy() - q_at).sum() + max(0.0, 1.0 - q_at.sum())))

    two = {d: tvd((i,)) for i, d in enumerate(dims)}
    three = {f"{dims[i]} x {dims[j]}": tvd((i, j))
             for i, j in itertools.combinations(range(len(dims)), 2)}
    return workload.WorkloadError(two, three)


def nps_releases(raw: pd.DataFrame, counts: CountTable) -> dict[str, pd.DataFrame]:
    """Shuffled columns, and every dimension at a random level per row with 30 % all '*'."""
    rng = np.random.default_rng(0)
    columns = list(counts.dimensions) + list(counts.informative.columns)
    generalized = raw[columns].astype(object).copy()
    for name, taxonomy in zip(counts.dimensions, counts.taxonomies, strict=True):
        leaves = taxonomy.encode(raw[name])
        level = rng.integers(0, taxonomy.height + 1, len(raw))
        labels = [np.asarray(taxonomy.level_labels[lv], dtype=object)[taxonomy.level_codes[lv]]
                  for lv in range(taxonomy.height + 1)]
        generalized[name] = np.choose(level, [lab[leaves] for lab in labels])
    generalized.loc[rng.random(len(raw)) < 0.3, list(counts.dimensions)] = "*"
    return {
        "shuffled": pd.DataFrame({c: rng.permutation(raw[c].to_numpy()) for c in columns}),
        "generalized": generalized.sample(frac=0.5, random_state=1),
    }


@pytest.mark.slow
def test_workload_error_matches_the_replaced_implementation(nps_config, nps_sample) -> None:
    counts = aggregate(nps_sample, nps_config)
    for name, released in nps_releases(nps_sample, counts).items():
        new = workload_error(counts, released)
        old = reference_workload_error(counts, released)
        assert list(new.two_way) == list(old.two_way) == list(counts.dimensions)
        assert list(new.three_way) == list(old.three_way)
        assert "age x sex" in new.three_way
        assert new.two_way == pytest.approx(old.two_way, abs=1e-12), name
        assert new.three_way == pytest.approx(old.three_way, abs=1e-12), name
        assert 0.05 < new.mean_two_way < new.mean_three_way < 1
    same = workload_error(counts, nps_sample)
    assert max([*same.two_way.values(), *same.three_way.values()]) == pytest.approx(0, abs=1e-15)
    kept = rows_kept_share(released, counts.dimensions, counts.n_rows)
    assert kept == pytest.approx(
        (released[list(counts.dimensions)].astype(str) != "*").any(axis=1).sum() / counts.n_rows)
