"""Every release says how good it is (issue 35): the steward's accuracy evidence.

A generated table with an outcome column (a handful of values, one of them rare) and a privacy
unit of several rows per patient: ``ipa`` must drop the rare outcome, and the CLI's summary,
the run's log and the evidence report must say so — verdict line, value counts, lost values —
instead of publishing the biased rates silently.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from medrelease.data.config import load_config
from medrelease.evidence.accuracy import SHRINK_WARNING, ValueCount
from medrelease.evidence.research import measure_accuracy
from medrelease.evidence.risk import synthetic_match_risk

pytestmark = pytest.mark.usefixtures("prefect_harness")

RARE = "6"  # an outcome 4 patients have: no DP release can keep it at these sizes


def write_outcome_dataset(folder: Path, patients: int = 2500, seed: int = 3) -> Path:
    """Patients with 1-3 admissions each: age band, sex, an outcome 0-6 whose value 6 is rare."""
    rng = np.random.default_rng(seed)
    rows = []
    for patient in range(patients):
        age = int(rng.integers(18, 90))
        sex = str(rng.choice(["F", "M"]))
        for _ in range(int(rng.integers(1, 4))):
            outcome = str(rng.choice(["0", "1", "2", "3", "4", "5"],
                                     p=[0.4, 0.25, 0.15, 0.1, 0.06, 0.04]))
            rows.append({"patient": f"p{patient:05d}", "age": age, "sex": sex,
                         "outcome": outcome})
    for patient in range(4):  # the rare outcome: one admission each of four patients
        rows.append({"patient": f"r{patient}", "age": 50 + patient, "sex": "F",
                     "outcome": RARE})
    pd.DataFrame(rows).to_csv(folder / "admissions.csv", index=False)
    (folder / "age.yaml").write_text(
        "domain: {min: 0, max: 99}\nlevels:\n  - {width: 10}\n  - {width: 50}\n")
    (folder / "sex.csv").write_text("F;*\nM;*\n")
    (folder / "outcomes.txt").write_text("\n".join(str(v) for v in range(7)) + "\n")
    (folder / "dataset.yaml").write_text(textwrap.dedent("""\
        name: outcome-test
        input: {path: admissions.csv}
        columns:
          patient: {role: identifier}
          age: {role: dimension, type: integer, taxonomy: age.yaml}
          sex: {role: dimension, taxonomy: sex.csv}
          outcome: {role: informative, domain: outcomes.txt}
        privacy: {lifetime_epsilon: 100, unit: patient, max_rows_per_unit: 3}
        mechanism: {name: ipa, params: {epsilon: 1.0}}
        """))
    return folder / "dataset.yaml"


@pytest.fixture
def home(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_ipa_dropping_a_rare_outcome_is_said_in_the_cli_the_log_and_the_report(
        tmp_path: Path, home: Path) -> None:
    from typer.testing import CliRunner

    from deployments.cli import app

    config_path = write_outcome_dataset(tmp_path)
    shown = CliRunner().invoke(app, ["release", str(config_path), "--mechanism", "ipa",
                                     "--seed", "7"], env={"COLUMNS": "400"})
    assert shown.exit_code == 0, shown.output
    text = re.sub(r"\s+", " ", shown.output.replace("│", " "))
    # the verdict line, with the lost outcome named
    assert re.search(r"accuracy (\(the steward's raw-data evaluation\) )?2-way error \d\.\d{3} "
                     r"\(mean TVD: 0 = the input's "
                     r"distributions, 1 = nothing in common\); worst 2-way: \S+ × \S+ "
                     r"\d\.\d{3}", text), text[-3000:]
    assert f"outcome value {RARE} not released" in text or \
        re.search(rf"outcome values [0-9, ]*\b{RARE}\b[0-9, ]* not released", text), text[-3000:]
    assert "WARNING: outcome" in text and f"{RARE} (4 input rows)" in text, text[-3000:]

    squeezed = shown.output.replace("\n", "").replace("│", "").replace(" ", "")
    steward = next(home.glob("steward/outcome-test/*/evaluation"))
    html = (steward / "report.html").read_text()
    evaluation = json.loads((steward / "evaluation.json").read_text())
    accuracy = evaluation["accuracy"]
    assert str(steward / "report.html").replace(" ", "") in squeezed
    assert RARE in accuracy["informative"]["lost"]
    counts = {v["value"]: v for v in accuracy["informative"]["values"]}
    assert counts[RARE]["input"] == 4 and counts[RARE]["released"] == 0
    # the accuracy comes first in the report, with the verdict, the counts and the lost value
    assert html.index("Verdict:") < html.index("Accuracy") < html.index("Privacy budget") \
        < html.index("Re-identification")
    assert accuracy["verdict"] in html.replace("&#x27;", "'")
    assert re.search(rf"Not released:</b> [^<]*\b{RARE}\b", html)
    assert "outcome, value by value" in html and "rate by dimension" in html
    # one input size everywhere: the evaluation's, the risk section's and the accuracy's
    input_rows = sum(v["input"] for v in counts.values())
    assert evaluation["input_rows"] == input_rows == evaluation["risk_input"]["rows"]
    # sections that do not apply say why, never empty
    assert "analysis queries" in evaluation["left_out"]
    assert "Not shown: the IPA paper" in html
    # the plain-words loss lines of a pooling mechanism
    assert any("pooled under '*'" in line for line in accuracy["informative"]["suppression"])


def test_a_value_shrunk_by_more_than_ten_percent_is_a_warning() -> None:
    kept = ValueCount("a", 1000, 950)
    shrunk = ValueCount("b", 1000, int(1000 * (1 - SHRINK_WARNING)) - 1)
    assert not kept.shrunk and shrunk.shrunk and not shrunk.lost
    assert ValueCount("c", 3, 0).lost and ValueCount("d", 0, 5).created


def test_accuracy_of_an_identical_release_is_zero_and_says_so(tmp_path: Path) -> None:
    config = load_config(write_outcome_dataset(tmp_path, patients=300))
    frame = pd.read_csv(config.input_path)[["age", "sex", "outcome"]].astype({"outcome": str})
    accuracy = measure_accuracy(frame, None, frame.astype(str), config)
    assert accuracy.workload is not None and accuracy.workload.mean(2) == pytest.approx(0.0)
    assert accuracy.warnings == [] and "kept within 10 %" in accuracy.verdict
    assert accuracy.workload.mean(3) == pytest.approx(0.0)


def test_pseudonyms_are_not_compared_and_the_report_says_why(tmp_path: Path) -> None:
    config = load_config(write_outcome_dataset(tmp_path, patients=100))
    frame = pd.read_csv(config.input_path)[["age", "sex", "outcome"]]
    accuracy = measure_accuracy(frame, None, frame, config, comparable=False)
    assert accuracy.workload is None and "pseudonym" in accuracy.not_applicable["workload"]
    assert "not measured" in accuracy.verdict


def test_synthetic_risk_counts_matches_of_unique_records_against_the_one_way_baseline() -> None:
    frame = pd.DataFrame({"a": ["x", "x", "y", "z"], "b": ["1", "1", "2", "3"]})
    # unique input records: (y, 2) and (z, 3); released: one copy of each, two others
    released = pd.DataFrame({"a": ["y", "z", "x", "y"], "b": ["2", "3", "1", "3"]})
    risk = synthetic_match_risk(frame, None, released, ["a", "b"])
    assert risk["unique_input_records"] == 2 and risk["unique_match_share"] == 0.5
    # p(a=y) p(b=2) + p(a=z) p(b=3) = 1/4 * 1/4 + 1/4 * 1/4
    assert risk["baseline_share"] == pytest.approx(0.125)


def test_the_log_names_no_value_that_is_not_in_a_public_domain(tmp_path: Path) -> None:
    """Prefect's log is a database: a rare value taken from the data stays out of it."""
    config = load_config(write_outcome_dataset(tmp_path, patients=200))
    frame = pd.read_csv(config.input_path)[["age", "sex", "outcome"]].astype({"outcome": str})
    released = frame[frame["outcome"] != RARE].astype(str)
    public = measure_accuracy(frame, None, released, config).as_json()
    assert RARE in public["log_verdict"] and RARE in public["log_warnings"][0]
    (tmp_path / "dataset.yaml").write_text(
        (tmp_path / "dataset.yaml").read_text().replace(", domain: outcomes.txt", ""))
    private = measure_accuracy(frame, None, released, load_config(tmp_path / "dataset.yaml"))
    logged = private.as_json()
    assert f"{RARE} (4 input rows)" in private.warnings[0]  # the report names it
    assert "1 outcome value(s) not released" in logged["log_verdict"]
    for line in [logged["log_verdict"], *logged["log_warnings"]]:
        assert "input rows" not in line and not re.search(rf"values? {RARE}\b", line), line
