"""intervals.csv (issue 54): every DP release states every estimate it shows with an interval
that holds where the release selects what it publishes, in a file a researcher can use, and
the publication audit holds the file to what the published folder determines."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from medrelease.data.aggregate import aggregate
from medrelease.data.config import load_config
from medrelease.evidence.audit_publication import inspect_folder, value_leaks
from medrelease.evidence.coverage import PLANTED, write_planted_dataset
from medrelease.mechanisms.base import ReleaseContext
from medrelease.plan import PublicFacts
from medrelease.privacy.interval_table import COLUMNS
from medrelease.privacy.intervals import noise_law_epsilon, selected_total_interval, sum_interval
from medrelease.release import (
    draw_release_steps,
    materialize_table,
    plan_release,
    score_nodes,
    select_node,
)

pytestmark = pytest.mark.usefixtures("prefect_harness")

PLANTED_TRUTH = 320 * 25


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> tuple[Path, Path]:
    """The planted-threshold table released with ipa through the CLI (``medrelease release``)
    in a fresh home and dataset root: (the published folder, a TEST release with a fixed
    seed; the dataset config)."""
    from typer.testing import CliRunner

    from deployments.cli import app

    base = tmp_path_factory.mktemp("planted")
    write_planted_dataset(base / "datasets" / "planted", common=100)  # (smaller: the C cells
    # only need to be far above the threshold; the P cells are the issue's)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MEDRELEASE_HOME", str(base / "home"))
        patch.setenv("MEDRELEASE_DATASETS", str(base / "datasets"))
        shown = CliRunner().invoke(app, ["release", "planted", "--mechanism", "ipa",
                                         "--seed", "11"], env={"COLUMNS": "200"})
        assert shown.exit_code == 0, shown.output
        [folder] = [line.split()[1] for line in shown.output.splitlines()
                    if line.startswith("published ")]
    return Path(folder), base / "datasets" / "planted" / "dataset.yaml"


@pytest.fixture
def planted_release(planted) -> Path:
    return planted[0]


def test_the_planted_values_total_covers_the_truth_through_the_cli(planted_release) -> None:
    """Issue 54: 320 classes of many rows of C and 25 (the threshold at eps 1) of P. The old
    statement — the sum of the published cells within the interval of their noises' sum —
    missed the planted total in 10 of 10 releases; the total row of intervals.csv covers it,
    and on this very release the old statement does not."""
    intervals = pd.read_csv(planted_release / "intervals.csv", dtype={"cell": str})
    assert list(intervals.columns) == list(COLUMNS)
    [row] = intervals[(intervals["what"] == "total") & (intervals["cell"] == PLANTED)
                      & (intervals["holds"] == "per estimate")].itertuples()
    assert row.lower <= PLANTED_TRUTH <= row.upper, row
    assert row.released > PLANTED_TRUTH + 100  # selection biased what was published upwards
    # the old statement on the same release: every published P cell's noise summed
    counts = intervals[(intervals["what"] == "count") & intervals["cell"].str.endswith(
        f"| {PLANTED}")]
    manifest = pd.read_json(planted_release / "manifest.json", typ="series")
    steps = {c["threshold"]: c["noise_epsilon"] for c in manifest["error_bars"]["cells"]}
    tau_pool = max(steps)
    laws: dict[float, int] = {}
    for r in counts["released"]:
        eps = steps[min(t for t in steps if t <= r)] if r < tau_pool else steps[tau_pool]
        laws[eps] = laws.get(eps, 0) + 1
    old_low, old_high = sum_interval(float(counts["released"].sum()), list(laws.items()))
    assert not old_low <= PLANTED_TRUTH <= old_high  # the gap the new construction closes


def test_the_published_folder_passes_the_audit_and_a_tampered_file_does_not(
        planted, tmp_path) -> None:
    """The audit re-derives intervals.csv from the folder: its rows match the data file's
    counts (no gaps), its count intervals follow a declared noise law, its columns are on the
    allow-list. A dropped row, a moved bound, an extra column are each caught."""
    planted_release, config = planted[0], load_config(planted[1])
    assert [str(f) for f in inspect_folder(planted_release, config)] == []
    original = pd.read_csv(planted_release / "intervals.csv", dtype=str, keep_default_na=False)

    def tampered(name: str, frame: pd.DataFrame) -> list[str]:
        folder = tmp_path / name
        shutil.copytree(planted_release, folder)
        frame.to_csv(folder / "intervals.csv", index=False)
        return [str(f) for f in inspect_folder(folder, config)]

    assert tampered("same", original) == []
    counts = original.index[original["what"] == "count"]
    assert any("no gaps" in f or "distinct rows" in f
               for f in tampered("gap", original.drop(index=counts[3])))
    moved = original.copy()
    moved.loc[counts[0], "upper"] = str(int(moved.loc[counts[0], "upper"]) + 1)
    assert any("noise law" in f for f in tampered("moved", moved))
    assert any("allow-list" in f for f in tampered("extra", original.assign(truth="8000")))


def test_the_decoded_scan_reads_intervals_csv(planted_release, tmp_path) -> None:
    """A value that appears in no other published file is found in intervals.csv's parsed
    cells (the data files are exempt only under a declared public domain: this one's)."""
    folder = tmp_path / "leak"
    shutil.copytree(planted_release, folder)
    manifest = (folder / "manifest.json").read_text()
    (folder / "manifest.json").write_text(manifest.replace('"domain": "codes.txt"', '"x": 1'))
    frame = pd.read_csv(folder / "intervals.csv", dtype=str, keep_default_na=False)
    frame.loc[0, "cell"] = "s000 | Zz-secret"
    frame.to_csv(folder / "intervals.csv", index=False)
    found = {f.where for f in value_leaks(folder, "Zz-secret")}
    assert "intervals.csv values (decoded)" in found


def test_every_released_count_of_ipa_has_its_interval_not_only_near_the_threshold(
        nps_config, nps_sample) -> None:
    """report.md used to list selective intervals only near the threshold
    (``near_threshold_complete: false``): every published cell now has its row, computed
    with the selective law (far above tau it is R +- k)."""
    from medrelease.privacy.intervals import thresholded_interval

    counts = aggregate(nps_sample, nps_config)
    context = ReleaseContext.from_counts(counts)
    plan = plan_release("ipa", {"epsilon": 1.0}, len(context.lattice), 7,
                        PublicFacts.of(nps_config))
    index, _ = select_node(plan, score_nodes(context, plan, context.lattice.nodes))
    chosen = materialize_table(context, plan, index)
    intervals = chosen.tables["intervals.csv"]
    rows = intervals[intervals["what"] == "count"]
    assert len(rows) == len(chosen.rows.cells) > 50
    cells, _, _ = draw_release_steps(context, plan, index)  # the same draw (a fixed seed)
    shown = cells.released_counts[cells.released_counts > 0]
    assert rows["released"].tolist() == shown.tolist()
    eps = noise_law_epsilon(plan.params.eps_cells, 1)
    at_node = cells.class_node[cells.class_of_cell][cells.released_counts > 0] == 0
    for r, low, high in rows[at_node][["released", "lower", "upper"]].itertuples(index=False):
        assert (low, high) == thresholded_interval(int(r), eps, 25)
    assert chosen.error_bars["intervals"]["rows"]["count, per estimate"] == len(rows)
    assert chosen.error_bars["intervals"]["example"]["what"] == "total"


def test_the_selected_total_holds_where_cells_sit_at_the_threshold() -> None:
    """The construction on its own, against its worst case: every cell exactly at tau (the
    selected noise is biased by E[Z | Z >= 0]) and cells below it (a shortfall). A sum of the
    published counts within the plain interval of their noises misses most of the time; the
    selected total holds at least 95 % (200 simulated releases)."""
    rng = np.random.default_rng(5)
    eps, tau, pool_eps, pool_tau = noise_law_epsilon(0.62), 25, noise_law_epsilon(0.02), 713
    steps = ((eps, tau, False), (pool_eps, pool_tau, True))
    a = math.exp(-eps)
    held = naive = 0
    runs = 200
    for _ in range(runs):
        n = np.r_[np.full(120, tau), np.full(60, tau - 3), np.full(20, 400)]
        z = rng.geometric(1 - a, n.size) - rng.geometric(1 - a, n.size)  # discrete Laplace
        published = n + z >= tau
        left = int(n[~published].sum())
        pool = left + int(rng.geometric(1 - math.exp(-pool_eps)) - rng.geometric(
            1 - math.exp(-pool_eps)))
        released = (n + z)[published]
        step_of = np.zeros(released.size, dtype=np.int64)
        if pool >= pool_tau:
            released, step_of = np.r_[released, pool], np.r_[step_of, 1]
        low, high = selected_total_interval(released, step_of, steps, 1,
                                            0 if pool >= pool_tau else 1)
        held += low <= n.sum() <= high
        q_low, q_high = sum_interval(float((n + z)[published].sum()),
                                     [(eps, int(published.sum()))])
        naive += q_low <= n[published].sum() <= q_high
    assert held / runs >= 0.95, held
    assert naive / runs < 0.5, naive  # the old statement, even about the published cells alone


def test_the_report_opens_with_how_to_use_these_numbers(planted_release) -> None:
    """report.md: after the title and the verdict, 'How to use these numbers' with a worked
    example that is a row of this release's intervals.csv; the guarantee's meaning is a
    section of the report, not a repository path."""
    report = (planted_release / "report.md").read_text()
    sections = [line for line in report.splitlines() if line.startswith("## ")]
    assert sections[0] == "## How to use these numbers"
    assert "## What the guarantee means" in sections
    opening = report[:report.index("## Guarantee")]
    intervals = pd.read_csv(planted_release / "intervals.csv", dtype={"cell": str})
    example = intervals[(intervals["what"] == "total") & (intervals["holds"] == "per estimate")
                        ].sort_values("released").iloc[-1]
    assert (f"The release shows {example['released']:,}; the true count lies between "
            f"{example['lower']:,} and {example['upper']:,}") in opening
    guarantee = report[report.index("## Guarantee"):report.index("## Lifetime")]
    assert "PRIVACY.md" not in guarantee and "docs/" not in guarantee
