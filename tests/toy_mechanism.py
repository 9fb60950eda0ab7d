"""A mechanism in one file, as docs/ARCHITECTURE.md describes: the lattice kind, with every
optional hook left to ``MechanismBase`` (candidates: every node; score: perturb and summarize;
selection: the exponential mechanism on 3 - IL). Registered by tests/unit/test_toy_mechanism.py
with one line. Not a product mechanism: which cells are present is released as it is, so it
claims no proven guarantee."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from pydantic import Field

from medrelease.data.lattice import NodeTable
from medrelease.evidence.metrics import ReleasedCells
from medrelease.mechanisms.base import (
    Capabilities,
    MechanismBase,
    MechanismParams,
    ReleaseContext,
    ReleaseShape,
    noise_bound,
)
from medrelease.privacy.guarantee import ADD_REMOVE_ONE_ROW, BudgetStep, Guarantee, StepDraws
from medrelease.privacy.randomness import discrete_laplace, generator_for


class ToyParams(MechanismParams):
    epsilon: float = Field(default=1.0, gt=0, le=10, description="privacy budget")


class ToyNoisyCells(MechanismBase):
    name: ClassVar[str] = "toy-noisy-cells"
    capabilities: ClassVar[Capabilities] = Capabilities(
        summary="toy: noisy counts of the present cells at a chosen node (no proven DP)",
        draws_declared_steps=True)
    selection: ClassVar[str] = "exponential"
    selection_step: ClassVar[str | None] = "node selection"
    Params: ClassVar[type[MechanismParams]] = ToyParams

    def guarantee(self, params: ToyParams) -> Guarantee:
        return Guarantee(self.name, params.epsilon, 0.0, ADD_REMOVE_ONE_ROW, False,
                         "toy — which cells are present is not protected")

    def budget_steps(self, params: ToyParams) -> list[BudgetStep]:
        return [BudgetStep("node selection", params.epsilon / 4, 0.0, self.name,
                           "exponential mechanism on 3 - IL"),
                BudgetStep("cells", 3 * params.epsilon / 4, 0.0, self.name,
                           "discrete Laplace on every present cell, clipped at 0")]

    def row_bounds(self, params: ToyParams, shape: ReleaseShape) -> tuple[int, int]:
        cells = shape.cells
        widest = noise_bound(3 * params.epsilon / 4)
        return 0, int(cells.true_counts.sum()) + cells.true_counts.size * widest

    def perturb_node(self, context: ReleaseContext, table: NodeTable,
                     seed: np.random.SeedSequence, params: ToyParams,
                     draws: StepDraws | None = None) -> ReleasedCells:
        step = draws.take("cells")
        _, class_of_cell, class_keys = table.classes()
        true = table.counts.astype(np.int64)
        noisy = np.maximum(0, true + discrete_laplace(generator_for(seed), step.epsilon,
                                                      true.size))
        n_classes = class_keys.size
        return ReleasedCells(
            class_of_cell=class_of_cell.astype(np.int64), inf_codes=table.inf_codes,
            true_counts=true, released_counts=noisy, class_extra=np.zeros(n_classes),
            class_noise=np.bincount(class_of_cell, weights=np.abs(noisy - true),
                                    minlength=n_classes),
            class_ncp=context.class_ncp(table, class_keys),
            suppressed_class=np.zeros(n_classes, dtype=bool),
            class_keys=class_keys.astype(np.int64))

    materialize = perturb_node  # the release is one more draw, with the release's seed
