"""Evaluation numbers against direct computation on small tables; the HTML report's plots."""

from __future__ import annotations

import math
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from medrelease.evidence.classification import information_gain
from medrelease.evidence.risk import frequency_attack
from medrelease.evidence.utility import compare_queries


def _label(config, column: str, value, level: int) -> str:
    taxonomy = config.taxonomies[column]
    leaf = int(taxonomy.encode(pd.Series([str(value)]))[0])
    return taxonomy.level_labels[level][taxonomy.level_codes[level][leaf]]


def test_queries_spread_generalized_values_as_specified(nps_config) -> None:
    original = pd.DataFrame({
        "age": ["22", "23", "27", "41"], "sex": ["F", "F", "M", "F"],
        "length_of_stay": ["3", "5", "1", "10"], "surgery": ["N", "N", "Y", "N"],
        "region": ["1", "1", "1", "1"], "diagnosis": ["A000", "A000", "A000", "B1"]})
    released = pd.DataFrame({
        "age": [_label(nps_config, "age", 22, 1), "23"],          # [20-29] -> groups 20 and 25
        "sex": ["F", "*"],                                          # * -> half F, half M
        "length_of_stay": ["3", _label(nps_config, "length_of_stay", 5, 1)],  # [5-9]: midpoint 7
        "surgery": ["N", "*"],                                      # * -> half non-surgical
        "region": ["1", "1"], "diagnosis": ["A000", "A000"]})
    side, summary = compare_queries(original, released, nps_config, diagnosis="A000")
    cell = side.set_index(["age_group", "sex"])
    assert cell.loc[(20, "F"), "original_stays"] == 2
    assert cell.loc[(20, "F"), "original_avg_los"] == 4.0
    assert cell.loc[(25, "M"), "original_stays"] == 0          # surgical stay excluded
    assert cell.loc[(20, "F"), "released_stays"] == pytest.approx(0.5 + 0.25)
    assert cell.loc[(25, "F"), "released_stays"] == pytest.approx(0.5)
    assert cell.loc[(20, "M"), "released_stays"] == pytest.approx(0.25)
    assert cell.loc[(20, "F"), "released_avg_los"] == pytest.approx((0.5 * 3 + 0.25 * 7) / 0.75)
    assert cell.loc[(20, "M"), "released_avg_los"] == pytest.approx(7.0)
    errors = (side["released_stays"] - side["original_stays"]).abs()
    assert summary["stays_mean_abs_error"] == pytest.approx(errors.mean())


def test_frequency_attack_by_hand() -> None:
    raw = pd.DataFrame({"a": ["x", "x", "x", "y", "y", "z"], "b": ["p", "q", "p", "q", "p", "q"]})
    result = frequency_attack(raw, ["a", "b"])
    assert result["values_decoded_share:a"] == 1.0     # frequencies 3, 2, 1: all distinct
    assert result["values_decoded_share:b"] == 0.5     # p and q tie at 3
    assert result["records_reidentified_share"] == 0.5


def test_information_gain_by_hand() -> None:
    frame = pd.DataFrame({"x": ["a", "a", "b", "b"], "noise": ["u", "v", "u", "v"],
                          "y": ["1", "1", "0", "0"]})
    gains = information_gain(frame, "y", ["x", "noise"])
    assert gains["x"] == pytest.approx(1.0) and gains["noise"] == pytest.approx(0.0)


class _Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.sources: list[str] = []
        self.headings: list[str] = []
        self._in_heading = False

    def handle_starttag(self, tag, attrs) -> None:
        if tag == "img":
            self.sources.append(dict(attrs)["src"])
        self._in_heading = tag in ("h1", "h2")

    def handle_data(self, data) -> None:
        if self._in_heading:
            self.headings.append(data.strip())
            self._in_heading = False


def check_report(report: Path) -> _Images:
    """Every plot the page shows exists and is a well-formed SVG with a title and data marks
    (lines, points or bars); returns the parsed page."""
    from xml.etree import ElementTree

    parser = _Images()
    parser.feed(report.read_text(encoding="utf-8"))
    assert parser.sources, "the report shows no plot"
    for source in parser.sources:
        image = report.parent / source
        root = ElementTree.fromstring(image.read_text(encoding="utf-8"))
        svg = "{http://www.w3.org/2000/svg}"
        assert root.tag == f"{svg}svg", source
        assert (root.findtext(f"{svg}title") or "").strip(), f"{source} has no title"
        marks = [e for e in root.iter() if e.tag in (f"{svg}polyline", f"{svg}circle")
                 or (e.tag == f"{svg}rect" and e.get("fill") != "white")]
        assert marks, f"{source} draws no data"
    return parser


def test_report_for_a_real_release(tmp_path, nps_config, nps_sample) -> None:
    from medrelease.evidence.evaluation import evaluate_release
    from medrelease.evidence.report_html import write_report
    from medrelease.release import release

    # A release folder as the flow publishes it (manifest, data, candidates), built directly.
    result = release(nps_sample.head(4000), nps_config, mechanism="ipa", seed=3)  # IL by node
    folder = tmp_path / "rel"
    folder.mkdir()
    result.table.to_parquet(folder / "data.parquet")
    manifest = {
        "dataset": "nps-sample", "release_id": "r1", "mechanism": "ipa",
        "guarantee": {"statement": result.guarantee.statement()}, "test_release": True,
        "budget_steps": [s.__dict__ for s in result.budget_steps],
        "released_rows": len(result.table)}
    record = {"information_loss": {"il": result.released_il.il}, "input_rows": 4000}
    import json
    (folder / "manifest.json").write_text(json.dumps(manifest))
    evaluation = evaluate_release(folder, nps_sample.head(4000), nps_config, record=record,
                                  candidates=result.candidates)
    target = write_report(evaluation, tmp_path / "evaluation")
    parser = check_report(target / "report.html")
    assert {"plots/query_stays.svg", "plots/il_by_height.svg", "plots/budget.svg"} <= set(
        parser.sources)
    side, _ = compare_queries(nps_sample.head(4000), result.table, nps_config)
    assert np.allclose(evaluation.queries["released_stays"], side["released_stays"])
    heights = evaluation.il_by_height
    levels = [c for c in result.candidates.columns if c.startswith("level_")]
    top = result.candidates[result.candidates[levels].sum(axis=1) == heights["height"].max()]
    assert math.isclose(heights["il"].iloc[-1], top["il"].mean())
    assert not list(tmp_path.glob(".partial-*"))
    page = (target / "report.html").read_text(encoding="utf-8")
    # a privacy officer's reading: a verdict first, each measure with range and direction,
    # no scientific notation, the queried diagnosis and the midpoint effect explained
    assert page.index("Verdict:") < page.index("<h2>")
    assert "lower is better" in page and "lower is safer" in page and "0 to 3" in page
    assert not re.findall(r"<td>[^<]*\de[-+]\d[^<]*</td>", page)  # tables: plain numbers
    assert "most frequent one" in page and "midpoint" in page


def test_evaluation_from_the_count_table_equals_the_rows(tmp_path, nps_config,
                                                          nps_sample) -> None:
    """The release flow evaluates from its count table instead of reading the input again:
    every figure must be what the rows give, and a table that does not describe the rows
    (rows dropped, or bounded per patient) is refused so the file is read instead."""
    import dataclasses
    import json

    from medrelease.data.aggregate import aggregate
    from medrelease.evidence.evaluation import InputRows, evaluate_release
    from medrelease.release import release

    rows = nps_sample.head(6000)
    result = release(rows, nps_config, mechanism="ipa", seed=5)
    folder = tmp_path / "rel"
    folder.mkdir()
    result.table.to_parquet(folder / "data.parquet")
    (folder / "manifest.json").write_text(json.dumps({
        "dataset": "nps-sample", "release_id": "r1", "mechanism": "ipa",
        "guarantee": {"statement": "s"}, "test_release": True, "budget_steps": [],
        "released_rows": len(result.table)}))
    counts = aggregate(rows, nps_config)
    given = InputRows.from_counts(counts, nps_config)
    assert given is not None and given.n_rows == len(rows) and len(given.table) < len(rows)
    from_rows = evaluate_release(folder, rows, nps_config)
    from_counts = evaluate_release(folder, given, nps_config)
    pd.testing.assert_frame_equal(from_counts.queries, from_rows.queries)
    assert from_counts.query_summary == from_rows.query_summary
    assert from_counts.risk_input == from_rows.risk_input
    assert from_counts.input_rows == len(rows)
    assert InputRows.from_counts(dataclasses.replace(counts, dropped_rows=3), nps_config) is None
    assert InputRows.from_counts(dataclasses.replace(counts, unit_bound=object()),
                                 nps_config) is None


@pytest.mark.parametrize("mechanism", ["ipa", "pseudonymize"])
def test_the_evaluations_accuracy_is_measure_accuracys_whatever_runs_beside_it(
        tmp_path, nps_config, nps_sample, mechanism) -> None:
    """The evaluation measures the workload on a second thread and the informative column
    beside its other sections: the accuracy it reports is ``measure_accuracy``'s on one
    thread, field for field (what does not apply, and in which order, included)."""
    import json

    from medrelease.evidence.evaluation import InputRows, _released_rows, evaluate_release
    from medrelease.evidence.research import measure_accuracy
    from medrelease.mechanisms import capabilities
    from medrelease.release import release

    rows = nps_sample.head(5000)
    result = release(rows, nps_config, mechanism=mechanism, seed=7,
                     key=b"evaluation-test-key-0123456789abcdef")
    folder = _release_folder(tmp_path / "rel", result, "nps-sample", mechanism)
    caps, given = capabilities(mechanism), InputRows(rows)
    alone = measure_accuracy(given.table, given.weights, _released_rows(folder), nps_config,
                             comparable=caps.raw_values, loss_reason=caps.loss_reason)
    reported = evaluate_release(folder, given, nps_config).accuracy
    # as JSON text: the same keys in the same order, and a rate not defined (NaN) on both sides
    assert json.dumps(reported) == json.dumps(alone.as_json())
    assert (reported["workload"] is None) == (mechanism == "pseudonymize")


def test_the_evaluation_measures_its_informative_half_while_the_workload_half_runs(
        tmp_path, nps_config, nps_sample, monkeypatch) -> None:
    """The two halves of the accuracy overlap: this thread measures the informative column
    before it waits for the workload thread (waiting first left one core idle for the
    informative half, 0.3-0.4 s of every evaluation at 1,361,000 rows). Here the workload half
    only finishes once the informative half has started: in the wrong order the evaluation
    would wait for it, and the workload half gives up after a few seconds."""
    import threading

    from medrelease.evidence import evaluation
    from medrelease.release import release

    rows = nps_sample.head(2000)
    result = release(rows, nps_config, mechanism="ipa", seed=7)
    folder = _release_folder(tmp_path / "rel", result, "nps-sample", "ipa")
    informative_started = threading.Event()
    workload, informative = evaluation.workload_accuracy, evaluation.informative_accuracy

    def workload_after_informative(*args, **kwargs):
        measured = workload(*args, **kwargs)
        assert informative_started.wait(timeout=5), \
            "the evaluation waited for the workload half before measuring its informative half"
        return measured

    def informative_marked(*args, **kwargs):
        informative_started.set()
        return informative(*args, **kwargs)

    monkeypatch.setattr(evaluation, "workload_accuracy", workload_after_informative)
    monkeypatch.setattr(evaluation, "informative_accuracy", informative_marked)
    reported = evaluation.evaluate_release(folder, evaluation.InputRows(rows), nps_config)
    assert reported.accuracy["workload"] and reported.accuracy["informative"]


def _release_folder(folder: Path, result, dataset: str, mechanism: str, details=None) -> Path:
    import json

    folder.mkdir()
    result.table.to_parquet(folder / "data.parquet")
    (folder / "manifest.json").write_text(json.dumps({
        "dataset": dataset, "release_id": "r2", "mechanism": mechanism,
        "guarantee": {"statement": result.guarantee.statement()}, "test_release": True,
        "budget_steps": [s.__dict__ for s in result.budget_steps],
        "released_rows": len(result.table), "mechanism_details": details or {}}))
    return folder


@pytest.mark.slow
def test_classification_evidence_for_a_diffgen_release(tmp_path) -> None:
    from medrelease.data.config import find_config
    from medrelease.data.input_schema import validate_input
    from medrelease.evidence.evaluation import evaluate_release
    from medrelease.evidence.report_html import write_report
    from medrelease.release import release
    from medrelease.storage.io import read_input

    config = find_config("adult")
    frame = validate_input(read_input(config), config).head(4000)
    result = release(frame, config, mechanism="diffgen",
                     params={"epsilon": 2.0, "specializations": 6}, seed=2)
    details = {"cut": result.details["cut"]}
    folder = _release_folder(tmp_path / "rel", result, "adult", "diffgen", details)
    evaluation = evaluate_release(folder, frame, config)
    scores = evaluation.classification
    assert set(scores) == {"LA", "BA tree", "BA forest", "CA tree", "CA forest"}
    assert all(0.0 <= s["accuracy"] <= 1.0 for s in scores.values())
    assert scores["BA tree"]["accuracy"] > scores["LA"]["accuracy"]
    gain = evaluation.information_gain.set_index("attribute")
    direct = information_gain(frame, "salary-class", ["sex"])["sex"]
    assert gain.loc["sex", "before"] == pytest.approx(direct)
    page = check_report(write_report(evaluation, tmp_path / "ev") / "report.html")
    assert "plots/classification.svg" in page.sources
    assert "plots/information_gain.svg" in page.sources
