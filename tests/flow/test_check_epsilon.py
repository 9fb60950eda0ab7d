"""``medrelease check --epsilon / --target-error``: epsilon chosen before it is spent (issue 53,
item 5). The declared analyses' expected 95 % errors come from public parameters and the
steward's declared ``expected_rows``, never from the input's row count."""

from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from deployments import cli
from deployments.cli import app
from medrelease.checkup import check_dataset
from medrelease.data.config import find_config
from medrelease.planning import (
    NO_ANALYSES,
    epsilon_for_target,
    expected_errors,
    form_epsilon_summary,
    planned_params,
    worst_share,
)
from medrelease.privacy.zcdp import rho_for

WIDE = {"COLUMNS": "240"}
SHARE = 0.3  # aim's default analyses_share
DELTA = 1e-6  # aim's default delta
DOMAIN = ["A01", "A02", "B01", "B02", "C01", "C02"]
# sex x diagnosis: 2 x 6; age (bands of 10 over 0..99) x ward: 10 x 2
CELLS = {"sex × diagnosis": 12, "age (level 1) × ward": 20}


@pytest.fixture(autouse=True)
def wide_console(monkeypatch) -> None:
    monkeypatch.setattr(cli.console, "width", 240)


@pytest.fixture
def datasets(tmp_path: Path, monkeypatch) -> Path:
    """An isolated data home and datasets folder (nothing bundled is touched)."""
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MEDRELEASE_DATASETS", str(tmp_path / "datasets"))
    return tmp_path / "datasets"


def write_extract(path: Path, rows: int, seed: int = 3) -> None:
    rng = np.random.default_rng(seed)
    pd.DataFrame({
        "patient_id": [f"P{p:04d}" for p in rng.integers(0, max(rows // 2, 1), rows)],
        "age": rng.integers(0, 100, rows),
        "sex": rng.choice(["F", "M"], rows),
        "ward": rng.choice(["north", "south"], rows),
        "diagnosis": rng.choice(DOMAIN, rows),
    }).to_csv(path, index=False)


def visits(root: Path, rows: int = 400, expected_rows: int | None = 5000,
           analyses: bool = True, unit_rows: int | None = None) -> Path:
    """A dataset with two declared analyses (one at a coarser taxonomy level)."""
    folder = root / "visits"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "age.yaml").write_text("domain: {min: 0, max: 99}\nlevels:\n  - {width: 10}\n")
    (folder / "sex.csv").write_text("F;*\nM;*\n")
    (folder / "ward.csv").write_text("north;*\nsouth;*\n")
    (folder / "diagnosis.txt").write_text("\n".join(DOMAIN) + "\n")
    unit = (f"  unit: patient_id\n  max_rows_per_unit: {unit_rows}\n" if unit_rows else "")
    declared = textwrap.dedent("""\
        analyses:
          - [sex, diagnosis]
          - {columns: [age, ward], levels: {age: 1}}
        """) if analyses else ""
    size = f"expected_rows: {expected_rows}\n" if expected_rows else ""
    (folder / "dataset.yaml").write_text(textwrap.dedent("""\
        name: visits
        input: {path: extract.csv}
        columns:
          patient_id: {role: identifier}
          age:        {role: dimension, type: integer, taxonomy: age.yaml}
          sex:        {role: dimension, taxonomy: sex.csv}
          ward:       {role: dimension, taxonomy: ward.csv}
          diagnosis:  {role: informative, domain: diagnosis.txt, domain_reviewed: true}
        privacy:
          lifetime_epsilon: 10
        """) + unit + declared + size)
    write_extract(folder / "extract.csv", rows)
    return folder


def sigma_by_hand(epsilon: float, analyses: int = 2, unit_rows: int = 1) -> float:
    """The analyses' share of rho / m^2, split evenly; rho_a = 1 / (2 sigma^2). With a unit
    declared, the rounds' rho comes from the epsilon the unit cut's count leaves."""
    from medrelease.privacy.unit_cut import UNIT_CUT_SHARE

    rounds = epsilon * (1 - UNIT_CUT_SHARE) if unit_rows > 1 else epsilon
    rho_each = SHARE * rho_for(rounds, DELTA) / unit_rows ** 2 / analyses
    return math.sqrt(1 / (2 * rho_each))


def test_the_numbers_are_the_formula(datasets: Path) -> None:
    visits(datasets)
    plan = expected_errors(find_config("visits"), epsilon=1.0)
    assert plan.mechanism == "aim" and plan.epsilon == 1.0 and plan.expected_rows == 5000
    sigma = sigma_by_hand(1.0)
    assert {e.analysis: e.cells for e in plan.analyses} == CELLS
    for error in plan.analyses:
        cells = CELLS[error.analysis]
        average = 5000 / cells
        assert error.sigma == pytest.approx(sigma, rel=1e-9)
        assert error.per_cell == pytest.approx(1.959964 * sigma, rel=1e-6)
        assert error.all_cells == pytest.approx(
            NormalDist().inv_cdf(1 - 0.025 / cells) * sigma, rel=1e-9)
        assert error.share == pytest.approx(1.959964 * sigma / average, rel=1e-6)
        assert error.all_cells_share == pytest.approx(error.all_cells / average, rel=1e-9)
        assert error.tvd == pytest.approx(math.sqrt(2 / math.pi) * sigma * cells / 10_000,
                                          rel=1e-9)
    assert any("not the input's" in note for note in plan.notes)


def test_the_answer_never_depends_on_the_input(datasets: Path) -> None:
    folder = visits(datasets, rows=300)
    small = check_dataset("visits", epsilon=1.0, target_error=0.2)
    write_extract(folder / "extract.csv", 3000, seed=9)
    large = check_dataset("visits", epsilon=1.0, target_error=0.2)
    assert small.ok and large.ok, (small.findings, large.findings)
    assert (small.rows, large.rows) == (300, 3000)
    assert small.errors == large.errors and small.errors is not None


def test_target_error_is_the_smallest_epsilon_that_meets_it(datasets: Path) -> None:
    visits(datasets)
    config = find_config("visits")
    _, params = planned_params(config)
    target = epsilon_for_target(config, params, 0.2)
    assert target.epsilon is not None and 0 < target.epsilon <= config.policy.max_epsilon

    def share(epsilon: float) -> float:
        return worst_share(config, params.model_copy(update={"epsilon": epsilon}))[0]

    assert share(target.epsilon) <= 0.2 < share(target.epsilon * (1 - 1e-6))
    assert target.worst_analysis == "age (level 1) × ward"  # the one with the most cells
    # by hand: 1.96 sigma x 20 cells / 5000 rows = 0.2 at that epsilon
    assert 1.959964 * sigma_by_hand(target.epsilon) * 20 / 5000 == pytest.approx(0.2, rel=1e-5)

    result = CliRunner().invoke(app, ["check", "visits", "--target-error", "0.2"], env=WIDE)
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert f"{target.epsilon:.4g}" in out and "--target-error 0.2" in out, out
    assert "expected 95 % error of the declared analyses at epsilon 1 (aim)" in out
    assert "sex × diagnosis" in out and "expected TVD" in out


def test_a_target_even_max_epsilon_misses_says_so(datasets: Path) -> None:
    visits(datasets)
    result = CliRunner().invoke(app, ["check", "visits", "--target-error", "0.001"], env=WIDE)
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "not met: even at the policy's max_epsilon 2" in out, out
    config = find_config("visits")
    _, params = planned_params(config)
    at_max = worst_share(config, params.model_copy(update={"epsilon": 2.0}))[0]
    assert f"±{at_max:.1%}" in out
    refused = CliRunner().invoke(app, ["check", "visits", "--target-error", "0"], env=WIDE)
    assert refused.exit_code == 2


def test_the_cli_prints_the_errors_at_epsilon(datasets: Path) -> None:
    visits(datasets)
    result = CliRunner().invoke(app, ["check", "visits", "--epsilon", "0.5"], env=WIDE)
    assert result.exit_code == 0, result.output
    sigma = sigma_by_hand(0.5)
    out = result.output
    assert f"{sigma:,.1f}" in out and f"±{1.959964 * sigma:,.1f}" in out, out
    assert f"±{1.959964 * sigma * 12 / 5000:.1%}" in out  # sex x diagnosis, share of a cell
    assert "at epsilon 0.5 (aim)" in " ".join(out.split())


def test_without_expected_rows_the_errors_are_in_rows_only(datasets: Path) -> None:
    visits(datasets, expected_rows=None)
    plan = expected_errors(find_config("visits"), epsilon=1.0, target_error=0.1)
    assert all(e.share is None and e.tvd is None and e.per_cell for e in plan.analyses)
    assert any("expected_rows is not declared" in note for note in plan.notes)
    assert plan.target is not None and plan.target.epsilon is None
    assert "needs expected_rows" in plan.target.message
    result = CliRunner().invoke(app, ["check", "visits", "--target-error", "0.1"], env=WIDE)
    out = " ".join(result.output.split())
    assert result.exit_code == 0 and "expected_rows is not declared" in out, out
    assert "share of an average cell (" not in out and "expected TVD" not in out
    assert not re.search(r"±[\d.]+%", out)  # no share anywhere


def test_no_declared_analyses_is_one_sentence(datasets: Path) -> None:
    visits(datasets, analyses=False)
    plan = expected_errors(find_config("visits"), epsilon=1.0, target_error=0.1)
    assert plan.analyses == () and plan.notes == (NO_ANALYSES,) and plan.target is None
    result = CliRunner().invoke(app, ["check", "visits", "--epsilon", "1",
                                      "--target-error", "0.1"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert NO_ANALYSES in " ".join(result.output.split())
    assert "expected 95 % error" not in result.output


def test_a_unit_of_m_rows_scales_sigma_and_says_so(datasets: Path) -> None:
    visits(datasets, unit_rows=3)
    plan = expected_errors(find_config("visits"), epsilon=1.0)
    assert plan.analyses[0].sigma == pytest.approx(sigma_by_hand(1.0, unit_rows=3), rel=1e-9)
    assert any("cut to at most 3" in note and "patient" in note for note in plan.notes)


def test_other_mechanisms_say_how_they_serve_an_analysis(datasets: Path) -> None:
    visits(datasets)
    config = find_config("visits")
    ipa = expected_errors(config, "ipa", 1.0, target_error=0.1)
    assert ipa.target is None and any("aim only" in note for note in ipa.notes)
    assert all("tau = " in e.note and "chosen privately" in e.note for e in ipa.analyses)
    histogram = expected_errors(config, "histogram", 1.0)
    from medrelease.privacy.intervals import half_width, noise_law_epsilon

    assert histogram.analyses[0].per_cell == half_width(noise_law_epsilon(1.0))
    assert "discrete Laplace" in histogram.analyses[0].note
    result = CliRunner().invoke(app, ["check", "visits", "--mechanism", "ipa",
                                      "--target-error", "0.1"], env=WIDE)
    out = " ".join(result.output.split())
    assert "computed for aim only" in out and "how it is served" in out, out


def test_the_form_line_gives_a_few_epsilons(datasets: Path) -> None:
    visits(datasets)
    line = form_epsilon_summary(find_config("visits"))
    assert line is not None and line.startswith("visits (analyses: largest of 2")
    shares = [float(s) / 100 for s in re.findall(r"±(\d+)% of an average cell", line)]
    assert len(shares) == 3 and shares == sorted(shares, reverse=True)  # at 0.5, 1, 2
    expected = 1.959964 * sigma_by_hand(1.0) * 20 / 5000
    assert shares[1] == pytest.approx(round(expected, 2), abs=0.011)
    from flows.request_form import ReleaseRequest

    help_text = ReleaseRequest.model_json_schema()["properties"]["epsilon"]["description"]
    assert "medrelease check DATASET --epsilon E" in help_text
