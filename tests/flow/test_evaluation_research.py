"""The steward's raw-data evaluation says what researchers need (issue 53, item 4).

A user study found releases that misled researchers under a green verdict: a column's
distribution collapsed to nearly uniform (age mean 51.6 against 59.8), a rare value inflated
(3 -> 38 rows), an effect erased (an outcome rate by treatment 0.398 vs 0.548 in the input,
0.474 vs 0.482 released) and rows holding an impossible combination (a cause of death for a
person alive). Each is built here by hand on a small table whose answer is known: the
evaluation must find it, say it as a WARNING (named in the report, log-safe in the log), and
find none of them in a faithful release. The verdict's section and the HTML report say that
this evaluation is no basis for deciding to publish.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pandas as pd
import pytest

from medrelease.data.config import DatasetConfig, load_config
from medrelease.evidence.accuracy import STEWARD_BASIS, Accuracy
from medrelease.evidence.research import COLLAPSE_TVD, ERASE_SHARE, measure_accuracy

PER_ARM = 1000          # patients per treatment arm
DEAD = {"A": 398, "B": 548}  # deaths per arm: rates 0.398 and 0.548
POOL = [round(60 + 12 * NormalDist().inv_cdf((k + 0.5) / 100)) for k in range(100)]


def write_dataset(folder: Path, domain: bool = True) -> Path:
    """A treatment (rx), survival status, age and a cause of death (informative; with a
    declared public domain unless ``domain=False``), one declared 2-column and one 3-column
    analysis, and one impossible combination: a cause of death for a person alive."""
    (folder / "age.yaml").write_text(
        "domain: {min: 0, max: 99}\nlevels:\n  - {width: 10}\n  - {width: 50}\n")
    (folder / "rx.csv").write_text("A;*\nB;*\n")
    (folder / "status.csv").write_text("0;*\n1;*\n")
    (folder / "causes.txt").write_text("none\ncancer\nheart\nrare\n")
    cause = ("{role: informative, domain: causes.txt}" if domain
             else "{role: informative}")
    (folder / "dataset.yaml").write_text(textwrap.dedent(f"""\
        name: research-test
        input: {{path: patients.csv}}
        columns:
          age: {{role: dimension, type: integer, taxonomy: age.yaml}}
          rx: {{role: dimension, taxonomy: rx.csv}}
          status: {{role: dimension, taxonomy: status.csv}}
          cause: {cause}
        privacy: {{lifetime_epsilon: 10}}
        analyses:
          - [rx, status]
          - {{columns: [age, rx, status], levels: {{age: 2}}}}
        impossible:
          - {{when: {{status: ["0"], cause: [cancer, heart, rare]}},
              reason: "alive, with a cause of death"}}
        """))
    patients().to_csv(folder / "patients.csv", index=False)
    return folder / "dataset.yaml"


def patients(dead: dict[str, int] = DEAD) -> pd.DataFrame:
    """2,000 patients: ``dead[arm]`` of each arm's 1,000 died (of cancer or heart disease,
    alternately; three of the first arm's of a rare cause); ages spread alike over every
    group (mean about 60), so only rx and status are associated."""
    rx = np.repeat(["A", "B"], PER_ARM)
    within = np.tile(np.arange(PER_ARM), 2)
    status = np.where(within < np.where(rx == "A", dead["A"], dead["B"]), "1", "0")
    cause = np.where(status == "1", np.where(within % 2 == 0, "cancer", "heart"), "none")
    cause[:3] = "rare"  # three deaths of a rare cause (arm A, status 1)
    age = np.asarray(POOL)[(np.arange(2 * PER_ARM) * 37) % 100]
    return pd.DataFrame({"age": age.astype(str), "rx": rx, "status": status, "cause": cause})


@pytest.fixture
def config(tmp_path: Path) -> DatasetConfig:
    return load_config(write_dataset(tmp_path))


def measured(config: DatasetConfig, released: pd.DataFrame) -> Accuracy:
    return measure_accuracy(patients(), None, released.astype(str), config)


def association(accuracy: Accuracy, name: str):
    return next(a for a in accuracy.research.associations if a.name == name)


def test_a_faithful_release_flags_nothing(config) -> None:
    """The input itself, reordered and ten rows short: no collapse, no inflation, every
    association kept, no impossible row; the verdict says no finding for researchers."""
    released = patients().sample(frac=1, random_state=4).iloc[10:]
    accuracy = measured(config, released)
    research = accuracy.research
    assert research is not None and not research.collapsed
    assert max(d.tvd for d in research.distributions) < COLLAPSE_TVD
    assert not research.inflated_counts and not accuracy.informative.inflated
    assert not research.flagged_associations
    rx_status = association(accuracy, "rx × status")
    assert rx_status.shows and not rx_status.erased and not rx_status.reversed
    assert research.impossible is not None and research.impossible_released == 0
    assert research.impossible_input == 0
    assert accuracy.warnings == [] and "for researchers" not in accuracy.verdict
    # the ages' means are the input's (numeric column), the categories have none
    age = next(d for d in research.distributions if d.column == "age")
    assert age.input_mean == pytest.approx(patients()["age"].astype(int).mean())
    assert age.released_mean == pytest.approx(released["age"].astype(int).mean())
    assert next(d for d in research.distributions if d.column == "rx").input_mean is None


def test_a_collapsed_age_distribution_is_flagged_with_its_means(config) -> None:
    """Ages released nearly uniformly over 18-85 (mean 51.2) for an input around 60 (its
    mean 60.0): the user study's 59.8 -> 51.6."""
    released = patients()
    released["age"] = (18 + np.arange(len(released)) % 68).astype(str)
    accuracy = measured(config, released)
    collapsed = accuracy.research.collapsed
    assert [d.column for d in collapsed] == ["age"]
    age = collapsed[0]
    assert age.tvd > COLLAPSE_TVD
    assert age.input_mean == pytest.approx(60.0)
    assert age.released_mean == pytest.approx(released["age"].astype(int).mean()) \
        == pytest.approx(51.22)
    # the TVD is the workload yardstick's 1-way marginal (its machinery, the same number)
    assert age.tvd == pytest.approx(accuracy.workload.marginals["age"], abs=1e-12)
    warning = next(w for w in accuracy.warnings if "1-way distribution" in w)
    assert warning.startswith("WARNING: 1 released column(s)") and "age 0." in warning
    assert "mean 60.0 in the input, 51.2 released" in warning
    assert "age (TVD" in accuracy.verdict
    logged = accuracy.as_json()["log_warnings"]
    assert any("age 0." in line and "mean" not in line for line in logged)  # no means logged


def test_a_rare_value_inflated_from_3_to_38_is_flagged_with_its_factor(config) -> None:
    released = patients()
    cancer = released.index[(released["cause"] == "cancer")][:35]
    released.loc[cancer, "cause"] = "rare"
    accuracy = measured(config, released)
    inflated = accuracy.informative.inflated
    assert [(v.value, v.input, v.released) for v in inflated] == [("rare", 3, 38)]
    assert inflated[0].factor == pytest.approx(38 / 3)
    warning = next(w for w in accuracy.warnings if "at least 2x" in w)
    assert "cause: 1 value(s)" in warning and "rare (3 -> 38, ×12.7)" in warning
    assert "1 value(s) inflated 2x or more" in accuracy.verdict
    as_json = accuracy.as_json()
    assert as_json["informative"]["inflated"] == [
        {"value": "rare", "input": 3, "released": 38, "factor": pytest.approx(38 / 3)}]
    # shrunk (cancer lost 35 of its rows) stays reported as before, next to inflated
    assert [v.value for v in accuracy.informative.shrunk] == []  # 35 of 473: -7 %
    assert "lost" in as_json["informative"] and "created" in as_json["informative"]


def test_a_dimension_value_inflated_is_flagged_at_its_released_level(config) -> None:
    """The youngest age (20 input rows) released 50 times; and as 10-year bands, a band
    released far above its input rows (the release's own level is compared)."""
    released = patients()
    youngest = str(min(POOL))
    older = released.index[released["age"] != youngest][:30]
    released.loc[older, "age"] = youngest
    accuracy = measured(config, released)
    found = accuracy.research.inflated["age"]
    assert [(v.value, v.input, v.released) for v in found] == [(youngest, 20, 50)]
    assert f"age: {youngest} (20 -> 50, ×2.5)" in next(
        w for w in accuracy.warnings if "at least 2x" in w)
    logged = " ".join(accuracy.as_json()["log_warnings"])
    assert "age 1 value(s)" in logged and f"{youngest} (20" not in logged  # no raw value
    # released as bands: [20-29] holds the input's 20 rows of that age range only
    banded = released.assign(age=[f"[{int(a) // 10 * 10}-{int(a) // 10 * 10 + 9}]"
                                  for a in released["age"]])
    band = measured(config, banded).research.inflated["age"]
    assert [(v.value, v.input, v.released) for v in band] == [("[20-29]", 20, 50)]


def test_a_release_with_more_rows_throughout_inflates_no_value(config) -> None:
    """Three copies of the input (a noise-row-heavy table): every count triples, no value's
    share moves, nothing is inflated."""
    released = pd.concat([patients()] * 3, ignore_index=True)
    accuracy = measured(config, released)
    assert not accuracy.informative.inflated and not accuracy.research.inflated_counts


def test_an_erased_treatment_effect_is_flagged(config) -> None:
    """Death rates 0.398 (A) and 0.548 (B) in the input, 0.474 and 0.482 released."""
    released = patients({"A": 474, "B": 482})
    accuracy = measured(config, released)
    rx_status = association(accuracy, "rx × status")
    assert rx_status.declared and rx_status.erased and not rx_status.reversed
    rates = {(r["group"], r["value"]): r for r in rx_status.rates}
    assert rates[("A", "1")]["input_rate"] == pytest.approx(0.398)
    assert rates[("B", "1")]["input_rate"] == pytest.approx(0.548)
    assert rates[("A", "1")]["released_rate"] == pytest.approx(0.474)
    assert rates[("B", "1")]["released_rate"] == pytest.approx(0.482)
    assert rx_status.input_spread == pytest.approx(0.15)
    assert rx_status.released_spread == pytest.approx(0.008)
    assert rx_status.released_spread < ERASE_SHARE * rx_status.input_spread
    assert rx_status.largest_difference == pytest.approx(0.076)
    assert set(rx_status.erased_values) == {"0", "1"}
    # the informative column by the treatment: 'none' (alive) 0.602 vs 0.452 -> erased too
    assert association(accuracy, "rx × cause").erased
    # age is independent of both in the input: nothing to erase
    assert not association(accuracy, "age × cause").shows
    # three columns: the joint TVD at the levels and status's rates given (age band, rx)
    three = association(accuracy, "age (level 2) × rx × status")
    assert three.tvd is not None and three.tvd > 0.05 and three.erased
    assert {r["group"] for r in three.rates} >= {"age=[50-99], rx=A", "age=[50-99], rx=B"}
    warning = next(w for w in accuracy.warnings if "erased or reversed" in w)
    assert "rx × status erased: status" in warning and "in the input" in warning
    assert "association" in accuracy.verdict and "rx × status" in accuracy.verdict
    logged = next(w for w in accuracy.as_json()["log_warnings"] if "erased" in w)
    assert "rx × status erased (rate spread across groups 0.150 in the input, 0.008 " \
           "released)" in logged


def test_a_reversed_effect_is_flagged(config) -> None:
    """The release swaps the arms' death rates (0.548 for A, 0.398 for B): the spread is kept,
    its direction is not."""
    from medrelease.evidence.research import research_accuracy

    research, _ = research_accuracy(patients(), None,
                                    patients({"A": 548, "B": 398}), config)
    rx_status = next(a for a in research.associations if a.name == "rx × status")
    assert rx_status.reversed and not rx_status.erased
    assert rx_status.released_spread == pytest.approx(0.15)
    assert rx_status.released_contrast == pytest.approx(-0.15)


def test_impossible_combinations_in_the_release_and_in_the_input(config) -> None:
    """Twelve released rows alive with a cause of death; a generalized status ('*') with a
    cause is not impossible (it also covers the dead). Three such input rows are a
    data-quality finding, counted apart."""
    released = patients()
    alive = released.index[released["status"] == "0"]
    released.loc[alive[:12], "cause"] = "cancer"
    released.loc[alive[12:20], ["status", "cause"]] = ["*", "heart"]
    accuracy = measured(config, released)
    research = accuracy.research
    assert research.impossible_released == 12 and research.impossible_input == 0
    assert research.impossible[0].reason == "alive, with a cause of death"
    warning = next(w for w in accuracy.warnings if "impossible" in w)
    assert warning == ("WARNING: 12 released row(s) hold a combination the config declares "
                       "impossible: alive, with a cause of death (12)")
    assert "12 released row(s) hold a combination declared impossible" in accuracy.verdict

    raw = patients()
    raw.loc[raw.index[raw["status"] == "0"][:3], "cause"] = "heart"
    found = measure_accuracy(raw, None, raw.astype(str), config)
    assert found.research.impossible_input == 3 and found.research.impossible_released == 3
    assert any("3 input row(s) hold a combination" in w and "data-quality" in w
               for w in found.warnings)
    logged = " ".join(found.as_json()["log_warnings"])
    assert "data-quality" in logged and "3 input row(s)" not in logged  # no input count logged
    # from counts (cells with weights) the same
    cells = raw.groupby(list(raw.columns)).size().reset_index(name="n")
    weights = cells.pop("n").to_numpy()
    weighted = measure_accuracy(cells, weights, raw.astype(str), config)
    assert weighted.research.impossible_input == 3


def test_the_log_names_no_value_of_a_domain_taken_from_the_data(tmp_path) -> None:
    """Without a declared domain the informative values are raw values: the log-safe lines
    count them; the report's lines name them."""
    config = load_config(write_dataset(tmp_path, domain=False))
    released = patients({"A": 474, "B": 482})
    cancer = released.index[released["cause"] == "cancer"][:35]
    released.loc[cancer, "cause"] = "rare"
    accuracy = measured(config, released)
    assert any("rare (3 -> 38" in w for w in accuracy.warnings)
    as_json = accuracy.as_json()
    logged = " ".join([as_json["log_verdict"], *as_json["log_warnings"]])
    assert "cause: 1 value(s) released at least 2x" in logged
    for raw in ("rare", "cancer", "none", "(3 -> 38"):
        assert raw not in logged, raw


def test_the_verdict_section_and_the_report_say_it_is_no_basis_for_publishing(
        tmp_path, config, monkeypatch) -> None:
    """The JSON, the Markdown artifact, the steward's summary and the HTML report carry the
    sentence; the research sections are in the report and in the Markdown."""
    from medrelease.evidence.accuracy import accuracy_markdown
    from medrelease.evidence.evaluation import evaluate_release
    from medrelease.evidence.report_html import write_report

    released = patients({"A": 474, "B": 482})
    folder = tmp_path / "release"
    folder.mkdir()
    released.to_parquet(folder / "data.parquet")
    (folder / "manifest.json").write_text(json.dumps({
        "dataset": "research-test", "release_id": "r1", "mechanism": "aim",
        "guarantee": {"statement": "s"}, "test_release": True, "budget_steps": [],
        "released_rows": len(released)}))
    evaluation = evaluate_release(folder, patients(), config)
    accuracy = evaluation.accuracy
    assert accuracy["basis"] == STEWARD_BASIS == evaluation.basis
    assert STEWARD_BASIS.startswith("steward's raw-data evaluation — it compares the release "
                                    "with the raw input")
    assert "the publication verdict in the release's manifest" in STEWARD_BASIS
    assert accuracy["research"]["associations"]["erased"][:1] == ["rx × cause"]
    assert "rx × status" in accuracy["research"]["associations"]["erased"]
    assert json.loads(json.dumps(accuracy, default=float)) is not None
    markdown = accuracy_markdown(accuracy, "r1")
    assert STEWARD_BASIS in markdown and "## What researchers need" in markdown
    assert re.search(r"\| rx × status \| [01] \| .*\*\*erased\*\*", markdown)
    page = (write_report(evaluation, tmp_path / "evaluation") / "report.html").read_text()
    text = page.replace("&#x27;", "'")
    assert STEWARD_BASIS in text
    assert text.index("Verdict:") < text.index(STEWARD_BASIS) < text.index("<h2>")
    assert "What researchers need" in text and "erased" in text
    import tasks.report

    monkeypatch.setattr(tasks.report, "render_public_report", lambda m: "# Release r1\n")
    summary = tasks.report.steward_summary_markdown(
        {"dataset": "research-test", "release_id": "r1", "guarantee": {"statement": "s"},
         "mechanism": "aim", "budget_steps": [], "released_rows": 1, "test_release": True},
        {"input_file": "x", "input_sha256": "0" * 64, "input_rows": 2000},
        pd.DataFrame(), {"verdict": evaluation.verdict, "warnings": evaluation.warnings,
                         "basis": evaluation.basis})
    assert STEWARD_BASIS in summary


def test_the_research_distances_are_the_workload_yardsticks_on_generalized_releases(
        nps_config, nps_sample) -> None:
    """On releases with labels of every level and '*' (their rows spread over the values they
    cover), each column's 1-way TVD is the workload's 1-way marginal."""
    from medrelease.data.aggregate import aggregate
    from tests.unit.test_workload import nps_releases

    rows = nps_sample.head(5000)
    for name, released in nps_releases(rows, aggregate(rows, nps_config)).items():
        accuracy = measure_accuracy(rows, None, released, nps_config)
        for d in accuracy.research.distributions:
            assert d.tvd == pytest.approx(accuracy.workload.marginals[d.column], abs=1e-9), \
                (name, d.column)
        assert json.dumps(accuracy.as_json())  # every new key is JSON
