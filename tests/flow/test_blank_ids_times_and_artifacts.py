"""Issue 36, the small holds: blank-looking unit ids (case 17), the published files' times
(case 18) and raw values in artifacts (case 19)."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest
import yaml

from flows.release import ReleaseRequest, release_flow
from medrelease.privacy.ledger import Ledger

from ..conftest import PAPER_TABLE_5, write_paper_dataset
from .test_content_identity import _dataset, _published, _spends

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture
def home(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture(scope="module")
def rows() -> pd.DataFrame:
    from .test_content_identity import SAMPLE

    return pd.read_csv(SAMPLE / "nps_sample.csv", dtype=str, nrows=3000)


# -- case 17: a unit id must name someone ----------------------------------------------------

def test_blank_looking_unit_ids_are_refused_with_column_and_rows_only(
        home: Path, tmp_path: Path, rows: pd.DataFrame) -> None:
    """Before: "   " and "NaN" were accepted as patients (each a "unit" of its own rows, so
    the unit's bound did not hold). Now refused before any spend, naming the column, how many
    rows and where, and no value."""
    config = _dataset(tmp_path / "units", "units", "units")
    spec = yaml.safe_load(config.read_text())
    spec["columns"]["patient_id"] = {"role": "identifier"}
    spec["privacy"].update(unit="patient_id", max_rows_per_unit=2)
    config.write_text(yaml.safe_dump(spec))
    blank = rows.copy()
    blank.loc[[10, 20, 30], "patient_id"] = ["   ", "NaN", " null "]
    blank.to_csv(tmp_path / "units" / "extract.csv", index=False)
    state = release_flow(ReleaseRequest(dataset=str(config), evaluate=False), return_state=True)
    assert state.name == "Refused", state.message
    message = state.message
    assert "column 'patient_id': 3 distinct value(s) look blank" in message
    assert "in 3 row(s), first at file line" in message
    assert "'   '" not in message and "'NaN'" not in message and "null " not in message
    assert _spends(home) == 0 and not _published(home, "units")


# -- case 18: the published files carry the release's day -----------------------------------

def test_published_files_carry_the_release_day_not_when_they_were_written(
        home: Path, tmp_path: Path, rows: pd.DataFrame) -> None:
    """Before: each file's nanosecond mtime was when it was written, which with the request
    time in the release id tells the run's duration. Now every file, the release folder and
    its dataset folder carry midnight UTC of the release's (request's) day."""
    config = _dataset(tmp_path / "times", "times", "times", rows)
    result = release_flow(ReleaseRequest(dataset=str(config), evaluate=False))
    stamp = result["release_id"].split("-")[0]  # 20261125T192512Z
    day = datetime.strptime(stamp[:8], "%Y%m%d").replace(tzinfo=UTC)
    folder = Path(result["path"])
    paths = [folder, folder.parent, *folder.rglob("*")]
    assert len(paths) > 4
    for path in paths:
        # (access times follow every read, this test's included: they say nothing of the run)
        assert os.stat(path).st_mtime_ns == int(day.timestamp()) * 10**9, path.name


# -- case 19: raw values are inert in every artifact -----------------------------------------

PAYLOAD = "<img src=x onerror=alert(1)>"


def test_a_raw_value_with_html_is_escaped_in_every_artifact(home: Path, tmp_path: Path) -> None:
    """Before: a diagnosis written as an <img> tag, named in the accuracy warning, reached
    three markdown artifacts (release summary, accuracy, evaluation) as a live element. Now no
    artifact (data or description) holds a tag; the value is shown escaped."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    (tmp_path / "ds").mkdir()
    config = write_paper_dataset(tmp_path / "ds")
    table = pd.concat([PAPER_TABLE_5] * 30, ignore_index=True)
    table.loc[::3, "Disease"] = PAYLOAD
    table.to_csv(tmp_path / "ds" / "table5.csv", index=False)
    result = release_flow(ReleaseRequest(dataset=str(config), mechanism="ipa"))
    assert result["flow_run_id"]
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[result["flow_run_id"]])))
    texts = {f"{a.key}/{a.type}": f"{a.data} {a.description}" for a in found}
    assert len(texts) >= 5
    live = [name for name, text in texts.items() if "<img" in text or "<" in text]
    assert not live, live
    assert any("&lt;img src=x onerror=alert(1)&gt;" in text for text in texts.values())
    assert Ledger(home / "ledger.sqlite").spends()  # it was released (and charged) normally
