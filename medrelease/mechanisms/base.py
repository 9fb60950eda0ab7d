"""The pieces every mechanism shares: ``MechanismBase`` (the default of every optional hook),
``Capabilities``, ``ReleaseContext``, ``NodeSummary``, ``ReleaseShape`` and small helpers.

The contract itself — which hooks each kind of mechanism (lattice, rows, synthetic) provides —
is in ``medrelease/mechanisms/contract.py``; the release driver calls those hooks and nothing
else (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, ClassVar

import numpy as np
import pandas as pd
from pydantic import ValidationError

from medrelease.data.aggregate import CountTable
from medrelease.data.config import DatasetConfig
from medrelease.data.lattice import Lattice, Node, NodeTable
from medrelease.errors import ParameterError
from medrelease.evidence.metrics import ILParts, ReleasedCells, class_ncp, information_loss
from medrelease.plan import MechanismParams, NodeSummary  # (defined below mechanisms)
from medrelease.privacy.guarantee import BudgetStep, StepDraws
from medrelease.storage.released_rows import ReleasedRows

SHARE_TOLERANCE = 1e-9


Selection = str  # "exponential" (private choice), "minimum_loss" (kanon), "fixed" (histogram)
# The kinds of mechanism (``Capabilities.kind``), each with its protocol in contract.py:
# "lattice" scores the generalization lattice's nodes and releases one (ipa, kanon, ...),
# "rows" releases from the rows in one pass (mondrian, pseudonymize, diffgen), and
# "synthetic" fits a model to noisy marginals and samples rows from it (aim).
KINDS = ("lattice", "rows", "synthetic", "relational")


@dataclass(frozen=True)
class Capabilities:
    """What a mechanism takes and gives, declared once in its own file.

    The form, the CLI, the release driver, the evaluation and the audits read these instead of
    testing mechanism names, so a new mechanism is one file plus one line in the registry.
    """

    summary: str  # the guarantee in a few words, shown in the form's mechanism dropdown
    gives: str = ""  # what a researcher gets, in one line (the form's and the README's)
    kind: str = "lattice"  # one of KINDS: which protocol of contract.py the mechanism follows
    set_valued_input: bool = False  # can release set-valued columns (DiffGen)
    needs_class_domain: bool = False  # one class column with declared public values
    output_roles: tuple[str, ...] = ("dimension", "informative")
    replays_scored_candidate: bool = False  # release = the perturbation that was scored
    needs_secret: bool = False  # reads a key (kept out of every log and record)
    audit_designs: tuple[str, ...] = ("unique", "tipping", "common")
    audit_public_domain: bool = False  # the audit gives its informative column a public domain
    # materialize(..., draws) takes each declared budget step from the plan (StepDraws) and
    # draws with that step's numbers; the selection's step is named by ``selection_step``.
    draws_declared_steps: bool = False
    # The accuracy evidence (evidence/accuracy.py): why rows of an informative value may be
    # missing from the release, in the steward's words (mechanisms that pool or suppress), and
    # whether released values can be compared with the input's at all (not for pseudonyms).
    loss_reason: str = ""
    raw_values: bool = True
    # Tables published beside the data (each on publication.PUBLISHED_TABLES), e.g. aim's
    # noisy measurements: ``MaterializedRelease.tables`` holds them by file name.
    published_tables: tuple[str, ...] = ()


@dataclass
class ReleaseContext:
    """The aggregated input and its lattice: everything a node perturbation reads.

    The lattice is built when first asked for: ``aim`` never walks it, and the nodes of a wide
    table's lattice (twenty columns: billions) would not fit in memory, nor would a wide
    table's cells fit the packed keys the lattice rolls up."""

    counts: CountTable
    built_lattice: Lattice | None = dataclass_field(default=None, repr=False)

    @classmethod
    def from_counts(cls, counts: CountTable) -> ReleaseContext:
        return cls(counts=counts)

    @property
    def lattice(self) -> Lattice:
        if self.built_lattice is None:
            self.built_lattice = Lattice(self.counts)
        return self.built_lattice

    @property
    def n_inf(self) -> int:
        return self.counts.n_inf

    def class_ncp(self, table: NodeTable, class_keys: np.ndarray) -> np.ndarray:
        return self.lattice_ncp(table.node, class_keys)

    def lattice_ncp(self, node: Node, class_keys: np.ndarray) -> np.ndarray:
        """Mean NCP of each class of ``node`` (from its labels and the taxonomies only)."""
        codes = self.lattice.class_codes_from_keys(class_keys)
        return class_ncp(self.lattice.taxonomies, node, codes)


@dataclass(frozen=True)
class ReleaseShape:
    """The one argument of every ``row_bounds``: the public-or-steward-side figures a release's
    plausible row range is computed from. Each kind fills what it has: a lattice mechanism the
    chosen node's ``cells``; a rows mechanism the ``rows`` it read (and ``noise_cells``, the
    cells its noise went into); a synthetic one the ``noisy_total`` it sampled to and that
    total's ``total_sigma`` (DP outputs, never the input's row count)."""

    cells: ReleasedCells | None = None
    rows: int = 0
    noise_cells: int = 0
    noisy_total: float = 0.0
    total_sigma: float = 0.0


@dataclass
class RowsOutput:
    """What a rows mechanism's ``release_rows`` returns: the released table, what its
    ``row_bounds`` reads, its information loss where it has one, and its own public summary."""

    table: pd.DataFrame
    shape: ReleaseShape
    il: ILParts | None = None
    details: dict[str, Any] = dataclass_field(default_factory=dict)
    # ``intervals.csv`` (a ``privacy.interval_table.IntervalTable``), for a mechanism that
    # declares it in ``published_tables``
    intervals: Any = None


class MechanismBase:
    """Every mechanism inherits this: the default of each optional hook of the contract
    (``contract.py``), so the driver calls every hook without asking whether it exists.

    What a mechanism must still declare itself: ``name``, ``Params``, ``capabilities``,
    ``selection``, ``guarantee``, ``row_bounds``, and its kind's release hooks
    (lattice: ``perturb_node`` or ``score_node``, and ``materialize``; rows: ``release_rows``;
    synthetic: ``start_rounds`` and ``sample``)."""

    name: ClassVar[str]
    Params: ClassVar[type[MechanismParams]]
    capabilities: ClassVar[Capabilities]
    selection: ClassVar[Selection] = "none"
    # The budget step the driver's node choice draws (exponential selection); None: no step
    # (the selection is not private, or there is none).
    selection_step: ClassVar[str | None] = None

    # -- every kind ------------------------------------------------------------------------

    def parse_params(self, raw: dict[str, Any]) -> MechanismParams:
        return parse(self.Params, raw, self.name)

    def budget_steps(self, params: MechanismParams) -> list[BudgetStep]:
        return []

    def check_work(self, config: DatasetConfig, params: MechanismParams) -> None:
        """Refuse work beyond the policy's limits from public facts only, before anything is
        read or spent (the flow's plan step). Mechanisms whose work the policy's other limits
        already bound refuse nothing here."""

    def expected_noise_rows(self, context: ReleaseContext, params: MechanismParams) -> float:
        """Rows the noise is expected to add beyond the input's, from public facts only (the
        taxonomies, the declared domain, the parameters); checked against the policy's
        ``max_noise_rows`` before any spend. Mechanisms that release no empty cell add none."""
        return 0.0

    def error_bars(self, params: MechanismParams, context: ReleaseContext | None = None,
                   node: Node | None = None) -> dict[str, Any]:
        """The published error bars (public parameters and the node's public domain only);
        none by default."""
        return {}

    def interval_table(self, params: MechanismParams, context: ReleaseContext,
                       cells: ReleasedCells, rows: ReleasedRows,
                       analyses: tuple[tuple[str, ...], ...] = ()) -> Any:
        """``intervals.csv`` of a lattice release (a ``privacy.interval_table.IntervalTable``)
        from the released cells and public parameters; None for a mechanism that states no
        intervals (it then declares no ``intervals.csv`` in ``published_tables``)."""
        return None

    # -- lattice kind ----------------------------------------------------------------------

    def candidate_nodes(self, context: ReleaseContext, params: MechanismParams
                        ) -> list[Node] | None:
        """The nodes to score (None: every node of the lattice)."""
        return None

    def score_node(self, context: ReleaseContext, table: NodeTable, index: int,
                   seed: np.random.SeedSequence | None, params: MechanismParams,
                   steps: list[BudgetStep]) -> NodeSummary:
        """One candidate's summary. Default: perturb it as a release would (its own seed; the
        plan's declared ``steps``, one set per candidate, where the mechanism draws through
        them) and summarize; a mechanism whose score needs no draw overrides this."""
        if seed is None:
            raise ValueError(f"{self.name} perturbs candidates to score them: the plan has no "
                             f"seed for candidate {index} (plan it with the lattice's size)")
        if self.capabilities.draws_declared_steps:
            draws = declared_draws(self, steps)
            cells = self.perturb_node(context, table, seed, params, draws)
            draws.close()
        else:
            cells = self.perturb_node(context, table, seed, params)
        return summarize(index, table.node, cells)

    def perturb_node(self, context: ReleaseContext, table: NodeTable,
                     seed: np.random.SeedSequence, params: MechanismParams,
                     draws: StepDraws | None = None) -> ReleasedCells:
        raise NotImplementedError(f"{self.name} scores candidates without perturbing them "
                                  "(score_node) and has no perturb_node")

    def selection_utility(self, summaries: list[NodeSummary], params: MechanismParams
                          ) -> tuple[np.ndarray, float, bool]:
        """(scores, sensitivity, monotone) for the exponential selection: the IPA paper's
        u = 3 - IL (sensitivity 3, two-sided) unless the mechanism scores its own way."""
        return (np.array([3.0 - s.il for s in summaries]), SELECTION_SENSITIVITY, False)

    def fixed_node(self, context: ReleaseContext, params: MechanismParams) -> Node:
        """The node of a ``fixed`` selection, chosen from public facts."""
        raise NotImplementedError(f"{self.name} declares selection {self.selection!r}, "
                                  "not 'fixed'; it has no fixed_node")

    def optimal_node(self, context: ReleaseContext, params: MechanismParams
                     ) -> tuple[Node, list[NodeSummary]]:
        """The ``minimum_loss`` search: its node and the summaries of the nodes it evaluated."""
        raise NotImplementedError(f"{self.name} declares selection {self.selection!r}, "
                                  "not 'minimum_loss'; it has no optimal_node")


SELECTION_SENSITIVITY = 3.0  # the paper's utility 3 - IL moves by at most 3 (NCP, EMD, rate)


def expected_rows_above(epsilon: float, threshold: int = 1) -> float:
    """E[Z 1{Z >= t}] for Z ~ discrete Laplace(1/eps), t >= 1: the rows an empty cell adds on
    average when every cell with a noisy count >= t is released (t = 1: its positive part).

    P(Z = k) = c a^|k| with a = exp(-eps), c = (1 - a) / (1 + a), so the sum over k >= t is
    c a^t (t / (1 - a) + a / (1 - a)^2).
    """
    a = math.exp(-epsilon)
    one_minus = -math.expm1(-epsilon)
    t = max(1, int(threshold))
    return (one_minus / (1 + a)) * a ** t * (t / one_minus + a / one_minus ** 2)


def summarize(index: int, node: Node, cells: ReleasedCells, feasible: bool = True) -> NodeSummary:
    released = cells.class_released()
    parts = information_loss(cells, released)
    sup = cells.suppressed_class
    return NodeSummary(
        index=index,
        node=tuple(int(x) for x in node),
        height=int(sum(node)),
        ncp=parts.ncp,
        emd=parts.emd,
        rate=parts.rate,
        il=parts.il,
        classes=int((released > 0).sum()),
        suppressed_classes=int(sup.sum()),
        suppressed_rows=int(released[sup].sum()),
        noise_rows=int(cells.class_noise.sum()),
        released_rows=int(released.sum()),
        feasible=feasible,
    )


def parse(params_model: type[MechanismParams], raw: dict[str, Any], mechanism: str):
    """Validate raw parameters into the mechanism's model with a readable error."""
    try:
        return params_model(**raw)
    except ValidationError as exc:
        unknown = [".".join(str(p) for p in e["loc"]) for e in exc.errors()
                   if e["type"] == "extra_forbidden"]
        if unknown:  # the steward's most likely slip: one sentence that says what is allowed
            takes = ", ".join(params_model.model_json_schema().get("properties", {}))
            raise ParameterError(f"{mechanism} does not take {', '.join(unknown)}; it takes: "
                                 f"{takes}") from None
        lines = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "parameters"
            lines.append(f"  {where}: {err['msg']} (got {err.get('input')!r})")
        raise ParameterError(f"invalid parameters for {mechanism!r}:\n" + "\n".join(lines)) from None


def split_budget(
    mechanism: str, epsilon: float, given: dict[str, float | None], defaults: dict[str, float]
) -> dict[str, float]:
    """Absolute epsilon per step: given values must add up to ``epsilon``; none given = default shares.

    Giving only some shares is ambiguous, so it is refused with the sum that was found.
    """
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise ParameterError(f"{mechanism}: epsilon must be a positive finite number, got {epsilon}")
    provided = {k: v for k, v in given.items() if v is not None}
    if not provided:
        return {k: share * epsilon for k, share in defaults.items()}
    missing = [k for k in given if given[k] is None]
    if missing:
        raise ParameterError(
            f"{mechanism}: give all of {', '.join(given)} or none (missing: {', '.join(missing)})"
        )
    for key, value in provided.items():
        if not (math.isfinite(value) and value > 0):
            raise ParameterError(f"{mechanism}: {key} must be positive and finite, got {value}")
    total = math.fsum(provided.values())
    if abs(total - epsilon) > SHARE_TOLERANCE * max(1.0, epsilon):
        parts = " + ".join(f"{k}={v:g}" for k, v in provided.items())
        raise ParameterError(
            f"{mechanism}: the budget shares must add up to epsilon={epsilon:g}, but "
            f"{parts} = {total:g}"
        )
    return dict(provided)


NOISE_TAIL = 1e-12


def declared_draws(mechanism: MechanismBase, steps: list[BudgetStep]) -> StepDraws:
    """The plan's steps as the mechanism's release draw sees them: the node choice's step
    (``selection_step``, drawn by the driver's selection) already taken."""
    draws = StepDraws(steps, mechanism.name)
    if mechanism.selection_step is not None:
        draws.take(mechanism.selection_step)
    return draws


def noise_bound(epsilon: float) -> int:
    """k with P(Z >= k) < 1e-12 for discrete Laplace(1/eps): a per-cell bound on added rows."""
    return math.ceil(math.log(1.0 / NOISE_TAIL) / epsilon)


def in_class_draws(
    rng: np.random.Generator,
    class_of_cell: np.ndarray,
    cell_weights: np.ndarray,
    draws_per_class: np.ndarray,
) -> np.ndarray:
    """For each class, draw ``draws_per_class`` cells of that class with prob. ∝ weight.

    Vectorized inverse-CDF over one global cumulative sum; returns the count drawn per cell.
    """
    n_cells = class_of_cell.size
    total = int(draws_per_class.sum())
    if total == 0:
        return np.zeros(n_cells, dtype=np.int64)
    n_classes = draws_per_class.size
    starts = np.searchsorted(class_of_cell, np.arange(n_classes), side="left")
    ends = np.searchsorted(class_of_cell, np.arange(n_classes), side="right")
    cumulative = np.cumsum(cell_weights)
    before = np.concatenate(([0.0], cumulative))[starts]
    class_weight = np.concatenate(([0.0], cumulative))[ends] - before
    which = np.repeat(np.arange(n_classes), draws_per_class)
    target = before[which] + rng.random(total) * class_weight[which]
    picked = np.searchsorted(cumulative, target, side="right")
    picked = np.clip(picked, starts[which], ends[which] - 1)
    return np.bincount(picked, minlength=n_cells).astype(np.int64)
