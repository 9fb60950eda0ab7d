"""``ipa``: IPA with a sound (eps, delta)-DP guarantee (ALGORITHMS.md §3) — the default.

Same product as the paper — generalized dimensions, raw informative values, microdata — but
every released cell is a noisy count that passed a stability threshold, and the node is chosen
by a score that steers:

1. node choice: the exponential mechanism over every lattice node g with the score
   ``U_g = sum over cells c = (class E, value v) of w(E) * max(0, n_c - tau + 1)``, where
   ``w(E) = floor(2^16 (1 - NCP(E)))`` comes from the class's labels and the taxonomies only
   and ``tau`` is the cells' public release threshold. One row changes one cell per node by
   one, so the sensitivity is 2^16 (one weight unit), and adding a row never lowers a score
   (monotone): probabilities ∝ exp(eps_candidates * U / 2^16). Scores are exact integers.
2. cells at g, drawn once (nothing is perturbed for the choice): discrete Laplace of scale
   1/eps_cells per (class, value) cell, kept iff the noisy count >= tau_cells;
3. the fallback ladder (``ladder_rungs`` R): the rows of the cells dropped so far, rolled up
   to a coarser node chosen among the nodes above the previous rung with the same score
   (private, monotone), released the same way;
4. suppression: the rows still left pool per informative value into (*, ..., *, v) cells,
   released the same way.

Proof (docs/PRIVACY.md, "ipa"): each step, given the outputs before it, is a function of a
table that differs by at most one row between neighbours — rows of dropped cells are placed
again, rows of kept cells never — so adaptive sequential composition gives
(sum of the step epsilons, sum of the step deltas) under add/remove one row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from pydantic import Field, field_validator
from pydantic.json_schema import SkipJsonSchema

from medrelease.data.lattice import Node, NodeTable, iter_above
from medrelease.errors import ParameterError
from medrelease.evidence.metrics import ReleasedCells
from medrelease.mechanisms.base import (
    Capabilities,
    MechanismBase,
    MechanismParams,
    NodeSummary,
    ReleaseContext,
    ReleaseShape,
    declared_draws,
    expected_rows_above,
    noise_bound,
    parse,
    split_budget,
    summarize,
)
from medrelease.mechanisms.interval_rows import ipa_interval_table
from medrelease.privacy.guarantee import ADD_REMOVE_ONE_ROW, BudgetStep, Guarantee, StepDraws
from medrelease.privacy.intervals import (
    LEVEL,
    CountIntervals,
    cells_entry,
    noise_law_epsilon,
    one_sided_width,
)
from medrelease.privacy.randomness import (
    discrete_laplace,
    exponential_mechanism,
    generator_for,
    noise_epsilon,
    selection_probabilities,
)
from medrelease.privacy.unit_cut import unit_cut_epsilon, unit_cut_step

# Default shares of epsilon, measured in benchmarks/ipa_split.py (docs/PRIVACY.md says why).
IPA_SHARES = {"eps_candidates": 0.05, "eps_cells": 0.62, "eps_ladder": 0.31,
              "eps_suppression": 0.02}
NO_LADDER_SHARES = {"eps_candidates": 0.05, "eps_cells": 0.90, "eps_suppression": 0.05}
LADDER_SELECTION_SHARE = 0.1   # of each rung's epsilon: choosing the rung's node
LABEL = "sound (epsilon, delta)-DP, proven (what it means: this release's report)"
WEIGHT_SCALE = 1 << 16         # score unit: a class weight is an integer in [0, 2^16]
DEFAULT_DELTA = 1e-6
MAX_EXACT_SCORE = 1 << 53      # scores pass through doubles: they must stay exact integers
POOL_FLOOR = 10                # measured in benchmarks/ipa_split.py (docs/PRIVACY.md)
EVERY_VALUE_SHARES = {"eps_candidates": 0.05, "eps_cells": 0.55, "eps_ladder": 0.30,
                      "eps_suppression": 0.10}


class IPAParams(MechanismParams):
    """Total eps and its split, total delta (a fixed default), minimum cell size, ladder."""

    epsilon: float = Field(default=1.0, description="total privacy budget")
    eps_candidates: float | None = Field(default=None, description="node selection (0.05 eps)")
    eps_cells: float | None = Field(default=None, description="noisy cells at the node (0.62 eps)")
    eps_ladder: float | None = Field(
        default=None, description="fallback ladder, all rungs together (0.31 eps)")
    eps_suppression: float | None = Field(default=None, description="pooled '*' cells (0.02 eps)")
    delta: float | None = Field(
        default=None, description="total delta, split evenly over the cell steps; default 1e-6 "
                                  "(or 1/(10 N) for a declared public bound N on the rows)"
    )
    suppression_threshold: int = Field(
        default=2, description="t: a released cell never has fewer rows than max(t, tau)"
    )
    ladder_rungs: int = Field(
        default=1, ge=0, le=4,
        description="coarser nodes the rows of dropped cells get a second chance at (0: none)")
    pool_every_value: bool = Field(
        default=False,
        description="needs a public informative domain: release the '*' pool as a noisy count "
                    "for every value of the domain (pure eps, rare values kept, noise rows "
                    "added) instead of thresholded cells of the values present")
    pool_floor: int = Field(
        default=POOL_FLOOR, ge=1, le=10_000,
        description="with pool_every_value: pooled counts below this are not released "
                    "(post-processing)")

    @field_validator("delta")
    @classmethod
    def _delta_in_unit_interval(cls, value: float | None) -> float | None:
        if value is not None and not (0.0 < value < 1.0):
            raise ValueError(
                "delta must lie strictly between 0 and 1: delta = 0 makes the release threshold "
                "infinite, delta >= 1 promises nothing"
            )
        return value

    @field_validator("suppression_threshold")
    @classmethod
    def _t_at_least_two(cls, value: int) -> int:
        if value < 2:
            raise ValueError("suppression_threshold t must be at least 2 (a class of one row "
                             "would be published as such; the score needs tau >= 2)")
        return value

    # Set by the release driver from the dataset config, never by users.
    max_rows: SkipJsonSchema[int | None] = None
    public_domain: SkipJsonSchema[bool] = False
    unit_rows: SkipJsonSchema[int] = 1  # m: a unit of up to m rows, spread over up to m cells
    unit_column: SkipJsonSchema[str | None] = None  # a declared unit: its cut is published


def default_delta(max_rows: int | None) -> float:
    """1e-6, or 1/(10 N) for a *declared* public bound N on the rows — never the data's n.

    A delta (hence a threshold) that moved with the table's own size would leak it and, for
    cells sitting exactly at the threshold, break the bound (docs/PRIVACY.md).
    """
    if max_rows is None:
        return DEFAULT_DELTA
    return min(DEFAULT_DELTA, 1.0 / (10 * max_rows))


def release_threshold(epsilon: float, delta: float, minimum: int, unit_rows: int = 1) -> int:
    """Smallest integer tau with P(1 + Z >= tau) <= delta for Z ~ discrete Laplace(eps); for a
    unit of ``unit_rows`` m > 1, see ``unit_release_threshold``.

    A cell that exists in only one of two neighbouring tables has count 1 there; it is released
    only if 1 + Z >= tau, which this tau makes a delta-probability event. P(Z >= k) =
    exp(-eps' k) / (1 + exp(-eps')) <= delta  <=>  k >= (ln(1/delta) - ln(1 + exp(-eps'))) / eps';
    a closed form (no search that could run forever), rounded up with a margin against float
    error, so tau is never one too small.
    """
    if unit_rows > 1:
        return unit_release_threshold(epsilon, delta, minimum, unit_rows)
    eps = noise_epsilon(epsilon)
    need = (-math.log(delta) - math.log1p(math.exp(-eps))) / eps
    k = max(1, math.ceil(need * (1 + 1e-12) + 1e-9))
    return max(1 + k, minimum)


def unit_release_threshold(epsilon: float, delta: float, minimum: int, unit_rows: int) -> int:
    """Smallest tau >= m + 1 with sum_i P(k_i + Z >= tau) <= delta for *every* way a unit of m
    rows can open new cells (counts k_1..k_j >= 1, sum <= m), Z ~ discrete Laplace(eps / m).

    With tau - k_i >= 1, P(k + Z >= tau) = exp(-eps'(tau - k)) / (1 + exp(-eps')), so the sum
    is exp(-eps' tau) B / (1 + exp(-eps')) with B = max over those counts of sum exp(eps' k_i)
    (``worst_new_cells``, exact by dynamic programming). Closed form in tau, rounded up with a
    margin against float error.
    """
    eps = noise_epsilon(epsilon / unit_rows)
    need = (worst_new_cells(eps, unit_rows) - math.log1p(math.exp(-eps)) - math.log(delta)) / eps
    return max(math.ceil(need * (1 + 1e-12) + 1e-9), unit_rows + 1, minimum)


def worst_new_cells(eps: float, unit_rows: int) -> float:
    """log max over compositions (k_1..k_j) of at most m of sum_i exp(eps k_i).

    best[s] = max_k logaddexp(eps k, best[s - k]): the worst split of s rows into new cells
    (one cell of m rows when eps m is large, m cells of one row when eps is small)."""
    best = [-math.inf] * (unit_rows + 1)
    for s in range(1, unit_rows + 1):
        best[s] = max(float(np.logaddexp(eps * k, best[s - k])) for k in range(1, s + 1))
    return max(best)


# -- the selection score ----------------------------------------------------------------------

def class_weights(context: ReleaseContext, node: Node, class_keys: np.ndarray) -> np.ndarray:
    """w(E) = floor(2^16 (1 - NCP(E))): from labels and taxonomies only, never row counts."""
    return _weights_of(context.lattice_ncp(node, class_keys))


def _weights_of(ncp: np.ndarray) -> np.ndarray:
    return np.floor((1.0 - np.clip(ncp, 0.0, 1.0)) * WEIGHT_SCALE).astype(np.int64)


def selection_score(context: ReleaseContext, table: NodeTable, tau: int) -> int:
    """U_g in weight units: sum of w(E) * max(0, n_c - tau + 1) over the node's cells.

    tau >= 2, so a cell of one row adds nothing; each cell term is 1-Lipschitz in its count.
    """
    if table.counts.size == 0:
        return 0
    _, class_of_cell, class_keys = table.classes()
    return _score(table.counts, class_of_cell, class_weights(context, table.node, class_keys),
                  tau)


def _score(counts: np.ndarray, class_of_cell: np.ndarray, weights: np.ndarray, tau: int) -> int:
    surplus = np.maximum(0, counts.astype(np.int64) - (tau - 1))
    score = int(np.dot(weights[class_of_cell], surplus))
    if score >= MAX_EXACT_SCORE:
        raise ParameterError("ipa: the table is too large for an exact selection score")
    return score


def choose_by_score(rng: np.random.Generator, scores: list[int], epsilon: float) -> int:
    """Exponential mechanism, monotone form: P(i) ∝ exp(eps * U_i / 2^16), drawn exactly."""
    return exponential_mechanism(rng, np.asarray(scores, dtype=np.float64), epsilon,
                                 WEIGHT_SCALE, monotone=True)


class IPA(MechanismBase):
    name: ClassVar[str] = "ipa"
    capabilities: ClassVar[Capabilities] = Capabilities(
        summary="(eps, delta)-DP, proven",
        gives=("real rows, quasi-identifiers generalized, informative values raw (counts "
               "noisy, rare cells pooled)"),
        draws_declared_steps=True,
        loss_reason=("a cell is released only when its noisy count reaches a threshold; rows "
                     "of smaller cells are pooled per value, and a pool below its own "
                     "threshold is not released"),
        published_tables=("intervals.csv",),
    )
    selection: ClassVar[str] = "exponential"
    selection_step: ClassVar[str] = "node selection"
    Params: ClassVar[type[MechanismParams]] = IPAParams

    def parse_params(self, raw: dict[str, Any]) -> IPAParams:
        params = parse(IPAParams, raw, self.name)
        if params.pool_every_value and not params.public_domain:
            raise ParameterError(
                "ipa: pool_every_value needs a public informative domain (a 'domain' file "
                "for the informative column in the dataset config)")
        defaults = (NO_LADDER_SHARES if not params.ladder_rungs
                    else EVERY_VALUE_SHARES if params.pool_every_value else IPA_SHARES)
        if not params.ladder_rungs and params.eps_ladder is not None:
            raise ParameterError("ipa: eps_ladder is given but ladder_rungs is 0")
        given = {k: getattr(params, k) for k in defaults}
        # with a declared unit, the count of rows its bound removed takes its share first
        main = params.epsilon - unit_cut_epsilon(params.epsilon, params.unit_column)
        shares = split_budget(self.name, main, given, defaults)
        delta = params.delta if params.delta is not None else default_delta(params.max_rows)
        return params.model_copy(update={**shares, "delta": delta})

    # -- the privacy map -------------------------------------------------------------------

    def step_delta(self, params: IPAParams) -> float:
        """delta shared by the thresholded steps (the pool is pure eps on a public domain)."""
        thresholded = params.ladder_rungs + 1 + (0 if params.pool_every_value else 1)
        return params.delta / thresholded

    def rung_epsilons(self, params: IPAParams) -> tuple[float, float]:
        """(node choice, cells) of one ladder rung."""
        if not params.ladder_rungs:
            return 0.0, 0.0
        rung = params.eps_ladder / params.ladder_rungs
        return rung * LADDER_SELECTION_SHARE, rung * (1 - LADDER_SELECTION_SHARE)

    def thresholds(self, params: IPAParams) -> tuple[int, int]:
        """(tau of the chosen node's cells, tau of the pooled '*' cells)."""
        d, t = self.step_delta(params), params.suppression_threshold
        m = params.unit_rows
        tau_pool = (max(params.pool_floor, t) if params.pool_every_value
                    else release_threshold(params.eps_suppression, d, t, m))
        return release_threshold(params.eps_cells, d, t, m), tau_pool

    def expected_noise_rows(self, context: ReleaseContext, params: IPAParams) -> float:
        """Only the pool of every informative value (``pool_every_value``) releases cells that
        may be empty; its noisy counts are released from ``tau_pool`` up. Every other cell
        exists in the input and passes a threshold that is a delta-probability event for noise
        alone."""
        if not params.pool_every_value:
            return 0.0
        _, tau_pool = self.thresholds(params)
        return context.n_inf * expected_rows_above(params.eps_suppression / params.unit_rows,
                                                   tau_pool)

    def rung_threshold(self, params: IPAParams) -> int:
        _, cells = self.rung_epsilons(params)
        return release_threshold(cells, self.step_delta(params), params.suppression_threshold,
                                 params.unit_rows)

    def guarantee(self, params: IPAParams) -> Guarantee:
        tau_cells, tau_sup = self.thresholds(params)
        ladder = (f"; ladder rungs: >= {self.rung_threshold(params)}"
                  if params.ladder_rungs else "")
        pool = (f"every domain value drawn, counts below {tau_sup} dropped"
                if params.pool_every_value else f">= {tau_sup}")
        return Guarantee(
            mechanism=self.name,
            epsilon=params.epsilon,
            delta=params.delta,
            neighbouring=ADD_REMOVE_ONE_ROW,
            proven=True,
            label=LABEL,
            notes=(f"cells released only with noisy count >= {tau_cells}{ladder} (pooled '*' "
                   f"cells: {pool}); noise is discrete Laplace"),
        )

    def budget_steps(self, params: IPAParams) -> list[BudgetStep]:
        d = self.step_delta(params)
        steps = [
            BudgetStep("node selection", params.eps_candidates, 0.0, self.name,
                       "exponential mechanism over lattice nodes, score U (weighted rows in "
                       f"cells above the threshold), sensitivity {params.unit_rows} weight "
                       f"unit{'s' if params.unit_rows > 1 else ''}, monotone"),
            BudgetStep("cells", params.eps_cells, d, self.name,
                       "discrete Laplace per (class, informative value) cell + threshold"),
        ]
        choose, cells = self.rung_epsilons(params)
        for rung in range(1, params.ladder_rungs + 1):
            steps += [
                BudgetStep(f"ladder rung {rung}: node", choose, 0.0, self.name,
                           "exponential mechanism over the nodes above the previous rung, "
                           "score U of the rows not yet placed"),
                BudgetStep(f"ladder rung {rung}: cells", cells, d, self.name,
                           "discrete Laplace per cell of the rows not yet placed + threshold"),
            ]
        if params.pool_every_value:
            steps.append(BudgetStep(
                "suppressed cells", params.eps_suppression, 0.0, self.name,
                "discrete Laplace on every value v of the public informative domain, pooled "
                "(*, v) cells; counts below the floor dropped after the draw (pure eps)"))
        else:
            steps.append(BudgetStep("suppressed cells", params.eps_suppression, d, self.name,
                                    "discrete Laplace per pooled (*, v) cell + threshold"))
        return steps + unit_cut_step(params.epsilon, params.unit_column, self.name)

    def error_bars(self, params: IPAParams, context: ReleaseContext | None = None,
                   node: Node | None = None) -> dict[str, Any]:
        """95 % intervals for the researcher, from the declared steps' noise and thresholds
        (public parameters only): each released count by its step, and what the pool's
        threshold may remove from a value's total."""
        m = params.unit_rows
        tau_cells, tau_pool = self.thresholds(params)
        steps = [("cells at the chosen node", params.eps_cells, tau_cells)]
        _, rung_cells = self.rung_epsilons(params)
        steps += [(f"cells at ladder rung {rung}", rung_cells, self.rung_threshold(params))
                  for rung in range(1, params.ladder_rungs + 1)]
        steps.append(("pooled cells (*, ..., *, value)", params.eps_suppression, tau_pool))
        cells = [cells_entry(name, CountIntervals.thresholded(noise_law_epsilon(eps, m), tau),
                             eps, m) for name, eps, tau in steps]
        lost = self.pool_loss_bound(params)
        return {
            "level": LEVEL,
            "statement": (
                "Each released row stands for one input row of its (class, value) cell; a "
                "cell's released count R is its true count n plus discrete Laplace noise, and "
                "a cell is published only when R reaches its threshold. The intervals below "
                "are selective: they hold with 95 % probability for every true count, given "
                "that the cell was published. Rows of cells below the threshold are not lost "
                "at once: they move to the next ladder rung, then to the pooled "
                "(*, ..., *, value) cell."),
            "cells": cells,
            "totals": (
                "A value's total (intervals.csv, what = total) is valid under selection: the "
                "published cells near a threshold were published because their noise was "
                "high, so the lower end allows for that noise given publication (and for "
                "cells that fell short of the threshold), and the upper end adds what the "
                "release could not show: when the release has no pooled (*, ..., *, value) "
                f"row for a value, up to {lost} of its rows (95 %) may have fallen below the "
                "pool's threshold, so its upper end is that much above the released total. "
                "A value absent from the release had at most that many rows."),
            "value_loss_bound": lost,
        }

    def interval_table(self, params: IPAParams, context: ReleaseContext,
                       cells: ReleasedCells, rows: Any,
                       analyses: tuple[tuple[str, ...], ...] = ()) -> Any:
        """``intervals.csv``: every published cell's selective interval and every value's
        total valid under selection (``interval_rows.ipa_interval_table``)."""
        return ipa_interval_table(self, params, context, cells, rows, analyses)

    def pool_loss_bound(self, params: IPAParams) -> int:
        """Rows of one value a dropped pooled cell may have held, at 97.5 %: n + Z < tau
        means n <= tau - 1 - Z, and Z >= -k with 97.5 % probability."""
        _, tau_pool = self.thresholds(params)
        eps = noise_law_epsilon(params.eps_suppression, params.unit_rows)
        return tau_pool - 1 + one_sided_width(eps, (1 + LEVEL) / 2)

    def row_bounds(self, params: IPAParams, shape: ReleaseShape) -> tuple[int, int]:
        """No minimum (every cell may be dropped); each cell adds at most ``noise_bound`` rows."""
        cells = shape.cells
        widest = noise_bound(min(params.eps_cells, params.eps_suppression,
                                 self.rung_epsilons(params)[1] or params.eps_cells)
                             / params.unit_rows)
        return 0, int(cells.true_counts.sum()) + int(cells.true_counts.size) * widest

    # -- scoring: deterministic, from roll-ups ---------------------------------------------

    def selection_utility(self, summaries: list[NodeSummary],
                          params: IPAParams) -> tuple[np.ndarray, float, bool]:
        return (np.array([s.score for s in summaries]), float(WEIGHT_SCALE * params.unit_rows),
                True)

    def score_node(self, context: ReleaseContext, table: NodeTable, index: int,
                   seed: np.random.SeedSequence, params: IPAParams,
                   steps: list[BudgetStep]) -> NodeSummary:
        """The node's score and, for the steward, what a noise-free release would look like:
        from the roll-up alone, so no seed is used and no step is drawn."""
        tau_cells, _ = self.thresholds(params)
        return noise_free_summary(context, table, tau_cells)

    # -- the release: every random draw of the mechanism happens here ----------------------

    def materialize(
        self, context: ReleaseContext, table: NodeTable, seed: np.random.SeedSequence,
        params: IPAParams, draws: StepDraws | None = None,
    ) -> ReleasedCells:
        """Steps 2-4 of the mechanism, each drawn with the plan's declared step (``draws``)."""
        rng = generator_for(seed)
        draws = draws or declared_draws(self, self.budget_steps(params))
        t, m = params.suppression_threshold, params.unit_rows  # noise at eps / m: L1 <= m
        cells = draws.take("cells")
        parts = [_noisy_cells(rng, table, cells.epsilon / m,
                              release_threshold(cells.epsilon, cells.delta, t, m))]
        left = _dropped(table, parts[-1])
        for rung in range(1, params.ladder_rungs + 1):
            above = [u for u in iter_above(context.lattice, left)
                     if u.node != context.lattice.nodes[-1]]
            if not above:
                for name in (f"ladder rung {r}: {part}" for r in range(rung,
                             params.ladder_rungs + 1) for part in ("node", "cells")):
                    draws.pass_over(name, "no coarser node below the top is left")
                break
            choose, rung_cells = (draws.take(f"ladder rung {rung}: node"),
                                  draws.take(f"ladder rung {rung}: cells"))
            tau_rung = release_threshold(rung_cells.epsilon, rung_cells.delta, t, m)
            scores = [selection_score(context, u, tau_rung) for u in above]
            chosen = above[choose_by_score(rng, scores, choose.epsilon / m)]  # sensitivity m
            parts.append(_noisy_cells(rng, chosen, rung_cells.epsilon / m, tau_rung))
            left = _dropped(chosen, parts[-1])
        pool_step = draws.take("suppressed cells")
        tau_sup = (self.thresholds(params)[1] if params.pool_every_value  # a public floor
                   else release_threshold(pool_step.epsilon, pool_step.delta, t, m))
        pool = _pooled(rng, context.n_inf, left, pool_step.epsilon / m, tau_sup,
                       every_value=params.pool_every_value)
        return _assemble(context, parts, pool)


def noise_free_summary(context: ReleaseContext, table: NodeTable, tau: int) -> NodeSummary:
    """Score U and the summary of the noise-free release at the node, from its roll-up alone.

    The same figures as ``summarize`` of ``_noise_free`` (tested equal) without building the
    release: cells with at least tau rows kept exactly, the rest pooled under '*' with their
    true counts. A class keeping R of its T rows has EMD 1 - R/T (the kept cells' shares grow
    by T/R, the dropped ones vanish) and no noise; the pool keeps its rows, so its EMD is 0.
    """
    index = context.lattice.index(table.node)
    if table.counts.size == 0:
        return NodeSummary(**{**summarize(index, table.node,
                                          _noise_free(context, table, tau)).__dict__,
                              "score": 0})
    heavy = _heavy_classes(table, tau)
    total = int(table.counts.sum())
    pooled = total - int(heavy.kept_rows.sum())
    has_pool = pooled > 0
    ncp = context.lattice_ncp(table.node, heavy.class_keys)
    released = np.concatenate([heavy.kept_rows, [pooled] if has_pool else []])
    class_ncp = np.concatenate([ncp, [1.0] if has_pool else []])
    emd_class = np.concatenate([1.0 - heavy.kept_rows / heavy.class_rows,
                                [0.0] if has_pool else []])
    mean_ncp = min(float(np.dot(released, class_ncp) / total), 1.0)
    emd = float(np.clip(emd_class, 0.0, 1.0).mean())
    score = int(np.dot(_weights_of(ncp), heavy.surplus))
    if score >= MAX_EXACT_SCORE:
        raise ParameterError("ipa: the table is too large for an exact selection score")
    return NodeSummary(
        index=index, node=tuple(int(x) for x in table.node), height=int(sum(table.node)),
        ncp=mean_ncp, emd=emd, rate=0.0, il=mean_ncp + emd, score=score,
        classes=int(released.size), suppressed_classes=int(has_pool),
        suppressed_rows=int(pooled), noise_rows=0, released_rows=total)


@dataclass(frozen=True)
class HeavyClasses:
    """The classes of a node holding a cell of at least tau rows, and what the summary needs
    of them: rows in all their cells, rows in their kept cells, and sum of max(0, n - tau + 1).
    Classes with no such cell release nothing of their own (their rows go to the pool)."""

    class_keys: np.ndarray
    class_rows: np.ndarray
    kept_rows: np.ndarray
    surplus: np.ndarray


def _heavy_classes(table: NodeTable, tau: int) -> HeavyClasses:
    """Two passes over the node's cells (which reach tau), then work on the kept cells and
    their classes only: at the lattice's lower nodes almost every cell is below tau (1M cells,
    a few thousand kept), so each kept class's cells are found by binary search on the sorted
    keys rather than by dividing every key by the informative radix (0.25 s of 2.5 s of
    scoring the NPS-like table)."""
    counts = table.counts
    kept = np.flatnonzero(counts >= tau)
    if kept.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return HeavyClasses(empty, empty, empty, empty)
    kept_class = table.cell_keys[kept] // table.n_inf  # sorted: the keys are
    first = np.flatnonzero(np.diff(kept_class, prepend=-1))
    class_keys = kept_class[first]
    bounds = np.empty(2 * class_keys.size, dtype=np.intp)
    bounds[0::2] = np.searchsorted(table.cell_keys, class_keys * table.n_inf)
    bounds[1::2] = np.searchsorted(table.cell_keys, (class_keys + 1) * table.n_inf)
    # Sums over [first cell, last cell + 1) of each class; the odd segments (between classes)
    # are dropped. A bound at the table's end is left out: reduceat's last segment runs there.
    ends_at_table_end = bounds[-1] == counts.size
    segment_sums = np.add.reduceat(counts.astype(np.int64, copy=False),
                                   bounds[:-1] if ends_at_table_end else bounds)
    kept_counts = counts[kept].astype(np.int64)
    return HeavyClasses(
        class_keys=class_keys,
        class_rows=segment_sums[0::2],
        kept_rows=np.add.reduceat(kept_counts, first),
        surplus=np.add.reduceat(kept_counts - (tau - 1), first),
    )


def _noise_free(context: ReleaseContext, table: NodeTable, tau: int) -> ReleasedCells:
    """Cells kept iff their true count reaches tau, no noise; the rest pooled under '*'."""
    kept = table.counts >= tau
    part = (table, table.counts.astype(np.int64), kept)
    left = _dropped(table, part)
    totals = np.bincount(left.inf_codes, weights=left.counts, minlength=context.n_inf)
    pool_inf = np.flatnonzero(totals)
    pool_counts = totals[pool_inf].astype(np.int64)
    return _assemble(context, [part], (pool_inf, pool_counts, pool_counts))


def _noisy_cells(rng: np.random.Generator, table: NodeTable, epsilon: float,
                 tau: int) -> tuple[NodeTable, np.ndarray, np.ndarray]:
    noisy = table.counts + discrete_laplace(rng, epsilon, table.counts.size)
    return table, noisy, noisy >= tau


def _dropped(table: NodeTable, part: tuple[NodeTable, np.ndarray, np.ndarray]) -> NodeTable:
    """The rows of the cells not released, still at the node's level (they get another rung)."""
    kept = part[2]
    return NodeTable(table.node, table.cell_keys[~kept], table.counts[~kept], table.n_inf)


def _pooled(rng: np.random.Generator, n_inf: int, left: NodeTable, epsilon: float,
            tau: int, every_value: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(value codes, true counts, released counts) of the (*, ..., *, v) cells.

    ``every_value`` (a public informative domain): every value of the domain is drawn, zero
    counts included, so which values appear is itself noisy and no delta is needed; ``tau`` is
    then a public floor applied after the draw. Otherwise only the values present are drawn
    and ``tau`` is the delta-calibrated threshold.
    """
    totals = np.bincount(left.inf_codes, weights=left.counts, minlength=n_inf).astype(np.int64)
    values = np.arange(n_inf) if every_value else np.flatnonzero(totals)
    counts = totals[values]
    noisy = counts + discrete_laplace(rng, epsilon, values.size)
    released = np.where(noisy >= tau, noisy, 0)
    keep = (counts > 0) | (released > 0)
    return values[keep], counts[keep], released[keep]


def _assemble(context: ReleaseContext, parts: list, pool: tuple) -> ReleasedCells:
    """One ReleasedCells over the rungs' classes (in rung order) and the '*' class last."""
    class_of, inf, true, released, noise, ncp, keys, node_of = [], [], [], [], [], [], [], []
    offset = 0
    for rung, (table, noisy, kept) in enumerate(parts):
        starts, class_of_cell, class_keys = table.classes()
        class_of.append(class_of_cell + offset)
        inf.append(table.inf_codes)
        true.append(table.counts)
        released.append(np.where(kept, noisy, 0))
        noise.append(np.where(kept, np.abs(noisy - table.counts), 0))
        ncp.append(context.lattice_ncp(table.node, class_keys))
        keys.append(class_keys)
        node_of.append(np.full(starts.size, rung))
        offset += starts.size
    pool_inf, pool_true, pool_released = pool
    has_pool = pool_inf.size > 0
    n_classes = offset + int(has_pool)
    class_of.append(np.full(pool_inf.size, offset))
    inf.append(pool_inf)
    true.append(pool_true)
    released.append(pool_released)
    noise.append(np.where(pool_released > 0, np.abs(pool_released - pool_true), 0))
    ncp.append(np.ones(int(has_pool)))
    keys.append(np.full(int(has_pool), -1))
    node_of.append(np.full(int(has_pool), -1))
    class_of_cell = np.concatenate(class_of).astype(np.int64)
    suppressed = np.zeros(n_classes, dtype=bool)
    suppressed[offset:] = True
    return ReleasedCells(
        class_of_cell=class_of_cell,
        inf_codes=np.concatenate(inf).astype(np.int64),
        true_counts=np.concatenate(true).astype(np.int64),
        released_counts=np.concatenate(released).astype(np.int64),
        class_extra=np.zeros(n_classes),
        class_noise=np.bincount(class_of_cell, weights=np.concatenate(noise),
                                minlength=n_classes),
        class_ncp=np.concatenate(ncp),
        suppressed_class=suppressed,
        class_keys=np.concatenate(keys).astype(np.int64),
        class_node=np.concatenate(node_of).astype(np.int64),
        nodes=tuple(part[0].node for part in parts),
    )


def top_probability(scores: np.ndarray, epsilon: float) -> float:
    """Probability that the top-scored node is chosen (for the report)."""
    probs = selection_probabilities(scores, epsilon, WEIGHT_SCALE, monotone=True)
    return float(probs[int(np.argmax(scores))])
