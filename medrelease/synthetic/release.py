"""``aim`` as a release: the rounds set up from the plan and the config, and the synthetic rows
as a ``MaterializedRelease`` (what the output checks and the publisher read).

The stage driver (``medrelease.release.synthesize``) runs the rounds through its executor
(in this process, or their scoring fanned out as Prefect tasks) from ``AIM.start_rounds`` to
``AIM.sample``; ``release_synthetic`` runs every round in this process for the tests, audits and
benchmarks that need no driver.
This module is the synthetic library's top and imports no mechanism: ``mechanisms/aim.py``
declares the mechanism and calls it (its rho, its rounds' rho and its row range are these).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Protocol

import numpy as np
import pandas as pd

from medrelease.data.aggregate import CountTable
from medrelease.data.config import DatasetConfig
from medrelease.data.constraints import impossible_for
from medrelease.errors import ParameterError
from medrelease.plan import MaterializedRelease, ReleasePlan
from medrelease.privacy.interval_table import with_intervals
from medrelease.privacy.randomness import generator_for
from medrelease.privacy.unit_cut import draw_unit_cut, unit_cut_epsilon
from medrelease.privacy.zcdp import rho_for
from medrelease.storage.released_rows import ReleasedRows
from medrelease.synthetic.aim_rounds import AIMRounds, Settings
from medrelease.synthetic.error_bars import (
    aim_interval_table,
    analysis_tables,
    bounds_summary,
    marginal_bounds,
    measurements_frame,
    one_way_moves,
)
from medrelease.synthetic.space import MarginalSpace

SYNTHETIC_NOTICE = "synthetic rows — no row describes a real patient"
MERGED_VALUE_EXPANSION = (
    "a merged group's sampled rows are shared among its values systematically (not at random) "
    "in proportion to weights read from round 0's noisy counts: each count shrunk towards the "
    "group's mean by the share of their spread the noise explains, and never above the upper "
    "end of its own 95 % interval (noisy count + 1.96 sigma); so a merged value gets at most "
    "ceil(that upper end x the group's sampled rows / the sum of the group's weights) rows of "
    "a batch (rows drawn again to replace an impossible combination come in further batches)")


class RoundsParams(Protocol):
    """What the rounds read from ``aim``'s parameters (``mechanisms/aim.py``: AIMParams)."""

    epsilon: float
    delta: float
    unit_rows: int
    rounds_per_column: int
    max_model_size: float
    max_cells: int
    iters: int
    tolerance: float
    final_iters: int
    workload_degree: int
    max_synthetic_rows: int
    analyses_share: float
    unit_column: str | None


def release_rho(params: RoundsParams) -> float:
    """The release's rho, for one privacy unit: the largest that implies (epsilon, delta) —
    less, with a declared unit, the unit cut's pure-epsilon share (``privacy/unit_cut.py``),
    which composes with the rounds' (epsilon - its share, delta)."""
    cut = unit_cut_epsilon(params.epsilon, getattr(params, "unit_column", None))
    return rho_for(params.epsilon - cut, params.delta)


def rounds_rho(params: RoundsParams) -> float:
    """The rho the rounds calibrate for at row sensitivity: rho / m^2 (``AIM.rounds_rho``)."""
    return release_rho(params) / params.unit_rows ** 2


def analyses_rho(params: RoundsParams, n_analyses: int) -> float:
    """The rounds' rho spent on the declared analyses (all of them), on the rounds' scale."""
    return params.analyses_share * rounds_rho(params) if n_analyses else 0.0


def analysis_sigma(params: RoundsParams, n_analyses: int) -> float:
    """The discrete Gaussian's sigma of each declared analysis's measurement, in rows of the
    table after the per-unit bound: the analyses' rho split evenly, rho_a = 1 / (2 sigma^2) at
    L2 sensitivity 1 (the unit's m is in the rounds' rho). The sampler's grid rounds sigma^2
    up by at most 2^-20 relative; what is charged and published is the rounded value. A
    function of public parameters only: ``medrelease check --epsilon`` reads it."""
    if n_analyses < 1:
        raise ValueError("no declared analysis: nothing is measured for one")
    return math.sqrt(n_analyses / (2 * analyses_rho(params, n_analyses)))


def sampled_row_bounds(noisy_total: float, total_sigma: float,
                       ceiling: int) -> tuple[int, int]:
    """Plausible released rows: within 12 of the noisy total's sigmas of the (clipped) noisy
    total the rows were sampled to, at most the public ceiling (``AIM.row_bounds``)."""
    spread = int(12 * total_sigma) + 1
    centre = round(noisy_total)
    return max(1, centre - spread), min(ceiling, centre + spread)


def default_workload(columns: list[str], degree: int) -> list[tuple[tuple[str, ...], float]]:
    """Every marginal of 2 up to ``degree`` released columns, weight 1 (AIM's default shape)."""
    return [(combo, 1.0) for k in range(2, max(2, degree) + 1)
            for combo in itertools.combinations(columns, k)]


def check_workload(workload: list[tuple[tuple[str, ...], float]], columns: list[str]) -> None:
    known = set(columns)
    for sets, weight in workload:
        unknown = sorted(set(sets) - known)
        if unknown:
            raise ParameterError(f"aim: the workload names column(s) {', '.join(unknown)} that "
                                 f"are not released; released: {', '.join(columns)}")
        if not weight > 0:
            raise ParameterError(f"aim: workload weight of {list(sets)} must be positive")


ANALYSIS_WEIGHT = 2.0  # a declared analysis's weight in the workload (the default sets weigh 1)


def workload_of(config: DatasetConfig | None, space: MarginalSpace,
                params: RoundsParams) -> list[tuple[tuple[int, ...], float]]:
    """The steward's declared workload, else every 2- to ``workload_degree``-way marginal;
    plus every declared analysis at ``ANALYSIS_WEIGHT`` (the rounds then favour marginals that
    share its columns); as attribute indices of the space."""
    names = list(space.names)
    declared = (config.workload if config is not None else None) or []
    sets = ([(tuple(w.columns), w.weight) for w in declared] if declared
            else default_workload(names, params.workload_degree))
    for analysis in (config.analyses if config is not None else []):
        sets.append((tuple(analysis.columns), ANALYSIS_WEIGHT))
    check_workload(sets, names)
    return [(tuple(names.index(c) for c in cols), weight) for cols, weight in sets]


def declared_analyses(config: DatasetConfig | None, space: MarginalSpace
                      ) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The config's analyses as (ascending attribute indices, their levels); an analysis of
    one column is a 1-way table at its level (measured like the others)."""
    if config is None:
        return []
    names = list(space.names)
    out = []
    for analysis in config.analyses:
        pairs = sorted((names.index(c), analysis.level_of(c)) for c in analysis.columns)
        out.append((tuple(c for c, _ in pairs), tuple(lv for _, lv in pairs)))
    return out


def aim_rounds(counts: CountTable, config: DatasetConfig | None, plan: ReleasePlan,
               log: Callable[[str], None] | None = None) -> AIMRounds:
    """The rounds of one release: candidates from the workload and the taxonomies (public),
    the true marginals from the count table, randomness from the plan's release stream."""
    params: RoundsParams = plan.params  # type: ignore[assignment]  (aim's AIMParams)
    taxonomy = config.informative_taxonomy if config is not None else None
    space = MarginalSpace(counts, taxonomy)
    analyses = declared_analyses(config, space)
    settings = Settings(rho=rounds_rho(params),
                        rounds=params.rounds_per_column * len(space.attributes),
                        max_model_size=params.max_model_size, max_cells=params.max_cells,
                        iters=params.iters, final_iters=params.final_iters,
                        tolerance=params.tolerance or None,
                        max_rows=params.max_synthetic_rows,
                        analyses_rho=analyses_rho(params, len(analyses)))
    impossible = (impossible_for(config, {a.name: a.leaf_labels for a in space.attributes})
                  if config is not None else None)
    rng = generator_for(plan.release_seed)
    run = AIMRounds(space, workload_of(config, space, params), settings, rng, log,
                    analyses=analyses, impossible=impossible)
    # the order the steward wrote each analysis in: its published table reads the same way
    run.analysis_orders = tuple(tuple(a.columns) for a in config.analyses) if config else ()
    return run


def synthetic_release(run: AIMRounds, counts: CountTable, plan: ReleasePlan) -> MaterializedRelease:
    """Sample the rows and describe them (public details: every measurement's columns, levels,
    sigma and selection epsilon — outputs of the rounds — never a score or a true count)."""
    seed = int(run.rng.integers(0, 2**63 - 1))
    codes, rows = run.synthesize(seed)
    leaves = run.leaves
    key = np.zeros(rows, dtype=np.int64)
    for attribute in leaves:
        key = key * attribute.size + codes[attribute.name]
    _, first, counts_per_row = np.unique(key, return_index=True, return_counts=True)
    cells = {}
    for attribute in leaves:
        leaf = codes[attribute.name][first]
        labels = list(attribute.leaf_labels)
        if attribute.name in counts.dimensions:
            cells[attribute.name] = pd.Categorical.from_codes(leaf, categories=labels)
        else:
            cells[attribute.name] = np.asarray(labels, dtype=object)[leaf]
    released = ReleasedRows(pd.DataFrame(cells), counts_per_row.astype(np.int64), plan.shuffle_seed)
    state = run.state
    details = {
        "synthetic": SYNTHETIC_NOTICE,
        # the guarantee's rho (for one privacy unit), and what the rounds ran at: one row's
        # sensitivity at rho / m^2 for a unit of m rows; rho_used counts on the rounds' scale
        "rho": release_rho(plan.params),  # type: ignore[arg-type]
        "rounds_rho": run.settings.rho,
        "rho_used": state.rho_used,
        "measurements": [r.as_dict() for r in state.records],
        "one_way_sigma": float(state.measurements[0].stddev),
        "merged_rare_values": {run.space.names[m.column]: m.merged for m in run.merges},
        # the public ceiling on the rows sampled, and whether the noisy total reached it
        "synthetic_rows_ceiling": run.settings.max_rows,
        "noisy_total_clipped": state.total_clipped,
        "merged_value_expansion": MERGED_VALUE_EXPANSION,
    }
    if run.impossible:
        details["impossible_rows_redrawn"] = int(run.rejected)
    cut = draw_unit_cut(plan.budget_steps, plan.unit, counts.unit_bound)
    if cut is not None:  # the unit bound's cut, a DP count of its own declared step
        details["unit_cut"] = cut
    bars = researcher_error_bars(run, codes)
    informative = next((n for n in run.space.names if n not in counts.dimensions), None)
    error_bars, tables = with_intervals(
        bars, aim_interval_table(run, codes, bars.get("analyses") or [], informative),
        plan.unit.scope() if plan.unit is not None else None)
    return MaterializedRelease(
        index=-1, node=tuple(0 for _ in counts.dimensions), rows=released, il=None,
        row_bounds=sampled_row_bounds(state.total, state.total_sigma, run.settings.max_rows),
        details=details,
        nodes=(tuple(0 for _ in counts.dimensions),),
        error_bars=error_bars,
        tables={**tables, "measurements.parquet": measurements_frame(run)})


def researcher_error_bars(run: AIMRounds, released_codes: dict[str, np.ndarray]) -> dict:
    """The published error bars: a 95 % bound per workload marginal and per measured marginal
    (AIM's paper §5), from the measurements, the selections and the sampled rows only."""
    summary = bounds_summary(marginal_bounds(run, released_codes, run.workload))
    summary["marginals"] = summary.pop("bounds")
    analyses = analysis_tables(run, released_codes)
    if analyses:
        summary["analyses"] = analyses
    summary["one_way"] = one_way_moves(run, released_codes)
    return summary


def release_synthetic(counts: CountTable, config: DatasetConfig | None, plan: ReleasePlan,
                      log: Callable[[str], None] | None = None) -> MaterializedRelease:
    run = aim_rounds(counts, config, plan, log)
    run.run()
    return synthetic_release(run, counts, plan)
