"""How often published intervals hold: one release at a time, against the input's truth.

The runners behind ``benchmarks/coverage.py`` and ``tests/test_coverage.py`` (EVALUATION.md,
"Intervals are tested, not trusted"): each releases a table once through the engine and checks
every interval the release states — as the manifest's ``error_bars`` describe them — against
the true value it is about. They read the raw input: benchmarks and tests only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from medrelease.data.config import DatasetConfig
from medrelease.mechanisms import get_mechanism
from medrelease.mechanisms.base import ReleaseContext
from medrelease.plan import PublicFacts, numeric_predictors
from medrelease.privacy.intervals import (
    clipped_total_interval,
    noise_law_epsilon,
    sum_interval,
    thresholded_interval,
)
from medrelease.release import (
    draw_release,
    fixed_index,
    plan_release,
    score_nodes,
    select_node,
)


@dataclass
class Tally:
    """Intervals stated and intervals that held, per kind of statement."""

    held: dict[str, int] = field(default_factory=dict)
    stated: dict[str, int] = field(default_factory=dict)
    widths: dict[str, list[float]] = field(default_factory=dict)

    def add(self, kind: str, covered: np.ndarray, width: np.ndarray | None = None) -> None:
        covered = np.asarray(covered, dtype=bool)
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
    the config with a class column and its rows)."""

    name: str
    config: DatasetConfig
    counts: object
    frame: pd.DataFrame
    class_config: DatasetConfig | None
    frame_for_class: pd.DataFrame | None = None  # the class config's rows (diffgen)


# -- ipa -----------------------------------------------------------------------------------

def run_ipa(table: Table, epsilon: float, seed: int) -> Tally:
    """One ipa release: each published cell's selective interval, each value's total."""
    impl = get_mechanism("ipa")
    context = ReleaseContext.from_counts(table.counts)
    plan = plan_release("ipa", {"epsilon": epsilon}, len(context.lattice), seed,
                        PublicFacts.of(table.config))
    index, _ = select_node(plan, score_nodes(context, plan, context.lattice.nodes))
    cells, _ = draw_release(context, plan, index)
    params = plan.params
    m = params.unit_rows
    tau_cells, tau_pool = impl.thresholds(params)
    _, rung_eps = impl.rung_epsilons(params)
    # the step of each class: its rung (class_node), the pool last
    class_node = (cells.class_node if cells.class_node is not None
                  else np.zeros(cells.n_classes, dtype=np.int64))
    step_eps = np.where(cells.suppressed_class, params.eps_suppression,
                        np.where(class_node == 0, params.eps_cells, rung_eps))
    step_tau = np.where(cells.suppressed_class, tau_pool,
                        np.where(class_node == 0, tau_cells, impl.rung_threshold(params)))
    published = cells.released_counts > 0
    tally = Tally()
    of_cell = cells.class_of_cell[published]
    lows, highs = [], []
    for released, eps, tau in zip(cells.released_counts[published], step_eps[of_cell],
                                  step_tau[of_cell], strict=True):
        low, high = thresholded_interval(int(released), noise_law_epsilon(eps, m), int(tau))
        lows.append(low)
        highs.append(high)
    true = cells.true_counts[published]
    tally.add("cells", (np.array(lows) <= true) & (true <= np.array(highs)),
              np.array(highs) - np.array(lows))
    # value totals: the input's count of each value against the published rule
    loss = impl.pool_loss_bound(params)
    input_totals = np.bincount(table.counts.inf_codes(), weights=table.counts.counts,
                               minlength=table.counts.n_inf)
    covered, widths, present = [], [], []
    for value in range(table.counts.n_inf):
        mine = published & (cells.inf_codes == value)
        total = float(cells.released_counts[mine].sum())
        pooled = bool((mine & cells.suppressed_class[cells.class_of_cell]).any())
        eps_counts: dict[float, int] = {}
        for eps in step_eps[cells.class_of_cell[mine]]:
            law = noise_law_epsilon(float(eps), m)
            eps_counts[law] = eps_counts.get(law, 0) + 1
        low, high = (sum_interval(total, list(eps_counts.items())) if eps_counts
                     else (0.0, 0.0))
        high += 0 if pooled else loss
        low = max(0.0, low)
        covered.append(low <= input_totals[value] <= high)
        widths.append(high - low)
        present.append(bool(eps_counts))
    covered, widths, present = np.array(covered), np.array(widths), np.array(present)
    tally.add("value totals", covered, widths)
    tally.add("value totals, values in the release", covered[present], widths[present])
    tally.add("value totals, values absent (at most the pool bound)", covered[~present],
              widths[~present])
    return tally


# -- histogram -----------------------------------------------------------------------------

def run_histogram(table: Table, epsilon: float, seed: int) -> Tally:
    context = ReleaseContext.from_counts(table.counts)
    plan = plan_release("histogram", {"epsilon": epsilon}, len(context.lattice), seed,
                        PublicFacts.of(table.config))
    index = fixed_index(context, plan)
    cells, _ = draw_release(context, plan, index)
    eps = noise_law_epsilon(plan.params.epsilon, plan.params.unit_rows)
    tally = Tally()
    bounds = clipped_bounds(cells.released_counts, eps)
    true = cells.true_counts
    node = context.lattice.nodes[index]
    domain = get_mechanism("histogram").domain_cells(context, node)
    classes = domain // context.n_inf
    # every cell of the domain has a published count; those empty in both (n = 0, R = 0) are
    # not in ``cells`` and their interval [0, k] holds
    silent = domain - true.size
    tally.add("cells (the node's whole domain)",
              np.concatenate([(bounds[:, 0] <= true) & (true <= bounds[:, 1]),
                              np.ones(silent, dtype=bool)]),
              bounds[:, 1] - bounds[:, 0])
    released = np.bincount(cells.inf_codes, weights=cells.released_counts,
                           minlength=context.n_inf)
    truth = np.bincount(cells.inf_codes, weights=cells.true_counts, minlength=context.n_inf)
    spans = np.array([clipped_total_interval(r, eps, classes) for r in released])
    tally.add("value totals", (spans[:, 0] <= truth) & (truth <= spans[:, 1]),
              spans[:, 1] - spans[:, 0])
    return tally


# -- diffgen -------------------------------------------------------------------------------

def run_diffgen(table: Table, epsilon: float, seed: int) -> Tally:
    from medrelease.data.aggregate import prepare_table
    from medrelease.privacy.randomness import generator_for

    config = table.class_config
    impl = get_mechanism("diffgen")
    facts = PublicFacts(n_numeric=numeric_predictors(config))
    plan = plan_release("diffgen", {"epsilon": epsilon}, 1, seed, facts)
    frame = prepare_table(table.frame_for_class, config, include_class=True)
    released, summary = impl.release_frame(frame, config, plan.params,
                                           generator_for(plan.release_seed))
    label = config.class_columns[0]
    keys = [*config.dimensions, label]
    generalized = impl.generalize(frame, config, summary).assign(**{label: frame[label].astype(str)})
    truth = generalized.astype(str).groupby(keys).size()
    shown = released.astype(str).groupby(keys).size()
    both = truth.to_frame("n").join(shown.to_frame("r"), how="outer").fillna(0)
    leaves = next(s.epsilon for s in plan.budget_steps if s.step == "leaf counts")
    eps = noise_law_epsilon(leaves, plan.params.unit_rows)
    bounds = clipped_bounds(both["r"].to_numpy(), eps)
    n = both["n"].to_numpy()
    tally = Tally()
    silent = summary["cells"] - len(both)  # drawn, empty in both: [0, k] holds
    tally.add("cells (every partition x class)",
              np.concatenate([(bounds[:, 0] <= n) & (n <= bounds[:, 1]),
                              np.ones(max(silent, 0), dtype=bool)]),
              bounds[:, 1] - bounds[:, 0])
    return tally


# -- aim -----------------------------------------------------------------------------------

def run_aim(table: Table, epsilon: float, seed: int) -> Tally:
    """One aim release: each stated marginal bound against the true TVD at its levels."""
    from medrelease.synthetic.release import release_synthetic

    plan = plan_release("aim", {"epsilon": epsilon}, 1, seed, PublicFacts.of(table.config))
    chosen = release_synthetic(table.counts, table.config, plan)
    rows = chosen.rows.to_frame().astype(str)
    truth = table.frame[list(rows.columns)].astype(str)
    tally = Tally()
    for bound in chosen.error_bars.get("marginals", []):
        columns = list(bound["columns"])
        levels = list(bound.get("levels") or [0] * len(columns))
        tvd = _tvd_at_levels(truth, rows, table.config, columns, levels)
        kind = "measured marginals at their levels" if any(levels) else (
            f"workload marginals ({bound['basis']})")
        held = np.array([tvd <= bound["tvd_bound"] + 1e-12])
        tally.add(kind, held, np.array([bound["tvd_bound"]]))
        if bound["tvd_bound"] < 1:  # the bounds that say something
            tally.add(f"{kind}, bound < 1", held, np.array([bound["tvd_bound"]]))
    return tally


def _tvd_at_levels(truth: pd.DataFrame, rows: pd.DataFrame, config: DatasetConfig,
                   columns: list[str], levels: list[int]) -> float:
    """TVD of the two tables' marginal on ``columns``, each column at its taxonomy level."""
    def at_levels(frame: pd.DataFrame) -> pd.Series:
        mapped = {}
        for column, level in zip(columns, levels, strict=True):
            taxonomy = (config.taxonomies.get(column) if column in config.dimensions
                        else config.informative_taxonomy)
            if level and taxonomy is not None:
                codes = taxonomy.level_codes[level][taxonomy.encode(frame[column])]
                mapped[column] = np.asarray(taxonomy.level_labels[level], dtype=object)[codes]
            else:
                mapped[column] = frame[column].to_numpy()
        counted = pd.DataFrame(mapped).groupby(columns).size()
        return counted / counted.sum()

    p, q = at_levels(truth), at_levels(rows)
    joined = p.to_frame("p").join(q.to_frame("q"), how="outer").fillna(0.0)
    return float(0.5 * (joined["p"] - joined["q"]).abs().sum())


def clipped_bounds(released: np.ndarray, eps: float) -> np.ndarray:
    """``clipped_interval`` of every count at once: R +- k, and the exact rows near 0."""
    from medrelease.privacy.intervals import CountIntervals

    rule = CountIntervals.clipped(eps, max_rows=100_000)
    released = np.asarray(released, dtype=np.int64)
    bounds = np.stack([released - rule.half_width, released + rule.half_width], axis=1)
    for value, low, high in rule.rows:
        bounds[released == value] = (low, high)
    return bounds


RUNNERS: dict[str, Callable[[Table, float, int], Tally]] = {
    "ipa": run_ipa, "histogram": run_histogram, "diffgen": run_diffgen, "aim": run_aim}


