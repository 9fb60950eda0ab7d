"""The review gate reads only what is published (issue 53): a decision taken on it is
post-processing of the release, so the guarantee holds whatever the reviewer decides.

A reviewer shown the steward's raw-data evaluation chooses which noisy run gets published
with the true data (docs/PRIVACY.md, "What the review may look at"). Here: two neighbouring
inputs that gave the same DP outputs (the same staged release) get the same review text and
the same publication verdict, although their raw-data evaluations differ, and the review text
holds no raw-data figure. Then the run's final state is named after the verdict."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from flows.review import RAW_EVALUATION_NOTE, summary_of
from medrelease.data.config import find_config
from medrelease.evidence.research import measure_accuracy
from medrelease.evidence.verdict import publication_verdict
from medrelease.privacy.publication import PublishResult
from medrelease.release import release

from ..conftest import ROOT

ROWS = 1500


def _neighbours() -> tuple[pd.DataFrame, pd.DataFrame]:
    """D and D' = D plus one row (a rare diagnosis of the declared domain)."""
    frame = pd.read_csv(ROOT / "datasets/nps-sample/nps_sample.csv", dtype=str, nrows=ROWS)
    counts = frame["diagnosis"].value_counts()
    added = frame.iloc[[0]].assign(diagnosis=counts.index[-1])
    return frame, pd.concat([frame, added], ignore_index=True)


def _staged(config, released: pd.DataFrame, folder: Path) -> PublishResult:
    """The staged release both runs produced: the same released rows, the same manifest (its
    public parameters, the mechanism's outputs and the verdict computed from them)."""
    facts = {"mechanism": "histogram", "columns": {c: {} for c in released.columns},
             "chosen_node": {"age": 3, "sex": 0, "length_of_stay": 1, "surgery": 0,
                             "region": 2},
             "mechanism_details": {}, "error_bars": {"level": 0.95}, "parameters": {}}
    manifest = {**facts, "dataset": config.name, "release_id": "20261129T000000Z-histogram-"
                "0123abcd", "test_release": False, "epsilon_spent": 1.0,
                "released_rows": len(released),
                "guarantee": {"statement": "(epsilon=1, delta=0)-differential privacy"},
                "lifetime": {"statement": "epsilon 1 of 10 spent on source 'nps-sample'"}}
    manifest["verdict"] = publication_verdict(manifest, released, config).as_dict()
    return PublishResult(manifest["release_id"], str(folder), manifest, {}, False)


def test_the_review_text_and_the_verdict_are_the_same_for_neighbouring_inputs(
        tmp_path: Path) -> None:
    config = find_config("nps-sample")
    without, with_one = _neighbours()
    # the DP outputs both runs gave (one draw, standing for the same outcome on either input)
    released = release(without, config, "histogram", {"epsilon": 1.0}, seed=11).table
    staged = _staged(config, released, tmp_path / "staged")

    evaluations = []
    for side, frame in (("without", without), ("with", with_one)):
        accuracy = measure_accuracy(frame, None, released, config).as_json()
        evaluations.append({**accuracy, "report": str(tmp_path / side / "report.html")})
    assert evaluations[0] != evaluations[1]  # the raw-data evaluations tell the inputs apart

    # the verdict is computed from the staged release alone: once per side, identical
    verdicts = [publication_verdict(staged.manifest, released, config).as_dict()
                for _ in evaluations]
    assert verdicts[0] == verdicts[1] == staged.manifest["verdict"]

    summaries = [summary_of(staged, evaluated, 24.0) for evaluated in evaluations]
    assert summaries[0] == summaries[1]
    texts = [s.markdown() for s in summaries]
    assert texts[0] == texts[1]
    text = texts[0]
    assert f"**Publication verdict: {verdicts[0]['level']}**" in text
    assert RAW_EVALUATION_NOTE in text
    for evaluated in evaluations:  # no raw-data figure, warning or evidence path
        assert evaluated["report"] not in text
        for line in [evaluated.get("verdict"), evaluated.get("log_verdict"),
                     *(evaluated.get("warnings") or []), *(evaluated.get("log_warnings") or [])]:
            assert not line or line not in text, line
    for words in ("2-way error", "TVD", "input count", "accuracy", "evidence report"):
        assert words not in text, words


@pytest.mark.usefixtures("prefect_harness")
def test_the_final_state_is_named_after_the_publication_verdict(tmp_path: Path,
                                                                monkeypatch) -> None:
    from prefect import flow

    from flows.release import ReleaseRequest, release_flow
    from flows.states import PUBLISHED, PUBLISHED_WITH_WARNINGS, published

    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    state = release_flow(ReleaseRequest(mechanism={"mechanism": "histogram", "epsilon": 1.0},
                                        seed=3, evaluate=False), return_state=True)
    result = state.result()
    verdict = result["manifest"]["verdict"]
    assert state.is_completed()
    assert state.name == (PUBLISHED if verdict["level"] == "fit" else PUBLISHED_WITH_WARNINGS)
    assert state.message.startswith("Published: ")
    assert f"publication verdict: {verdict['headline']}" in state.message

    @flow(name="verdict-state-names")
    def named(levels: list[str]) -> list[tuple[str, str]]:
        states = [published("http://portal/r", {"level": level, "headline": f"{level}: x"},
                            ["2-way error 0.01"], {}) for level in levels]
        return [(s.name, s.message) for s in states]

    fit, care, not_fit = named(["fit", "use with care", "not fit"])
    assert (fit[0], care[0], not_fit[0]) == (PUBLISHED, PUBLISHED_WITH_WARNINGS,
                                             PUBLISHED_WITH_WARNINGS)
    # the verdict first, the steward's raw-data evaluation after it, labelled
    assert care[1] == ("Published: http://portal/r — publication verdict: use with care: x; "
                       "steward's raw-data evaluation: 2-way error 0.01")
