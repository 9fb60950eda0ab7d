"""The release flow on Prefect's test harness: success, bad input, over budget, failures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.release import ReleaseRequest, release_flow
from medrelease.errors import BudgetExceededError, InputValidationError
from medrelease.privacy.ledger import Ledger
from medrelease.storage.links import release_link
from medrelease.storage.manifest_model import PublicManifest, StewardRecord
from medrelease.storage.store import StoreError
from tests.unit.test_evaluation import check_report

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture
def home(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path))
    return tmp_path


def _spends(home: Path) -> list:
    return Ledger(home / "ledger.sqlite").spends()


def _release_dirs(home: Path) -> list[Path]:
    """Folders in either store (publishable or test)."""
    return [p for name in ("releases", "test-releases") if (home / name).exists()
            for p in (home / name).rglob("*") if p.is_dir()]


def test_full_run_publishes_release_and_ledger(home: Path) -> None:
    # ipa named: the lattice, its risk figures and the IPA paper's queries (the sample's default
    # is aim, tested in tests/flow/test_registry.py)
    result = release_flow(ReleaseRequest(batch_size=64, mechanism="ipa"))
    folder = Path(result["path"])
    assert folder.parent == home / "releases" / "nps-sample"
    assert {p.name for p in folder.iterdir()} == {"data.parquet", "data.csv", "manifest.json",
                                                  "report.md", "intervals.csv"}
    manifest = PublicManifest(**json.loads((folder / "manifest.json").read_text()))
    assert manifest.mechanism == "ipa" and manifest.guarantee.proven
    assert manifest.epsilon_spent == pytest.approx(1.0)
    assert not manifest.test_release and "for publication" in manifest.seed_policy
    assert manifest.checks.passed and manifest.lifetime.source == "nps-sample"
    assert "patient_id" not in (folder / "data.csv").read_text().splitlines()[0]
    record = StewardRecord(**result["record"])
    steward = home / "steward" / "nps-sample" / manifest.release_id
    assert record.flow_run_id == result["flow_run_id"] and record.status == "published"
    assert record.input_rows == 20_000 and record.published_path == str(folder)
    assert {"record.json", "candidates.csv", "checks.json"} <= {p.name for p in
                                                                steward.iterdir()}
    [spend] = _spends(home)
    assert spend.status == "released" and spend.release_id == manifest.release_id
    assert spend.flow_run_id == result["flow_run_id"] and not spend.test
    # The evaluation (internal evidence) ran at the end, beside the steward record.
    report = Path(result["evaluation"])
    assert report.is_relative_to(steward) and not report.is_relative_to(home / "releases")
    page = check_report(report)
    assert "Analysis queries (IPA paper)" in page.headings
    evaluation = json.loads((report.parent / "evaluation.json").read_text())
    assert evaluation["release_id"] == manifest.release_id
    assert evaluation["risk_release"]["k_achieved"] == manifest.risk["k_achieved"]


def test_one_task_per_node_and_paper_mechanism(home: Path) -> None:
    request = ReleaseRequest(seed=2, batch_size=1, void_lifetime_guarantee=True,
                             mechanism={"mechanism": "ipa-paper", "epsilon": 0.5})
    result = release_flow(request)
    manifest = result["manifest"]
    assert manifest["guarantee"]["proven"] is False
    assert "formal guarantee not upheld" in manifest["guarantee"]["label"]
    assert "FORMAL GUARANTEE NOT UPHELD" in (Path(result["path"]) / "report.md").read_text()
    assert manifest["released_rows"] >= result["record"]["input_rows"]


BAD_INPUTS = {
    "uncovered": ("patient_id,age,sex,length_of_stay,surgery,region,diagnosis\n"
                  "1,34,F,3,N,11,A001\n2,34,F,3,N,77,A001\n",
                  r"column 'region': 1 distinct value\(s\) are not covered.*file line 3"),
    "wrong type": ("patient_id,age,sex,length_of_stay,surgery,region,diagnosis\n"
                   "1,34,F,three,N,11,A001\n",
                   "column 'length_of_stay': 1 distinct value\\(s\\) are not whole numbers.*file line 2"),
    "empty table": ("patient_id,age,sex,length_of_stay,surgery,region,diagnosis\n",
                    "no data rows"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_fails_before_any_spend(home: Path, case: str) -> None:
    text, message = BAD_INPUTS[case]
    path = home / "extract.csv"
    path.write_text(text)
    with pytest.raises(InputValidationError, match=f"(?s){message}"):
        release_flow(ReleaseRequest(input_path=str(path), seed=3))
    assert _spends(home) == []
    assert _release_dirs(home) == []


def test_over_budget_is_refused_before_noise(home: Path) -> None:
    from medrelease.privacy.ledger import SpendRequest

    ledger = Ledger(home / "ledger.sqlite")
    ledger.reserve(SpendRequest("nps-sample", "nps-sample", "ipa", 9.5, 0.0, 10.0, 1e-4))
    with pytest.raises(BudgetExceededError, match=r"spent 9.5 \+ requested 1 > total 10"):
        release_flow(ReleaseRequest(seed=4))
    assert len(_spends(home)) == 1
    assert _release_dirs(home) == []


def test_budget_and_catalogue_artifacts_after_a_release_and_after_a_refusal(home: Path) -> None:
    """A steward sees spent / left and the releases in the UI, refused runs included."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    from medrelease.privacy.ledger import SpendRequest

    released = release_flow(ReleaseRequest(seed=4, mechanism="ipa", evaluate=False))  # (fast)
    Ledger(home / "ledger.sqlite").reserve(
        SpendRequest("nps-sample", "nps-sample", "ipa", 8.5, 0.0, 10.0, 1e-4))
    refusal = release_flow(ReleaseRequest(seed=5, mechanism="ipa", evaluate=False),
                           return_state=True)
    assert refusal.name == "Refused" and "requested 1 > total 10" in refusal.message

    def artifacts(flow_run_id) -> dict:
        with get_client(sync_client=True) as client:
            found = client.read_artifacts(artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
        return {a.key: a for a in found}

    first = artifacts(released["flow_run_id"])
    assert "left after this release on source `nps-sample`: epsilon 9 of 10" in \
        first["nps-sample-release-summary"].data
    catalogue = first["nps-sample-releases"].data  # a list, each release a portal link
    assert f"`{released['release_id']}`" in catalogue
    assert f"]({release_link('nps-sample', released['release_id'])})" in catalogue
    assert "file://" not in catalogue  # opens nothing from a browser (issue 39)
    assert "differential privacy" in catalogue
    after_refusal = artifacts(refusal.state_details.flow_run_id)
    budget = after_refusal["nps-sample-budget"].data
    assert "| epsilon | 9.5 | 10 | 0.5 |" in budget and released["release_id"] in budget


@pytest.mark.parametrize("where", ["scoring", "publish"])
def test_failure_after_charge_keeps_reservation_and_publishes_nothing(
    home: Path, monkeypatch, where: str
) -> None:
    if where == "scoring":
        import tasks.lattice

        def broken(*args, **kwargs):
            raise RuntimeError("worker lost")

        monkeypatch.setattr(tasks.lattice, "score_node_piece", broken)
        expected: type[Exception] = RuntimeError
    else:
        import medrelease.storage.store

        def disk_full(path, data):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(medrelease.storage.store, "_write_json", disk_full)
        expected = StoreError
    with pytest.raises(expected):  # ipa: its lattice scoring is what breaks
        release_flow(ReleaseRequest(seed=5, mechanism="ipa"))
    [spend] = _spends(home)
    assert spend.status == "failed" and spend.epsilon == 1.0
    assert Ledger(home / "ledger.sqlite").state("nps-sample", 10, 1e-4).epsilon_spent == 1.0
    leftovers = [p for p in _release_dirs(home) if p.name != "nps-sample"]
    assert leftovers == []


@pytest.mark.parametrize(("options", "label"), [
    ({"mechanism": "kanon", "k": 10, "max_suppression": 0.05}, "no differential privacy"),
    ({"mechanism": "histogram", "epsilon": 0.5}, "epsilon-DP"),
])
def test_baseline_mechanisms_through_the_flow(home: Path, options: dict, label: str) -> None:
    result = release_flow(ReleaseRequest(seed=8, mechanism=options, void_lifetime_guarantee=True))
    manifest = result["manifest"]
    assert label in manifest["guarantee"]["label"]
    assert manifest["checks"]["passed"]
    [spend] = _spends(home)
    assert spend.epsilon == manifest["epsilon_spent"] == options.get("epsilon", 0.0)


def test_pseudonymization_key_never_reaches_any_output(home: Path, monkeypatch, caplog) -> None:
    key = "k3y-" + "7f1e" * 8
    monkeypatch.setenv("MEDRELEASE_PSEUDONYM_KEY", key)
    caplog.set_level("DEBUG")
    result = release_flow(ReleaseRequest(seed=9, mechanism={"mechanism": "pseudonymize"},
                                     void_lifetime_guarantee=True))
    assert "no formal privacy guarantee" in result["manifest"]["guarantee"]["label"]
    outputs = [p for p in home.rglob("*") if p.is_file()]
    assert any(p.name == "TEST-data.csv" for p in outputs)
    for path in outputs:
        data = path.read_bytes()
        assert key.encode() not in data and key.encode().hex().encode() not in data, path
    assert key not in caplog.text
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[result["flow_run_id"]])))
        run = client.read_flow_run(result["flow_run_id"])
    assert artifacts and all(key not in str(a.data) + str(a.description) for a in artifacts)
    assert key not in str(run.parameters)
    evaluation = json.loads((Path(result["evaluation"]).parent / "evaluation.json").read_text())
    attack = evaluation["frequency_attack"]["records_reidentified_share"]
    assert 0.0 < attack <= 1.0
    # pseudonymization keeps every row unique that was unique
    assert evaluation["risk_release"]["unique_row_share"] == evaluation["risk_input"][
        "unique_row_share"]


def test_pseudonymization_without_key_is_refused_and_counted(home: Path, monkeypatch) -> None:
    monkeypatch.delenv("MEDRELEASE_PSEUDONYM_KEY", raising=False)
    with pytest.raises(Exception, match="needs a key"):
        release_flow(ReleaseRequest(seed=9, mechanism={"mechanism": "pseudonymize"},
                                     void_lifetime_guarantee=True))
    assert _release_dirs(home) == []


@pytest.mark.parametrize(("epsilon", "error", "message"), [
    (0.0, "ParameterError", "epsilon must be a positive"),
    (-1.0, "ParameterError", "epsilon must be a positive"),
    (float("nan"), "ParameterError", "epsilon must be a positive"),
    (1e6, "ParameterError", r"1e\+06 is above 100, the product.s bound"),
    (1e-300, "ParameterError", r"below 9\.5"),
])
def test_bad_budgets_are_refused_before_any_spend(home: Path, epsilon, error, message) -> None:
    with pytest.raises(Exception, match=message) as err:
        release_flow(ReleaseRequest(seed=1, mechanism={"mechanism": "ipa", "epsilon": epsilon}))
    assert type(err.value).__name__ == error
    assert _spends(home) == [] and _release_dirs(home) == []


def test_malformed_config_and_one_row_table(home: Path) -> None:
    from medrelease.errors import ConfigError

    bad = home / "bad.yaml"
    bad.write_text("name: Bad Name!\ncolumns: {}\n")
    with pytest.raises(ConfigError, match=r"(?s)name.*lower-case.*privacy"):
        release_flow(ReleaseRequest(dataset=str(bad)))
    one = home / "one.csv"
    one.write_text("patient_id,age,sex,length_of_stay,surgery,region,diagnosis\n"
                   "1,34,F,3,N,11,A001\n")
    result = release_flow(ReleaseRequest(input_path=str(one), seed=2, mechanism="ipa"))
    # ipa cannot show a single person: no cell reaches its threshold.
    assert result["manifest"]["released_rows"] == 0
    assert result["manifest"]["checks"]["passed"]


MIMIC = Path(__file__).resolve().parents[3] / "shared" / "data" / "mimic-iii-demo"


@pytest.mark.skipif(not MIMIC.is_dir(), reason="MIMIC-III demo not beside the checkout")
def test_mimic_set_valued_diffgen_through_the_flow(home: Path) -> None:
    from medrelease.data.mimic import write_admissions

    extract = home / "admissions.csv"
    write_admissions(MIMIC, extract)
    with pytest.raises(Exception, match="cannot release set-valued"):
        release_flow(ReleaseRequest(dataset="mimic-demo", input_path=str(extract), seed=1,
                                    mechanism={"mechanism": "ipa"}))
    assert _spends(home) == []
    result = release_flow(ReleaseRequest(
        dataset="mimic-demo", input_path=str(extract), seed=2,
        mechanism={"mechanism": "diffgen", "epsilon": 1.0, "specializations": 5}))
    manifest = result["manifest"]
    # patient level: 100 patients, each cut to at most 2 of their 129 admissions (114 kept)
    assert manifest["checks"]["passed"] and result["record"]["input_rows"] == 114
    assert result["record"]["unit_bound"]["rows before the bound"] == 129
    assert manifest["guarantee"]["neighbouring"].startswith("add/remove one patient")
    assert "at most 2 admissions" in manifest["guarantee"]["neighbouring"]
    details = manifest["mechanism_details"]
    assert set(details) == {"leaf_partitions", "cut", "set_specializations", "budget_steps_drawn",
                            "unit_cut"}  # the rows the patient bound removed, a noisy count
    assert details["unit_cut"]["epsilon"] == pytest.approx(0.02)
    assert "each patient to at most 2 admissions" in details["unit_cut"]["statement"]
    assert set(details["budget_steps_drawn"].values()) == {"drawn"}
    assert "icd9_codes" in details["cut"]
    [spend] = _spends(home)
    assert spend.epsilon == manifest["epsilon_spent"] == 1.0
    released = Path(result["path"]) / "TEST-data.csv"
    header = released.read_text().splitlines()[0].split(",")
    assert header[-2:] == ["icd9_codes", "died_in_hospital"]
    assert "hadm_id" not in header and "subject_id" not in header


@pytest.fixture(scope="module")
def dask_scheduler(tmp_path_factory):
    """One Dask cluster (two single-threaded worker processes, as the flow's own local cluster)
    for the tests of what Dask workers compute: they reach it as a deployment names its
    scheduler (``MEDRELEASE_DASK_ADDRESS``) instead of starting a cluster each (10-15 s each on
    2 cores). The flow's own local cluster is started by the first test below. Its workers
    keep the environment they started with, as on a real deployment: the input folders the
    tests' extracts lie in are declared before they start (``steward_places``)."""
    from distributed import LocalCluster

    base = str(tmp_path_factory.getbasetemp())
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MEDRELEASE_DATASETS", base)
        patch.setenv("MEDRELEASE_INPUT_ROOTS", base)
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                               dashboard_address=None)
    with cluster:
        yield cluster.scheduler_address


@pytest.mark.xdist_group("dask")  # one worker: one shared cluster
def test_dask_runner_gives_the_same_release_as_threads(home: Path, tmp_path: Path) -> None:
    """Same seed, same release, whichever runner scores the lattice (a local Dask cluster)."""
    import pandas as pd

    extract = tmp_path / "small.csv"
    pd.read_csv(Path(__file__).resolve().parents[2] / "datasets/nps-sample/nps_sample.csv",
                nrows=3000).to_csv(extract, index=False)
    results = [release_flow(ReleaseRequest(input_path=str(extract), seed=5, batch_size=64,
                                           mechanism="ipa", task_runner=runner, evaluate=False))
               for runner in ("thread", "dask")]
    thread, dask = (pd.read_parquet(Path(r["path"]) / "TEST-data.parquet") for r in results)
    assert results[0]["manifest"]["chosen_node"] == results[1]["manifest"]["chosen_node"]
    assert thread.equals(dask)


def test_unreachable_dask_scheduler_fails_before_any_spend(home: Path, monkeypatch) -> None:
    from tasks.runners import RunnerUnavailableError

    monkeypatch.setenv("MEDRELEASE_DASK_ADDRESS", "tcp://127.0.0.1:9")  # deployment-level only
    monkeypatch.setenv("MEDRELEASE_DASK_CONNECT_TIMEOUT", "2s")
    with pytest.raises(RunnerUnavailableError, match="no budget was spent"):
        release_flow(ReleaseRequest(seed=1, mechanism="ipa", task_runner="dask", evaluate=False))
    assert _spends(home) == []
    assert _release_dirs(home) == []


def _partitions(folder: Path, rows: int = 3000, parts: int = 3) -> Path:
    """The first ``rows`` rows of the sample as one file and as ``parts`` files part-1.csv, ..."""
    import pandas as pd

    sample = pd.read_csv(Path(__file__).resolve().parents[2] /
                         "datasets/nps-sample/nps_sample.csv", nrows=rows, dtype=str)
    sample.to_csv(folder / "whole.csv", index=False)
    size = -(-rows // parts)
    for number in range(parts):
        sample.iloc[number * size:(number + 1) * size].to_csv(
            folder / f"part-{number + 1}.csv", index=False)
    return folder / "part-*.csv"


@pytest.mark.xdist_group("dask")
def test_dask_workers_aggregate_the_files_of_an_extract_to_the_same_release(
        home: Path, tmp_path: Path, dask_scheduler: str, monkeypatch) -> None:
    """An extract in three files, read and aggregated one file per Dask worker task, gives the
    count table, hence (same seed) the release, of the same rows in one file on threads."""
    import pandas as pd

    monkeypatch.setenv("MEDRELEASE_DASK_ADDRESS", dask_scheduler)

    pattern = _partitions(tmp_path)
    whole = release_flow(ReleaseRequest(input_path=str(tmp_path / "whole.csv"), seed=5,
                                        mechanism="ipa", batch_size=64, evaluate=False))
    parts = release_flow(ReleaseRequest(input_path=str(pattern), seed=5, batch_size=64,
                                        mechanism="ipa", task_runner="dask", evaluate=False))
    assert parts["record"]["input_rows"] == whole["record"]["input_rows"] == 3000
    assert parts["record"]["input_file"] == str(pattern)
    assert parts["manifest"]["chosen_node"] == whole["manifest"]["chosen_node"]
    one, three = (pd.read_parquet(Path(r["path"]) / "TEST-data.parquet") for r in (whole, parts))
    assert one.equals(three)


@pytest.mark.xdist_group("dask")
def test_a_bad_row_in_the_last_file_is_named_with_its_file_and_line_before_any_spend(
        home: Path, tmp_path: Path, dask_scheduler: str, monkeypatch) -> None:
    monkeypatch.setenv("MEDRELEASE_DASK_ADDRESS", dask_scheduler)
    pattern = _partitions(tmp_path)
    last = tmp_path / "part-3.csv"
    lines = last.read_text().splitlines()
    fields = lines[7].split(",")
    fields[1] = "not-an-age"
    lines[7] = ",".join(fields)
    last.write_text("\n".join(lines) + "\n")
    expected = r"(?s)in part-3\.csv: .*column .age.*first at file line 8"
    with pytest.raises(InputValidationError, match=expected):
        release_flow(ReleaseRequest(input_path=str(pattern), seed=5, task_runner="dask",
                                    evaluate=False))
    assert _spends(home) == []
    assert _release_dirs(home) == []


def test_a_mechanism_straying_from_its_declared_steps_publishes_nothing(home: Path,
                                                                        monkeypatch) -> None:
    """A declared step never drawn stops the run at the draw: no release folder, and the
    reservation stays counted (noise had been drawn)."""
    from medrelease.mechanisms.ipa import IPA
    from medrelease.privacy.guarantee import BudgetStep, StepAccountingError

    declared = IPA.budget_steps
    monkeypatch.setattr(IPA, "budget_steps", lambda self, params: [
        *declared(self, params), BudgetStep("forgotten", 0.0, 0.0, "ipa")])
    with pytest.raises(StepAccountingError, match="'forgotten' were neither drawn"):
        release_flow(ReleaseRequest(seed=2, mechanism="ipa", batch_size=64, evaluate=False))
    assert [p for p in _release_dirs(home) if p.name != "nps-sample"] == []
    [spend] = _spends(home)
    assert spend.status == "failed" and "StepAccountingError" in spend.note
