"""How often published intervals hold: one release at a time, against the input's truth.

The runners behind ``benchmarks/coverage.py`` and ``tests/unit/test_coverage.py`` (EVALUATION.md,
"Intervals are tested, not trusted"): each releases a table once through the engine's own
functions — the same ones the flow calls — takes the ``intervals.csv`` that release would
publish and checks every row against the true value it is about:

* per estimate: each row of kind ``count`` / ``total`` / ``marginal`` marked ``per estimate``
  covers its truth or not (the share should be about 95 %);
* simultaneous: a family of rows marked ``simultaneous`` (one ``columns`` value: the
  informative column's totals, one declared analysis) covers when every row of it does (one
  event per family and release; the share should be at least 95 %).

With a privacy unit declared, the truth is the table after that release's own bound (what the
intervals claim to be about), and the same rows are also checked against the whole input (what
the bound biases: the unit cut's published count says by how much). They read the raw input:
benchmarks and tests only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from medrelease.data.aggregate import CountTable, aggregate
from medrelease.data.config import DatasetConfig
from medrelease.data.constraints import column_taxonomy
from medrelease.data.units import bound_frame
from medrelease.mechanisms import get_mechanism
from medrelease.mechanisms.base import ReleaseContext
from medrelease.plan import PublicFacts, ReleasePlan
from medrelease.privacy.interval_table import (
    COLUMN_SEP,
    PER_ESTIMATE,
    SIMULTANEOUS,
    joined_cells,
)
from medrelease.privacy.intervals import clipped_interval, noise_law_epsilon
from medrelease.release import (
    cells_to_rows,
    draw_release_steps,
    fixed_index,
    lattice_size,
    plan_release,
    release_without_lattice,
    score_nodes,
    select_node,
)

LEVELLED = re.compile(r"^(?P<column>.+) \(level (?P<level>\d+)\)$")


@dataclass
class Tally:
    """Intervals stated and intervals that held, per kind of statement."""

    held: dict[str, int] = field(default_factory=dict)
    stated: dict[str, int] = field(default_factory=dict)
    widths: dict[str, list[float]] = field(default_factory=dict)

    def add(self, kind: str, covered: np.ndarray, width: np.ndarray | None = None) -> None:
        covered = np.asarray(covered, dtype=bool)
        if not covered.size:
            return
        self.held[kind] = self.held.get(kind, 0) + int(covered.sum())
        self.stated[kind] = self.stated.get(kind, 0) + int(covered.size)
        if width is not None and np.size(width):
            self.widths.setdefault(kind, []).append(float(np.mean(width)))

    def share(self, kind: str) -> float:
        return self.held[kind] / self.stated[kind] if self.stated.get(kind) else float("nan")

    def merge(self, other: Tally) -> None:
        for kind in other.stated:
            self.held[kind] = self.held.get(kind, 0) + other.held[kind]
            self.stated[kind] = self.stated.get(kind, 0) + other.stated[kind]
            self.widths.setdefault(kind, []).extend(other.widths.get(kind, []))


@dataclass
class Table:
    """A table released again and again: its config, count table and rows (and, for DiffGen,
    the config with a class column and its rows). With a privacy unit declared in ``config``
    the rows keep the unit's column and every release bounds them afresh."""

    name: str
    config: DatasetConfig
    counts: CountTable
    frame: pd.DataFrame
    class_config: DatasetConfig | None
    frame_for_class: pd.DataFrame | None = None  # the class config's rows (diffgen)


# -- checking an intervals.csv ---------------------------------------------------------------

def tally_rows(intervals: pd.DataFrame, truth: np.ndarray, suffix: str = "") -> Tally:
    """Per-estimate coverage by ``what``, and simultaneous coverage by family (``columns``),
    of ``intervals`` against ``truth`` (one true value per row; NaN: not checked)."""
    tally = Tally()
    truth = np.asarray(truth, dtype=np.float64)
    known = ~np.isnan(truth)
    covered = (intervals["lower"].to_numpy() <= truth) & (truth <= intervals["upper"].to_numpy())
    width = (intervals["upper"] - intervals["lower"]).to_numpy()
    zero = (intervals["released"] == 0).to_numpy()
    for what in ("count", "total", "marginal"):
        mine = known & (intervals["what"] == what).to_numpy()
        each = mine & (intervals["holds"] == PER_ESTIMATE).to_numpy()
        if what == "total":  # a value the release does not show: only the pool's bound
            if (each & zero).any():
                tally.add(f"total of a value not released{suffix}", covered[each & zero],
                          width[each & zero])
            each &= ~zero
        if each.any():
            tally.add(f"{what}{suffix}", covered[each], width[each])
        together = mine & (intervals["holds"] == SIMULTANEOUS).to_numpy()
        for family in np.unique(intervals["columns"].to_numpy()[together]):
            rows = together & (intervals["columns"] == family).to_numpy()
            tally.add(f"{what}, simultaneous{suffix}", np.array([covered[rows].all()]),
                      width[rows])
    return tally


def label_truth(frame: pd.DataFrame, config: DatasetConfig, intervals: pd.DataFrame,
                levels: dict[str, int] | None = None) -> np.ndarray:
    """The input's count of every row's cell, by labels: each column of ``columns`` mapped to
    its level (``name (level k)``, else ``levels[name]``, else the leaves) through its
    taxonomy; NaN where a column is not in ``frame``."""
    out = np.full(len(intervals), np.nan)
    for columns, rows in intervals.groupby("columns").groups.items():
        labels = []
        for part in str(columns).split(COLUMN_SEP):
            match = LEVELLED.match(part)
            name = match.group("column") if match else part
            level = int(match.group("level")) if match else (levels or {}).get(name, 0)
            if name not in frame.columns:
                labels = None
                break
            taxonomy = column_taxonomy(config, name)
            if taxonomy is None:
                labels.append(frame[name].astype(str).to_numpy(dtype=object))
                continue
            codes = np.asarray(taxonomy.level_codes[level], dtype=np.int64)[
                taxonomy.encode(frame[name])]
            labels.append(np.asarray(taxonomy.level_labels[level], dtype=object)[codes])
        if labels is None:
            continue
        counts = pd.Series(joined_cells(labels)).value_counts()
        index = np.asarray(rows)
        out[index] = counts.reindex(intervals.loc[index, "cell"].to_numpy()).fillna(0) \
            .to_numpy(dtype=np.float64)
    return out


def _bounded(table: Table, plan: ReleasePlan, config: DatasetConfig | None = None,
             frame: pd.DataFrame | None = None) -> tuple[pd.DataFrame, object]:
    """The release's own bounded rows (and the bound's report), or the rows as they are."""
    frame = table.frame if frame is None else frame
    if plan.unit is None:
        return frame, None
    return bound_frame(frame, plan.unit)


def _facts(config: DatasetConfig) -> PublicFacts:
    return PublicFacts.of(config)


# -- the lattice mechanisms: ipa, histogram -------------------------------------------------

def run_lattice(mechanism: str, table: Table, epsilon: float, seed: int) -> Tally:
    """One ``ipa`` or ``histogram`` release: every row of its intervals.csv against the truth
    (a count: its cell's true count in the table the mechanism saw; a total: its value's)."""
    config = table.config
    plan = plan_release(mechanism, {"epsilon": epsilon}, lattice_size(config), seed,
                        _facts(config))
    frame, report = _bounded(table, plan)
    counts = (replace(aggregate(frame, config), unit_bound=report) if report is not None
              else table.counts)
    context = ReleaseContext.from_counts(counts)
    index = fixed_index(context, plan)
    if index is None:
        index, _ = select_node(plan, score_nodes(context, plan, context.lattice.nodes))
    cells, _, cut = draw_release_steps(context, plan, index)
    node = context.lattice.nodes[index]
    rows = cells_to_rows(context, node, cells, plan.shuffle_seed)
    intervals = get_mechanism(mechanism).interval_table(plan.params, context, cells,
                                                        rows).frame()
    truth = np.full(len(intervals), np.nan)
    is_count = (intervals["what"] == "count").to_numpy()
    truth[is_count] = cells.true_counts[cells.released_counts > 0]
    totals = (intervals["what"] == "total").to_numpy()
    truth[totals] = label_truth(frame, config, intervals[totals].reset_index(drop=True))
    tally = tally_rows(intervals, truth)
    if mechanism == "histogram":  # a domain cell released as 0 is not listed: [0, k] stated
        zero = cells.released_counts == 0
        step = get_mechanism(mechanism).cells_epsilon(plan.params)
        top = clipped_interval(0, noise_law_epsilon(step, plan.params.unit_rows))[1]
        silent = get_mechanism(mechanism).domain_cells(context, node) - cells.true_counts.size
        stated = np.r_[cells.true_counts[zero] <= top, np.ones(max(silent, 0), dtype=bool)]
        tally.add("count released as 0 (not listed, stated [0, k])", stated,
                  np.full(stated.size, top))
    if cut is not None:  # the unit cut's published count, against what the bound removed
        tally.add("unit cut count (at most 4 per unit)",
                  np.array([cut["lower"] <= report.rows_cut_capped <= cut["upper"]]),
                  np.array([cut["upper"] - cut["lower"]]))
    if plan.unit is not None:  # the same statements against the whole input
        whole = np.full(len(intervals), np.nan)
        whole[totals] = label_truth(table.frame, config,
                                    intervals[totals].reset_index(drop=True))
        if mechanism == "histogram":
            whole[is_count] = label_truth(table.frame, config,
                                          intervals[is_count].reset_index(drop=True),
                                          dict(zip(counts.dimensions, node, strict=True)))
        tally.merge(tally_rows(intervals, whole, " vs the whole input"))
    return tally


def run_ipa(table: Table, epsilon: float, seed: int) -> Tally:
    return run_lattice("ipa", table, epsilon, seed)


def run_histogram(table: Table, epsilon: float, seed: int) -> Tally:
    return run_lattice("histogram", table, epsilon, seed)


# -- diffgen -------------------------------------------------------------------------------

def run_diffgen(table: Table, epsilon: float, seed: int) -> Tally:
    """One DiffGen release: every (leaf partition, class) count against the input's rows
    generalized to the release's cut, every class total against the input's."""
    from medrelease.data.aggregate import prepare_table

    config = table.class_config
    impl = get_mechanism("diffgen")
    plan = plan_release("diffgen", {"epsilon": epsilon}, 1, seed, _facts(config))
    frame, report = _bounded(table, plan, config, table.frame_for_class)
    chosen = release_without_lattice(frame, config, plan, None, report)
    intervals = chosen.tables["intervals.csv"]
    prepared = prepare_table(frame, config, include_class=True)
    label = config.class_columns[0]
    generalized = impl.generalize(prepared, config, chosen.details).assign(
        **{label: prepared[label].astype(str)})
    columns = [*config.dimensions, *config.set_valued, label]
    truth = np.full(len(intervals), np.nan)
    counts = pd.Series(joined_cells([generalized[c].to_numpy(dtype=object)
                                     for c in columns])).value_counts()
    is_count = (intervals["what"] == "count").to_numpy()
    truth[is_count] = counts.reindex(intervals.loc[is_count, "cell"].to_numpy()).fillna(0)
    classes = prepared[label].astype(str).value_counts()
    is_total = (intervals["what"] == "total").to_numpy()
    truth[is_total] = classes.reindex(intervals.loc[is_total, "cell"].to_numpy()).fillna(0)
    return tally_rows(intervals, truth)


# -- aim -----------------------------------------------------------------------------------

def run_aim(table: Table, epsilon: float, seed: int) -> Tally:
    """One aim release: every 1-way marginal cell (each level) and every declared analysis's
    cell against the input's count, and each workload marginal's TVD bound against the true
    TVD between the input and the released rows."""
    from medrelease.synthetic.release import release_synthetic

    config = table.config
    plan = plan_release("aim", {"epsilon": epsilon}, 1, seed, _facts(config))
    frame, report = _bounded(table, plan)
    counts = (replace(aggregate(frame, config), unit_bound=report) if report is not None
              else table.counts)
    chosen = release_synthetic(counts, config, plan)
    intervals = chosen.tables["intervals.csv"]
    tally = tally_rows(intervals, label_truth(frame, config, intervals))
    if plan.unit is not None:
        tally.merge(tally_rows(intervals, label_truth(table.frame, config, intervals),
                               " vs the whole input"))
    released = chosen.rows.to_frame().astype(str)
    truth = frame[list(released.columns)]
    for bound in chosen.error_bars.get("marginals", []):
        if bound["tvd_bound"] >= 1 or any(bound.get("levels") or []):
            continue  # the informative ones at the leaves (the rest: see intervals.csv)
        tvd = _tvd(truth, released, config, list(bound["columns"]))
        tally.add("TVD bound of a workload marginal (< 1)",
                  np.array([tvd <= bound["tvd_bound"] + 1e-12]), np.array([bound["tvd_bound"]]))
    return tally


def _tvd(truth: pd.DataFrame, rows: pd.DataFrame, config: DatasetConfig,
         columns: list[str]) -> float:
    """TVD of the two tables' marginal on ``columns`` at the leaves (labels compared as the
    release writes them: through each column's taxonomy)."""
    def counted(frame: pd.DataFrame, raw: bool) -> pd.Series:
        labels = []
        for name in columns:
            taxonomy = column_taxonomy(config, name)
            if taxonomy is None or not raw:
                labels.append(frame[name].astype(str).to_numpy(dtype=object))
            else:
                labels.append(np.asarray(taxonomy.level_labels[0], dtype=object)[
                    taxonomy.encode(frame[name])])
        counts = pd.Series(joined_cells(labels)).value_counts()
        return counts / counts.sum()

    p, q = counted(truth, True), counted(rows, False)
    joined = p.to_frame("p").join(q.to_frame("q"), how="outer").fillna(0.0)
    return float(0.5 * (joined["p"] - joined["q"]).abs().sum())


RUNNERS: dict[str, Callable[[Table, float, int], Tally]] = {
    "ipa": run_ipa, "histogram": run_histogram, "diffgen": run_diffgen, "aim": run_aim}


# -- the planted-threshold table -------------------------------------------------------------

PLANTED = "P"   # the planted value: tau rows in every class
COMMON = "C"    # the common value: many rows in every class


def write_planted_dataset(folder: Path, classes: int = 320, common: int = 1000,
                          planted: int = 25, name: str = "planted") -> Path:
    """A dataset where selection bites (issue 54): ``classes`` sites, each with ``common``
    rows of value C and ``planted`` rows of value P — at eps 1 ``planted`` = 25 is ipa's cell
    threshold, so about half the P cells are published, each with its noise biased upwards,
    and the rows of the others are pooled into (*, P). The site taxonomy has no level between
    a site and '*' (any coarser node would hold the P cells far above the threshold); the
    informative domain {C, P} is declared. Returns the dataset.yaml path (config, taxonomy,
    domain and extract written)."""
    folder.mkdir(parents=True, exist_ok=True)
    sites = [f"s{i:03d}" for i in range(classes)]
    (folder / "site.csv").write_text("".join(f"{s};*\n" for s in sites))
    (folder / "codes.txt").write_text(f"{COMMON}\n{PLANTED}\n")
    rows = np.repeat(np.arange(classes), common + planted)
    value = np.tile(np.r_[np.zeros(common, dtype=bool), np.ones(planted, dtype=bool)], classes)
    pd.DataFrame({"site": np.asarray(sites, dtype=object)[rows],
                  "code": np.where(value, PLANTED, COMMON)}).to_csv(folder / "extract.csv",
                                                                    index=False)
    config = {"name": name, "input": {"path": "extract.csv", "format": "csv", "delimiter": ","},
              "columns": {"site": {"role": "dimension", "taxonomy": "site.csv"},
                          "code": {"role": "informative", "domain": "codes.txt",
                                   "domain_reviewed": True}},
              "missing": "reject",
              "privacy": {"lifetime_epsilon": 20.0, "lifetime_delta": 1e-4},
              "mechanism": {"name": "ipa", "params": {"epsilon": 1.0}},
              "policy": {"mechanisms": ["ipa", "histogram", "aim"], "max_epsilon": 5.0}}
    path = folder / "dataset.yaml"
    path.write_text(json.dumps(config, indent=1))  # JSON is YAML
    return path


def unit_config(config: DatasetConfig, column: str = "patient_id",
                max_rows: int = 1) -> DatasetConfig:
    """``config`` with ``column`` as the privacy unit, each unit cut to ``max_rows`` rows."""
    from medrelease.data.config import config_from_dict

    raw = config.model_dump(exclude={"base_dir", "config_file"})
    raw["columns"][column] = {"role": "identifier"}
    raw["privacy"] = {**raw["privacy"], "unit": column, "max_rows_per_unit": max_rows,
                      "unit_noun": "patient", "row_noun": "admission"}
    return config_from_dict(raw, config.base_dir)
