"""``aim``: zCDP accounting against OpenDP, the exact discrete Gaussian, the sensitivities the
proof rests on (on random neighbouring tables), coarse measurements, and a small release."""

from __future__ import annotations

import itertools
import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from medrelease.data.aggregate import aggregate
from medrelease.data.config import load_config
from medrelease.mechanisms import get_mechanism
from medrelease.privacy.zcdp import cdp_delta, discrete_gaussian, grid_sigma_sq, rho_for
from medrelease.release import plan_release
from medrelease.synthetic import pgm
from medrelease.synthetic.aim_rounds import Settings, build_candidates, true_answers
from medrelease.synthetic.axis_sums import sum_axis
from medrelease.synthetic.release import aim_rounds, release_synthetic, workload_of
from medrelease.synthetic.space import MarginalSpace, RollUps

DIAGNOSES = [f"{c}{i}" for c in "AB" for i in range(4)]


def write_small_dataset(folder: Path, rows: int = 400, seed: int = 0) -> Path:
    """Age (3 levels), sex, and a diagnosis with a declared domain and a two-level taxonomy."""
    rng = np.random.default_rng(seed)
    age = rng.integers(1, 41, rows)
    sex = np.where(rng.random(rows) < 0.5, "F", "M")
    diagnosis = np.where(age > 20, "A", "B").astype(object) + rng.integers(0, 4, rows).astype(str)
    return write_aim_dataset(folder, pd.DataFrame({"age": age, "sex": sex,
                                                   "diagnosis": diagnosis}), "small-aim")


def write_aim_dataset(folder: Path, frame: pd.DataFrame, name: str) -> Path:
    """``frame`` (age 1-40, sex, a diagnosis of ``DIAGNOSES``) as a dataset for aim: age in
    10-year bands, the diagnosis with a declared domain and a letter-level taxonomy."""
    frame.to_csv(folder / "t.csv", index=False)
    (folder / "age.yaml").write_text("domain: {min: 1, max: 40}\nlevels:\n  - {width: 10}\n")
    (folder / "sex.csv").write_text("F;*\nM;*\n")
    (folder / "dx.txt").write_text("\n".join(DIAGNOSES) + "\n")
    (folder / "dx.csv").write_text("".join(f"{d};{d[0]};*\n" for d in DIAGNOSES))
    (folder / "dataset.yaml").write_text(textwrap.dedent(f"""\
        name: {name}
        input: {{path: t.csv}}
        columns:
          age: {{role: dimension, type: integer, taxonomy: age.yaml}}
          sex: {{role: dimension, taxonomy: sex.csv}}
          diagnosis: {{role: informative, domain: dx.txt, taxonomy: dx.csv}}
        privacy: {{lifetime_epsilon: 100}}
        policy: {{mechanisms: [aim]}}
        """))
    return folder / "dataset.yaml"


@pytest.fixture
def small(tmp_path: Path):
    config = load_config(write_small_dataset(tmp_path))
    table = pd.read_csv(tmp_path / "t.csv")
    return config, table


# -- accounting ------------------------------------------------------------------------------

@pytest.mark.parametrize("epsilon,delta", [(0.5, 1e-6), (1.0, 1e-6), (2.0, 1e-9), (4.0, 1e-5)])
def test_rho_is_the_largest_that_gives_the_charged_delta_as_opendp_converts_it(epsilon, delta):
    dp = pytest.importorskip("opendp.prelude")
    dp.enable_features("contrib")
    rho = rho_for(epsilon, delta)
    assert cdp_delta(rho, epsilon) <= delta < cdp_delta(rho * 1.001, epsilon)
    scale = 1 / math.sqrt(2 * rho)  # a Gaussian of sensitivity 1 is exactly rho-zCDP
    gaussian = dp.m.make_gaussian(dp.atom_domain(T=float, nan=False),
                                  dp.absolute_distance(T=float), scale=scale)
    assert gaussian.map(1.0) == pytest.approx(rho, rel=1e-9)
    profile = dp.c.make_zCDP_to_approxDP(gaussian).map(1.0)
    assert profile.delta(epsilon) == pytest.approx(delta, rel=1e-6)
    assert profile.delta(epsilon) <= delta * (1 + 1e-9)


def test_the_budget_is_one_step_of_the_whole_epsilon_and_delta_and_rounds_never_overspend(small):
    config, table = small
    impl = get_mechanism("aim")
    params = impl.parse_params({"epsilon": 0.8, "delta": 1e-7})
    (step,) = impl.budget_steps(params)
    assert (step.epsilon, step.delta) == (0.8, 1e-7) and "rho" in step.description
    plan = plan_release("aim", {"epsilon": 0.8, "delta": 1e-7, "rounds_per_column": 1,
                                "iters": 50, "final_iters": 50}, 0, seed=5)
    run = aim_rounds(aggregate(table, config), config, plan)
    run.run()
    rho = impl.rho(plan.params)
    assert run.state.rho_used <= rho * (1 + 1e-9)
    assert run.state.rho_used >= rho * 0.95  # the last round spends what is left
    spent = sum(r.rho for r in run.state.records) + sum(
        1 / (2 * float(m.stddev) ** 2) for m in run.state.measurements[:3])
    assert spent == pytest.approx(run.state.rho_used, rel=1e-9)


# -- the discrete Gaussian -------------------------------------------------------------------

def _pmf(sigma_sq: float, support: np.ndarray) -> np.ndarray:
    weights = np.exp(-support.astype(float) ** 2 / (2 * sigma_sq))
    full = np.exp(-np.arange(-200, 201) ** 2 / (2 * sigma_sq)).sum()
    return weights / full


@pytest.mark.parametrize("sigma", [0.6, 1.5, 4.0])
def test_discrete_gaussian_has_its_exact_law_and_opendps(sigma):
    dp = pytest.importorskip("opendp.prelude")
    dp.enable_features("contrib")
    sigma_sq = grid_sigma_sq(sigma)
    ours = discrete_gaussian(np.random.default_rng(11), sigma_sq, 40_000)
    support = np.arange(-int(6 * sigma) - 1, int(6 * sigma) + 2)
    expected = _pmf(float(sigma_sq), support) * ours.size
    observed = np.array([(ours == k).sum() for k in support])
    keep = expected >= 5
    chi2 = stats.chisquare(observed[keep], expected[keep] * observed[keep].sum()
                           / expected[keep].sum())
    assert chi2.pvalue > 1e-4
    opendp = np.asarray(dp.m.make_gaussian(dp.vector_domain(dp.atom_domain(T="i64")),
                                           dp.l2_distance(T="i64"),
                                           scale=math.sqrt(float(sigma_sq)))([0] * 20_000))
    table = np.array([[(ours == k).sum() for k in support[keep]],
                      [(opendp == k).sum() for k in support[keep]]])
    assert stats.chi2_contingency(table).pvalue > 1e-4


def test_a_broken_sampler_fails_the_law_test():
    """The test above can fail: a sampler with 20 % more variance is caught."""
    wide = discrete_gaussian(np.random.default_rng(3), grid_sigma_sq(1.5 * math.sqrt(1.2)), 40_000)
    support = np.arange(-8, 9)
    expected = _pmf(2.25, support) * wide.size
    observed = np.array([(wide == k).sum() for k in support])
    assert stats.chisquare(observed, expected * observed.sum() / expected.sum()).pvalue < 1e-6


# -- sensitivities on random neighbouring tables ----------------------------------------------

def _neighbours(table: pd.DataFrame, rng: np.random.Generator) -> tuple[pd.DataFrame, pd.DataFrame]:
    extra = pd.DataFrame({"age": [int(rng.integers(1, 41))], "sex": [rng.choice(["F", "M"])],
                          "diagnosis": [rng.choice(DIAGNOSES)]})
    return table, pd.concat([table, extra], ignore_index=True)


def test_every_measurement_has_l2_sensitivity_one_and_every_score_its_weight(small):
    config, table = small
    plan = plan_release("aim", {"epsilon": 1.0, "rounds_per_column": 1, "iters": 50,
                                "final_iters": 50}, 0, seed=2)
    run = aim_rounds(aggregate(table, config), config, plan)
    run.start()
    round_plan = run.plan_round()
    rng = np.random.default_rng(9)
    for _ in range(8):
        d, d2 = _neighbours(table.sample(frac=0.9, random_state=int(rng.integers(1e6))), rng)
        space, space2 = (run.merged_like_this_run(MarginalSpace(aggregate(t, config),
                                                                config.informative_taxonomy))
                         for t in (d, d2))
        answers, answers2 = (true_answers(s, run.candidates) for s in (space, space2))
        for a, b in zip(answers, answers2, strict=True):
            assert np.linalg.norm((a - b).ravel(), 2) <= 1.0 + 1e-12
        run.answers = answers
        s1 = run.score(round_plan, round_plan.eligible)
        run.answers = answers2
        s2 = run.score(round_plan, round_plan.eligible)
        weights = np.array([run.candidates[i].weight for i in round_plan.eligible])
        assert np.all(np.abs(s1 - s2) <= weights + 1e-9)


def test_candidates_are_the_workload_closure_at_every_level_below_star(small):
    config, table = small
    space = MarginalSpace(aggregate(table, config), config.informative_taxonomy)
    params = get_mechanism("aim").parse_params({})
    settings = Settings(rho=0.1, rounds=3, max_model_size=80, max_cells=10**6, iters=10,
                        final_iters=10)
    candidates = build_candidates(space, workload_of(config, space, params), settings)
    shapes = {(c.columns, c.levels) for c in candidates}
    # age: leaves and 10-year bands; sex: leaves; diagnosis: codes and letters
    assert ((0, 2), (1, 1)) in shapes and ((0, 1, 2), (0, 0, 0)) in shapes
    assert len(shapes) == 2 + 1 + 2 + (2 * 1) + (2 * 2) + (1 * 2) + (2 * 1 * 2)
    weight = {c.columns: c.weight for c in candidates}
    assert weight[(0,)] == 3 and weight[(0, 1)] == 6 and weight[(0, 1, 2)] == 9


def test_a_coarse_measurement_is_the_level_sum_of_the_fine_clique(small):
    config, table = small
    space = MarginalSpace(aggregate(table, config), config.informative_taxonomy)
    fine = space.fine_marginal((0, 2))
    coarse = space.roll_up(fine, (0, 2), (1, 1))
    attrs = space.attributes
    query = pgm.LevelQuery((tuple(int(x) for x in attrs[0].level_maps[1]),
                            tuple(int(x) for x in attrs[2].level_maps[1])),
                           (attrs[0].cardinality(1), attrs[2].cardinality(1)))
    assert np.allclose(query.forward(fine), coarse.ravel())
    # its adjoint is its transpose: <Q x, y> = <x, Q^T y> (what the estimator's gradient uses)
    other = np.random.default_rng(0).normal(size=coarse.size)
    assert np.isclose(query.forward(fine) @ other,
                      float((fine * query.adjoint(other, fine.shape)).sum()))
    assert query.op_norm_sq() == 10 * 4  # ten ages in a band x four codes in a letter
    assert coarse.sum() == len(table)


def test_roll_ups_from_coarser_tables_are_the_roll_ups_of_the_fine_table(small):
    """Scoring takes each level combination from one already summed (RollUps): every one of a
    3-column set's combinations equals the roll-up of the fine marginal, whatever the order
    they are asked in."""
    config, table = small
    space = MarginalSpace(aggregate(table, config), config.informative_taxonomy)
    columns = (0, 1, 2)
    fine = space.fine_marginal(columns)
    combos = list(itertools.product(*[range(space.attributes[c].levels) for c in columns]))
    assert len(combos) >= 4 and any(sum(map(bool, lv)) == 2 for lv in combos)
    rolled = RollUps(space, columns, fine)
    for levels in reversed(combos):  # coarsest first: each builds the tables it needs
        expected = space.roll_up(fine, columns, levels)
        assert rolled(levels).shape == expected.shape
        assert np.allclose(rolled(levels), expected)
        assert rolled(levels).sum() == len(table)


def test_axis_sums_are_the_one_hot_products_on_any_code_map():
    """``sum_axis`` (reduceat in group order, no BLAS) gives what the one-hot product gave: on
    every axis, for code maps in order, out of order (a merged attribute's rare groups come
    last) and with a code no index maps to; exactly on counts, to rounding on estimates."""
    rng = np.random.default_rng(3)
    counts = rng.integers(0, 50, size=(7, 5, 6)).astype(np.float64)
    estimate = rng.random((7, 5, 6)) * 1e3
    maps = [np.array([0, 0, 1, 1, 1, 2, 2]), np.array([2, 0, 1, 0, 2, 1, 0]),
            np.array([0, 0, 3, 3, 1, 1, 0])]  # sorted; unsorted; group 2 empty
    for axis in range(3):
        for groups in maps:
            groups = groups[:counts.shape[axis]] % 4
            n_groups = 4
            onehot = np.zeros((groups.size, n_groups))
            onehot[np.arange(groups.size), groups] = 1.0
            for table, exact in ((counts, True), (estimate, False)):
                expected = np.moveaxis(np.tensordot(table, onehot, axes=([axis], [0])), -1, axis)
                got = sum_axis(table, axis, groups, n_groups)
                assert got.shape == expected.shape and got.dtype == np.float64
                assert (np.array_equal(got, expected) if exact
                        else np.allclose(got, expected, rtol=1e-13, atol=0))
    assert sum_axis(counts.astype(np.float32), 0, maps[1], 3).dtype == np.float64
    with pytest.raises(ValueError, match="group codes must lie in"):  # (the one-hot raised)
        sum_axis(counts, 1, np.array([0, 1, 5, 0, 1]), 2)


def test_the_selection_does_not_depend_on_how_the_scoring_was_batched(small):
    """The flow scores a round's candidates in batches of tasks (more or fewer as scoring
    costs) and hands their scores over batch by batch: the rounds, the model and so the
    release for a seed are the engine's, whatever the batches."""
    config, table = small
    plan = plan_release("aim", {"epsilon": 1.0, "iters": 50, "final_iters": 50}, 0, seed=5)

    def rounds(n_batches: int | None) -> list:
        run = aim_rounds(aggregate(table, config), config, plan)
        run.start()
        while not run.state.done:
            round_plan = run.plan_round()
            batches = (run.batches(round_plan, n_batches) if n_batches
                       else [list(reversed(round_plan.eligible))])
            indices = [i for batch in batches for i in batch]
            scores = np.concatenate([run.score(round_plan, batch) for batch in batches])
            run.finish_round(round_plan, indices, scores)
        return [(r.columns, r.levels) for r in run.state.records]

    reference = rounds(None)
    assert len(reference) >= 3
    assert rounds(4) == reference and rounds(2) == reference


def test_fine_marginals_from_supersets_are_the_counted_ones(small, monkeypatch):
    """Round 0's true marginals: a set whose superset's table is smaller than the count table
    is summed from it, the others counted from the rows; the same numbers exactly."""
    from medrelease.synthetic.aim_rounds import fine_marginals

    config, table = small
    space = MarginalSpace(aggregate(table, config), config.informative_taxonomy)
    sets = {s for k in (1, 2, 3) for s in itertools.combinations(range(3), k)}
    expected = {s: space.fine_marginal(s) for s in sets}
    counted = []
    original = space.fine_marginal
    monkeypatch.setattr(space, "fine_marginal", lambda s: counted.append(s) or original(s))
    got = fine_marginals(space, sets)
    assert set(got) == sets and all(np.array_equal(got[s], expected[s]) for s in sets)
    assert all(got[s].shape == space.shape(s) for s in sets)
    assert (0, 1, 2) in counted and len(counted) < len(sets)  # some were summed


@pytest.mark.parametrize("domain_order", ["the taxonomy's", "reversed"])
def test_error_bars_count_the_released_rows_as_a_pass_over_them_would(tmp_path, domain_order):
    """The error bars' released marginals (summed from a superset's table where that is
    cheaper) are the released rows' counts at every workload set and level combination, also
    where the taxonomy lists the leaves in another order than the domain's values (level 0 is
    then a permutation, which the measurements' code maps read too)."""
    from medrelease.synthetic.error_bars import _ErrorBars

    path = write_small_dataset(tmp_path, rows=20_000)  # no diagnosis value rare: none merged
    if domain_order == "reversed":  # the taxonomy file lists the leaves the other way round
        (tmp_path / "dx.csv").write_text("".join(f"{d};{d[0]};*\n" for d in DIAGNOSES[::-1]))
    config, table = load_config(path), pd.read_csv(tmp_path / "t.csv")
    plan = plan_release("aim", {"epsilon": 1.0, "iters": 50, "final_iters": 50}, 0, seed=5)
    run = aim_rounds(aggregate(table, config), config, plan)
    run.run()
    codes, _ = run.synthesize(7)
    bars = _ErrorBars(run, codes, 0.95)
    space = run.space
    sets = sorted({s for k in (3, 2, 1) for s in itertools.combinations(range(3), k)},
                  key=len, reverse=True)  # supersets first: the summed path is taken
    for columns in sets:
        for levels in itertools.product(*[range(space.attributes[c].levels) for c in columns]):
            shape = space.shape(columns, levels)
            flat = np.zeros(bars.rows, dtype=np.int64)
            for c, lv, size in zip(columns, levels, shape, strict=True):
                flat = flat * size + space.attributes[c].level_maps[lv][bars.released[c]]
            expected = np.bincount(flat, minlength=math.prod(shape)).reshape(shape)
            assert np.array_equal(bars.released_marginal(columns, levels), expected)
    level0 = space.attributes[2].level_maps[0]
    assert (domain_order == "reversed") == (not np.array_equal(level0, np.arange(level0.size)))


def test_rare_values_merge_under_their_parent_and_coarse_marginals_do_not_change(small):
    config, table = small
    space = MarginalSpace(aggregate(table, config), config.informative_taxonomy)
    before = space.fine_marginal((0, 2))
    coarse = space.roll_up(before, (0, 2), (1, 1))
    keep = np.ones(space.attributes[2].size, dtype=bool)
    keep[[1, 2, 5]] = False  # A1, A2 (parent A) and B1 (parent B)
    merge = space.merge(2, keep)
    merged = space.attributes[2]
    assert merged.size == 5 + 2 and merged.leaf_labels[-2:] == ("A (rare)", "B (rare)")
    assert [list(m) for m in merge.members[-2:]] == [[1, 2], [5]]
    after = space.fine_marginal((0, 2))
    assert after.sum() == before.sum()
    assert np.array_equal(space.roll_up(after, (0, 2), (1, 1)), coarse)
    assert np.array_equal(after[:, -2], before[:, [1, 2]].sum(axis=1))
    leaves = merge.expand(np.full(2000, merged.size - 2), np.random.default_rng(0))
    assert set(np.unique(leaves)) == {1, 2}  # a group's leaves, each about half the time
    assert abs((leaves == 1).mean() - 0.5) < 0.05


# -- a release -------------------------------------------------------------------------------

def test_a_small_release_is_synthetic_rows_on_public_values_and_a_noisy_total(small):
    config, table = small
    plan = plan_release("aim", {"epsilon": 2.0, "rounds_per_column": 1, "iters": 50,
                                "final_iters": 100}, 0, seed=4)
    chosen = release_synthetic(aggregate(table, config), config, plan)
    released = chosen.table
    assert list(released.columns) == ["age", "sex", "diagnosis"]
    assert set(released["diagnosis"]) <= set(DIAGNOSES)
    assert set(released["age"].astype(int)) <= set(range(1, 41))
    assert set(released["sex"].astype(str)) <= {"F", "M"}
    assert abs(len(released) - len(table)) < 60  # a noisy total (sigma ~ 5 at eps 2)
    assert chosen.details["synthetic"].startswith("synthetic rows")
    assert chosen.details["measurements"] and "score" not in str(chosen.details)
    assert chosen.row_bounds[0] <= len(released) <= chosen.row_bounds[1]


def test_aim_refuses_an_informative_column_without_a_public_domain(tmp_path):
    from medrelease.errors import ParameterError
    from medrelease.mechanisms import check_fits

    path = write_small_dataset(tmp_path)
    path.write_text(path.read_text().replace("domain: dx.txt, ", ""))
    with pytest.raises(ParameterError, match=r"public domains only.*'diagnosis'"):
        check_fits(load_config(path), "aim")


@pytest.mark.usefixtures("prefect_harness")
def test_aim_releases_through_the_flow_with_its_rounds_public_and_nothing_input_derived(
        tmp_path, monkeypatch):
    import json

    from flows.release import ReleaseRequest, release_flow

    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    path = write_small_dataset(tmp_path)
    result = release_flow(ReleaseRequest(
        dataset=str(path), mechanism="aim", epsilon=1.0, seed=6, evaluate=False,
        parameters={"rounds_per_column": 1, "iters": 50, "final_iters": 100}))
    manifest = result["manifest"]
    assert manifest["mechanism"] == "aim" and manifest["checks"]["passed"]
    checks = " ".join(manifest["checks"]["checks"])  # synthetic rows' checks, not ipa's words
    assert "leaf label" in checks and "ladder" not in checks and "suppressed" not in checks
    assert manifest["epsilon_spent"] == pytest.approx(1.0)
    assert manifest["delta_spent"] == pytest.approx(1e-6)
    assert "rho" in manifest["guarantee"]["notes"] and "zCDP" in manifest["guarantee"]["label"]
    details = manifest["mechanism_details"]
    assert details["synthetic"] == "synthetic rows — no row describes a real patient"
    assert details["rho_used"] <= details["rounds_rho"] * (1 + 1e-9)
    assert details["rounds_rho"] == pytest.approx(details["rho"])  # a unit of one row: m = 1
    assert {"columns", "levels", "sigma", "selection_epsilon"} <= set(details["measurements"][0])
    published = json.dumps(manifest)
    assert "input_rows" not in published and "score" not in published
    released = pd.read_csv(Path(result["path"]) / "TEST-data.csv")
    assert set(released["diagnosis"]) <= set(DIAGNOSES)
    # the researcher's error bars: the noisy measurements as a table, a bound per marginal
    from medrelease.privacy.publication import PUBLISHED_TABLES

    folder = Path(result["path"])
    measured = pd.read_parquet(folder / "measurements.parquet")
    assert set(measured.columns) <= set(PUBLISHED_TABLES["measurements.parquet"]) | set(
        manifest["columns"])
    labels = set(DIAGNOSES) | {d[0] for d in DIAGNOSES}  # codes and their letters (level 1)
    assert (measured["round"] == 0).any() and set(measured["diagnosis"].dropna()) <= labels
    assert "measurements.parquet" in manifest["files"]
    bars = manifest["error_bars"]
    assert bars["level"] == 0.95 and {tuple(m["columns"]) for m in bars["marginals"]} >= {
        ("age", "sex"), ("sex", "diagnosis")}
    assert all(0 <= m["tvd_bound"] <= 1 for m in bars["marginals"])
    report = (folder / "report.md").read_text()
    assert "## Error bars (95 % confidence)" in report
    # the marginal bounds' table lists the bounds that say something; the rest in one sentence
    useful = [m for m in bars["marginals"] if m["basis"] != "none" and m["tvd_bound"] < 1]
    assert all(f"| {' × '.join(m['columns'])} |" in report for m in useful)
    assert "| 1 (nothing excluded) |" not in report
    # every 1-way cell has its interval in intervals.csv (issue 54)
    intervals = pd.read_csv(folder / "intervals.csv", dtype={"cell": str})
    assert "intervals.csv" in manifest["files"]
    one_way = intervals[(intervals["what"] == "marginal") & (intervals["columns"] == "age")]
    assert len(one_way) == len(set(one_way["cell"])) > 0
    # aim in its own terms (issue 39): rounds, marginals measured, synthetic rows, error bars;
    # no lattice, rung or class-size wording anywhere in the report or the steward's summary
    from tasks.report import steward_summary_markdown

    rounds = max(m["round"] for m in details["measurements"])
    assert f"- rounds: {rounds} after the 1-way marginals" in report
    assert f"- marginals measured with noise: {len(details['measurements'])}" in report
    assert f"synthetic rows sampled from the model fitted to those measurements: " \
           f"{manifest['released_rows']:,}" in report
    assert "workload marginals have a bound below 1" in report
    summary = steward_summary_markdown(manifest, result["record"], pd.DataFrame())
    for words in ("lattice node", "ladder", "smallest class", "prosecutor risk:",
                  "rows unique", "No lattice search"):
        assert words not in report and words not in summary, words


@pytest.mark.usefixtures("prefect_harness")
def test_a_cli_release_shows_aims_rounds_as_they_run(tmp_path, monkeypatch):
    """The CLI's progress comes from the flow's structured records (``flows/progress.py``):
    off a terminal each round is a line (round k of about n, rho used, elapsed), in order, the
    last at the whole rho; on the run page the progress artifact is as before."""
    import re

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from typer.testing import CliRunner

    from deployments.cli import app

    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    path = write_small_dataset(tmp_path)
    shown = CliRunner().invoke(app, [
        "release", str(path), "--mechanism", "aim", "--epsilon", "1", "--seed", "6",
        "-p", "rounds_per_column=1", "-p", "iters=50", "-p", "final_iters=100"],
        env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    rounds = re.findall(r"^aim round (\d+) of about (\d+): rho used (\d+)% \((\d+\.\d) s\)$",
                        shown.output, re.MULTILINE)
    assert len(rounds) >= 2, shown.output
    numbers = [int(r[0]) for r in rounds]
    assert numbers == list(range(len(rounds))) and len({r[1] for r in rounds}) == 1
    shares = [int(r[2]) for r in rounds]
    assert shares == sorted(shares) and shares[-1] == 100
    assert [float(r[3]) for r in rounds] == sorted(float(r[3]) for r in rounds)
    assert "aim: sampling rows: from the fitted model" in shown.output
    assert re.search(r"^published \S+ \(\d+\.\d s\); writing the evidence report$",
                     shown.output, re.MULTILINE), shown.output
    with get_client(sync_client=True) as client:
        budget_used = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(like_="%aim-budget-used%")))
    assert budget_used and budget_used[0].type == "progress"
