"""``histogram``: a noisy contingency table at one lattice node (ALGORITHMS.md §5).

Every cell of the node's *full* domain — every combination of generalized dimension values
times every informative value, empty cells included — gets discrete Laplace noise of scale
1/eps; negative counts become 0; rows are produced from the counts. The node is a parameter or,
by default, the finest node with at most ``auto_cells`` cells: chosen from the taxonomies alone,
so the choice costs no budget. Domains over ``cell_limit`` are refused before any allocation.
Adding or removing one row changes one cell by one: eps-DP, provided the informative domain is
public (declared in the dataset config); with a declared unit of at most m rows, the counts move
by m in L1 and the noise has scale m/eps. With a domain taken
from the data the set of informative values itself is disclosed, and the label says so.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

from medrelease.data.lattice import Node, NodeTable
from medrelease.errors import ParameterError
from medrelease.evidence.metrics import ReleasedCells, class_ncp
from medrelease.mechanisms.base import (
    Capabilities,
    MechanismBase,
    MechanismParams,
    ReleaseContext,
    ReleaseShape,
    declared_draws,
    expected_rows_above,
    noise_bound,
)
from medrelease.mechanisms.interval_rows import histogram_interval_table
from medrelease.privacy.guarantee import ADD_REMOVE_ONE_ROW, BudgetStep, Guarantee, StepDraws
from medrelease.privacy.intervals import (
    LEVEL,
    CountIntervals,
    cells_entry,
    clipped_interval,
    noise_law_epsilon,
)
from medrelease.privacy.randomness import discrete_laplace, generator_for
from medrelease.privacy.unit_cut import unit_cut_epsilon, unit_cut_step

DEFAULT_CELL_LIMIT = 5_000_000


class HistogramParams(MechanismParams):
    epsilon: float = Field(default=1.0, gt=0, allow_inf_nan=False, description="privacy budget")
    node: dict[str, int] | None = Field(
        default=None, description="levels per dimension; default: finest node within the limit")
    cell_limit: int = Field(default=DEFAULT_CELL_LIMIT, ge=1,
                            description="refuse domains with more cells than this")
    auto_cells: int = Field(default=100_000, ge=1,
                            description="without 'node': the finest node with at most this many "
                                        "cells (each empty cell adds noise rows)")
    # Set by the release driver from the dataset config, never by users (hidden from forms).
    public_domain: SkipJsonSchema[bool] = True
    unit_rows: SkipJsonSchema[int] = 1  # m: one unit changes the counts by m in L1
    unit_column: SkipJsonSchema[str | None] = None  # a declared unit: its cut is published


class Histogram(MechanismBase):
    name: ClassVar[str] = "histogram"
    capabilities: ClassVar[Capabilities] = Capabilities(
        summary="eps-DP with a public informative domain (else unproven)",
        gives="every cell of one generalization level with a noisy count, empty cells included",
        audit_public_domain=True,
        draws_declared_steps=True,
        published_tables=("intervals.csv",),
    )
    selection: ClassVar[str] = "fixed"
    Params: ClassVar[type[MechanismParams]] = HistogramParams


    def guarantee(self, params: HistogramParams) -> Guarantee:
        if params.public_domain:
            return Guarantee(self.name, params.epsilon, 0.0, ADD_REMOVE_ONE_ROW, True,
                             "noisy contingency table, epsilon-DP (discrete Laplace per cell)")
        return Guarantee(
            self.name, params.epsilon, 0.0, ADD_REMOVE_ONE_ROW, False,
            "noisy contingency table — informative domain taken from the data, not DP",
            "Declare a public 'domain' file for the informative column to make this epsilon-DP.")

    def cells_epsilon(self, params: HistogramParams) -> float:
        """The cell counts' epsilon: the release's, less the unit cut's share when a unit is
        declared (``privacy/unit_cut.py``)."""
        return params.epsilon - unit_cut_epsilon(params.epsilon, params.unit_column)

    def budget_steps(self, params: HistogramParams) -> list[BudgetStep]:
        return [BudgetStep("cell counts", self.cells_epsilon(params), 0.0, self.name,
                           "discrete Laplace(1/eps) on every cell of the node's full domain"),
                *unit_cut_step(params.epsilon, params.unit_column, self.name)]

    def candidate_nodes(self, context: ReleaseContext, params: HistogramParams) -> list[Node]:
        return [self.fixed_node(context, params)]

    def domain_cells(self, context: ReleaseContext, node: Node) -> int:
        cards = [t.cardinality(level) for t, level in zip(context.lattice.taxonomies, node,
                                                            strict=True)]
        return math.prod(cards) * context.n_inf

    def fixed_node(self, context: ReleaseContext, params: HistogramParams) -> Node:
        names = context.counts.dimensions
        if params.node is not None:
            unknown = sorted(set(params.node) - set(names))
            if unknown or set(params.node) != set(names):
                raise ParameterError(
                    f"histogram: 'node' needs a level for each of {', '.join(names)}"
                    + (f" (unknown: {', '.join(unknown)})" if unknown else ""))
            node = tuple(int(params.node[n]) for n in names)
            for name, level, taxonomy in zip(names, node, context.lattice.taxonomies, strict=True):
                if not 0 <= level <= taxonomy.height:
                    raise ParameterError(f"histogram: level {level} of {name!r} is outside "
                                         f"0..{taxonomy.height}")
            size = self.domain_cells(context, node)
            if size > params.cell_limit:
                raise ParameterError(
                    f"histogram: node {dict(zip(names, node, strict=True))} has {size:,} cells "
                    f"(classes x {context.n_inf:,} informative values), over the cell limit "
                    f"{params.cell_limit:,}; choose a coarser node or raise cell_limit")
            return node
        budget = min(params.cell_limit, params.auto_cells)
        fitting = [n for n in context.lattice.nodes if self.domain_cells(context, n) <= budget]
        if not fitting:
            raise ParameterError(
                f"histogram: even the top node has {context.n_inf:,} cells, over "
                f"{budget:,}; raise auto_cells / cell_limit")
        return min(fitting, key=lambda n: (sum(n), -self.domain_cells(context, n), n))

    def expected_noise_rows(self, context: ReleaseContext, params: HistogramParams) -> float:
        """Every cell of the node's full domain is released with its clipped noisy count."""
        cells = self.domain_cells(context, self.fixed_node(context, params))
        return cells * expected_rows_above(self.cells_epsilon(params) / params.unit_rows)

    def error_bars(self, params: HistogramParams, context: ReleaseContext | None = None,
                   node: Node | None = None) -> dict[str, Any]:
        """95 % intervals for the researcher (public: the parameters and the node's domain):
        every cell of the node's domain is drawn, clipped at 0; a total over c cells by
        ``clipped_total_interval``."""
        m = params.unit_rows
        step = self.cells_epsilon(params)
        eps = noise_law_epsilon(step, m)
        cells = [cells_entry("every cell of the node's domain (a combination with no rows "
                             "was released as 0)", CountIntervals.clipped(eps), step, m)]
        out: dict[str, Any] = {
            "level": LEVEL,
            "statement": ("Every cell of the chosen node's full domain — every combination of "
                          "the generalized dimensions times every informative value, empty "
                          "ones included — was released as max(0, n + Z) rows, Z discrete "
                          "Laplace. A cell with rows (in data.csv and intervals.csv) has the "
                          "interval of its true count given that it came out at 1 or more, "
                          "which holds with 95 % probability for every true count; a "
                          "combination absent from data.csv was released as 0 and its true "
                          f"count lies in [0, {clipped_interval(0, eps)[1]}] (95 %)."),
            "cells": cells,
            "totals": ("A total over c cells of the domain (e.g. a value over every class: c = "
                       "the node's classes) with released total T lies in [T - q+, T + q], q+ "
                       "the 97.5 % quantile of the sum of c noises' positive parts and q that "
                       "of the sum of c noises (clipping at 0 only ever adds rows)."),
        }
        if context is not None and node is not None:
            out["classes"] = self.domain_cells(context, node) // max(context.n_inf, 1)
        return out

    def interval_table(self, params: HistogramParams, context: ReleaseContext,
                       cells: ReleasedCells, rows: Any,
                       analyses: tuple[tuple[str, ...], ...] = ()) -> Any:
        """``intervals.csv``: every released cell's interval and every value's total over the
        node's classes (``interval_rows.histogram_interval_table``)."""
        node = cells.nodes[0] if cells.nodes else self.fixed_node(context, params)
        classes = self.domain_cells(context, node) // max(context.n_inf, 1)
        return histogram_interval_table(params, self.cells_epsilon(params), context, cells,
                                        rows, classes, node=tuple(node), analyses=analyses)

    def row_bounds(self, params: HistogramParams, shape: ReleaseShape) -> tuple[int, int]:
        cells = shape.cells
        return 0, int(cells.true_counts.sum()) + cells.released_counts.size * noise_bound(
            self.cells_epsilon(params) / params.unit_rows)

    def perturb_node(self, context: ReleaseContext, table: NodeTable,
                     seed: np.random.SeedSequence, params: HistogramParams,
                     draws: StepDraws | None = None) -> ReleasedCells:
        return self._noisy(context, table, generator_for(seed), params)

    def materialize(self, context: ReleaseContext, table: NodeTable,
                    seed: np.random.SeedSequence, params: HistogramParams,
                    draws: StepDraws | None = None) -> ReleasedCells:
        """The one draw, with the plan's declared step (``draws``)."""
        draws = draws or declared_draws(self, self.budget_steps(params))
        step = draws.take("cell counts")
        return self._noisy(context, table, generator_for(seed), params, step.epsilon)

    def _noisy(self, context: ReleaseContext, table: NodeTable, rng: np.random.Generator,
               params: HistogramParams, epsilon: float | None = None) -> ReleasedCells:
        lattice = context.lattice
        node = table.node
        size = self.domain_cells(context, node)
        if size > params.cell_limit:
            raise ParameterError(f"histogram: {size:,} cells exceed the cell limit "
                                 f"{params.cell_limit:,}")
        cards = [t.cardinality(level) for t, level in zip(lattice.taxonomies, node, strict=True)]
        n_inf = context.n_inf
        codes = lattice.class_codes_from_keys(table.class_keys)
        dense_class = (np.ravel_multi_index(tuple(codes.T), cards) if cards
                       else np.zeros(len(codes), dtype=np.int64))
        true = np.bincount(dense_class * n_inf + table.inf_codes, weights=table.counts,
                           minlength=size).astype(np.int64)
        epsilon = self.cells_epsilon(params) if epsilon is None else epsilon
        # L1 sensitivity m (a unit of m rows): noise scale m / eps
        released = np.maximum(0, true + discrete_laplace(rng, epsilon / params.unit_rows, size))
        keep = np.flatnonzero((true > 0) | (released > 0))  # empty both ways: nothing to show
        class_of = keep // n_inf
        used_classes, class_of = np.unique(class_of, return_inverse=True)
        all_codes = np.stack(np.unravel_index(used_classes, cards), axis=1) if cards else \
            np.zeros((len(used_classes), 0), dtype=np.int64)
        radices = lattice.counts.radices // n_inf
        class_keys = (all_codes * radices).sum(axis=1) if cards else np.zeros(len(used_classes),
                                                                              dtype=np.int64)
        noise = np.abs(released[keep] - true[keep])
        return ReleasedCells(
            class_of_cell=class_of.astype(np.int64),
            inf_codes=(keep % n_inf).astype(np.int64),
            true_counts=true[keep],
            released_counts=released[keep],
            class_extra=np.zeros(len(used_classes)),
            class_noise=np.bincount(class_of, weights=noise, minlength=len(used_classes)),
            class_ncp=class_ncp(lattice.taxonomies, node, all_codes),
            suppressed_class=np.zeros(len(used_classes), dtype=bool),
            class_keys=class_keys.astype(np.int64),
        )
