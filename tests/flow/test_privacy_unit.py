"""Patient-level privacy: the bound, and every DP mechanism's sensitivity for one whole patient.

Neighbouring tables differ in *all* rows of one patient (here 5 admissions, spread over several
cells). The proof (docs/PRIVACY.md, "The privacy unit") couples the bound's choices for every
other patient, so ``B(D') = B(D) + S_u`` with ``S_u`` the bound applied to the patient alone;
each check below compares what a mechanism noises on ``B(D)`` and ``B(D) + S_u`` against the
sensitivity it is calibrated for, and is run again with the bound removed to show it fails.
"""

from __future__ import annotations

import itertools
import math
from decimal import Decimal, getcontext

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from medrelease.data.aggregate import aggregate
from medrelease.data.config import config_from_dict, find_config
from medrelease.data.nps import generate_nps
from medrelease.data.units import UnitBound, bound_frame, bounded_weights
from medrelease.mechanisms import get_mechanism
from medrelease.mechanisms.base import ReleaseContext
from medrelease.mechanisms.ipa import WEIGHT_SCALE, release_threshold, selection_score
from medrelease.plan import PublicFacts
from medrelease.privacy.randomness import noise_fraction
from medrelease.release import plan_release
from medrelease.synthetic.aim_rounds import (
    Settings,
    build_candidates,
    true_answers,
    workload_closure,
)
from medrelease.synthetic.space import MarginalSpace

M = 2  # the bound under test; the patient who differs has 5 admissions


@pytest.fixture(scope="module")
def unit_config(nps_config):
    """nps-sample with patient_id as the privacy unit (at most M rows per patient)."""
    raw = nps_config.model_dump(exclude={"base_dir", "config_file"})
    raw["columns"]["patient_id"] = {"role": "identifier"}
    raw["privacy"] = {**raw["privacy"], "unit": "patient_id", "max_rows_per_unit": M}
    return config_from_dict(raw, nps_config.base_dir)


def _neighbours(seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(others, the patient who differs): 400 admissions of ~210 patients with 1-5 each, and
    one patient with 5 admissions in different cells (distinct ages and diagnoses)."""
    table = generate_nps(400, seed=seed, repeat_admissions=True)
    patient = generate_nps(5, seed=seed + 1000).assign(patient_id=10**6)
    patient["age"] = [30, 45, 60, 75, 90]
    return table.astype(str), patient.astype(str)


def _bounded_pair(config, seed: int, bound: bool) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``B(D)`` and ``B(D) + S_u`` (the coupling of the proof), or D and D' unbounded."""
    others, patient = _neighbours(seed)
    if not bound:
        return others.drop(columns="patient_id"), pd.concat(
            [others, patient], ignore_index=True).drop(columns="patient_id")
    rng = np.random.SeedSequence(seed)
    base, _ = bound_frame(others, UnitBound("patient_id", M, rng.spawn(1)[0]))
    extra, _ = bound_frame(patient, UnitBound("patient_id", M, rng.spawn(1)[0]))
    return base, pd.concat([base, extra], ignore_index=True)


def _cell_l1(config, a: pd.DataFrame, b: pd.DataFrame) -> int:
    ca, cb = aggregate(a, config), aggregate(b, config)
    counts = pd.Series(cb.counts, index=cb.cell_keys).sub(
        pd.Series(ca.counts, index=ca.cell_keys), fill_value=0)
    return int(np.abs(counts).sum())


def _cells_l1(config, a, b) -> int:
    """ipa's cells, histogram's and DiffGen's noised counts are roll-ups of the finest cells
    (DiffGen with the class as the informative column): their L1 change is at most this."""
    return _cell_l1(config, a, b)


def _ipa_score_change(config, a, b) -> tuple[int, int]:
    """(min, max) over every lattice node of U(B(D) + S_u) - U(B(D)), weight units."""
    tau = release_threshold(0.62, 1e-6 / 3, 2, M)
    contexts = [ReleaseContext.from_counts(aggregate(t, config)) for t in (a, b)]
    changes = []
    for node in contexts[0].lattice.nodes[::7]:
        scores = []
        for context in contexts:
            table = context.lattice.from_finest(node)
            scores.append(selection_score(context, table, tau))
        changes.append(scores[1] - scores[0])
    return min(changes), max(changes)


def _aim_marginal_change(config, a, b) -> float:
    """The largest L1 (>= L2) change of any aim candidate marginal (every level combination)."""
    answers = []
    for table in (a, b):
        space = MarginalSpace(aggregate(table, config), config.informative_taxonomy)
        settings = Settings(rho=1.0, rounds=1, max_model_size=1e9, max_cells=10**7, iters=1,
                            final_iters=1)
        workload = [(c, 1.0) for c in itertools.combinations(range(len(space.names)), 2)]
        candidates = build_candidates(space, workload, settings)
        answers.append(true_answers(space, candidates))
    assert workload_closure(workload)
    return max(float(np.abs(y - x).sum()) for x, y in zip(*answers, strict=True))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_one_patient_moves_what_each_mechanism_noises_by_at_most_m(unit_config, seed):
    a, b = _bounded_pair(unit_config, seed, bound=True)
    assert 1 <= len(b) - len(a) <= M
    assert _cells_l1(unit_config, a, b) <= M
    low, high = _ipa_score_change(unit_config, a, b)
    assert low >= 0 and high <= M * WEIGHT_SCALE
    assert _aim_marginal_change(unit_config, a, b) <= M


@pytest.mark.parametrize("seed", [1, 2])
def test_without_the_bound_the_same_checks_fail(unit_config, seed):
    a, b = _bounded_pair(unit_config, seed, bound=False)
    assert len(b) - len(a) == 5
    assert _cells_l1(unit_config, a, b) > M
    assert _aim_marginal_change(unit_config, a, b) > M


def test_the_bound_keeps_min_rows_m_per_unit_chosen_uniformly():
    units = np.repeat(np.arange(4), [1, 2, 5, 3])      # one group per row
    kept_of_unit2 = np.zeros(5)
    runs = 4000
    root = np.random.SeedSequence(7)
    for child in root.spawn(runs):
        kept, report = bounded_weights(units, np.ones(units.size, np.int64), 2,
                                       np.random.default_rng(child))
        assert np.bincount(units, weights=kept).tolist() == [1, 2, 2, 2]
        kept_of_unit2 += kept[3:8]
    assert report.units_over_bound == 2 and report.rows_after == 7
    # each of unit 2's five rows stays with probability 2/5
    assert stats.chisquare(kept_of_unit2, np.full(5, runs * 2 / 5)).pvalue > 1e-3


def test_bound_on_group_weights_equals_the_bound_on_rows():
    """The DuckDB path bounds groups of identical rows; a group of w rows is w draws."""
    units = np.array([0, 0, 1, 2, 2, 2])
    weights = np.array([3, 4, 1, 2, 2, 5])
    kept, _ = bounded_weights(units, weights, 3, np.random.default_rng(1))
    assert np.bincount(units, weights=kept).tolist() == [3, 1, 3]
    assert (kept <= weights).all()


def _exact_worst(eps_frac, tau: int, m: int) -> Decimal:
    """max over splits of at most m rows into new cells of sum P(k + Z >= tau), exactly."""
    getcontext().prec = 60
    x = (-Decimal(eps_frac.numerator) / Decimal(eps_frac.denominator)).exp()

    def tail(j: int) -> Decimal:  # P(Z >= j), j >= 1
        return x ** j / (1 + x)

    def splits(total: int, largest: int):
        if total == 0:
            yield []
        for k in range(min(total, largest), 0, -1):
            for rest in splits(total - k, k):
                yield [k, *rest]

    return max(sum(tail(tau - k) for k in split) for s in range(1, m + 1)
               for split in splits(s, s))


@pytest.mark.parametrize(("epsilon", "delta", "m"), [(0.62, 3.3e-7, 2), (0.05, 1e-6, 3),
                                                      (2.0, 1e-6, 5), (0.3, 1e-5, 4)])
def test_unit_threshold_bounds_the_worst_new_cells_and_is_minimal(epsilon, delta, m):
    tau = release_threshold(epsilon, delta, 2, m)
    eps = noise_fraction(epsilon / m)
    assert _exact_worst(eps, tau, m) <= Decimal(delta)
    if tau > max(m + 1, 2):
        assert _exact_worst(eps, tau - 1, m) > Decimal(delta)
    # the row-level threshold does not hold for a unit: a cell of m rows passes it too often
    row_tau = release_threshold(epsilon, delta, 2)
    assert m < row_tau < tau
    assert _exact_worst(noise_fraction(epsilon), row_tau, m) > Decimal(delta)


def test_m_one_is_the_row_threshold_exactly():
    for epsilon, delta in [(0.62, 3.3e-7), (0.05, 1e-6), (3.0, 1e-9)]:
        assert release_threshold(epsilon, delta, 2, 1) == release_threshold(epsilon, delta, 2)


def test_each_mechanism_draws_at_eps_over_m(unit_config):
    """Histogram: the noise on cells far from 0 has the law of discrete Laplace(eps / m)."""
    facts = PublicFacts.of(unit_config)
    plan = plan_release("histogram", {"epsilon": 1.0, "auto_cells": 5_000}, 0, 5, facts)
    assert plan.params.unit_rows == M and plan.unit is not None
    assert "one patient" in plan.guarantee.neighbouring
    table = generate_nps(20000, seed=2).astype(str)
    counts = aggregate(table.drop(columns="patient_id"), unit_config)
    context = ReleaseContext.from_counts(counts)
    impl = get_mechanism("histogram")
    node = impl.fixed_node(context, plan.params)
    cells = impl.materialize(context, context.lattice.from_finest(node), plan.release_seed,
                             plan.params)
    big = cells.true_counts >= 25
    noise = (cells.released_counts - cells.true_counts)[big]
    assert noise.size > 100
    a = math.exp(-1.0 / M)
    expected_abs = 2 * a / (1 - a * a)  # E|Z| for discrete Laplace(eps / m)
    assert abs(np.abs(noise).mean() - expected_abs) < 5 * np.abs(noise).std() / math.sqrt(
        noise.size)
    row_level = 2 * math.exp(-1.0) / (1 - math.exp(-2.0))
    assert np.abs(noise).mean() > row_level * 1.5


def test_mimic_demo_declares_patient_level_and_aim_ipa_diffgen_follow(tmp_path):
    config = find_config("mimic-demo")
    assert config.unit_column == "subject_id" and config.unit_warning is None
    facts = PublicFacts.of(config)
    for name in ("ipa", "histogram", "diffgen", "aim"):
        plan = plan_release(name, {}, 0, 1, facts)
        assert plan.unit is not None and plan.unit.max_rows == 2, name
        assert plan.guarantee.neighbouring.startswith("add/remove one patient"), name
    aim = get_mechanism("aim")
    params = plan_release("aim", {}, 0, 1, facts).params
    assert aim.rounds_rho(params) == pytest.approx(aim.rho(params) / 4)
    kanon = plan_release("kanon", {"k": 5}, 0, 1, facts)
    assert kanon.unit is None and kanon.guarantee.neighbouring == "add/remove one row"


def test_identifiers_without_a_unit_are_warned_about_in_report_and_form(nps_config):
    from flows.release import ReleaseRequest
    from medrelease.evidence.evaluation import Evaluation
    from medrelease.evidence.report_html import render

    raw = nps_config.model_dump(exclude={"base_dir", "config_file"})
    raw["columns"]["patient_id"] = {"role": "identifier"}
    config = config_from_dict(raw, nps_config.base_dir)
    assert "patient_id" in config.unit_warning and "no privacy unit" in config.unit_warning
    page = render(Evaluation("x", "r", "ipa", "g", True, [], {}, 1, 1,
                             unit_warning=config.unit_warning), [])
    assert "Warning:" in page and "patient_id" in page
    form = ReleaseRequest.model_json_schema()["properties"]["dataset"]["description"]
    # the unit beside each bundled dataset ready to release; mimic-demo's input is prepared
    # by `medrelease prepare-mimic`, and until then the form says how instead (issue 56)
    assert "mimic-demo (one patient, at most 2 admissions)" in form or (
        "**mimic-demo**: its input is missing" in form and "prepare-mimic" in form)
    assert "nps-sample (one row)" in form
