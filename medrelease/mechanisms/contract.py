"""The mechanism contract: one protocol per kind, every hook the release driver calls.

A mechanism is one class in its own file under ``medrelease/mechanisms/``, inheriting
``MechanismBase`` (``base.py``: the default of every optional hook), plus one ``register``
line in ``medrelease/mechanisms/__init__.py``. Its ``capabilities.kind`` says which protocol
below it follows, and the driver (``medrelease/release.py``) dispatches on that kind only.

Every kind declares its privacy map as data (``guarantee``, ``budget_steps``), refuses what
public facts can refuse (``parse_params``, ``check_work``, ``expected_noise_rows``), and states
its plausible row range (``row_bounds``, one signature: a ``ReleaseShape``) and its published
error bars (``error_bars``; a lattice mechanism's ``intervals.csv`` from ``interval_table``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import pandas as pd

from medrelease.data.aggregate import CountTable
from medrelease.data.config import DatasetConfig
from medrelease.data.lattice import Node, NodeTable
from medrelease.evidence.metrics import ReleasedCells
from medrelease.mechanisms.base import (
    Capabilities,
    ReleaseContext,
    ReleaseShape,
    RowsOutput,
    Selection,
)
from medrelease.plan import MaterializedRelease, MechanismParams, NodeSummary, ReleasePlan
from medrelease.privacy.guarantee import BudgetStep, Guarantee, StepDraws


@runtime_checkable
class Mechanism(Protocol):
    """The hooks of every kind."""

    name: ClassVar[str]
    Params: ClassVar[type[MechanismParams]]
    capabilities: ClassVar[Capabilities]
    selection: ClassVar[Selection]
    selection_step: ClassVar[str | None]

    def parse_params(self, raw: dict[str, Any]) -> MechanismParams: ...

    def guarantee(self, params: MechanismParams) -> Guarantee: ...

    def budget_steps(self, params: MechanismParams) -> list[BudgetStep]: ...

    def check_work(self, config: DatasetConfig, params: MechanismParams) -> None: ...

    def expected_noise_rows(self, context: ReleaseContext, params: MechanismParams
                            ) -> float: ...

    def row_bounds(self, params: MechanismParams, shape: ReleaseShape) -> tuple[int, int]: ...

    def error_bars(self, params: MechanismParams, context: ReleaseContext | None = None,
                   node: Node | None = None) -> dict[str, Any]: ...


@runtime_checkable
class LatticeMechanism(Mechanism, Protocol):
    """Kind ``lattice``: score candidate nodes of the generalization lattice, choose one
    (``selection``: exponential, minimum_loss or fixed), release its cells."""

    def candidate_nodes(self, context: ReleaseContext, params: MechanismParams
                        ) -> list[Node] | None: ...

    def score_node(self, context: ReleaseContext, table: NodeTable, index: int,
                   seed: np.random.SeedSequence | None, params: MechanismParams,
                   steps: list[BudgetStep]) -> NodeSummary: ...

    def perturb_node(self, context: ReleaseContext, table: NodeTable,
                     seed: np.random.SeedSequence, params: MechanismParams,
                     draws: StepDraws | None = None) -> ReleasedCells: ...

    def selection_utility(self, summaries: list[NodeSummary], params: MechanismParams
                          ) -> tuple[np.ndarray, float, bool]: ...

    def fixed_node(self, context: ReleaseContext, params: MechanismParams) -> Node: ...

    def optimal_node(self, context: ReleaseContext, params: MechanismParams
                     ) -> tuple[Node, list[NodeSummary]]: ...

    def materialize(self, context: ReleaseContext, table: NodeTable,
                    seed: np.random.SeedSequence, params: MechanismParams,
                    draws: StepDraws | None = None) -> ReleasedCells: ...

    def interval_table(self, params: MechanismParams, context: ReleaseContext,
                       cells: ReleasedCells, rows: Any,
                       analyses: tuple[tuple[str, ...], ...] = ()) -> Any: ...


@runtime_checkable
class RowsMechanism(Mechanism, Protocol):
    """Kind ``rows``: release from the (unit-bounded) rows in one pass, no lattice."""

    def release_rows(self, table: pd.DataFrame, config: DatasetConfig,
                     params: MechanismParams, rng: np.random.Generator,
                     draws: StepDraws | None, key: bytes | None) -> RowsOutput: ...


@runtime_checkable
class SyntheticMechanism(Mechanism, Protocol):
    """Kind ``synthetic``: fit a model to noisy marginals of the count table in rounds and
    sample rows. ``start_rounds`` measures round 0 and returns the rounds (``plan_round``,
    ``batches``, ``score``, ``finish_round``, ``state``: the loop ``medrelease.stages.
    run_rounds`` drives through the caller's executor); ``sample`` draws the rows."""

    def start_rounds(self, counts: CountTable, config: DatasetConfig | None, plan: ReleasePlan,
                     log: Callable[[str], None] | None = None) -> Any: ...

    def sample(self, run: Any, counts: CountTable, plan: ReleasePlan) -> MaterializedRelease: ...


@runtime_checkable
class RelationalMechanism(Mechanism, Protocol):
    """Kind ``relational``: release a relational dataset's tables (validated frames, one per
    table of ``config.relational_schema``) in one step."""

    def release_tables(self, frames: Any, config: DatasetConfig, plan: ReleasePlan,
                       log: Callable[[str], None] | None = None) -> MaterializedRelease: ...


PROTOCOLS: dict[str, type[Mechanism]] = {
    "lattice": LatticeMechanism, "rows": RowsMechanism, "synthetic": SyntheticMechanism,
    "relational": RelationalMechanism}


def hooks(protocol: type[Mechanism]) -> list[str]:
    """Every attribute and method a protocol lists, its bases' included (the registry checks
    that a mechanism has each one before it is registered)."""
    names: set[str] = set()
    for cls in protocol.__mro__:
        if cls is object or not getattr(cls, "_is_protocol", False) or cls is Protocol:
            continue
        names.update(getattr(cls, "__annotations__", {}))
        names.update(name for name, value in vars(cls).items()
                     if callable(value) and not name.startswith("_"))
    return sorted(names)
