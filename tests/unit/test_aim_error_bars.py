"""``aim``'s error bars: the measurements as a table, and per-marginal bounds computed from DP
outputs only that cover the true error between the input and the released rows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from medrelease.data.aggregate import aggregate
from medrelease.data.config import load_config
from medrelease.privacy.zcdp import discrete_gaussian, grid_sigma_sq
from medrelease.release import plan_release
from medrelease.synthetic.error_bars import (
    bounds_summary,
    marginal_bounds,
    measurements_frame,
    noise_l1,
)
from medrelease.synthetic.release import aim_rounds
from medrelease.synthetic.space import MarginalSpace

from ..flow.test_aim import DIAGNOSES, write_aim_dataset

# A2, A3 (one "A (rare)" group of two) and B3 (alone under B) fall below 3 sigma_0 at eps 1
SHARES = np.array([0.3, 0.25, 0.003, 0.002, 0.2, 0.2, 0.04, 0.005])
SEEDS = (0, 1, 2)


def write_dataset(folder: Path, rows: int = 3000, seed: int = 0) -> Path:
    """Age (leaves and 10-year bands), sex, and a diagnosis (codes and letters) with rare codes."""
    rng = np.random.default_rng(seed)
    age = rng.integers(1, 41, rows)
    sex = np.where(rng.random(rows) < 0.5, "F", "M")
    diagnosis = rng.choice(DIAGNOSES, rows, p=SHARES / SHARES.sum())
    return write_aim_dataset(folder, pd.DataFrame({"age": age, "sex": sex,
                                                   "diagnosis": diagnosis}), "aim-error-bars")


# one worker for the module: its fixture fits aim three times, and xdist would fit it per worker
pytestmark = pytest.mark.xdist_group("aim-error-bars")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three releases at eps 1; max_cells 500 keeps the fine 3-way marginal (560 merged cells)
    out of the candidates, so one workload marginal has no bound."""
    folder = tmp_path_factory.mktemp("aim-error-bars")
    config = load_config(write_dataset(folder))
    counts = aggregate(pd.read_csv(folder / "t.csv"), config)
    out = []
    for seed in SEEDS:
        plan = plan_release("aim", {"epsilon": 1.0, "rounds_per_column": 3, "iters": 50,
                                    "final_iters": 100, "max_cells": 500}, 0, seed=seed)
        run = aim_rounds(counts, config, plan)
        run.run()
        codes, rows = run.synthesize(seed)
        out.append((run, codes, rows))
    truth = MarginalSpace(counts, config.informative_taxonomy)
    return truth, out


def workload(run) -> list[tuple[int, ...]]:
    """Every 1-way marginal and the release's workload (every 2- and 3-way)."""
    return [(c,) for c in range(len(run.space.names))] + [cols for cols, _ in run.workload]


def true_tvd(truth: MarginalSpace, codes: dict, columns: tuple[str, ...],
             levels: tuple[int, ...]) -> float:
    """TVD between the input's and the released rows' marginal, from leaf codes with numpy."""
    index = tuple(truth.names.index(n) for n in columns)
    source = truth.roll_up(truth.fine_marginal(index), index, levels).ravel()
    rows = len(codes[truth.names[0]])
    flat = np.zeros(rows, dtype=np.int64)
    for c, level in zip(index, levels, strict=True):
        attribute = truth.attributes[c]
        flat = flat * attribute.cardinality(level) + attribute.level_maps[level][codes[attribute.name]]
    released = np.bincount(flat, minlength=source.size)
    return 0.5 * float(np.abs(source / source.sum() - released / released.sum()).sum())


# -- the measurements as a table --------------------------------------------------------------

def test_the_measurements_frame_holds_every_measured_cell_with_its_labels(runs):
    _, released = runs
    merged_somewhere = False
    for run, _, _ in released:
        state, names = run.state, run.space.names
        frame = measurements_frame(run)
        assert list(frame.columns) == ["round", "marginal", "levels", "sigma", *names,
                                       "noisy_count"]
        assert frame["noisy_count"].dtype == np.int64
        assert len(frame) == (sum(a.size for a in run.leaves) + sum(r.cells for r in state.records))
        zero = frame[frame["round"] == 0]
        for c, name in enumerate(names):
            block = zero[zero["marginal"] == name]
            assert list(block[name].astype(str)) == list(run.leaves[c].leaf_labels)
            assert block[[n for n in names if n != name]].isna().all().all()
            assert np.array_equal(block["noisy_count"].to_numpy(), state.one_way_noisy[c])
            # the leaf vector is what round 0 measured: the model's measurement is its
            # re-expression on merged values (a group's sum scaled by 1/sqrt(its size))
            stored = np.asarray(state.measurements[c].noisy)
            merge = next((m for m in run.merges if m.column == c), None)
            if merge is None:
                assert np.array_equal(stored, state.one_way_noisy[c])
            else:
                merged_somewhere = True
                sums = [state.one_way_noisy[c][m].sum() / math.sqrt(m.size) for m in merge.members]
                assert np.allclose(stored, sums)
        d = len(names)
        for k, record in enumerate(state.records):
            block = frame[frame["round"] == record.round]
            assert len(block) == record.cells
            assert set(block["marginal"]) == {" × ".join(record.columns)}
            assert set(block["levels"]) == {",".join(map(str, record.levels))}
            counts = block["noisy_count"].to_numpy()
            assert np.array_equal(counts, state.noisy[k])
            assert np.array_equal(counts, state.measurements[d + k].noisy)
            assert block["sigma"].iloc[0] == pytest.approx(record.sigma)
            cells = block[list(record.columns)].astype(str).drop_duplicates()
            assert len(cells) == record.cells  # every cell once, labelled at its levels
            for name, level in zip(record.columns, record.levels, strict=True):
                attribute = run.space.attributes[names.index(name)]
                assert set(block[name].astype(str)) == set(attribute.level_labels[level])
    assert merged_somewhere
    assert any("(rare)" in str(label) for run, _, _ in released
               for label in run.space.attributes[2].leaf_labels)


# -- the bounds -------------------------------------------------------------------------------

class Poison:
    """Stands for the data: any use raises."""

    def __getattr__(self, name):
        raise AssertionError(f"the error bars read the data ({name})")

    def __getitem__(self, key):
        raise AssertionError("the error bars read the data")

    def __iter__(self):
        raise AssertionError("the error bars read the data")

    def __len__(self):
        raise AssertionError("the error bars read the data")

    def __array__(self, *args, **kwargs):
        raise AssertionError("the error bars read the data")


def test_the_bounds_never_read_the_data(runs, monkeypatch):
    _, released = runs
    run, codes, _ = released[0]
    before = marginal_bounds(run, codes, workload(run))
    rng = np.random.default_rng(0)
    monkeypatch.setattr(run, "answers", [rng.normal(size=a.shape) * 1e6 for a in run.answers])
    monkeypatch.setattr(run.space, "weights", rng.integers(0, 10**6, run.space.weights.size))
    monkeypatch.setattr(run.space, "codes", [rng.permutation(c) for c in run.space.codes])
    assert marginal_bounds(run, codes, workload(run)) == before
    monkeypatch.setattr(run, "answers", Poison())
    monkeypatch.setattr(run.space, "weights", Poison())
    monkeypatch.setattr(run.space, "codes", Poison())
    assert marginal_bounds(run, codes, workload(run)) == before


def test_the_bounds_cover_the_true_error_of_every_marginal(runs):
    truth, released = runs
    pairs = covered = informative = 0
    bases = set()
    for run, codes, rows in released:
        bounds = marginal_bounds(run, codes, workload(run))
        assert [b.columns for b in bounds[:len(workload(run))]] == [
            tuple(run.space.names[c] for c in cols) for cols in workload(run)]
        for bound in bounds:
            tvd = true_tvd(truth, codes, bound.columns, bound.levels)
            pairs += 1
            covered += tvd <= bound.tvd_bound
            informative += bound.tvd_bound < 1
            bases.add(bound.basis)
            if bound.basis == "none":
                assert bound.tvd_bound == 1.0 and bound.l1_bound is None and bound.reason
            else:
                assert bound.tvd_bound == pytest.approx(min(1.0, bound.l1_bound / rows))
        summary = bounds_summary(bounds)
        assert json.loads(json.dumps(summary)) == summary
        assert summary["level"] == 0.95 and len(summary["bounds"]) == len(bounds)
        assert "within" in summary["bounds"][0]["statement"]
    print(f"\ncoverage {covered}/{pairs}, informative (tvd_bound < 1) {informative}/{pairs}")
    assert covered >= 0.93 * pairs
    assert bases == {"measured", "selection", "none"}
    assert informative >= pairs / 3


def test_measured_one_way_bounds_are_informative_on_a_few_thousand_rows(runs):
    _, released = runs
    for run, codes, _ in released:
        one_way = [b for b in marginal_bounds(run, codes, [(c,) for c in range(len(run.space.names))])
                   if b.target == "workload"]
        assert [b.basis for b in one_way] == ["measured"] * len(run.space.names)
        assert all(b.tvd_bound < 1 for b in one_way), [b.as_dict() for b in one_way]
        assert all("round(s) 0" in b.reason for b in one_way)


@pytest.mark.parametrize("sigma", [0.7, 3.0])
def test_the_gaussian_l1_bound_holds_for_the_discrete_gaussian_sampler(sigma):
    """G treats the discrete Gaussian as N(0, sigma^2): its 95 % bound is exceeded at most about
    5 % of the time by the sampler's own noise (40 cells, 2,000 draws)."""
    sigma_sq = grid_sigma_sq(sigma)
    noise = discrete_gaussian(np.random.default_rng(5), sigma_sq, 40 * 2000).reshape(2000, 40)
    bound = noise_l1(np.full(40, math.sqrt(float(sigma_sq))), 0.05)
    assert (np.abs(noise).sum(axis=1) > bound).mean() <= 0.05
