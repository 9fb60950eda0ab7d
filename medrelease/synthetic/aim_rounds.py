"""AIM's rounds on the taxonomies: candidates, private selection, measurement, estimation.

McKenna et al., VLDB 2022, Algorithm 2, with one change of substance: a candidate is a set of
attributes *and a taxonomy level for each*, so a coarse marginal (a 10-year age band, a
diagnosis chapter) competes with the fine one and is measured where the fine one would drown
in noise. Every marginal is a roll-up of the aggregated count table; the estimator (Private-PGM)
takes a coarse marginal as a linear measurement of the fine clique.

Accounting (docs/PRIVACY.md, "aim"), for neighbours that differ in one row:
* round 0: every attribute's leaf-level 1-way marginal, discrete Gaussian sigma_0;
* round t: exponential mechanism with eps_t over score
  ``w_r (||M_r(p_hat) - M_r(D)||_1 - sqrt(2/pi) sigma_t n_r)`` (sensitivity max w_r), then the
  chosen marginal + N_Z(0, sigma_t^2) (L2 sensitivity 1): rho_t = eps_t^2/8 + 1/(2 sigma_t^2);
* annealing (sigma halves, eps doubles) when the estimate moved less than the expected noise;
  the last round spends exactly what is left. sigma^2 is rounded up to the sampler's grid and
  the rounded value is what is charged, so the rho used never exceeds the rho planned.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from medrelease.data.constraints import ImpossibleCombos
from medrelease.privacy.randomness import exponential_mechanism
from medrelease.privacy.zcdp import (
    RhoFilter,
    discrete_gaussian,
    exponential_rho,
    gaussian_rho,
    grid_sigma_sq,
)
from medrelease.synthetic import pgm
from medrelease.synthetic.axis_sums import marginal_of_subset
from medrelease.synthetic.junction_tree import sizes_with_each
from medrelease.synthetic.space import (
    Columns,
    Levels,
    MarginalSpace,
    RollUps,
    merge_rare,
    rare_groups,
    shrunk_weights,
)

EXPECTED_ABS = math.sqrt(2.0 / math.pi)  # E|N(0, 1)|
MEASURE_SHARE = 0.9  # of a round's rho: the measurement (the rest: selection), as in AIM
MERGE_SIGMAS = 3.0   # a value whose round-0 noisy count is below this many sigmas is merged
MAX_REDRAWS = 30     # batches drawn again to replace rows holding an impossible combination


@dataclass(frozen=True)
class Candidate:
    columns: Columns
    levels: Levels
    weight: float


@dataclass(frozen=True)
class Settings:
    """Public parameters of the rounds (validated by the mechanism's ``Params``)."""

    rho: float
    rounds: int
    max_model_size: float  # MB of the junction tree, as in AIM
    max_cells: int         # a candidate's own cells
    iters: int             # mirror descent steps per round (at most)
    final_iters: int
    tolerance: float | None = None  # stop a fit early below this relative loss improvement
    max_rows: int | None = None     # the public ceiling on the rows sampled (and the total)
    analyses_rho: float = 0.0       # of ``rho``: the declared analyses' measurements, first

    @property
    def rounds_rest(self) -> float:
        """The rho the rounds plan with once the declared analyses have theirs."""
        return self.rho - self.analyses_rho


@dataclass(frozen=True)
class RoundRecord:
    """What a round published (all DP outputs or public): never scores or true counts."""

    round: int
    columns: tuple[str, ...]
    levels: tuple[int, ...]
    cells: int
    sigma: float
    selection_epsilon: float
    rho: float
    rho_used: float
    annealed: bool = False
    # What the selection's error bound reads (medrelease.synthetic.error_bars): all public or
    # DP outputs, not in ``as_dict`` (the publication decides what of them is shown).
    candidates: int = 0          # eligible candidates the exponential mechanism chose among
    sensitivity: float = 0.0     # its sensitivity: the largest weight among them
    weight: float = 0.0          # the selected candidate's weight w_sel
    planned_sigma: float = 0.0   # sigma before the grid: the expected-noise term of the quality
    fit_gap: float = 0.0         # ||y_t - M_sel(p_{t-1})||_1: the noisy vector vs the prior model
    analysis: bool = False       # a declared analysis, measured in round 0 (no selection)

    def as_dict(self) -> dict:
        out = {"round": self.round, "columns": list(self.columns), "levels": list(self.levels),
               "cells": self.cells, "sigma": self.sigma,
               "selection_epsilon": self.selection_epsilon, "rho": self.rho,
               "rho_used": self.rho_used, "annealed": self.annealed}
        if self.analysis:
            out["declared_analysis"] = True
        return out


def workload_closure(workload: list[tuple[Columns, float]]) -> dict[Columns, float]:
    """AIM's candidate sets and weights: every non-empty subset r of a workload set, weighted
    ``w_r = sum_s w_s |r ∩ s|``."""
    subsets = {sub for cols, _ in workload for k in range(1, len(cols) + 1)
               for sub in itertools.combinations(sorted(cols), k)}
    # |r ∩ s| counts the columns of r in s, so w_r is the sum over r's columns of the weight
    # of the workload sets holding each: one pass, not |subsets| x |workload| intersections
    # (a 40-column table's 3-way workload: 6,500 x 6,500 took a minute)
    per_column: dict[int, float] = {}
    for cols, weight in workload:
        for column in set(cols):
            per_column[column] = per_column.get(column, 0.0) + weight
    return {r: math.fsum(per_column[c] for c in r) for r in sorted(subsets)}


def build_candidates(space: MarginalSpace, workload: list[tuple[Columns, float]],
                     settings: Settings) -> list[Candidate]:
    """Each closure set at every combination of its attributes' levels below '*', kept when
    its fine clique fits the model-size limit and its own cells ``max_cells`` (public sizes)."""
    out = []
    for columns, weight in workload_closure(workload).items():
        if space.cells(columns) * 8 / 2**20 > settings.max_model_size:
            continue
        ranges = [range(space.attributes[c].levels) for c in columns]
        for levels in itertools.product(*ranges):
            if space.cells(columns, levels) <= settings.max_cells:
                out.append(Candidate(columns, tuple(levels), float(weight)))
    return out


def noisy_total(oneway: list[np.ndarray], sigma: float,
                more: Sequence[tuple[np.ndarray, float]] = ()) -> tuple[float, float]:
    """Inverse-variance mean of the noisy 1-way sums (each has variance sigma^2 x its cells)
    and of the sums of ``more`` measurements (noisy vector, its sigma: the declared analyses,
    whose small sigma makes them the best estimates of the total), at least 1, and its
    standard deviation."""
    vectors = [(y, sigma) for y in oneway] + list(more)
    precision = np.array([1.0 / (s ** 2 * y.size) for y, s in vectors])
    sums = np.array([float(y.sum()) for y, _ in vectors])
    total = float((precision * sums).sum() / precision.sum())
    return max(1.0, total), math.sqrt(1.0 / float(precision.sum()))


def true_answers(space: MarginalSpace, candidates: list[Candidate]) -> list[np.ndarray]:
    """Every candidate's marginal of the data, from one fine marginal per attribute set."""
    fine = fine_marginals(space, {cand.columns for cand in candidates})
    rolled = {columns: RollUps(space, columns, table) for columns, table in fine.items()}
    return [rolled[cand.columns](cand.levels) for cand in candidates]


def fine_marginals(space: MarginalSpace, sets: set[Columns]) -> dict[Columns, np.ndarray]:
    """The fine marginal of each attribute set: summed from the smallest superset's table
    already computed when that table has fewer cells than the count table has rows (a sum over
    its other axes is then cheaper than a pass over the rows), else counted from the rows.
    Counts are whole numbers below 2^53: either way the same numbers, exactly."""
    out: dict[Columns, np.ndarray] = {}
    rows = len(space.weights)
    attributes = range(len(space.attributes))
    for columns in sorted(sets, key=lambda c: (-len(c), c)):
        # the supersets one column larger: in a subset-closed family (the candidates: the
        # workload's closure, cut by size) a larger superset holds one of them with no more
        # cells, and elsewhere the rows give the same numbers; a scan of every table made
        # was 3,300 x 3,300 set tests on a 40-column table (8 s)
        supersets = [s for s in (tuple(sorted((*columns, a))) for a in attributes
                                 if a not in columns)
                     if s in out and space.cells(s) < rows]
        if not supersets:
            out[columns] = space.fine_marginal(columns)
            continue
        source = min(supersets, key=space.cells)
        out[columns] = marginal_of_subset(out[source], source, columns)
    return out


@dataclass
class RoundPlan:
    sigma: float
    epsilon: float
    last: bool
    eligible: list[int]


@dataclass
class AIMState:
    """The rounds so far: measurements (noisy, public), the model, the budget used (``budget``,
    a zCDP filter every selection and measurement is charged to before its draw)."""

    sigma: float
    epsilon: float
    budget: RhoFilter
    measurements: list[pgm.Measurement] = field(default_factory=list)
    cliques: list[tuple[str, ...]] = field(default_factory=list)
    records: list[RoundRecord] = field(default_factory=list)
    model: pgm.Model | None = None
    done: bool = False
    total: float = 1.0        # noisy total of the leaf-level 1-way measurements
    total_sigma: float = 0.0  # its standard deviation
    total_clipped: bool = False  # the noisy total was above the ceiling (a DP output)
    one_way_noisy: list[np.ndarray] = field(default_factory=list)  # round 0, leaves, int64
    noisy: list[np.ndarray] = field(default_factory=list)  # per record: its noisy vector, int64
    previous_model: pgm.Model | None = None  # the model before the latest round's measurement, p_{T-1}
    last_eligible: tuple[int, ...] = ()  # candidate indices the latest selection chose among

    @property
    def rho_used(self) -> float:
        """The rho charged so far: the filter's total (what the manifest states)."""
        return self.budget.used


class AIMRounds:
    """One run of the rounds over a marginal space; the flow drives ``plan_round``, fans out
    ``score`` over batches of candidates, and hands the scores to ``finish_round``."""

    def __init__(self, space: MarginalSpace, workload: list[tuple[Columns, float]],
                 settings: Settings, rng: np.random.Generator,
                 log: Callable[[str], None] | None = None,
                 analyses: Sequence[tuple[Columns, Levels]] = (),
                 impossible: ImpossibleCombos | None = None) -> None:
        self.space, self.workload, self.settings, self.rng = space, workload, settings, rng
        self.leaves = space.attributes  # the released domains (merging changes the model's)
        self.candidates: list[Candidate] = []  # built in ``start``, on the merged values
        self.answers: list[np.ndarray] = []
        self.merges: list = []
        self.log = log or (lambda _message: None)
        self.domain = pgm.domain(space.names, tuple(a.size for a in space.attributes))
        # declared analyses (ascending attribute indices, their levels): measured in round 0
        self.analyses = tuple((tuple(c), tuple(lv)) for c, lv in analyses)
        if self.analyses and not settings.analyses_rho > 0:
            raise ValueError("declared analyses need a share of rho (analyses_rho)")
        self.impossible = impossible
        self.analysis_orders: tuple[tuple[str, ...], ...] = ()  # the declared column orders
        self.rejected = 0  # sampled rows dropped for an impossible combination (a count of
        # post-processing draws, public)
        rounds = settings.rounds
        rest = settings.rounds_rest
        self.state = AIMState(sigma=math.sqrt(rounds / (2 * MEASURE_SHARE * rest)),
                              epsilon=math.sqrt(8 * (1 - MEASURE_SHARE) * rest / rounds),
                              budget=RhoFilter(settings.rho))
        self.started: float | None = None  # perf_counter at round 0 (elapsed, estimates)

    def elapsed(self) -> float:
        """Seconds since round 0 started (0 before it)."""
        return 0.0 if self.started is None else time.perf_counter() - self.started

    def remaining_estimate(self) -> float | None:
        """Seconds the rounds still need, roughly: the time so far scaled by the share of the
        rounds' rho still to spend (rounds spend rho, and later ones are dearer and slower, so
        it errs short); None before two rounds after round 0 have run (too little to go on)."""
        share = self.state.rho_used / self.settings.rho
        if len(self.state.records) < 2 or share <= 0 or self.state.done:
            return None
        return self.elapsed() * (1 - min(share, 1.0)) / share

    def rounds_estimate(self) -> int:
        """How many rounds after round 0 this run makes, about: those made so far and what the
        rho left buys at the next round's cost (``plan_round``: rounds at that cost while two
        are left, then a last one spending the rest). Annealing quadruples a round's cost, so
        this errs high and falls as rounds anneal; it is a measure of the run so far, where
        the nominal ``settings.rounds`` only bounds it (a table planned for 80 ran 17). Public
        facts only: the budget spent and the noise scales."""
        done = self.selection_rounds
        if self.state.done:
            return done
        left = self.settings.rho - self.state.rho_used
        cost = gaussian_rho(self.state.sigma ** 2) + exponential_rho(self.state.epsilon)
        if not cost > 0 or left <= 0:
            return done + 1
        return done + max(0, math.floor(left / cost) - 1) + 1

    # -- round 0 ------------------------------------------------------------------------------
    def start(self) -> None:
        """Every attribute's leaf-level 1-way marginal (these also give the noisy total), then
        each attribute's rare values merged (``merge_rare``) and the candidates rebuilt."""
        state = self.state
        self.started = time.perf_counter()
        oneway = []
        for c in range(len(self.space.attributes)):
            fine = self.space.fine_marginal((c,))
            state.budget.charge(gaussian_rho(float(grid_sigma_sq(state.sigma))),
                                f"round 0: 1-way marginal of {self.space.names[c]}")
            oneway.append(fine.reshape(-1) + discrete_gaussian(
                self.rng, grid_sigma_sq(state.sigma), fine.size))
        state.one_way_noisy = [np.rint(y).astype(np.int64) for y in oneway]
        sigma = math.sqrt(float(grid_sigma_sq(state.sigma)))
        for c, noisy in enumerate(oneway):
            self._record_one_way(c, noisy, sigma)
        self._measure_analyses()
        state.total, state.total_sigma = noisy_total(
            oneway, sigma, [(y, r.sigma) for r, y in zip(state.records, state.noisy,
                                                        strict=True) if r.analysis])
        ceiling = self.settings.max_rows
        if ceiling is not None and state.total > ceiling:  # post-processing of the DP total
            state.total, state.total_clipped = float(ceiling), True
        self.candidates = build_candidates(self.space, self.workload, self.settings)
        self.answers = true_answers(self.space, self.candidates)
        self.domain = pgm.domain(self.space.names, tuple(a.size for a in self.space.attributes))
        state.model = pgm.estimate(self.domain, state.measurements, self.settings.iters,
                                   state.total, tol=self.settings.tolerance)
        merged = sum(m.merged for m in self.merges)
        declared = (f", then the {len(self.analyses)} declared analyses with noise sigma "
                    f"{self.state.records[0].sigma:.1f}" if self.analyses else "")
        self.log(f"Round 0 of about {self.rounds_estimate()}: measured the "
                 f"{len(self.space.attributes)} columns' one-way marginals with noise sigma "
                 f"{state.sigma:.1f}{declared} and merged {merged} rare values into groups; "
                 f"{state.rho_used / self.settings.rho:.0%} of the rounds' rho used "
                 f"({state.rho_used:.4g} of {self.settings.rho:.4g}) after "
                 f"{self.elapsed():.1f} s.")

    def merged_like_this_run(self, space: MarginalSpace) -> MarginalSpace:
        """``space`` (another table's, e.g. a neighbour's) with this run's merges applied: the
        merges are outputs of round 0, so the rest of the proof conditions on them."""
        for merge in self.merges:
            space.merge(merge.column, merge.keep, merge.groups, merge.weights)
        return space

    def _record_one_way(self, column: int, noisy: np.ndarray, sigma: float) -> None:
        """Merge the values whose noisy count is below ``MERGE_SIGMAS`` sigma (post-processing
        of this DP measurement, as MST compresses its domain) and re-express the measurement
        on the merged values: a group's noisy sum scaled by 1/sqrt(its size). A column a
        declared analysis reads at its leaves is never merged (its table is measured and
        released value by value). A group's leaves weigh their noisy counts shrunk towards the
        group's mean and held below their own 95 % upper ends (``shrunk_weights``): expanded
        back to leaves, no merged value gets more rows than its measurement allows."""
        name = self.space.names[column]
        keep = noisy >= MERGE_SIGMAS * sigma
        if (keep.all() or self.space.attributes[column].size <= 2
                or column in self.leaf_columns):
            self.state.measurements.append(pgm.measurement(noisy, (name,), sigma, None))
            self.state.cliques.append((name,))
            return
        groups = rare_groups(self.space.attributes[column], keep, noisy, MERGE_SIGMAS, sigma)
        probe = merge_rare(self.space.attributes[column], keep, groups)[2]
        weights = tuple(shrunk_weights(noisy[m], sigma) for m in probe.members)
        merge = self.space.merge(column, keep, groups, weights)
        self.merges.append(merge)
        sums = np.array([noisy[m].sum() for m in merge.members], dtype=np.float64)
        scale = 1.0 / np.sqrt([m.size for m in merge.members])
        query = pgm.ScaledQuery(tuple(float(w) for w in scale))
        self.state.measurements.append(pgm.measurement(sums * scale, (name,), sigma, query))
        self.state.cliques.append((name,))

    @property
    def leaf_columns(self) -> set[int]:
        """Columns a declared analysis reads at level 0 (never merged)."""
        return {c for columns, levels in self.analyses
                for c, level in zip(columns, levels, strict=True) if level == 0}

    def _measure_analyses(self) -> None:
        """Each declared analysis at its levels, once, with the analyses' share of rho split
        evenly (sigma_a^2 = k / (2 rho_a)); recorded as round-0 records, published with the
        other measurements. No selection: which marginals are measured is public."""
        if not self.analyses:
            return
        sigma = math.sqrt(len(self.analyses) / (2 * self.settings.analyses_rho))
        for columns, levels in self.analyses:
            answer = self.space.roll_up(self.space.fine_marginal(columns), columns, levels)
            rho = self._measure(columns, levels, answer, sigma)
            self.state.records.append(RoundRecord(
                0, tuple(self.space.names[c] for c in columns), levels, int(answer.size),
                math.sqrt(float(grid_sigma_sq(sigma))), 0.0, rho, self.state.rho_used,
                planned_sigma=sigma, analysis=True))

    def _measure(self, columns: Columns, levels: Levels, answer: np.ndarray,
                 sigma: float) -> float:
        """Add N_Z(0, sigma^2) to the integer counts; returns the rho charged (grid sigma)."""
        sigma_sq = grid_sigma_sq(sigma)
        rho = self.state.budget.charge(gaussian_rho(float(sigma_sq)),
                                       f"measurement of {columns} at levels {levels}")
        counts = np.rint(answer).astype(np.int64).reshape(-1)
        noisy = counts + discrete_gaussian(self.rng, sigma_sq, counts.size)
        self.state.noisy.append(np.asarray(noisy, dtype=np.int64))
        clique = tuple(self.space.names[c] for c in columns)
        query = None
        if any(levels):
            attrs = [self.space.attributes[c] for c in columns]
            query = pgm.LevelQuery(
                tuple(tuple(int(x) for x in a.level_maps[lv]) if lv else None
                      for a, lv in zip(attrs, levels, strict=True)),
                tuple(a.cardinality(lv) for a, lv in zip(attrs, levels, strict=True)))
        used_sigma = math.sqrt(float(sigma_sq))
        self.state.measurements.append(pgm.measurement(noisy, clique, used_sigma, query))
        if clique not in self.state.cliques:
            self.state.cliques.append(clique)
        return rho

    # -- later rounds -------------------------------------------------------------------------
    def plan_round(self) -> RoundPlan:
        """This round's sigma and eps (the last spends what is left) and the candidates whose
        fine clique keeps the model within its size limit at the budget used so far."""
        state, rho = self.state, self.settings.rho
        sigma, eps = state.sigma, state.epsilon
        left = rho - state.rho_used
        last = left < 2 * (gaussian_rho(sigma ** 2) + exponential_rho(eps))
        if last:
            sigma = math.sqrt(1 / (2 * MEASURE_SHARE * left))
            eps = math.sqrt(8 * (1 - MEASURE_SHARE) * left)
        limit = self.settings.max_model_size * (state.rho_used + exponential_rho(eps)
                                                + gaussian_rho(sigma ** 2)) / rho
        return RoundPlan(sigma, eps, last, self._eligible(limit))

    def _eligible(self, size_limit: float) -> list[int]:
        cliques = list(self.state.cliques)
        fits: dict[Columns, bool] = {}
        outside: list[Columns] = []
        names = self.space.names
        measured = [set(cl) for cl in cliques]
        for columns in sorted({c.columns for c in self.candidates}):
            clique = {names[c] for c in columns}
            if any(clique <= cl for cl in measured):
                fits[columns] = True
            else:
                outside.append(columns)
        sizes = sizes_with_each(self.domain.attributes, self.domain.shape, cliques,
                                [tuple(names[c] for c in cols) for cols in outside])
        for columns, size in zip(outside, sizes, strict=True):
            fits[columns] = size <= size_limit
        return [i for i, c in enumerate(self.candidates) if fits[c.columns]]

    def batches(self, plan: RoundPlan, n_batches: int) -> list[list[int]]:
        """Eligible candidates cut into batches that never split an attribute set (the model's
        marginal of a set is computed once per batch)."""
        by_set: dict[Columns, list[int]] = {}
        for i in plan.eligible:
            by_set.setdefault(self.candidates[i].columns, []).append(i)
        groups = sorted(by_set.values(), key=len, reverse=True)
        out: list[list[int]] = [[] for _ in range(max(1, min(n_batches, len(groups))))]
        for group in groups:
            min(out, key=len).extend(group)
        return [b for b in out if b]

    def score(self, plan: RoundPlan, indices: list[int]) -> np.ndarray:
        """AIM's quality of each candidate: weight x (L1 error of the model - expected noise)."""
        model: dict[Columns, RollUps] = {}
        out = np.empty(len(indices))
        names = self.space.names  # (a property: built once here, not per candidate)
        for k, i in enumerate(indices):
            cand = self.candidates[i]
            if cand.columns not in model:
                clique = tuple(names[c] for c in cand.columns)
                model[cand.columns] = RollUps(self.space, cand.columns,
                                              pgm.model_marginal(self.state.model, clique))
            estimate = model[cand.columns](cand.levels)
            error = float(np.abs(self.answers[i] - estimate).sum())
            out[k] = cand.weight * (error - EXPECTED_ABS * plan.sigma * estimate.size)
        return out

    def finish_round(self, plan: RoundPlan, indices: list[int], scores: np.ndarray) -> RoundRecord:
        """Select by the exponential mechanism, measure, re-estimate, anneal, record.

        The candidates are taken in the plan's order whatever order they were scored in (the
        flow scores them in batches of tasks, more or fewer as scoring costs): the draw, and so
        the release for a seed, must not depend on how the scoring was cut."""
        order = np.argsort(np.asarray(indices, dtype=np.int64), kind="stable")
        indices = [int(indices[k]) for k in order]
        scores = np.asarray(scores, dtype=np.float64)[order]
        chosen, sensitivity = self._select(plan, indices, scores)
        cand = self.candidates[chosen]
        before = self._model_answer(cand)
        rho = exponential_rho(plan.epsilon) + self._measure(cand.columns, cand.levels,
                                                           self.answers[chosen], plan.sigma)
        fit_gap = float(np.abs(self.state.noisy[-1] - before.reshape(-1)).sum())
        self._refit(indices)
        annealed = self._anneal(plan, cand, before)
        record = RoundRecord(self.selection_rounds + 1,
                             tuple(self.space.names[c] for c in cand.columns), cand.levels,
                             int(before.size), math.sqrt(float(grid_sigma_sq(plan.sigma))),
                             plan.epsilon, rho, self.state.rho_used, annealed,
                             candidates=len(indices), sensitivity=float(sensitivity),
                             weight=cand.weight, planned_sigma=float(plan.sigma), fit_gap=fit_gap)
        self.state.records.append(record)
        self.log(self.round_sentence(record))
        return record

    @property
    def selection_rounds(self) -> int:
        """Rounds after round 0 so far (a declared analysis is measured in round 0)."""
        return sum(1 for r in self.state.records if not r.analysis)

    def _select(self, plan: RoundPlan, indices: list[int], scores: np.ndarray
                ) -> tuple[int, float]:
        """The round's private selection (charged before it is drawn): the chosen candidate's
        index and the mechanism's sensitivity (the largest weight among the eligible)."""
        sensitivity = max(self.candidates[i].weight for i in indices)
        self.state.budget.charge(exponential_rho(plan.epsilon),
                                 f"selection of round {self.selection_rounds + 1}")
        pick = exponential_mechanism(self.rng, scores, plan.epsilon, sensitivity)
        return indices[pick], sensitivity

    def _refit(self, indices: list[int]) -> None:
        """Re-estimate the model from every measurement so far, warm-started from the last."""
        state = self.state
        state.previous_model, state.last_eligible = state.model, tuple(indices)
        state.model = pgm.estimate(self.domain, state.measurements, self.settings.iters,
                                   state.total, warm_start=state.model,
                                   tol=self.settings.tolerance)

    def _anneal(self, plan: RoundPlan, cand: Candidate, before: np.ndarray) -> bool:
        """Halve sigma and double eps when the estimate of the measured marginal moved less
        than the noise expected in it (AIM's annealing); the last round ends the rounds."""
        state = self.state
        moved = float(np.abs(self._model_answer(cand) - before).sum())
        annealed = (not plan.last) and moved <= EXPECTED_ABS * plan.sigma * before.size
        state.sigma, state.epsilon = plan.sigma, plan.epsilon
        if annealed:
            state.sigma, state.epsilon = plan.sigma / 2, plan.epsilon * 2
        state.done = plan.last
        return annealed

    def round_sentence(self, record: RoundRecord) -> str:
        """The round as a steward reads it in the run's log (public facts only)."""
        state, rho = self.state, self.settings.rho
        levels = ", ".join(str(x) for x in record.levels)
        left = self.remaining_estimate()
        ending = (" This was the last round; sampling the rows next." if state.done
                  else f" About {left:.0f} s of rounds left." if left is not None else "")
        annealed = (" The model moved less than the noise, so the next rounds measure with "
                    "half the noise." if record.annealed else "")
        return (f"Round {record.round} of about {self.rounds_estimate()}: measured "
                f"{' x '.join(record.columns)} (taxonomy levels {levels}; {record.cells:,} "
                f"cells) with noise sigma {record.sigma:.1f}; {state.rho_used / rho:.0%} of the "
                f"rounds' rho used ({state.rho_used:.4g} of {rho:.4g}) after "
                f"{self.elapsed():.1f} s.{annealed}{ending}")

    def _model_answer(self, cand: Candidate) -> np.ndarray:
        clique = tuple(self.space.names[c] for c in cand.columns)
        fine = pgm.model_marginal(self.state.model, clique)
        return self.space.roll_up(fine, cand.columns, cand.levels)

    def run(self, progress: Callable[[RoundRecord], None] | None = None) -> None:
        """Every round in this process (the driver, tests, benchmarks); the flow runs the same
        loop (``medrelease.stages.run_rounds``) with its scoring fanned out as tasks."""
        from medrelease.stages import InProcess, run_rounds

        if self.state.model is None:
            self.start()
        run_rounds(self, InProcess(), progress)

    def synthesize(self, seed: int) -> tuple[dict[str, np.ndarray], int]:
        """The final estimate (more iterations) and its synthetic rows, as many as the noisy
        total of the leaf-level 1-way measurements; merged values become leaves in proportion
        to their weights (``Merge.expand``). A row holding a declared impossible combination
        is dropped and drawn again from the model (``_without_impossible``): the rows follow
        the model's law given that no impossible combination occurs (post-processing)."""
        model = pgm.estimate(self.domain, self.state.measurements, self.settings.final_iters,
                             self.state.total, warm_start=self.state.model)
        rows = max(1, round(float(model.total)))
        if self.settings.max_rows is not None:
            rows = min(rows, self.settings.max_rows)
        codes = self._leaf_sample(model, rows, seed)
        if self.impossible:
            codes = self._without_impossible(model, codes, rows, seed)
        return codes, len(next(iter(codes.values())))

    def _leaf_sample(self, model: pgm.Model, rows: int, seed: int) -> dict[str, np.ndarray]:
        codes = pgm.sample(model, rows, seed)
        expand = np.random.default_rng(seed + 1)
        for merge in self.merges:
            name = self.space.names[merge.column]
            codes[name] = merge.expand(codes[name], expand)
        return codes

    def _without_impossible(self, model: pgm.Model, codes: dict[str, np.ndarray], rows: int,
                            seed: int) -> dict[str, np.ndarray]:
        """Rejection sampling: drop the impossible rows, draw more from the model (a batch
        sized by the share rejected so far) and keep the possible ones until ``rows`` are
        possible. Exact for the model's law given the possible rows. If the model puts almost
        all its mass on impossible rows (after ``MAX_REDRAWS`` batches), fewer rows are
        released, and the details say how many were redrawn."""
        assert self.impossible is not None
        bad = self.impossible.leaf_rows(codes)
        parts = [{k: v[~bad] for k, v in codes.items()}]
        have, drawn, rejected = int((~bad).sum()), rows, int(bad.sum())
        attempt = 0
        while have < rows and attempt < MAX_REDRAWS:
            attempt += 1
            accept = max((drawn - rejected) / drawn, 0.01)
            batch = math.ceil((rows - have) / accept * 1.2) + 16
            more = self._leaf_sample(model, batch, seed + 7919 * attempt)
            bad = self.impossible.leaf_rows(more)
            drawn, rejected = drawn + batch, rejected + int(bad.sum())
            keep = np.flatnonzero(~bad)[: rows - have]
            parts.append({k: v[keep] for k, v in more.items()})
            have += keep.size
        self.rejected = rejected
        return {k: np.concatenate([p[k] for p in parts]) for k in codes}
