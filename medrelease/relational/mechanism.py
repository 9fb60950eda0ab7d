"""The relational release: synthetic patients and their child rows (admissions, diagnoses ...)
with fresh keys, under (eps, delta)-DP for adding or removing one patient with all their rows
in every table (docs/RELATIONAL.md has the design, the measurements and the proof).

1. The tables are validated, every parent's children cut to ``max_children`` at random, and
   each root-to-leaf chain of tables flattened into its *patient-normalised* table
   (``flatten.py``): every patient weighs ``L`` there, so each marginal moves by at most ``L``
   (L2) when one patient comes or goes.
2. ``aim``'s rounds (``AIMRounds``: taxonomy levels, rare-value merges, the zCDP filter) run on
   each chain's table with that chain's share of rho, calibrated at ``rho_c / L^2`` exactly as
   ``aim`` calibrates a unit of ``m`` rows at ``rho / m^2``; the chains' rho's add up to the
   release's rho.
3. Generation (post-processing): the number of patients from the chains' noisy totals; the
   patients' columns and children counts from the model; per patient, its children drawn from
   the model's conditional law given the patient's columns and count (``generate.py``), and so
   on down. Keys are fresh (``<table>-<n>``, in a random order), so every reference holds by
   construction and no input key is ever released.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import Field

from medrelease.plan import MechanismParams
from medrelease.privacy.randomness import RandomSource, exponential_mechanism, generator_for
from medrelease.privacy.zcdp import (
    discrete_gaussian,
    exponential_rho,
    gaussian_rho,
    grid_sigma_sq,
    rho_for,
)
from medrelease.relational.flatten import ABSENT, PathTable, chain_columns, path_table
from medrelease.relational.generate import ModelView, sample_given
from medrelease.relational.schema import RelSchema, RelTable, encode
from medrelease.synthetic import pgm
from medrelease.synthetic.aim_rounds import (
    AIMRounds,
    RoundPlan,
    Settings,
    build_candidates,
    noisy_total,
    true_answers,
)
from medrelease.synthetic.space import Attribute, Merge

SYNTHETIC_NOTICE = ("synthetic patients and their rows, with fresh keys: no row describes a "
                    "real patient, no key is an input key")


class RelationalParams(MechanismParams):
    """The relational release's parameters (all public)."""

    epsilon: float = Field(default=1.0, gt=0, le=100, allow_inf_nan=False)
    delta: float = Field(default=1e-6, gt=0, le=1e-3, allow_inf_nan=False)
    rounds_per_column: int = Field(default=4, ge=1, le=64,
                                   description="aim's nominal rounds per column of a chain")
    max_model_size: float = Field(default=2.5, gt=0, le=2000)
    max_cells: int = Field(default=1_000_000, ge=1, le=50_000_000)
    iters: int = Field(default=300, ge=10, le=10_000,
                       description="mirror-descent steps per round (aim: 100). A child table's "
                                   "model starts from its parent's measurements, and its "
                                   "absent-row cells are structural zeros that mirror descent "
                                   "fits slowly: at 100 steps its rounds kept re-measuring one "
                                   "badly fitted marginal (docs/results/relational.md)")
    tolerance: float = Field(default=1e-4, ge=0, le=0.1)
    final_iters: int = Field(default=1000, ge=10, le=20_000,
                             description="mirror-descent steps of each final model (aim: 300)")
    workload_degree: int = Field(default=2, ge=1, le=3,
                                 description="every marginal of 2 up to this many columns of "
                                             "a chain (parent and child columns alike)")
    chain_shares: tuple[float, ...] | None = Field(
        default=None, description="share of rho per root-to-leaf chain (default: equal)")
    max_patients: int = Field(default=1_000_000, ge=1, le=10_000_000,
                              description="public ceiling on the synthetic patients")
    max_condition_cells: int = Field(default=5_000_000, ge=1000, le=100_000_000,
                                     description="largest conditional table drawn from")
    analyses_share: float = Field(
        default=0.3, ge=0.05, le=0.8, allow_inf_nan=False,
        description="share of a model's rho spent first on the schema's declared analyses "
                    "drawn from it (each measured once at its columns' values, as aim's)")
    focus_one_way: bool = Field(
        default=True, description="with models 'table': round 0 measures the 1-way marginals "
                                  "of the columns drawn from the model only")
    inherit: bool = Field(default=True,
                          description="with models 'table': a child table's model starts from "
                                      "its parent table's measurements (post-processing)")
    weighting: Literal["patient", "row"] = Field(
        default="patient",
        description="patient: each patient weighs the same in every model's table "
                    "(sensitivity 1 patient); row: every row weighs 1 at sensitivity the "
                    "product of max_children (the join as flattened today; for comparison)")
    models: Literal["table", "chain"] = Field(
        default="table",
        description="table: one model per child table, on the chain from the patients down to "
                    "it, its workload the marginals with a column of a table drawn from it; "
                    "chain: one model per root-to-leaf chain, every marginal")


class ScaledAIMRounds(AIMRounds):
    """``AIMRounds`` on a table whose counts are in units of 1/``scale`` patient.

    The rounds' rho is the chain's rho / scale^2, so a round's selection epsilon is the
    patient-level one divided by ``scale``; the exponential mechanism is drawn with the scores
    divided by ``scale`` and the epsilon multiplied by it: the same law, exp(eps_t s / (2 w)),
    without an epsilon below the sampler's floor of 2^-20 when ``scale`` is large. The charge
    is the rounds' own (eps_t^2 / 8 on the rounds' scale)."""

    def __init__(self, *args: object, scale: int = 1,
                 one_way: Sequence[int] | None = None, prior: ChainPrior | None = None,
                 **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.scale = int(scale)
        self.one_way = tuple(range(len(self.space.attributes))) if one_way is None \
            else tuple(one_way)
        self.prior = prior
        self.one_way_sigma = 0.0  # round 0's sigma (on the grid), set by ``start``
        if prior is not None:  # the parent chain's merges, on this space's columns
            names = list(self.space.names)
            for name, merge in prior.merges:
                self.merges.append(self.space.merge(names.index(name), merge.keep,
                                                    merge.groups, merge.weights))

    def start(self) -> None:
        """Round 0 as ``AIMRounds.start``, on the columns of ``one_way`` only: in a child
        table's model its ancestors' columns are evidence (given when its rows are drawn), so
        their 1-way marginals would inform nothing that is drawn; a column measured in no
        round stays out of the model's cliques (uniform, and cancelled in every conditional
        drawn given it)."""
        state = self.state
        self.started = time.perf_counter()
        if self.prior is not None:  # public: the parent chain's measurements, rescaled
            state.measurements.extend(self.prior.measurements)
            state.cliques.extend(dict.fromkeys(m.clique for m in self.prior.measurements))
        sigma_sq = grid_sigma_sq(state.sigma)
        oneway = []
        for c in self.one_way:
            fine = self.space.fine_marginal((c,))
            state.budget.charge(gaussian_rho(float(sigma_sq)),
                                f"round 0: 1-way marginal of {self.space.names[c]}")
            oneway.append(fine.reshape(-1) + discrete_gaussian(self.rng, sigma_sq, fine.size))
        state.one_way_noisy = [np.rint(y).astype(np.int64) for y in oneway]
        sigma = self.one_way_sigma = math.sqrt(float(sigma_sq))
        for c, noisy in zip(self.one_way, oneway, strict=True):
            self._record_one_way(c, noisy, sigma)
        self._measure_analyses()
        state.total, state.total_sigma = noisy_total(
            oneway, sigma, [(y, r.sigma) for r, y in zip(state.records, state.noisy,
                                                        strict=True) if r.analysis])
        self.candidates = build_candidates(self.space, self.workload, self.settings)
        self.answers = true_answers(self.space, self.candidates)
        self.domain = pgm.domain(self.space.names, tuple(a.size for a in self.space.attributes))
        state.model = pgm.estimate(self.domain, state.measurements, self.settings.iters,
                                   state.total, tol=self.settings.tolerance)

    def _select(self, plan: RoundPlan, indices: list[int], scores: np.ndarray
                ) -> tuple[int, float]:
        sensitivity = max(self.candidates[i].weight for i in indices)
        self.state.budget.charge(exponential_rho(plan.epsilon),
                                 f"selection of round {self.selection_rounds + 1}")
        pick = exponential_mechanism(self.rng, np.asarray(scores, dtype=np.float64) / self.scale,
                                     plan.epsilon * self.scale, sensitivity)
        return indices[pick], sensitivity


@dataclass(frozen=True)
class ChainPrior:
    """What a child table's model inherits from its parent table's model: the parent chain's
    measurements (every column of the parent chain is a column of the child chain, and each of
    its marginals there is the parent chain's times L_child / L_parent exactly: a row's weight
    is split among its children), and its rare-value merges. DP outputs already charged:
    reusing them is post-processing."""

    measurements: tuple[pgm.Measurement, ...]
    merges: tuple[tuple[str, Merge], ...]

    @classmethod
    def of(cls, parent: ChainRun, scale: int) -> ChainPrior:
        ratio = scale / parent.scale
        measurements = tuple(pgm.Measurement(m.noisy * ratio, m.clique, m.stddev * ratio,
                                             m.query) for m in parent.run.state.measurements)
        names = parent.run.space.names
        return cls(measurements, tuple((names[m.column], m) for m in parent.run.merges))


@dataclass
class ChainRun:
    """One chain's measurements and model (DP outputs), and its accounting."""

    tables: tuple[str, ...]
    scale: int
    rho: float  # the chain's share of the release's rho (one patient)
    run: ScaledAIMRounds
    model: pgm.Model
    table: PathTable | None = field(default=None, repr=False)  # the data: steward side only
    reduced: list[str] = field(default_factory=list)  # conditioning cut to fit (generation)

    @property
    def rho_used(self) -> float:
        """What the chain's filter charged, back on the patient's scale (x scale^2)."""
        return self.run.state.rho_used * self.scale ** 2

    def measurements(self) -> list[dict]:
        """Every measurement (public): columns, levels, cells, sigma and selection epsilon on
        the patient's scale (noise in patients at sensitivity 1 patient), the rho charged."""
        chain = " -> ".join(self.tables)
        state = self.run.state
        sigma0 = self.run.one_way_sigma / self.scale
        out = [{"chain": chain, "round": 0, "columns": [a.name], "levels": [0],
                "cells": a.size, "sigma_patients": sigma0, "selection_epsilon": 0.0,
                "rho": 1.0 / (2 * sigma0 ** 2)}
               for a in (self.run.leaves[c] for c in self.run.one_way)]
        for record in state.records:
            out.append({"chain": chain, "round": record.round, "columns": list(record.columns),
                        "levels": list(record.levels), "cells": record.cells,
                        "sigma_patients": record.sigma / self.scale,
                        "selection_epsilon": record.selection_epsilon * self.scale,
                        "rho": record.rho * self.scale ** 2})
        return out


@dataclass
class RelationalRelease:
    """The synthetic tables (one frame per input table, fresh keys) and what is public."""

    tables: dict[str, pd.DataFrame]
    epsilon: float
    delta: float
    rho: float
    chains: list[ChainRun]
    noisy_patients: float
    guarantee: str
    details: dict

    @property
    def rho_used(self) -> float:
        """The rho charged by every chain's filter, on the patient's scale (<= rho)."""
        return float(sum(c.rho_used for c in self.chains))

    def measurements(self) -> list[dict]:
        return [m for c in self.chains for m in c.measurements()]


def guarantee_text(schema: RelSchema, params: RelationalParams) -> str:
    """The neighbouring relation and the guarantee in words (names every table)."""
    root = schema.root
    bounds = ", ".join(f"each {t.parent} row's {t.name} cut to at most {t.max_children}"
                       for t in schema.tables[1:])
    rho = rho_for(params.epsilon, params.delta)
    return (f"({params.epsilon:g}, {params.delta:g})-DP via rho = {rho:.6g}-zCDP for adding or "
            f"removing one {schema.unit_noun} (one row of {root.name}, by {root.key}) with all "
            f"their rows in every table ({', '.join(t.name for t in schema.tables)})"
            + (f"; {bounds}, chosen at random" if bounds else ""))


def model_chains(schema: RelSchema, params: RelationalParams) -> tuple[tuple[RelTable, ...], ...]:
    """The chains a model is fitted on (``params.models``)."""
    return schema.lineages if params.models == "table" else schema.paths


def chain_shares(schema: RelSchema, params: RelationalParams) -> list[float]:
    """Each chain's share of rho (public; equal unless declared)."""
    chains = model_chains(schema, params)
    shares = list(params.chain_shares) if params.chain_shares else [1.0] * len(chains)
    if len(shares) != len(chains) or not all(s > 0 for s in shares):
        raise ValueError(f"chain_shares needs {len(chains)} positive shares (one per chain: "
                         + "; ".join(" -> ".join(t.name for t in c) for c in chains) + ")")
    total = sum(shares)
    return [s / total for s in shares]


def workload(table: PathTable, degree: int, drawn: set[str] | None = None
             ) -> list[tuple[tuple[int, ...], float]]:
    """Every 2- to ``degree``-way marginal of a chain's columns (aim's default shape; parent x
    child pairs are most of them), weight 1, that holds a column of a table drawn from this
    chain's model (``drawn``; all when None): an ancestor's columns are evidence in a child
    table's model, where their own marginals would inform nothing that is drawn."""
    mine = {i for i, c in enumerate(table.columns) if drawn is None or c.table in drawn}
    return [(combo, 1.0) for k in range(2, max(2, degree) + 1)
            for combo in itertools.combinations(range(len(table.columns)), k)
            if mine & set(combo)]


def chain_analyses(schema: RelSchema, table: PathTable, drawn: set[str] | None
                   ) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The schema's declared analyses this chain's model measures first: those whose deepest
    table is drawn from it, as ascending column indices at their values."""
    names = list(table.names)
    out = []
    for analysis in schema.analyses:
        if not set(analysis) <= set(names):
            continue
        deepest = max(analysis, key=lambda c: len(schema.ancestors(c.split(".", 1)[0])))
        if drawn is None or deepest.split(".", 1)[0] in drawn:
            columns = tuple(sorted(names.index(c) for c in analysis))
            out.append((columns, (0,) * len(columns)))
    return out


def fit_chain(schema: RelSchema, table: PathTable, rho: float, params: RelationalParams,
              rng: np.random.Generator, log: Callable[[str], None] | None = None,
              drawn: set[str] | None = None, prior: ChainPrior | None = None
              ) -> ScaledAIMRounds:
    """aim's rounds on one chain's patient-normalised table at ``rho / L^2`` (its declared
    analyses first, then the rounds on its workload), starting from ``prior``."""
    space = table.space()
    analyses = chain_analyses(schema, table, drawn)
    rounds_rho = rho / table.scale ** 2
    settings = Settings(rho=rounds_rho,
                        rounds=params.rounds_per_column * len(space.attributes),
                        max_model_size=params.max_model_size, max_cells=params.max_cells,
                        iters=params.iters, final_iters=params.final_iters,
                        tolerance=params.tolerance or None, max_rows=None,
                        analyses_rho=params.analyses_share * rounds_rho if analyses else 0.0)
    one_way = None if drawn is None or not params.focus_one_way else \
        [i for i, c in enumerate(table.columns) if c.table in drawn]
    run = ScaledAIMRounds(space, workload(table, params.workload_degree, drawn), settings,
                          rng, log, analyses=analyses, scale=table.scale, one_way=one_way,
                          prior=prior)
    run.run()
    return run


def release_relational(schema: RelSchema, frames: Mapping[str, pd.DataFrame],
                       params: RelationalParams | None = None, seed: int | None = None,
                       log: Callable[[str], None] | None = None,
                       keep_tables: bool = False,
                       source: RandomSource | None = None) -> RelationalRelease:
    """The relational release of ``frames`` (one DataFrame per table of ``schema``).

    ``seed`` makes it reproducible (a TEST release, never for publication); without it every
    stream comes from OS entropy. ``source``: the release plan's random source (the product's
    path; ``seed`` is then unused). ``keep_tables`` keeps each chain's patient-normalised table
    on the result (tests and benchmarks; it is the data, never published)."""
    params = params or RelationalParams()
    rho = rho_for(params.epsilon, params.delta)
    shares = chain_shares(schema, params)
    source = source or RandomSource(seed)
    chains_of = model_chains(schema, params)
    streams = source.spawn(len(schema.tables) + len(chains_of) + 1)
    bound_streams = {t.name: generator_for(s) for t, s in zip(schema.tables, streams,
                                                               strict=False)}
    encoded = encode(schema, frames, bound_streams)
    chains: list[ChainRun] = []
    homes = home_chains(schema, chains_of)
    for i, chain in enumerate(chains_of):
        table = path_table(schema, encoded, chain, params.weighting == "patient")
        rng = generator_for(streams[len(schema.tables) + i])
        drawn = {name for name, home in homes.items() if home == i}
        parent = homes.get(chain[-1].parent or "", i)
        prior = ChainPrior.of(chains[parent], table.scale) \
            if params.models == "table" and params.inherit and parent < i \
            and params.weighting == "patient" else None
        run = fit_chain(schema, table, shares[i] * rho, params, rng, log,
                        drawn if params.models == "table" else None, prior)
        model = pgm.estimate(run.domain, run.state.measurements, params.final_iters,
                             run.state.total, warm_start=run.state.model)
        chains.append(ChainRun(tuple(t.name for t in chain), table.scale, shares[i] * rho,
                               run, model, table if keep_tables else None))
    noisy = noisy_patients(chains) if params.weighting == "patient" else \
        row_weighted_patients(schema, chains[0])
    patients = int(min(max(1, round(noisy)), params.max_patients))
    tables = generate(schema, chains, patients, generator_for(streams[-1]),
                      params.max_condition_cells, params.weighting == "row")
    details: dict = {"synthetic": SYNTHETIC_NOTICE, "rho": rho,
                     "rho_used": float(sum(c.rho_used for c in chains)),
                     "chains": [{"tables": list(c.tables), "scale": c.scale, "rho": c.rho,
                                 "rho_used": c.rho_used} for c in chains],
                     "noisy_patients": noisy, "patients_ceiling": params.max_patients,
                     "test_release": source.test_release}
    reduced = [r for c in chains for r in c.reduced]
    if reduced:
        details["conditioning_reduced"] = reduced
    return RelationalRelease(tables, params.epsilon, params.delta, rho, chains, noisy,
                             guarantee_text(schema, params), details)


def home_chains(schema: RelSchema, chains: tuple[tuple[RelTable, ...], ...]) -> dict[str, int]:
    """The chain whose model draws each table: the first chain that ends at it, else the
    first that holds it (the patients: the first chain)."""
    home: dict[str, int] = {}
    for i, chain in enumerate(chains):
        home.setdefault(chain[-1].name, i)
    for i, chain in enumerate(chains):
        for table in chain:
            home.setdefault(table.name, i)
    return home


def first_count(schema: RelSchema) -> str:
    """The root's count of its first child table (the column patients are weighed by when
    rows weigh 1)."""
    return f"{schema.root.name}.n_{schema.tables[1].name}"


def per_patient(view: ModelView, schema: RelSchema) -> pgm.Model:
    """The first model with a factor 1 / max(k, 1) on the root's count of its first child
    table: its law of the root's columns, per patient (row weighting only; the first model's
    chain is the root and that table, where a patient weighs max(k, 1) rows). Post-processing."""
    model = view.model
    count = first_count(schema)
    merge = view.merges.get(count)
    leaves = np.arange(view.leaf_sizes[count], dtype=np.float64)
    if merge is None:
        factor = 1.0 / np.maximum(leaves, 1.0)
    else:  # a merged group of counts: its members' mean weight
        factor = np.array([float(np.mean(1.0 / np.maximum(leaves[m], 1.0)))
                           for m in merge.members])
    potentials = {**model.potentials, (count,): np.log(factor)}
    return pgm.Model(model.domain, (*model.cliques, (count,)), potentials, {}, model.total)


def row_weighted_patients(schema: RelSchema, chain: ChainRun) -> float:
    """The number of patients when rows weigh 1: the first model's noisy count of root-and-
    first-child rows, each patient's max(k, 1) of them divided out (post-processing)."""
    count = first_count(schema)
    model = chain.model
    table = np.asarray(model.marginal((count,)), dtype=np.float64)
    view = ModelView(model, {chain.run.space.names[m.column]: m for m in chain.run.merges},
                     {a.name: a.size for a in chain.run.leaves})
    merge = view.merges.get(count)
    leaves = np.arange(view.leaf_sizes[count], dtype=np.float64)
    if merge is None:
        return float((table / np.maximum(leaves, 1.0)).sum())
    return float(sum(t * np.mean(1.0 / np.maximum(leaves[m], 1.0))
                     for t, m in zip(table, merge.members, strict=True)))


def noisy_patients(chains: list[ChainRun]) -> float:
    """The number of patients: each chain's noisy total (inverse-variance mean of its noisy
    1-way sums, aim's) over its scale, combined by inverse variance (post-processing)."""
    totals = np.array([c.run.state.total / c.scale for c in chains])
    sigmas = np.array([max(c.run.state.total_sigma / c.scale, 1e-9) for c in chains])
    precision = 1.0 / sigmas ** 2
    return float((totals * precision).sum() / precision.sum())


@dataclass
class _Drawn:
    """A generated table: each row's parent row (-1 for the root), and the leaf codes of the
    table's chain columns (its released columns and its children counts)."""

    parent_row: np.ndarray
    leaves: dict[str, np.ndarray]


def generate(schema: RelSchema, chains: list[ChainRun], patients: int,
             rng: np.random.Generator, max_condition_cells: int,
             row_weighted: bool = False) -> dict[str, pd.DataFrame]:
    """Patients, then every table's rows given their parents (and their parents' parents),
    each table from the model of the first chain that holds it; then fresh keys."""
    views = []
    for c in chains:
        merges = {c.run.space.names[m.column]: m for m in c.run.merges}
        sizes = {a.name: a.size for a in c.run.leaves}
        views.append(ModelView(c.model, merges, sizes, max_condition_cells, c.reduced))
    if row_weighted:  # a patient of k children weighed max(k, 1) there: drawn at 1 / max(k, 1)
        views[0] = replace(views[0], model=per_patient(views[0], schema))
    home = home_chains(schema, tuple(tuple(schema.table(n) for n in c.tables) for c in chains))
    drawn: dict[str, _Drawn] = {}
    for table in schema.tables:
        view = views[home[table.name]]
        lineage = (*schema.ancestors(table.name), table)
        own = [c for c, _ in chain_columns(schema, lineage) if c.table == table.name]
        if table.parent is None:
            rows, given = patients, {}
            parent_row = np.full(patients, -1, dtype=np.int64)
        else:
            counts = drawn[table.parent].leaves[f"{table.parent}.n_{table.name}"]
            parent_row = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
            rows = int(parent_row.size)
            given = _ancestor_codes(schema, table, drawn, parent_row, view)
        allowed = {}
        for column in own:
            if column.absent is not None:
                mask = np.ones(view.model.domain.sizes[column.name], dtype=bool)
                mask[view.model_codes_of_leaf(column.name, column.absent)] = False
                allowed[column.name] = mask
        codes = sample_given(view, given, [c.name for c in own], rows, rng, allowed)
        leaves = {c.name: view.to_leaves(c.name, codes[c.name], rng, c.absent) for c in own}
        drawn[table.name] = _Drawn(parent_row, leaves)
    return frames_of(schema, drawn, rng, chains)


def _ancestor_codes(schema: RelSchema, table: RelTable, drawn: dict[str, _Drawn],
                    parent_row: np.ndarray, view: ModelView) -> dict[str, np.ndarray]:
    """For each row to draw, the model codes of every column of its parent and of the
    parent's ancestors (the row's whole lineage is the conditioning evidence)."""
    out: dict[str, np.ndarray] = {}
    rows = parent_row
    name = table.parent
    while name is not None:
        ancestor = drawn[name]
        for column, leaves in ancestor.leaves.items():
            if column in view.model.domain.sizes:
                out[column] = view.to_model(column, leaves[rows])
        rows = ancestor.parent_row[rows]
        name = schema.table(name).parent
    return out


def frames_of(schema: RelSchema, drawn: dict[str, _Drawn], rng: np.random.Generator,
              chains: list[ChainRun]) -> dict[str, pd.DataFrame]:
    """One frame per table: fresh keys ``<table>-<n>`` numbered after a random shuffle (the
    numbers say nothing about how rows were drawn), the reference to the parent's fresh key,
    and the released columns as their leaf labels."""
    leaves_of: dict[str, Attribute] = {a.name: a for c in chains for a in c.run.leaves}
    frames: dict[str, pd.DataFrame] = {}
    new_key: dict[str, np.ndarray] = {}
    for table in schema.tables:
        d = drawn[table.name]
        n = d.parent_row.size
        number = rng.permutation(n)
        keys = np.array([f"{table.name}-{i + 1}" for i in number], dtype=object)
        new_key[table.name] = keys
        data: dict[str, object] = {}
        if table.key:
            data[table.key] = keys
        if table.parent is not None:
            data[table.parent_key or f"{table.parent}_key"] = new_key[table.parent][d.parent_row]
        for column in table.columns:
            name = f"{table.name}.{column.name}"
            labels = np.asarray(leaves_of[name].leaf_labels, dtype=object)
            data[column.name] = labels[d.leaves[name]]
        frame = pd.DataFrame(data).iloc[np.argsort(number)].reset_index(drop=True)
        released = frame[list(table.column_names)].to_numpy()
        if table.parent is not None and (released == ABSENT).any():
            raise AssertionError(f"{table.name}: the absent marker reached a released row")
        frames[table.name] = frame
    return frames
