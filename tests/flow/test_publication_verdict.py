"""The publication verdict (issue 53, item 4): fit / use with care / not fit for the declared
analyses, computed from the published manifest fields, the released rows and the config's
public declarations — never the input — so that acting on it is post-processing.

Each rule on hand-made manifests and released frames; then one release through the flow whose
manifest carries the verdict, whose report opens with it and whose publication audit
recomputes it (and flags a verdict that is not the one its folder gives)."""

from __future__ import annotations

import asyncio
import html
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from medrelease.data.config import DatasetConfig, config_from_dict
from medrelease.evidence.verdict import (
    CARE,
    FIT,
    NOT_FIT,
    THRESHOLDS,
    publication_verdict,
)

from ..conftest import ROOT

STATUS = [str(v) for v in range(10)]  # the informative column's declared domain


def _config(folder: Path, analyses: list | None = None, impossible: list | None = None
            ) -> DatasetConfig:
    """rx (a1, a2 -> A; b1, b2 -> B; *), age 0-39 (bands of 10, then 20; *), status with a
    declared domain of 10 values."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rx.csv").write_text("a1;A;*\na2;A;*\nb1;B;*\nb2;B;*\n")
    (folder / "age.yaml").write_text("domain: {min: 0, max: 39}\nlevels:\n  - {width: 10}\n"
                                     "  - {width: 20}\n")
    (folder / "status.txt").write_text("\n".join(STATUS) + "\n")
    spec = {"name": "verdict-test", "input": {"path": "extract.csv"},
            "columns": {"rx": {"role": "dimension", "taxonomy": "rx.csv"},
                        "age": {"role": "dimension", "type": "integer",
                                "taxonomy": "age.yaml"},
                        "status": {"role": "informative", "domain": "status.txt"}},
            "privacy": {"lifetime_epsilon": 10.0},
            "analyses": [["rx", "status"], {"columns": ["age", "status"],
                                            "levels": {"age": 1}}]
            if analyses is None else analyses,
            "impossible": impossible or []}
    return config_from_dict(spec, folder)


def _manifest(mechanism: str = "ipa", node: dict | None = None, details: dict | None = None,
              bars: dict | None = None) -> dict:
    return {"mechanism": mechanism, "columns": {"rx": {}, "age": {}, "status": {}},
            "chosen_node": {"rx": 0, "age": 1} if node is None else node,
            "mechanism_details": details or {}, "error_bars": bars or {}, "parameters": {}}


def _rows(rx: list[str], age: list[str], status: list[str] | None = None) -> pd.DataFrame:
    """Released rows: every status value of the domain (unless given), 10 rows each."""
    status = STATUS if status is None else status
    n = 10 * len(status)
    return pd.DataFrame({"rx": [rx[i % len(rx)] for i in range(n)],
                         "age": [age[i % len(age)] for i in range(n)],
                         "status": [status[i % len(status)] for i in range(n)]})


def test_kept_at_the_declared_levels_is_fit(tmp_path: Path) -> None:
    config = _config(tmp_path)
    verdict = publication_verdict(_manifest(), _rows(["a1", "b2"], ["[0-9]", "[10-19]"]),
                                  config)
    assert verdict.level == FIT and verdict.headline.startswith("fit: every declared analysis")
    assert [a.status for a in verdict.analyses] == [FIT, FIT]
    served = verdict.as_dict()["analyses"][0]["served"]
    assert served == [{"column": "rx", "declared_level": 0, "released_level": 0, "how": "kept"},
                      {"column": "status", "declared_level": 0, "released_level": 0,
                       "how": "kept"}]
    json.dumps(verdict.as_dict())  # published: plain JSON
    assert verdict.as_dict()["thresholds"] == THRESHOLDS


def test_a_column_at_star_is_generalized_away_and_not_fit(tmp_path: Path) -> None:
    config = _config(tmp_path)
    verdict = publication_verdict(_manifest(node={"rx": 2, "age": 1}),
                                  _rows(["*"], ["[0-9]"]), config)
    rx_status, age_status = verdict.analyses
    assert rx_status.status == NOT_FIT and "rx generalized away" in rx_status.why
    assert age_status.status == FIT
    assert verdict.level == NOT_FIT
    assert "not fit for: rx × status (rx generalized away)" in verdict.headline
    # DiffGen: the level comes from its published cut
    diffgen = publication_verdict(_manifest("diffgen", node={}, details={
        "cut": {"rx": ["*"], "age": ["[0-19]", "[20-39]"]}}), _rows(["*"], ["[0-19]"]), config)
    assert [a.status for a in diffgen.analyses] == [NOT_FIT, CARE]
    assert "diagnosis" not in diffgen.headline and "generalized away" in diffgen.headline


def test_coarser_than_declared_is_use_with_care(tmp_path: Path) -> None:
    config = _config(tmp_path)
    verdict = publication_verdict(_manifest(node={"rx": 1, "age": 2}),
                                  _rows(["A", "B"], ["[0-19]", "[20-39]"]), config)
    assert verdict.level == CARE
    assert [a.why for a in verdict.analyses] == ["rx generalized to level 1, declared 0",
                                                 "age generalized to level 2, declared 1"]
    assert verdict.headline.startswith("use with care: rx × status: rx generalized to level 1")
    assert verdict.analyses[0].served[0].how == "coarser"


def test_rows_coarser_than_the_node_in_many_rows_are_use_with_care(tmp_path: Path) -> None:
    """ipa keeps rx at the node, but a fifth of its rows are pooled at (*, *, v)."""
    config = _config(tmp_path)
    rows = _rows(["a1", "a2", "b1", "b2", "*"], ["[0-9]", "[10-19]", "[20-29]", "[30-39]", "*"])
    verdict = publication_verdict(_manifest(), rows, config)
    rx_status = verdict.analyses[0]
    assert rx_status.status == CARE and "rx coarser than level 0 in 20% of the released" \
        in rx_status.why
    assert "age coarser than level 1 in 20%" in verdict.analyses[1].why


def test_declared_values_absent_from_the_release(tmp_path: Path) -> None:
    config = _config(tmp_path)
    few_absent = publication_verdict(_manifest(), _rows(["a1"], ["[0-9]"], STATUS[:8]), config)
    assert few_absent.level == CARE
    assert few_absent.headline == "use with care: status: 2 of 10 declared values not released"
    assert few_absent.as_dict()["domains"] == [{"column": "status", "declared": 10,
                                                "released": 8}]
    assert [a.status for a in few_absent.analyses] == [FIT, FIT]  # 20 %: not above 50 %
    most_absent = publication_verdict(_manifest(), _rows(["a1"], ["[0-9]"], STATUS[:4]), config)
    assert most_absent.level == NOT_FIT
    assert [a.status for a in most_absent.analyses] == [NOT_FIT, NOT_FIT]
    assert "status: 60% of its declared values not released" in most_absent.analyses[0].why
    assert "6 of 10 declared values not released" in most_absent.headline
    # A column in no declared analysis: only "use with care", however many are absent.
    alone = publication_verdict(_manifest(), _rows(["a1"], ["[0-9]"], STATUS[:4]),
                                _config(tmp_path / "none", analyses=[]))
    assert alone.level == CARE and alone.analyses == ()


def test_a_released_impossible_combination_is_not_fit(tmp_path: Path) -> None:
    config = _config(tmp_path, impossible=[{"when": {"rx": ["b2"], "status": ["0"]},
                                            "reason": "no b2 at status 0"}])
    clean = publication_verdict(_manifest(), _rows(["a1", "b1"], ["[0-9]"]), config)
    assert clean.level == FIT and clean.impossible_rows == 0
    rows = _rows(["a1", "b1"], ["[0-9]"])
    rows.loc[[0, 1, 2], ["rx", "status"]] = [["b2", "0"], ["b2", "0"], ["B", "0"]]
    hit = publication_verdict(_manifest(), rows, config)
    # B also stands for b1: a generalized label that covers a possible value is possible
    assert hit.impossible_rows == 2 and hit.level == NOT_FIT
    assert hit.headline.startswith("not fit: 2 released rows hold a declared impossible")


def test_no_declared_analysis_and_every_dimension_at_star(tmp_path: Path) -> None:
    config = _config(tmp_path, analyses=[])
    verdict = publication_verdict(_manifest(node={"rx": 2, "age": 3}), _rows(["*"], ["*"]),
                                  config)
    assert verdict.level == CARE and "every dimension generalized to '*'" in verdict.headline
    kept = publication_verdict(_manifest(), _rows(["a1"], ["[0-9]"]), config)
    assert kept.level == FIT and kept.headline == "fit: no declared analysis; nothing flagged"


def test_a_release_without_rows_is_not_fit(tmp_path: Path) -> None:
    empty = _rows(["a1"], ["[0-9]"]).iloc[:0]
    verdict = publication_verdict(_manifest(), empty, _config(tmp_path))
    assert verdict.level == NOT_FIT and verdict.headline.startswith("not fit: no rows released")
    assert all(a.status == NOT_FIT and "no rows released" in a.why for a in verdict.analyses)
    alone = publication_verdict(_manifest(), empty, _config(tmp_path / "none", analyses=[]))
    assert alone.level == NOT_FIT


def _aim_bars(lower_upper: list[tuple[int, int, int]], one_way: list[dict] | None = None
              ) -> dict:
    """aim's error bars for the analysis rx × status: cells (released, lower, upper)."""
    cells = [{"cell": [rx, s], "released": r, "measured": r, "lower": lo, "upper": hi}
             for (rx, s), (r, lo, hi) in zip([("a1", "0"), ("a1", "1"), ("b1", "0"),
                                               ("b1", "1")], lower_upper, strict=False)]
    return {"level": 0.95, "analyses": [{"name": "rx × status", "columns": ["rx", "status"],
                                         "levels": [0, 0], "sigma": 4.0, "level": 0.95,
                                         "holds": "per estimate", "cells": cells}],
            "one_way": one_way or []}


def _aim(config: DatasetConfig, bars: dict, details: dict | None = None):
    rows = _rows(["a1", "b1"], ["[0-9]"])
    return publication_verdict(_manifest("aim", node={}, bars=bars, details=details), rows,
                               config)


def test_aim_intervals_too_wide_drifting_rows_and_moved_one_way(tmp_path: Path) -> None:
    config = _config(tmp_path, analyses=[["rx", "status"]])
    # +-10 % around every released count: fit
    tight = _aim(config, _aim_bars([(100, 90, 110), (200, 180, 220), (50, 45, 55),
                                    (80, 72, 88)]))
    assert tight.level == FIT and tight.analyses[0].figures["median_relative_half_width"] \
        == pytest.approx(0.1)
    # +-30 %: use with care; +-80 %: not fit
    wide = _aim(config, _aim_bars([(100, 70, 130), (200, 140, 260), (50, 35, 65), (80, 56, 104)]))
    assert wide.analyses[0].status == CARE and "wide intervals (typical cell +-30%)" \
        in wide.analyses[0].why
    unreadable = _aim(config, _aim_bars([(100, 20, 180), (200, 40, 360), (50, 10, 90),
                                         (80, 16, 144)]))
    assert unreadable.level == NOT_FIT and "rx × status (intervals too wide)" \
        in unreadable.headline
    # the mass-weighted median: one large, tight cell outweighs three small, wide ones
    weighted = _aim(config, _aim_bars([(1000, 950, 1050), (10, 0, 30), (10, 0, 30),
                                       (10, 0, 30)]))
    assert weighted.analyses[0].status == FIT
    # a fifth of the rows in a cell whose released count is outside its interval: drift
    drift = _aim(config, _aim_bars([(100, 90, 110), (100, 120, 140), (200, 180, 220),
                                    (100, 90, 110)]))
    assert drift.analyses[0].status == CARE and "20% of its released rows lie in cells outside" \
        in drift.analyses[0].why
    assert drift.analyses[0].figures["mass_outside_interval"] == pytest.approx(0.2)
    moved = _aim(config, _aim_bars([(100, 90, 110)] * 4, one_way=[
        {"column": "status", "sigma": 3.0, "moved_tvd": 0.08, "noise_tvd": 0.01},
        {"column": "rx", "sigma": 3.0, "moved_tvd": 0.01, "noise_tvd": 0.01}]))
    assert moved.level == CARE
    assert moved.reasons == ("status: its 1-way distribution moved by TVD 0.080 from its "
                             "measurement (noise alone: 0.010)",)
    # a move no larger than the measurement's own noise explains: the rows are no worse
    noisy = _aim(config, _aim_bars([(100, 90, 110)] * 4, one_way=[
        {"column": "status", "sigma": 30.0, "moved_tvd": 0.08, "noise_tvd": 0.2}]))
    assert noisy.level == FIT
    clipped = _aim(config, _aim_bars([(100, 90, 110)] * 4), {"noisy_total_clipped": True})
    assert clipped.level == CARE and "synthetic-row ceiling" in clipped.headline


def test_aim_without_the_new_error_bars_says_nothing_about_them(tmp_path: Path) -> None:
    """Until aim publishes ``analyses`` and ``one_way`` in its error bars, no rule reads them."""
    config = _config(tmp_path, analyses=[["rx", "status"]])
    verdict = _aim(config, {"level": 0.95, "marginals": []})
    assert verdict.level == FIT and verdict.analyses[0].figures == {}
    assert verdict.analyses[0].served[0].how == "synthetic"
    # present but without this analysis: said
    other = _aim(config, {"analyses": [], "one_way": []})
    assert other.analyses[0].status == CARE and "no interval published" in other.analyses[0].why


def test_the_verdict_reads_no_more_than_it_is_given(tmp_path: Path) -> None:
    """Same manifest and released rows: the same verdict, whatever else exists (its signature
    takes no input table; a released frame and its ``ReleasedRows`` give the same verdict)."""
    from medrelease.storage.released_rows import ReleasedRows

    config = _config(tmp_path)
    rows = _rows(["a1", "b2", "*"], ["[0-9]", "[10-19]"], STATUS[:7])
    frame = publication_verdict(_manifest(), rows, config).as_dict()
    distinct = rows.value_counts().reset_index()
    cells = ReleasedRows(cells=distinct[["rx", "age", "status"]],
                         counts=distinct["count"].to_numpy())
    assert publication_verdict(_manifest(), cells, config).as_dict() == frame


# -- through the flow: published, rendered, audited ----------------------------------------



def _nps_with_analyses(folder: Path) -> Path:
    """The NPS sample's config, released with ipa (fast), with two declared analyses."""
    source = ROOT / "datasets" / "nps-sample"
    spec = yaml.safe_load((source / "dataset.yaml").read_text())
    for column in spec["columns"].values():
        if "taxonomy" in column:
            column["taxonomy"] = str((source / column["taxonomy"]).resolve())
    shutil.copy(source / "diagnosis_codes.txt", folder)
    extract = folder / "extract.csv"
    pd.read_csv(source / spec["input"]["path"], dtype=str).iloc[:3000].to_csv(extract,
                                                                              index=False)
    spec.update(name="verdict-nps", input={**spec["input"], "path": str(extract)},
                mechanism={"name": "ipa", "params": {"epsilon": 1.0}},
                analyses=[["sex", "surgery"], {"columns": ["age", "diagnosis"],
                                               "levels": {"diagnosis": 1}}])
    spec["privacy"].update(source="verdict-nps")
    path = folder / "verdict-nps.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.usefixtures("prefect_harness")
def test_a_release_publishes_its_verdict_and_the_audit_recomputes_it(tmp_path: Path,
                                                                     monkeypatch) -> None:
    from flows.release import ReleaseRequest, release_flow
    from medrelease.data.config import load_config
    from medrelease.evidence.audit_publication import inspect_folder
    from medrelease.storage.manifest_model import PublicManifest

    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    config_path = _nps_with_analyses(tmp_path)
    result = release_flow(ReleaseRequest(dataset=str(config_path), seed=7, evaluate=False))
    folder = Path(result["path"])
    manifest = json.loads((folder / "manifest.json").read_text())
    PublicManifest(**manifest)
    verdict = manifest["verdict"]
    assert verdict["level"] in (FIT, CARE, NOT_FIT)
    assert [a["name"] for a in verdict["analyses"]] == ["sex × surgery",
                                                       "age × diagnosis (level 1)"]
    assert all(len(a["served"]) == 2 for a in verdict["analyses"])
    # report.md opens with the verdict and lists each declared analysis and how it is served
    report = (folder / "report.md").read_text()
    assert report.splitlines()[2].startswith("**Publication verdict:** ")
    assert "## Declared analyses" in report and "sex × surgery" in report
    # the portal's catalogue shows it as a badge, with the headline
    page = _catalogue_page(tmp_path / "home", "verdict-nps")
    badge = {"fit": "ok", "use with care": "warn", "not fit": "bad"}[verdict["level"]]
    row = page[page.index(result["release_id"]):]
    row = row[:row.index("</tr>")]
    assert f'<span class="badge {badge}">{verdict["level"]}</span>' in row
    assert html.escape(verdict["headline"], quote=False) in row
    # the audit recomputes it from the published folder and the config's declarations
    config = load_config(config_path)
    assert inspect_folder(folder, config) == []
    # ... and flags a verdict that the folder does not give
    manifest["verdict"] = {**verdict, "level": FIT if verdict["level"] != FIT else CARE}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert any(f.where == "manifest.verdict" and f.check == "re-derivation"
               for f in inspect_folder(folder, config))


def _catalogue_page(home: Path, dataset: str) -> str:
    """The portal's catalogue page of ``dataset`` over ``home``'s stores, rendered as it
    serves it (its routes and authentication are tests/served/test_portal.py's)."""
    from starlette.requests import Request

    from deployments.portal import VIEWER_KEY, Portal, PortalPlaces, Viewer

    portal = Portal(PortalPlaces(home / "releases", home / "test-releases", home / "steward"),
                    "steward:verdict-test")
    request = Request({"type": "http", "method": "GET", "path": f"/releases/{dataset}",
                       "headers": [], "path_params": {"dataset": dataset},
                       VIEWER_KEY: Viewer("sam", "steward", "secret")})  # (a TEST release)
    return bytes(asyncio.run(portal.dataset(request)).body).decode()
