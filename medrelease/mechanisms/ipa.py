"""``ipa``: IPA with a sound (eps, delta)-DP guarantee (ALGORITHMS.md §3) — the default.

Same product as the paper — generalized dimensions, raw informative values, microdata — but
every released cell is a noisy count that passed a stability threshold:

1. node choice: candidates perturbed as below (own randomness), scored by u = 3 - IL, chosen by
   the exponential mechanism with ``eps_candidates`` (sensitivity 3; any score in [0, 3] works);
2. cells: at the chosen node, freshly drawn, every non-empty (class, informative value) cell gets
   discrete Laplace noise of scale 1/eps_cells and is kept iff noisy count >= tau_cells;
3. suppression: rows of dropped cells pool per informative value into (*, ..., *, v) cells,
   released the same way with eps_suppression / delta_suppression.

Proof sketch (docs/PRIVACY.md has the full statement): step 1 is eps_cand-DP because the
exponential mechanism's score has sensitivity <= 3 whatever the candidate perturbation. In step
2 each row touches exactly one cell; for a cell present in both neighbours the noisy count is
eps_cells-DP and the keep decision a function of it; a cell present in only one neighbour has
count 1 there and is released with probability P(Z >= tau - 1) <= delta_cells (tau chosen from
the exact discrete-Laplace tail). Step 3 is the same argument given step 2's output (adaptive
composition): each row is in at most one pooled cell. Total: (eps_cand + eps_cells + eps_sup,
delta_cells + delta_sup) under add/remove one row.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
from pydantic import Field, field_validator
from pydantic.json_schema import SkipJsonSchema

from medrelease.guarantee import ADD_REMOVE_ONE_ROW, BudgetStep, Guarantee
from medrelease.lattice import NodeTable
from medrelease.mechanisms.base import (
    MechanismParams,
    ReleaseContext,
    noise_bound,
    parse,
    split_budget,
)
from medrelease.metrics import ReleasedCells
from medrelease.randomness import discrete_laplace, noise_epsilon

IPA_SHARES = {"eps_candidates": 0.2, "eps_cells": 0.6, "eps_suppression": 0.2}
LABEL = "sound (epsilon, delta)-DP, proof in docs/PRIVACY.md"
SELECTION_SENSITIVITY = 3.0
DEFAULT_DELTA = 1e-6


class IPAParams(MechanismParams):
    """Total eps and its split, total delta (a fixed default), minimum cell size."""

    epsilon: float = Field(default=1.0, description="total privacy budget")
    eps_candidates: float | None = Field(default=None, description="node selection (0.2 eps)")
    eps_cells: float | None = Field(default=None, description="noisy cells at the node (0.6 eps)")
    eps_suppression: float | None = Field(default=None, description="pooled '*' cells (0.2 eps)")
    delta: float | None = Field(
        default=None, description="total delta, split evenly; default 1e-6 (or 1/(10 N) for a "
                                  "declared public bound N on the rows, if smaller)"
    )
    suppression_threshold: int = Field(
        default=2, description="t: a released cell never has fewer rows than max(t, tau)"
    )

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
                             "would be published as such)")
        return value

    # Set by the release driver from the dataset config (privacy.max_rows), never by users.
    max_rows: SkipJsonSchema[int | None] = None


def default_delta(max_rows: int | None) -> float:
    """1e-6, or 1/(10 N) for a *declared* public bound N on the rows — never the data's n.

    A delta (hence a threshold) that moved with the table's own size would leak it and, for
    cells sitting exactly at the threshold, break the bound (docs/PRIVACY.md).
    """
    if max_rows is None:
        return DEFAULT_DELTA
    return min(DEFAULT_DELTA, 1.0 / (10 * max_rows))


def release_threshold(epsilon: float, delta: float, minimum: int) -> int:
    """Smallest integer tau with P(1 + Z >= tau) <= delta for Z ~ discrete Laplace(eps).

    A cell that exists in only one of two neighbouring tables has count 1 there; it is released
    only if 1 + Z >= tau, which this tau makes a delta-probability event. P(Z >= k) =
    exp(-eps' k) / (1 + exp(-eps')) <= delta  <=>  k >= (ln(1/delta) - ln(1 + exp(-eps'))) / eps';
    a closed form (no search that could run forever), rounded up with a margin against float
    error, so tau is never one too small.
    """
    eps = noise_epsilon(epsilon)
    need = (-math.log(delta) - math.log1p(math.exp(-eps))) / eps
    k = max(1, math.ceil(need * (1 + 1e-12) + 1e-9))
    return max(1 + k, minimum)


class IPA:
    name: ClassVar[str] = "ipa"
    selection: ClassVar[str] = "exponential"
    Params: ClassVar[type[MechanismParams]] = IPAParams

    def parse_params(self, raw: dict[str, Any]) -> IPAParams:
        params = parse(IPAParams, raw, self.name)
        shares = split_budget(
            self.name, params.epsilon, {k: getattr(params, k) for k in IPA_SHARES}, IPA_SHARES
        )
        delta = params.delta if params.delta is not None else default_delta(params.max_rows)
        return params.model_copy(update={**shares, "delta": delta})

    def thresholds(self, params: IPAParams) -> tuple[int, int]:
        half = params.delta / 2
        return (
            release_threshold(params.eps_cells, half, params.suppression_threshold),
            release_threshold(params.eps_suppression, half, params.suppression_threshold),
        )

    def guarantee(self, params: IPAParams) -> Guarantee:
        tau_cells, tau_sup = self.thresholds(params)
        return Guarantee(
            mechanism=self.name,
            epsilon=params.epsilon,
            delta=params.delta,
            neighbouring=ADD_REMOVE_ONE_ROW,
            proven=True,
            label=LABEL,
            notes=(f"cells released only with noisy count >= {tau_cells} (pooled '*' cells: "
                   f">= {tau_sup}); noise is discrete Laplace"),
        )

    def budget_steps(self, params: IPAParams) -> list[BudgetStep]:
        half = params.delta / 2
        return [
            BudgetStep("node selection", params.eps_candidates, 0.0, self.name,
                       "exponential mechanism over lattice nodes, u = 3 - IL, sensitivity 3"),
            BudgetStep("cells", params.eps_cells, half, self.name,
                       "discrete Laplace per (class, informative value) cell + threshold"),
            BudgetStep("suppressed cells", params.eps_suppression, half, self.name,
                       "discrete Laplace per pooled (*, v) cell + threshold"),
        ]

    def row_bounds(self, params: IPAParams, cells: ReleasedCells) -> tuple[int, int]:
        """No minimum (every cell may be dropped); each cell adds at most ``noise_bound`` rows."""
        sup = cells.suppressed_class[cells.class_of_cell]
        node_rows = int(cells.true_counts[~sup].sum())
        high = (node_rows + int((~sup).sum()) * noise_bound(params.eps_cells)
                + int(sup.sum()) * noise_bound(params.eps_suppression))
        return 0, high

    def perturb_node(
        self, context: ReleaseContext, table: NodeTable, seed: np.random.SeedSequence,
        params: IPAParams,
    ) -> ReleasedCells:
        return self._perturb(context, table, np.random.default_rng(seed), params)

    def materialize(
        self, context: ReleaseContext, table: NodeTable, seed: np.random.SeedSequence,
        params: IPAParams,
    ) -> ReleasedCells:
        """Fresh draw at the chosen node (the caller passes a seed no candidate used)."""
        return self._perturb(context, table, np.random.default_rng(seed), params)

    def _perturb(
        self, context: ReleaseContext, table: NodeTable, rng: np.random.Generator,
        params: IPAParams,
    ) -> ReleasedCells:
        n_inf = context.n_inf
        tau_cells, tau_sup = self.thresholds(params)
        starts, class_of_cell, class_keys = table.classes()
        counts, inf = table.counts, table.inf_codes
        noisy = counts + discrete_laplace(rng, params.eps_cells, counts.size)
        kept = noisy >= tau_cells

        pool_true = np.bincount(inf[~kept], weights=counts[~kept], minlength=n_inf)
        pool_inf = np.flatnonzero(pool_true)
        pool_counts = pool_true[pool_inf].astype(np.int64)
        pool_noisy = pool_counts + discrete_laplace(rng, params.eps_suppression, pool_inf.size)
        pool_kept = pool_noisy >= tau_sup

        n_node = starts.size
        has_pool = pool_inf.size > 0
        n_classes = n_node + int(has_pool)
        released = np.where(kept, noisy, 0)
        pool_released = np.where(pool_kept, pool_noisy, 0)
        noise = np.where(kept, np.abs(noisy - counts), 0)
        pool_noise = np.where(pool_kept, np.abs(pool_noisy - pool_counts), 0)
        class_of = np.concatenate([class_of_cell, np.full(pool_inf.size, n_node)])
        class_noise = np.bincount(
            class_of, weights=np.concatenate([noise, pool_noise]), minlength=n_classes
        )
        sup_flag = np.zeros(n_classes, dtype=bool)
        sup_flag[n_node:] = True
        return ReleasedCells(
            class_of_cell=class_of.astype(np.int64),
            inf_codes=np.concatenate([inf, pool_inf]).astype(np.int64),
            true_counts=np.concatenate([counts, pool_counts]).astype(np.int64),
            released_counts=np.concatenate([released, pool_released]).astype(np.int64),
            class_extra=np.zeros(n_classes),
            class_noise=class_noise,
            class_ncp=np.concatenate([context.class_ncp(table, class_keys),
                                      [1.0] * int(has_pool)]),
            suppressed_class=sup_flag,
            class_keys=np.concatenate([class_keys, [-1] * int(has_pool)]).astype(np.int64),
        )
