"""``kanon``: optimal full-domain k-anonymity with a suppression limit (Incognito-style).

Syntactic model — no differential privacy. Among the lattice nodes whose equivalence classes
all have at least k rows once classes smaller than k are suppressed (at most
``max_suppression`` of the rows), pick the one of minimal information loss. Feasibility is
monotone (generalizing merges classes, so suppressed rows can only decrease), so a top-down
search skips every node below an infeasible one without rolling it up; ``optimal_node`` is
tested against exhaustive search. Suppressed rows are released as ``(*, ..., *, v)`` when there
are at least k of them (that class is k-anonymous too) and withheld otherwise; either way they
count with NCP 1.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from pydantic import Field

from medrelease.data.lattice import Node, NodeTable
from medrelease.errors import ParameterError
from medrelease.evidence.metrics import ReleasedCells
from medrelease.mechanisms.base import (
    Capabilities,
    MechanismBase,
    MechanismParams,
    NodeSummary,
    ReleaseContext,
    ReleaseShape,
    summarize,
)
from medrelease.privacy.guarantee import Guarantee, StepDraws

LABEL = "syntactic model — no differential privacy"


class KAnonParams(MechanismParams):
    k: int = Field(default=10, ge=2, description="minimum equivalence-class size")
    max_suppression: float = Field(default=0.02, ge=0, le=1,
                                   description="largest share of rows that may be suppressed")


class KAnonymity(MechanismBase):
    name: ClassVar[str] = "kanon"
    capabilities: ClassVar[Capabilities] = Capabilities(
        summary="syntactic k-anonymity, no DP",
        gives="real rows generalized until every class has k rows (no noise, no DP)",
        audit_designs=(),
        loss_reason=("rows of classes smaller than k are suppressed: released under '*' when "
                     "at least k of them, else withheld"),
    )
    selection: ClassVar[str] = "minimum_loss"
    Params: ClassVar[type[MechanismParams]] = KAnonParams

    def guarantee(self, params: KAnonParams) -> Guarantee:
        return Guarantee.no_dp_claim(self.name, LABEL,
                                     f"every released class has at least k={params.k} rows")


    def candidate_nodes(self, context: ReleaseContext, params: KAnonParams) -> list[Node]:
        return list(context.lattice.nodes)

    def row_bounds(self, params: KAnonParams, shape: ReleaseShape) -> tuple[int, int]:
        total = int(shape.cells.true_counts.sum())
        return int(np.floor(total * (1 - params.max_suppression))), total

    def is_feasible(self, cells: ReleasedCells, params: KAnonParams) -> bool:
        suppressed = cells.true_counts[cells.suppressed_class[cells.class_of_cell]].sum()
        return bool(suppressed <= params.max_suppression * cells.true_counts.sum())

    def perturb_node(self, context: ReleaseContext, table: NodeTable,
                     seed: np.random.SeedSequence, params: KAnonParams,
                     draws: StepDraws | None = None) -> ReleasedCells:
        return self._suppress(context, table, params, withhold_small_pool=False)

    def materialize(self, context: ReleaseContext, table: NodeTable,
                    seed: np.random.SeedSequence, params: KAnonParams,
                    draws: StepDraws | None = None) -> ReleasedCells:
        return self._suppress(context, table, params, withhold_small_pool=True)

    def _suppress(self, context: ReleaseContext, table: NodeTable, params: KAnonParams,
                  withhold_small_pool: bool) -> ReleasedCells:
        starts, class_of_cell, class_keys = table.classes()
        counts, inf = table.counts, table.inf_codes
        sizes = np.add.reduceat(counts, starts) if starts.size else counts[:0]
        small = sizes < params.k
        sup_cell = small[class_of_cell]
        pool = np.bincount(inf[sup_cell], weights=counts[sup_cell], minlength=context.n_inf)
        pool_inf = np.flatnonzero(pool)
        kept = np.flatnonzero(~small)
        renumber = np.cumsum(~small) - 1
        has_pool = pool_inf.size > 0
        n_classes = kept.size + int(has_pool)
        pool_counts = pool[pool_inf].astype(np.int64)
        pool_released = pool_counts
        if withhold_small_pool and pool_counts.sum() < params.k:
            pool_released = np.zeros_like(pool_counts)
        true = np.concatenate([counts[~sup_cell], pool_counts]).astype(np.int64)
        sup_flag = np.zeros(n_classes, dtype=bool)
        sup_flag[kept.size:] = True
        return ReleasedCells(
            class_of_cell=np.concatenate([renumber[class_of_cell[~sup_cell]],
                                          np.full(pool_inf.size, kept.size)]).astype(np.int64),
            inf_codes=np.concatenate([inf[~sup_cell], pool_inf]).astype(np.int64),
            true_counts=true,
            released_counts=np.concatenate([counts[~sup_cell], pool_released]).astype(np.int64),
            class_extra=np.zeros(n_classes),
            class_noise=np.zeros(n_classes),
            class_ncp=np.concatenate([context.class_ncp(table, class_keys[kept]),
                                      [1.0] * int(has_pool)]),
            suppressed_class=sup_flag,
            class_keys=np.concatenate([class_keys[kept], [-1] * int(has_pool)]).astype(np.int64),
        )

    def optimal_node(self, context: ReleaseContext, params: KAnonParams,
                     exhaustive: bool = False) -> tuple[int, list[NodeSummary]]:
        """The feasible node of least IL; top-down with monotonicity pruning (or exhaustive)."""
        lattice = context.lattice
        order = sorted(lattice.nodes, key=lambda n: (-sum(n), n))
        infeasible: set[Node] = set()
        summaries: list[NodeSummary] = []
        for node in order:
            if not exhaustive and any(c in infeasible for c in _coarser(node, lattice.heights)):
                infeasible.add(node)  # a finer node of an infeasible one is infeasible
                continue
            table = lattice.from_finest(node) if sum(node) else lattice.bottom()
            cells = self.perturb_node(context, table, None, params)
            feasible = self.is_feasible(cells, params)
            summaries.append(summarize(lattice.index(node), node, cells, feasible))
            if not feasible:
                infeasible.add(node)
        feasible_ones = [s for s in summaries if s.feasible]
        if not feasible_ones:
            raise ParameterError(
                f"kanon: no lattice node is {params.k}-anonymous with at most "
                f"{params.max_suppression:.1%} of rows suppressed")
        best = min(feasible_ones, key=lambda s: (s.il, s.height, s.index))
        return best.index, summaries


def _coarser(node: Node, heights: tuple[int, ...]) -> list[Node]:
    return [tuple(lv + (1 if j == i else 0) for j, lv in enumerate(node))
            for i in range(len(node)) if node[i] < heights[i]]
