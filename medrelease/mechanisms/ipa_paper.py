"""``ipa-paper``: IPA exactly as published (Lee & Chung 2020, Algorithm 1 + 2; ALGORITHMS.md §2).

Kept to reproduce and audit the paper. Its claimed eps-DP guarantee does NOT hold: class sizes
are only ever increased (so a class of n - 1 rows is impossible with a given person), and every
real row is published with its raw informative value. Releases are labelled accordingly.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, field_validator
from pydantic.json_schema import SkipJsonSchema

from medrelease.data.aggregate import group_sum
from medrelease.data.lattice import NodeTable
from medrelease.errors import ParameterError
from medrelease.evidence.metrics import ReleasedCells
from medrelease.mechanisms.base import (
    Capabilities,
    MechanismBase,
    MechanismParams,
    ReleaseContext,
    ReleaseShape,
    declared_draws,
    expected_rows_above,
    in_class_draws,
    noise_bound,
    parse,
    split_budget,
)
from medrelease.privacy.guarantee import ADD_REMOVE_ONE_ROW, BudgetStep, Guarantee, StepDraws
from medrelease.privacy.randomness import discrete_laplace, generator_for

PAPER_SHARES = {
    "eps_suppression": 0.1,
    "eps_insertion": 0.3,
    "eps_value": 0.3,
    "eps_candidates": 0.3,
}
LABEL = "paper mechanism — formal guarantee not upheld"
WHY_NOT = (
    "Released class sizes are never below the true size (noise clipped at zero), so a class of "
    "n-1 rows is possible without a person and impossible with them; every real row is published "
    "with its raw informative value, so a value only one person has is always present with them. "
    "No finite epsilon bounds either ratio (ALGORITHMS.md §2)."
)
VALUE_SENSITIVITY = 1.0
SELECTION_SENSITIVITY = 3.0


class IPAPaperParams(MechanismParams):
    """Budget (total and per step), suppression threshold t, and the threshold-noise variant."""

    epsilon: float = Field(default=1.0, description="total privacy budget claimed by the paper")
    eps_suppression: float | None = Field(default=None, description="noisy threshold (paper 0.1 eps)")
    eps_insertion: float | None = Field(default=None, description="counterfeit counts (0.3 eps)")
    eps_value: float | None = Field(default=None, description="counterfeit values (0.3 eps)")
    eps_candidates: float | None = Field(default=None, description="node selection (0.3 eps)")
    suppression_threshold: int = Field(default=2, description="t: classes of <= t rows suppressed")
    threshold_noise: Literal["paper", "authors_code"] = Field(
        default="paper",
        description="'paper': t + Lap((t-1)/eps_sup); 'authors_code': max(t, t + Lap(1/eps_sup))",
    )

    # Set by the release driver from the dataset config, never by users: a declared public
    # bound on the rows also bounds the classes that gain counterfeit rows.
    max_rows: SkipJsonSchema[int | None] = None

    @field_validator("suppression_threshold")
    @classmethod
    def _t_at_least_two(cls, value: int) -> int:
        if value < 2:
            raise ValueError(
                "suppression_threshold t must be at least 2: the paper's threshold noise "
                "Lap((t-1)/eps_sup) has scale 0 for t = 1, i.e. no noise at all"
            )
        return value


class IPAPaper(MechanismBase):
    name: ClassVar[str] = "ipa-paper"
    capabilities: ClassVar[Capabilities] = Capabilities(
        summary="paper mechanism, formal guarantee NOT upheld",
        gives="the IPA paper's release, for comparison only: its DP claim does not hold",
        replays_scored_candidate=True,
        draws_declared_steps=True,
        loss_reason=("classes at or below a noisy threshold are suppressed: their rows are "
                     "released under '*'"),
    )
    selection: ClassVar[str] = "exponential"
    selection_step: ClassVar[str] = "node selection"
    Params: ClassVar[type[MechanismParams]] = IPAPaperParams

    def parse_params(self, raw: dict[str, Any]) -> IPAPaperParams:
        params = parse(IPAPaperParams, raw, self.name)
        shares = split_budget(
            self.name,
            params.epsilon,
            {k: getattr(params, k) for k in PAPER_SHARES},
            PAPER_SHARES,
        )
        return params.model_copy(update=shares)

    def error_bars(self, params: IPAPaperParams, context: object = None,
                   node: object = None) -> dict[str, object]:
        """No intervals: the paper's counts are biased by construction, said in words."""
        return {"level": None, "statement": (
            "No intervals are given: the paper mechanism only ever adds rows (negative noise "
            "is clipped at zero), so every released class count is at least its true count, "
            "and suppressed classes are released under '*'. Its privacy claim does not hold "
            "either (see the guarantee).")}

    def guarantee(self, params: IPAPaperParams) -> Guarantee:
        return Guarantee(
            mechanism=self.name,
            epsilon=params.epsilon,
            delta=0.0,
            neighbouring=ADD_REMOVE_ONE_ROW,
            proven=False,
            label=LABEL,
            notes=WHY_NOT,
        )

    def budget_steps(self, params: IPAPaperParams) -> list[BudgetStep]:
        return [
            BudgetStep("suppression threshold", params.eps_suppression, 0.0, self.name,
                       "noisy threshold per equivalence class (claimed, not upheld)"),
            BudgetStep("counterfeit counts", params.eps_insertion, 0.0, self.name,
                       "Laplace count of counterfeit rows per class, clipped at 0 (claimed)"),
            BudgetStep("counterfeit values", params.eps_value, 0.0, self.name,
                       "exponential mechanism for each counterfeit row's informative value"),
            BudgetStep("node selection", params.eps_candidates, 0.0, self.name,
                       "exponential mechanism over lattice nodes, u = 3 - IL, sensitivity 3"),
        ]

    def expected_noise_rows(self, context: ReleaseContext, params: IPAPaperParams) -> float:
        """Every released class gains max(0, Z) counterfeit rows, Z discrete Laplace at
        eps_insertion (a run at eps 1e-5 on 3,000 rows published 2,236,816 rows). Which node is
        chosen, and so how many classes it has, is a private choice: the bound takes the node
        with the most possible classes, the finest (the product of the taxonomies' leaves;
        at most a declared ``max_rows``), plus the pooled '*' class. Public facts only."""
        classes = math.prod(t.cardinality(0) for t in context.lattice.taxonomies)
        if params.max_rows is not None:
            classes = min(classes, params.max_rows)
        return (classes + 1) * expected_rows_above(params.eps_insertion)

    def row_bounds(self, params: IPAPaperParams, shape: ReleaseShape) -> tuple[int, int]:
        """Every real row is kept; each class gains at most ``noise_bound`` counterfeit rows."""
        cells = shape.cells
        real = int(cells.true_counts.sum())
        return real, real + cells.n_classes * noise_bound(params.eps_insertion)

    def perturb_node(
        self, context: ReleaseContext, table: NodeTable, seed: np.random.SeedSequence,
        params: IPAPaperParams, draws: StepDraws | None = None,
    ) -> ReleasedCells:
        """One candidate, drawn with the plan's declared steps (``draws``: one set per
        candidate — the paper perturbs every node with the same steps and counts them once)."""
        draws = draws or declared_draws(self, self.budget_steps(params))
        cells, _ = self._perturb(context, table, generator_for(seed), params, draws)
        return cells

    def materialize(
        self, context: ReleaseContext, table: NodeTable, seed: np.random.SeedSequence,
        params: IPAPaperParams, draws: StepDraws | None = None,
    ) -> ReleasedCells:
        """The scored candidate itself: replay the node's stream, then draw absent values.

        The paper releases the very table it scored, so the chosen node's perturbation is
        replayed from the same seed. Counterfeit rows whose value lies outside their class were
        counted but not yet given a value; that value is uniform over the absent ones, drawn now.
        """
        rng = generator_for(seed)
        draws = draws or declared_draws(self, self.budget_steps(params))
        cells, absent_draws = self._perturb(context, table, rng, params, draws)
        return _add_absent_values(cells, absent_draws, context.n_inf, rng)

    def _perturb(
        self, context: ReleaseContext, table: NodeTable, rng: np.random.Generator,
        params: IPAPaperParams, draws: StepDraws,
    ) -> tuple[ReleasedCells, np.ndarray]:
        if params.eps_suppression is None or params.eps_insertion is None or params.eps_value is None:
            raise ParameterError("ipa-paper: parameters were not resolved (call parse_params)")
        eps_threshold = draws.take("suppression threshold").epsilon
        eps_insertion = draws.take("counterfeit counts").epsilon
        eps_value = draws.take("counterfeit values").epsilon
        n_inf = context.n_inf
        starts, class_of_cell, class_keys = table.classes()
        counts, inf = table.counts, table.inf_codes
        sizes = np.add.reduceat(counts, starts) if starts.size else counts[:0]
        t = params.suppression_threshold
        if params.threshold_noise == "paper":
            theta = t + rng.laplace(0.0, (t - 1) / eps_threshold, starts.size)
        else:
            theta = np.maximum(t, t + rng.laplace(0.0, 1.0 / eps_threshold, starts.size))
        suppressed = sizes <= theta

        # Suppressed classes pool into one class (*, ..., *) keeping their informative values.
        sup_cell = suppressed[class_of_cell]
        pool_true = np.bincount(inf[sup_cell], weights=counts[sup_cell], minlength=n_inf)
        pool_inf = np.flatnonzero(pool_true)
        kept = np.flatnonzero(~suppressed)
        renumber = np.cumsum(~suppressed) - 1
        has_pool = pool_inf.size > 0
        n_classes = kept.size + int(has_pool)
        keep_cell = ~sup_cell
        class_of = np.concatenate(
            [renumber[class_of_cell[keep_cell]], np.full(pool_inf.size, kept.size)]
        ).astype(np.int64)
        inf_codes = np.concatenate([inf[keep_cell], pool_inf]).astype(np.int64)
        true_counts = np.concatenate([counts[keep_cell], pool_true[pool_inf]]).astype(np.int64)
        out_keys = np.concatenate([class_keys[kept], [-1] * int(has_pool)]).astype(np.int64)
        ncp = np.concatenate([context.class_ncp(table, class_keys[kept]), [1.0] * int(has_pool)])
        sup_flag = np.zeros(n_classes, dtype=bool)
        sup_flag[kept.size:] = True

        # Insertion: n' = n + Lap(1/eps_ins) (discrete), only positive differences are inserted.
        counterfeit = np.maximum(0, discrete_laplace(rng, eps_insertion, n_classes))

        # Counterfeit values: exponential mechanism over Inf with score S(E, v) (Eq. 3-4).
        class_size = np.bincount(class_of, weights=true_counts, minlength=n_classes)
        distinct = np.bincount(class_of, minlength=n_classes)
        absent = n_inf - distinct
        half_eps = eps_value / (2.0 * VALUE_SENSITIVITY)
        in_logit = half_eps * true_counts / (class_size[class_of] + 1.0)
        out_logit = half_eps / ((class_size + 1.0) * np.maximum(absent, 1))
        class_starts = np.searchsorted(class_of, np.arange(n_classes))
        top = np.maximum(np.maximum.reduceat(in_logit, class_starts), out_logit)
        weights = np.exp(in_logit - top[class_of])
        weight_in = np.bincount(class_of, weights=weights, minlength=n_classes)
        weight_out = np.where(absent > 0, absent * np.exp(out_logit - top), 0.0)
        p_in = weight_in / (weight_in + weight_out)
        draws_in = rng.binomial(counterfeit, p_in)
        draws_out = counterfeit - draws_in
        added = in_class_draws(rng, class_of, weights, draws_in)

        cells = ReleasedCells(
            class_of_cell=class_of,
            inf_codes=inf_codes,
            true_counts=true_counts,
            released_counts=true_counts + added,
            class_extra=draws_out.astype(np.float64),
            class_noise=counterfeit.astype(np.float64),
            class_ncp=ncp,
            suppressed_class=sup_flag,
            class_keys=out_keys,
        )
        return cells, draws_out


def _add_absent_values(
    cells: ReleasedCells, absent_draws: np.ndarray, n_inf: int, rng: np.random.Generator
) -> ReleasedCells:
    """Give each out-of-class counterfeit row a value uniform over the values absent from its class."""
    which = np.repeat(np.arange(absent_draws.size), absent_draws)
    if which.size == 0:
        return cells
    present = cells.class_of_cell * n_inf + cells.inf_codes
    values = rng.integers(0, n_inf, which.size)
    pending = np.arange(which.size)
    for _ in range(10_000):
        keys = which[pending] * n_inf + values[pending]
        pos = np.minimum(np.searchsorted(present, keys), present.size - 1)
        clash = present[pos] == keys
        if not clash.any():
            break
        pending = pending[clash]
        values[pending] = rng.integers(0, n_inf, pending.size)
    new_keys, new_counts = group_sum(which * n_inf + values, np.ones(which.size, dtype=np.int64))
    new_class = new_keys // n_inf
    order = np.argsort(
        np.concatenate([present, new_keys]), kind="stable"
    )
    return ReleasedCells(
        class_of_cell=np.concatenate([cells.class_of_cell, new_class])[order],
        inf_codes=np.concatenate([cells.inf_codes, new_keys % n_inf])[order],
        true_counts=np.concatenate([cells.true_counts, np.zeros_like(new_counts)])[order],
        released_counts=np.concatenate([cells.released_counts, new_counts])[order],
        class_extra=np.zeros_like(cells.class_extra),
        class_noise=cells.class_noise,
        class_ncp=cells.class_ncp,
        suppressed_class=cells.suppressed_class,
        class_keys=cells.class_keys,
    )
