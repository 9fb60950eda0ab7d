"""``intervals.csv`` of the lattice mechanisms (``ipa``, ``histogram``): from the released cells.

What is read: each published cell's released count and labels (``cells_to_rows``' distinct
rows, in the order of the cells with a released count), the step that published it (its
rung: an output), each step's public epsilon and threshold, and the public informative domain.
Never a true count: ``ReleasedCells.true_counts`` is not touched here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from medrelease.evidence.metrics import ReleasedCells
from medrelease.mechanisms.base import ReleaseContext
from medrelease.privacy.interval_table import (
    PER_ESTIMATE,
    SIMULTANEOUS,
    IntervalTable,
    bonferroni_level,
    joined_cells,
)
from medrelease.privacy.intervals import (
    LEVEL,
    clipped_total_interval,
    noise_law_epsilon,
    selected_total_interval,
    thresholded_bounds,
)
from medrelease.storage.released_rows import ReleasedRows


def _published(cells: ReleasedCells) -> np.ndarray:
    """The cells with a released count, in the order ``cells_to_rows`` lists them."""
    return np.flatnonzero(cells.released_counts > 0)


def _labels(rows: ReleasedRows) -> tuple[list[str], np.ndarray]:
    """(the released columns, each distinct released row's labels joined by ' | ')."""
    columns = list(rows.cells.columns)
    return columns, joined_cells([rows.cells[c].to_numpy(dtype=object) for c in columns])


def _value_labels(context: ReleaseContext) -> tuple[list[str], np.ndarray]:
    """(the informative columns, each informative code's value text)."""
    informative = context.counts.informative
    columns = list(informative.columns)
    return columns, joined_cells([informative[c].to_numpy(dtype=object) for c in columns])


# -- ipa -------------------------------------------------------------------------------------

def ipa_interval_table(impl: Any, params: Any, context: ReleaseContext, cells: ReleasedCells,
                       rows: ReleasedRows, analyses: tuple[tuple[str, ...], ...] = (),
                       level: float = LEVEL) -> IntervalTable:
    """Every published cell's selective interval (``count``), and every value's total valid
    under selection (``total``, per estimate and, all values at once, simultaneous): the
    values of the declared domain, or those the release shows when none is declared."""
    m = params.unit_rows
    tau_cells, tau_pool = impl.thresholds(params)
    _, rung_eps = impl.rung_epsilons(params)
    rungs_run = max(0, len(cells.nodes) - 1) if cells.nodes else 0
    steps: list[tuple[float, int, bool]] = [(noise_law_epsilon(params.eps_cells, m), tau_cells,
                                             False)]
    steps += [(noise_law_epsilon(rung_eps, m), impl.rung_threshold(params), False)] * rungs_run
    pool = len(steps)
    steps.append((noise_law_epsilon(params.eps_suppression, m), tau_pool, True))
    class_node = (cells.class_node if cells.class_node is not None
                  else np.where(cells.suppressed_class, -1, 0))
    class_step = np.where(class_node < 0, pool, class_node)
    shown = _published(cells)
    released = cells.released_counts[shown].astype(np.int64)
    step_of = class_step[cells.class_of_cell[shown]].astype(np.int64)
    inf_of = cells.inf_codes[shown].astype(np.int64)
    table = IntervalTable(level)
    columns, labels = _labels(rows)
    lower = np.zeros(released.size, dtype=np.int64)
    upper = np.zeros(released.size, dtype=np.int64)
    for s, (eps, tau, _) in enumerate(steps):
        here = step_of == s
        if here.any():
            lower[here], upper[here] = thresholded_bounds(released[here], eps, tau, level)
    table.add("count", columns, labels, released, lower, upper)
    # value totals
    value_columns, value_labels = _value_labels(context)
    values = (np.arange(context.n_inf) if params.public_domain else np.unique(inf_of))
    order = np.argsort(inf_of, kind="stable")
    starts = np.searchsorted(inf_of[order], values, side="left")
    ends = np.searchsorted(inf_of[order], values, side="right")
    frozen = tuple(steps)
    for holds, each in ((PER_ESTIMATE, level), (SIMULTANEOUS,
                                                bonferroni_level(level, values.size))):
        totals, lows, highs = [], [], []
        for start, end in zip(starts, ends, strict=True):
            mine = order[start:end]
            low, high = selected_total_interval(
                released[mine], step_of[mine], frozen, pool,
                0 if (step_of[mine] == pool).any() else 1, each)
            totals.append(int(released[mine].sum()))
            lows.append(low)
            highs.append(high)
        table.add("total", value_columns, value_labels[values], totals, lows, highs, holds)
    for analysis in analyses:
        _ipa_analysis(table, analysis, context, cells, rows, shown, released, step_of,
                      frozen, pool, bool(params.public_domain), level)
    return table


def _ancestor(taxonomy: Any, source: int, target: int) -> dict[str, str]:
    """Label at level ``source`` -> the label of its ancestor at level ``target``."""
    codes_s = np.asarray(taxonomy.level_codes[source], dtype=np.int64)
    codes_t = np.asarray(taxonomy.level_codes[target], dtype=np.int64)
    labels_s, labels_t = taxonomy.level_labels[source], taxonomy.level_labels[target]
    return {labels_s[a]: labels_t[b] for a, b in zip(codes_s, codes_t, strict=True)}


def _ipa_analysis(table: IntervalTable, analysis: tuple[str, ...], context: ReleaseContext,
                  cells: ReleasedCells, rows: ReleasedRows, shown: np.ndarray,
                  released: np.ndarray, step_of: np.ndarray,
                  steps: tuple[tuple[float, int, bool], ...], pool: int, public_domain: bool,
                  level: float) -> None:
    """One declared analysis's marginal cells at the chosen node's levels (``marginal``, per
    estimate and simultaneous): a cell's lower end from the published cells inside it (valid
    under selection), its upper end adding every published coarser cell that contains it
    (ladder rungs, the pool) and, per value whose pooled cell was not published, what the
    pool's threshold may have removed. Without a declared domain and without the informative
    column, how many values lost rows is unknown: such an analysis gets no interval."""
    dims = list(context.counts.dimensions)
    informative = list(context.counts.informative.columns)
    if any(c not in dims and c not in informative for c in analysis):
        return
    if not public_domain and not any(c in informative for c in analysis):
        return
    nodes = cells.nodes or ()
    chosen = nodes[0]
    taxonomies = context.lattice.taxonomies
    class_node = (cells.class_node if cells.class_node is not None
                  else np.where(cells.suppressed_class, -1, 0))[cells.class_of_cell[shown]]
    tops = tuple(t.height for t in taxonomies)
    cell_nodes = [nodes[k] if k >= 0 else tops for k in class_node]
    dim_index = {c: dims.index(c) for c in analysis if c in dims}
    levels = [tuple(n[dim_index[c]] if c in dim_index else 0 for c in analysis)
              for n in cell_nodes]
    labels = [rows.cells[c].to_numpy(dtype=object).astype(str) for c in analysis]
    own = tuple(chosen[dim_index[c]] if c in dim_index else 0 for c in analysis)
    keys = list(zip(*labels, strict=True)) if labels else []
    matched: dict[tuple, list[int]] = {}
    coarser: dict[tuple, dict[tuple, list[int]]] = {}
    same: dict[tuple[int, int], set[str]] = {}  # (column, level): labels equal to the node's

    def equivalent(k: int, lv: int, label: str) -> bool:
        """Whether a coarser label of column k is the node-level label of the same text,
        covering exactly it (a region '11' at every level): then its rows are that cell's."""
        if (k, lv) not in same:
            up = _ancestor(taxonomies[dim_index[analysis[k]]], own[k], lv)
            children: dict[str, list[str]] = {}
            for child, parent in up.items():
                children.setdefault(parent, []).append(child)
            same[(k, lv)] = {p for p, c in children.items() if c == [p]}
        return label in same[(k, lv)]

    for i, (lv, key) in enumerate(zip(levels, keys, strict=True)):
        differs = [k for k, (a, b) in enumerate(zip(lv, own, strict=True)) if a != b]
        if all(lv[k] > own[k] and equivalent(k, lv[k], key[k]) for k in differs):
            matched.setdefault(key, []).append(i)
        elif all(a >= b for a, b in zip(lv, own, strict=True)):
            coarser.setdefault(lv, {}).setdefault(key, []).append(i)
    maps = {}
    for lv in coarser:
        maps[lv] = [(_ancestor(taxonomies[dim_index[c]], own[k], lv[k])
                     if c in dim_index and lv[k] != own[k] else None)
                    for k, c in enumerate(analysis)]
    pooled = set(cells.inf_codes[shown][step_of == pool].tolist())
    value_code = {v: k for k, v in enumerate(_value_labels(context)[1])}
    inf_position = next((k for k, c in enumerate(analysis) if c in informative), None)
    groups = sorted(matched)
    family = bonferroni_level(level, len(groups))
    for holds, each in ((PER_ESTIMATE, level), (SIMULTANEOUS, family)):
        totals, lows, highs = [], [], []
        for key in groups:
            inside = np.asarray(matched[key], dtype=np.int64)
            over = []
            for lv, by_key in coarser.items():
                up = tuple(m[key[k]] if m is not None else key[k]
                           for k, m in enumerate(maps[lv]))
                over += by_key.get(up, [])
            over = np.asarray(over, dtype=np.int64)
            if inf_position is not None:
                code = value_code.get(key[inf_position])
                lost = int(code not in pooled)
            else:
                lost = context.n_inf - len(pooled)
            low, high = selected_total_interval(
                released[inside], step_of[inside], steps, pool, lost, each,
                released[over], step_of[over])
            totals.append(int(released[inside].sum()))
            lows.append(low)
            highs.append(high)
        table.add("marginal", list(analysis),
                  joined_cells([[k[i] for k in groups] for i in range(len(analysis))]),
                  totals, lows, highs, holds)


# -- histogram -------------------------------------------------------------------------------

def listed_clipped_bounds(released: np.ndarray, eps: float, level: float = LEVEL
                          ) -> tuple[np.ndarray, np.ndarray]:
    """The interval of a count released as R = max(0, n + Z) and *listed because R >= 1*
    (intervals.csv and data.csv show the cells with rows): given R >= 1, R = n + Z with
    n + Z >= 1, the thresholded law at tau = 1, so the selective interval holds for every n
    given that the cell is listed. (The unconditional ``clipped_interval`` would not: among
    the listed cells of a mostly empty domain, the empty ones that noise lifted to R >= 1
    outnumber the rest, and 12 % of listed intervals missed.) A cell not listed was
    released as 0: ``clipped_interval(0)`` = [0, k], stated in the manifest."""
    return thresholded_bounds(released, eps, 1, level)


MAX_ANALYSIS_CELLS = 1_000_000  # histogram: every cell of a declared analysis is listed


def _histogram_analysis(table: IntervalTable, analysis: tuple[str, ...], eps: float,
                        context: ReleaseContext, node: tuple[int, ...], domain: int,
                        rows: ReleasedRows, released: np.ndarray, level: float) -> None:
    """Every cell of one declared analysis at the node's levels (``marginal``, per estimate
    and simultaneous): the sum of the domain cells under it, each drawn as max(0, n + Z), so
    ``clipped_total_interval`` over domain / (the analysis's cells) cells holds for every cell
    — listed whether it came out 0 or not (no selection)."""
    dims = list(context.counts.dimensions)
    informative = list(context.counts.informative.columns)
    if any(c not in dims and c not in informative for c in analysis):
        return
    value_labels = _value_labels(context)[1]
    axes = [(np.asarray(context.lattice.taxonomies[dims.index(c)].level_labels[
        node[dims.index(c)]], dtype=object).astype(str) if c in dims
             else np.asarray(value_labels, dtype=object).astype(str)) for c in analysis]
    size = int(np.prod([a.size for a in axes]))
    if not size or size > MAX_ANALYSIS_CELLS:
        return
    grid = np.unravel_index(np.arange(size), [a.size for a in axes])
    labels = joined_cells([a[g] for a, g in zip(axes, grid, strict=True)])
    shown = joined_cells([rows.cells[c].to_numpy(dtype=object).astype(str) for c in analysis])
    totals = pd.Series(released).groupby(shown).sum().reindex(labels).fillna(0)
    totals = totals.to_numpy(dtype=np.int64)
    under = domain // size
    for holds, each in ((PER_ESTIMATE, level), (SIMULTANEOUS, bonferroni_level(level, size))):
        spans = np.array([clipped_total_interval(t, eps, under, each) for t in totals]
                         ).reshape(-1, 2)
        table.add("marginal", list(analysis), labels, totals, spans[:, 0], spans[:, 1], holds)


def histogram_interval_table(params: Any, step_epsilon: float, context: ReleaseContext,
                             cells: ReleasedCells, rows: ReleasedRows, classes: int,
                             level: float = LEVEL, node: tuple[int, ...] = (),
                             analyses: tuple[tuple[str, ...], ...] = ()) -> IntervalTable:
    """Every listed cell's interval given R >= 1 (``count``; a cell of the domain absent from
    the data was released as 0: the manifest states its interval), and every value of the
    domain's total over the node's ``classes`` cells (``total``, per estimate and
    simultaneous)."""
    eps = noise_law_epsilon(step_epsilon, params.unit_rows)
    shown = _published(cells)
    released = cells.released_counts[shown].astype(np.int64)
    table = IntervalTable(level)
    columns, labels = _labels(rows)
    low, high = listed_clipped_bounds(released, eps, level)
    table.add("count", columns, labels, released, low, high)
    value_columns, value_labels = _value_labels(context)
    totals = np.bincount(cells.inf_codes[shown], weights=released,
                         minlength=context.n_inf).astype(np.int64)
    for holds, each in ((PER_ESTIMATE, level),
                        (SIMULTANEOUS, bonferroni_level(level, context.n_inf))):
        spans = np.array([clipped_total_interval(t, eps, classes, each) for t in totals]
                         ).reshape(-1, 2)
        table.add("total", value_columns, value_labels, totals, spans[:, 0], spans[:, 1],
                  holds)
    for analysis in analyses:
        _histogram_analysis(table, analysis, eps, context, node, classes * context.n_inf,
                            rows, released, level)
    return table


def released_frame_labels(frame: pd.DataFrame, columns: list[str]) -> np.ndarray:
    """Labels of a released frame's rows, joined (DiffGen's and the audit's)."""
    return joined_cells([frame[c].to_numpy(dtype=object) for c in columns])
