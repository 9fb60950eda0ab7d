"""The release's data: what a plan holds, what the facts it may depend on are, and what a
release produces — no mechanism registry, no driver.

Everything the stages pass between each other (the driver in ``medrelease/release.py``, the
Prefect tasks in ``tasks/``, the synthetic rounds in ``medrelease/synthetic/``) is defined here,
so those layers import these types from below instead of from each other.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict

from medrelease.data.config import DatasetConfig
from medrelease.data.lattice import Node
from medrelease.data.units import UnitBound, unit_relation
from medrelease.evidence.metrics import ILParts
from medrelease.privacy.guarantee import BudgetStep, Guarantee
from medrelease.privacy.randomness import RandomSource
from medrelease.storage.released_rows import ReleasedRows


class MechanismParams(BaseModel):
    """Common base: unknown parameters are an error, not silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)



@dataclass(frozen=True)
class CheckReport:
    """The output checks' result (``schemas/output.py`` builds and runs the suite): whether the
    release passed, each expectation's result and the suite (steward record), and the checks in
    words that name no input-derived value (the public manifest)."""

    success: bool
    results: list[dict[str, Any]]
    suite: dict[str, Any]
    public: list[str] = field(default_factory=list)

    def failures(self) -> list[dict[str, Any]]:
        return [r for r in self.results if not r["success"]]

@dataclass(frozen=True)
class NodeSummary:
    """A candidate as the selection sees it: small, never a table."""

    index: int
    node: Node
    height: int
    ncp: float
    emd: float
    rate: float
    il: float
    classes: int
    suppressed_classes: int
    suppressed_rows: int
    noise_rows: int
    released_rows: int
    feasible: bool = True
    score: float = float("nan")  # ipa: the selection score U (weight units); else unused

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["node"] = list(self.node)
        return out


@dataclass
class ReleasePlan:
    """A mechanism with validated parameters, its privacy map, and the seeds of every stage.

    Seeds are internal: they determine the noise and must never be logged or published.
    ``kind`` and ``selection_step`` are decided by ``plan_release`` from the mechanism's
    declarations, so nothing downstream asks the registry again.
    """

    mechanism: str
    params: MechanismParams
    guarantee: Guarantee
    budget_steps: list[BudgetStep]
    random: RandomSource
    node_seeds: list[np.random.SeedSequence] = field(repr=False)
    selection_seed: np.random.SeedSequence = field(repr=False)
    release_seed: np.random.SeedSequence = field(repr=False)
    shuffle_seed: np.random.SeedSequence = field(repr=False)
    unit: UnitBound | None = None  # the declared unit's bound, for mechanisms calibrated to it
    kind: str = "lattice"  # the mechanism's declared kind (Capabilities.kind)
    selection_step: str | None = None  # the budget step the node choice draws, if any
    analyses: tuple[tuple[str, ...], ...] = ()  # the declared analyses' columns (public)

    @property
    def selection_epsilon(self) -> float:
        """The node choice's epsilon: its declared budget step's (the privacy map drives the
        noise); 0 for a mechanism whose selection draws nothing."""
        if self.selection_step is None:
            return 0.0
        return next(s.epsilon for s in self.budget_steps if s.step == self.selection_step)


@dataclass(frozen=True)
class PublicFacts:
    """What a plan may depend on besides the request: fixed by the dataset config, never read
    from the data (so no threshold or parameter can move with the table)."""

    public_domain: bool = False
    n_numeric: int = 0
    max_rows: int | None = None
    unit_rows: int = 1  # rows one unit may have after the bound (1: the unit is one row)
    unit_column: str | None = None  # the declared unit's identifier column
    unit_relation: str | None = None  # the neighbouring relation in words, for that unit
    domain_from_data: str | None = None  # informative column whose domain was read from data
    taxonomies_from_data: tuple[str, ...] = ()  # dimensions whose taxonomy was read from data
    bounds_from_data: tuple[str, ...] = ()  # relational: tables whose max_children is unreviewed
    row_noun: str | None = None  # the config's word for one row (the row note; none: generic)
    unit_noun: str | None = None  # the config's word for whom rows describe
    declared_analyses: int = 0  # how many analyses the config declares (aim measures each)
    # the declared analyses' columns (public): the row mechanisms' intervals.csv states each
    # one's marginal cells, every cell at once (simultaneous)
    analysis_columns: tuple[tuple[str, ...], ...] = ()

    @classmethod
    def of(cls, config: DatasetConfig) -> PublicFacts:
        privacy, unit = config.privacy, config.unit_column
        return cls(public_domain=config.informative_domain is not None,
                   domain_from_data=config.domain_read_from_data,
                   taxonomies_from_data=(*config.taxonomies_read_from_data,
                                         *config.child_values_from_data),
                   bounds_from_data=tuple(config.bounds_not_reviewed),
                   n_numeric=numeric_predictors(config), max_rows=privacy.max_rows,
                   unit_rows=privacy.max_rows_per_unit if unit else 1, unit_column=unit,
                   unit_relation=(tables_relation(config) if config.relational is not None
                                  else unit_relation(privacy.unit_words, privacy.row_words,
                                                     unit, privacy.max_rows_per_unit)
                                  if unit else None),
                   row_noun=privacy.row_noun, unit_noun=privacy.unit_noun,
                   declared_analyses=len(config.analyses),
                   analysis_columns=tuple(tuple(a.columns) for a in config.analyses))


PUBLIC_FACTS = tuple(f.name for f in fields(PublicFacts))  # set from the config, never by a request


def tables_relation(config: DatasetConfig) -> str:
    """A relational dataset's neighbouring relation in words: one patient with all their rows
    in every table, each parent's rows cut to its bound (the config's declarations)."""
    schema = config.relational_schema
    root = schema.root
    bounds = " and ".join(
        f"at most {t.max_children} {t.name} rows per "
        + (schema.unit_noun if t.parent == root.name else f"{t.parent} row")
        for t in schema.tables[1:])
    return (f"add/remove one {schema.unit_noun} (one row of {root.name}, by {root.key}) with "
            f"all their rows in every table ({', '.join(t.name for t in schema.tables)}); "
            f"{bounds}, chosen at random")


def numeric_predictors(config: DatasetConfig) -> int:
    return sum(1 for c in config.dimensions if config.taxonomies[c].kind == "numeric")


@dataclass(frozen=True)
class ResolvedMechanism:
    """Which mechanism runs with which raw parameters, and where each came from."""

    name: str
    params: dict[str, Any]
    source: str  # "request" or "dataset config" (the mechanism's name)


@dataclass
class MaterializedRelease:
    """The chosen node's released table, its information loss and its plausible row range."""

    index: int
    node: Node
    rows: ReleasedRows
    il: ILParts | None
    row_bounds: tuple[int, int]
    details: dict[str, Any] = field(default_factory=dict)
    summary: NodeSummary | None = None
    nodes: tuple[Node, ...] = ()  # every node whose labels appear (ipa's ladder), else (node,)
    # For the researcher (published): 95 % intervals / bounds from the mechanism's outputs and
    # public parameters only, and tables published beside the data (aim's measurements).
    error_bars: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    # kind ``relational``: the released tables themselves, by table name (each published as
    # ``<name>.csv`` and ``<name>.parquet`` instead of ``data.*``; ``rows`` is the first)
    data_tables: dict[str, pd.DataFrame] = field(default_factory=dict)

    @property
    def table(self) -> pd.DataFrame:
        """Every released row in memory; the flow never asks for it (it streams ``rows``)."""
        return self.rows.to_frame()


@dataclass
class Release:
    """A finished release and everything needed to defend it."""

    table: pd.DataFrame
    mechanism: str
    params: dict[str, Any]
    node: dict[str, int]
    node_index: int
    candidates: pd.DataFrame
    guarantee: Guarantee
    budget_steps: list[BudgetStep]
    seed_policy: str
    for_publication: bool
    input_rows: int
    released_il: ILParts
    details: dict[str, Any] = field(default_factory=dict)  # mechanism's own summary (diffgen: cut)

    @property
    def released_rows(self) -> int:
        return len(self.table)

    @property
    def epsilon_spent(self) -> float:
        return math.fsum(s.epsilon for s in self.budget_steps)
