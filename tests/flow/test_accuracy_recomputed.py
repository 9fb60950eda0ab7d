"""The accuracy a release reports is the accuracy of what it published (issue 35).

For Adult and the NPS-like sample and for ``aim``, ``ipa``, ``histogram`` and ``kanon``: a
release through the flow writes ``evaluation.json``; its ``accuracy.workload.mean_2way`` and
``mean_3way`` must equal a recomputation from the files alone — the input extract read again
and the published ``data.parquet`` — with the yardstick of ``medrelease/evidence/workload.py``.
Extracts are cut to 1,500 rows and ``aim`` runs few, short rounds: the test is about the
evidence's wiring, not about the mechanisms' accuracy (``benchmarks/peers.py`` measures that).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from flows.release import ReleaseRequest, release_flow
from medrelease.data.aggregate import prepare_table
from medrelease.data.config import load_config
from medrelease.evidence.workload import Yardstick

from ..conftest import ROOT

pytestmark = pytest.mark.usefixtures("prefect_harness")

ROWS = 1500
FAST_AIM = {"rounds_per_column": 1, "iters": 50, "final_iters": 50, "max_model_size": 1.0}
DATASETS = {"nps": "nps-sample", "adult": "adult-ipa"}


def _config_copy(folder: Path, dataset: str) -> Path:
    """The bundled config on the first ``ROWS`` rows, every mechanism allowed (scratch data)."""
    source = ROOT / "datasets" / dataset / "dataset.yaml"
    spec = yaml.safe_load(source.read_text())
    config = load_config(source)
    for column in spec["columns"].values():
        if "taxonomy" in column:
            column["taxonomy"] = str((source.parent / column["taxonomy"]).resolve())
        if "domain" in column:  # a domain file lies beside its config
            shutil.copy(source.parent / column["domain"], folder)
    extract = folder / f"{dataset}.csv"
    delimiter = spec.get("input", {}).get("delimiter", ",")
    pd.read_csv(config.input_path, sep=delimiter, dtype=str).head(ROWS).to_csv(
        extract, sep=delimiter, index=False)
    spec.update(name=f"{dataset}-cut", input={**spec["input"], "path": str(extract)},
                privacy={"lifetime_epsilon": 100.0, "lifetime_delta": 1e-3},
                policy={"mechanisms": ["aim", "ipa", "histogram", "kanon"],
                        "allow_unproven": True, "max_epsilon": 5.0})
    path = folder / f"{dataset}-cut.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _recomputed(config_path: Path, folder: Path) -> tuple[float, float]:
    """Mean TVD of the 2- and 3-way marginals, from the extract and the published rows only."""
    config = load_config(config_path)
    from medrelease.storage.io import read_input

    frame = prepare_table(read_input(config), config, include_class=True)
    released = pd.read_parquet(next(folder.glob("*data.parquet")))
    columns = [c for c in config.dimensions + config.informative if c in released.columns]
    taxonomies = {c: config.taxonomies[c] if c in config.dimensions else None for c in columns}
    domains = ({config.informative[0]: config.informative_domain}
               if config.informative_domain else None)
    yardstick = Yardstick.from_rows(frame[columns], released[columns], taxonomies,
                                    domains=domains)
    by_size: dict[int, list[float]] = {2: [], 3: []}
    for combo, tvd in yardstick.marginals(max_way=3).items():
        if len(combo) in by_size:
            by_size[len(combo)].append(tvd)
    return (sum(by_size[2]) / len(by_size[2]), sum(by_size[3]) / len(by_size[3]))


@pytest.mark.parametrize("mechanism", ["aim", "ipa", "histogram", "kanon"])
@pytest.mark.parametrize("table", ["nps", "adult"])
def test_reported_workload_error_is_that_of_the_published_rows(
        table: str, mechanism: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    config_path = _config_copy(tmp_path, DATASETS[table])
    parameters = FAST_AIM if mechanism == "aim" else {}
    result = release_flow(ReleaseRequest(dataset=str(config_path), mechanism=mechanism,
                                         seed=11, parameters=parameters,
                                         void_lifetime_guarantee=True))
    evaluation = json.loads((Path(result["evaluation"]).parent / "evaluation.json").read_text())
    workload = evaluation["accuracy"]["workload"]
    two, three = _recomputed(config_path, Path(result["path"]))
    assert workload["mean_2way"] == pytest.approx(two, abs=1e-9)
    assert workload["mean_3way"] == pytest.approx(three, abs=1e-9)
    assert 0.0 <= two <= 1.0 and 0.0 <= three <= 1.0
    # the flow's summary and the CLI read the same verdict
    assert result["accuracy"]["verdict"] == evaluation["accuracy"]["verdict"]
    assert f"2-way error {workload['mean_2way']:.3f}" in result["accuracy"]["verdict"]
    shutil.rmtree(tmp_path / "home", ignore_errors=True)
