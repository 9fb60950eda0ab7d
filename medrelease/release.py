"""The release driver: plan -> (by the mechanism's kind) score every lattice node -> select
privately -> materialize; or release from the rows; or synthesize.

Each stage is a plain function over small objects (``medrelease/plan.py``) so that the Prefect
flow can run the same stages as tasks (``tasks/``) and fan the scoring out over batches of
nodes; ``release()`` runs them in-process, optionally on a thread pool. The driver calls the
hooks of the mechanism contract (``medrelease/mechanisms/contract.py``) and nothing else.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from medrelease.data.aggregate import (
    CountTable,
    aggregate,
)
from medrelease.data.config import DatasetConfig
from medrelease.data.lattice import DEFAULT_BATCH_SIZE, Lattice, Node
from medrelease.data.taxonomy import SUPPRESSED
from medrelease.data.units import UnitBound, bound_frame
from medrelease.errors import ParameterError
from medrelease.evidence.metrics import ILParts, ReleasedCells, information_loss
from medrelease.mechanisms import (
    check_fits,
    default_mechanism,
    get_mechanism,
    uses_lattice,
)
from medrelease.mechanisms.base import (
    NodeSummary,
    ReleaseContext,
    ReleaseShape,
    declared_draws,
    summarize,
)
from medrelease.plan import (
    MaterializedRelease,
    PublicFacts,
    Release,
    ReleasePlan,
    ResolvedMechanism,
)
from medrelease.privacy.guarantee import BudgetStep, Guarantee, PrivacyAccountant
from medrelease.privacy.interval_table import FILE as INTERVALS
from medrelease.privacy.interval_table import with_intervals
from medrelease.privacy.ledger import MAX_CAP_DELTA, MAX_CAP_EPSILON
from medrelease.privacy.randomness import (
    RandomSource,
    exponential_mechanism,
    generator_for,
    selection_probabilities,
)
from medrelease.privacy.unit_cut import draw_unit_cut
from medrelease.stages import (
    PROBE_NODES,
    SCORING_TASK_SECONDS,
    Executor,
    Hooks,
    InProcess,
    ProgressHooks,
    after,
    packed,
    run_rounds,
)
from medrelease.stages import Progress as StageProgress
from medrelease.storage.released_rows import ReleasedRows

Progress = Callable[[int, int], None]


def resolve_mechanism(config: DatasetConfig, mechanism: str | None = None,
                      epsilon: float | None = None,
                      params: dict[str, Any] | None = None) -> ResolvedMechanism:
    """The one resolution used by the flow, the CLI, schedules and arrivals: what the request
    says, else the dataset config's ``mechanism``, else the registry's rule for the dataset
    (``default_mechanism``: ``aim`` with a declared informative domain, else ``ipa``).

    The config's parameters apply when the request names no mechanism or names the config's
    own; a request's ``epsilon`` and ``params`` override them key by key.
    """
    own = config.mechanism.name or default_mechanism(config)
    name = mechanism or own
    impl = get_mechanism(name)
    merged = dict(config.mechanism.params) if name == own else {}
    merged.update(params or {})
    if epsilon is not None:
        if "epsilon" not in impl.Params.model_fields:
            raise ParameterError(f"{name} takes no epsilon ({impl.capabilities.summary}); "
                                 "leave epsilon empty")
        merged["epsilon"] = epsilon
    return ResolvedMechanism(name, merged, "request" if mechanism else "dataset config")


def plan_release(
    mechanism: str, params: dict[str, Any] | None, n_nodes: int, seed: int | None = None,
    facts: PublicFacts | None = None, *, product_bounds: bool = True,
) -> ReleasePlan:
    """Validate parameters, state the guarantee and charge the steps to a fresh accountant.

    ``product_bounds=False`` lifts the bounds on a release's total (epsilon <= 100, delta <=
    0.01) for the statistical step audits only, which need a test-only delta large enough to
    measure (``medrelease/evidence/step_audit.py``); no flow or CLI path passes it.

    Raises ``ParameterError`` before anything random exists if a parameter is wrong.
    Mechanisms whose guarantee depends on a public fact (a declared informative domain, the
    number of numeric predictors, a declared bound on the rows) read it from ``facts``, never
    from user parameters and never from the data.
    """
    impl = get_mechanism(mechanism)
    raw = dict(params or {})
    for name, value in asdict(facts or PublicFacts()).items():  # (only fields Params declares)
        if name in impl.Params.model_fields:
            raw[name] = value
    parsed = impl.parse_params(raw)
    steps = impl.budget_steps(parsed)
    _check_budget_numbers(impl.name, steps, product_bounds)  # before any threshold exists
    guarantee = impl.guarantee(parsed)
    facts = facts or PublicFacts()
    calibrated = facts.unit_column is not None and "unit_rows" in impl.Params.model_fields
    if calibrated:  # every sensitivity, threshold and delta was derived for one unit
        guarantee = replace(guarantee, neighbouring=facts.unit_relation)
    else:  # the row note in the config's words (generic when it names none)
        guarantee = replace(guarantee, row_noun=facts.row_noun, unit_noun=facts.unit_noun)
    if facts.domain_from_data and guarantee.epsilon is not None:
        guarantee = replace(guarantee, label=guarantee.label + domain_from_data_caveat(
            facts.domain_from_data))
    if facts.taxonomies_from_data and guarantee.epsilon is not None:
        guarantee = replace(guarantee, label=guarantee.label + taxonomies_from_data_caveat(
            facts.taxonomies_from_data))
    if facts.bounds_from_data and guarantee.epsilon is not None:
        guarantee = replace(guarantee, label=guarantee.label + bounds_from_data_caveat(
            facts.bounds_from_data))
    _check_steps_make_the_guarantee(impl.name, steps, guarantee)
    accountant = PrivacyAccountant(guarantee.epsilon or 0.0, guarantee.delta or 0.0)
    # (syntactic models and pseudonymization spend nothing: no steps, no limit needed)
    for step in steps:
        accountant.spend(step)
    source = RandomSource(seed)
    seeds = source.spawn(n_nodes + 3)  # (the unit bound's stream is its own: unit_stream)
    return ReleasePlan(
        mechanism=impl.name,
        params=parsed,
        guarantee=guarantee,
        budget_steps=list(accountant.steps),
        random=source,
        node_seeds=seeds[:n_nodes],
        selection_seed=seeds[n_nodes],
        release_seed=seeds[n_nodes + 1],
        shuffle_seed=seeds[n_nodes + 2],
        unit=UnitBound(facts.unit_column, facts.unit_rows, source.unit_stream(),
                       facts.unit_noun or "unit", facts.row_noun or "row")
        if calibrated else None,
        kind=impl.capabilities.kind,
        selection_step=impl.selection_step,
        analyses=facts.analysis_columns,
    )


def domain_from_data_caveat(column: str) -> str:
    """What the guarantee adds while a domain read from the data is unreviewed: the list of
    values is the table's own, so which values occur is disclosed, whatever epsilon says."""
    return (f"; the set of values of {column!r} was taken from the data (its domain file, "
            "drafted by medrelease init, is not marked domain_reviewed), so which values occur "
            "is disclosed and not covered by this guarantee")


def taxonomies_from_data_caveat(columns: Sequence[str]) -> str:
    """What the guarantee adds while dimension taxonomies read from the data are unreviewed
    (one caveat naming them all): a value list is the table's own values, bands from its
    minimum to its maximum its own range, so which values occur is disclosed, whatever
    epsilon says."""
    quoted = [repr(c) for c in columns]
    names = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"
    one = len(quoted) == 1
    return (f"; the values of {names} were taken from the data ({'its' if one else 'their'} "
            f"taxonomy file{'' if one else 's'} or value list{'' if one else 's'}, drafted by "
            "medrelease init, "
            f"list{'s' if one else ''} the values found or span{'s' if one else ''} the "
            f"smallest to the largest found, and {'is' if one else 'are'} not marked "
            "domain_reviewed), so which "
            "values occur is disclosed and not covered by this guarantee")


def bounds_from_data_caveat(tables: Sequence[str]) -> str:
    """What the guarantee adds while a relational dataset's ``max_children`` are not marked
    reviewed: drafted from the data, a bound discloses how many rows its parents have."""
    return (f"; max_children of {', '.join(tables)} is not marked max_children_reviewed "
            "(medrelease init drafts it from the data, where it discloses how many rows the "
            "parents have), so that bound is not covered by this guarantee")


def lattice_size(config: DatasetConfig) -> int:
    """Lattice nodes: the product of each dimension's taxonomy levels (public: the config's)."""
    return math.prod(config.taxonomies[c].height + 1 for c in config.dimensions)


MIN_STEP_EPSILON = 2.0 ** -20   # below this a noise scale is beyond any sensible use
# A release can never spend more than a lifetime cap may hold: the product's bounds on a cap
# (``ledger set-cap``) bound every release's epsilon and delta too (delta = 0.5 promises nothing).
MAX_EPSILON = MAX_CAP_EPSILON
MAX_DELTA = MAX_CAP_DELTA


def _check_budget_numbers(mechanism: str, steps: list[BudgetStep],
                          product_bounds: bool = True) -> None:
    """Epsilons every sampler and threshold handles exactly and in bounded time, and a total
    (epsilon, delta) within the product's bounds on a lifetime cap; before anything is read."""
    total = math.fsum(s.epsilon for s in steps)
    if product_bounds and total > MAX_EPSILON:
        raise ParameterError(f"{mechanism}: epsilon {total:g} is above {MAX_EPSILON:g}, the "
                             "product's bound on a lifetime cap (where a privacy guarantee means "
                             "nothing); use a smaller epsilon. Nothing was read or spent.")
    delta = math.fsum(s.delta for s in steps)
    if product_bounds and not delta <= MAX_DELTA:
        raise ParameterError(f"{mechanism}: delta {delta:g} is above {MAX_DELTA:g}, the "
                             "product's bound on a lifetime cap (a larger delta protects no "
                             "one); use a smaller delta. Nothing was read or spent.")
    for step in steps:
        if 0 < step.epsilon < MIN_STEP_EPSILON:
            raise ParameterError(
                f"{mechanism}: budget step {step.step!r} gets epsilon {step.epsilon:g}, below "
                f"{MIN_STEP_EPSILON:g} (2^-20); raise epsilon or give this step a larger share")


def _check_steps_make_the_guarantee(mechanism: str, steps: list[BudgetStep],
                                    guarantee: Guarantee) -> None:
    """The total is computed in one place: the guarantee's (epsilon, delta) must be the sum of
    the declared steps (sequential composition), never a number stated beside them."""
    if not steps:
        return
    eps, delta = math.fsum(s.epsilon for s in steps), math.fsum(s.delta for s in steps)
    stated_eps, stated_delta = guarantee.epsilon or 0.0, guarantee.delta or 0.0
    if not (math.isclose(eps, stated_eps, rel_tol=1e-9, abs_tol=1e-12)
            and math.isclose(delta, stated_delta, rel_tol=1e-9, abs_tol=1e-15)):
        raise ParameterError(
            f"{mechanism}: its budget steps add up to (epsilon {eps:g}, delta {delta:g}) but its "
            f"guarantee states (epsilon {stated_eps:g}, delta {stated_delta:g}); a mechanism's "
            "guarantee must be the composition of its declared steps")


def candidate_nodes(context: ReleaseContext, plan: ReleasePlan) -> list[Node]:
    """The nodes a mechanism scores, in depth-first roll-up order."""
    wanted = get_mechanism(plan.mechanism).candidate_nodes(context, plan.params)
    if wanted is None:
        return context.lattice.dfs_order()
    chosen = set(wanted)
    return [n for n in context.lattice.dfs_order() if n in chosen]


def node_batches(context: ReleaseContext, batch_size: int,
                 plan: ReleasePlan | None = None) -> list[list[Node]]:
    """Candidate nodes cut into batches of at most ``batch_size`` that each roll up cheaply.

    A node whose source (``Lattice.source_of``) is in its batch is one step up from it; any
    other is rolled up from the finest cells, which costs about 30 step-ups at the lower nodes.
    So the roll-up tree is cut into few connected pieces (``_roll_up_pieces``), and the pieces
    are packed into batches in depth-first order: each piece costs one roll-up from the finest.
    """
    if batch_size < 1:
        raise ValueError(f"batch size must be at least 1, got {batch_size}")
    order = candidate_nodes(context, plan) if plan else context.lattice.dfs_order()
    batches: list[list[Node]] = []
    for piece in _roll_up_pieces(context.lattice, order, batch_size):
        if batches and len(batches[-1]) + len(piece) <= batch_size:
            batches[-1].extend(piece)
        else:
            batches.append(list(piece))
    return batches


def _roll_up_pieces(lattice: Lattice, order: list[Node], limit: int) -> list[list[Node]]:
    """Connected pieces of the roll-up tree over ``order`` of at most ``limit`` nodes, each in
    depth-first order: children are visited before their parent, and while a node's piece
    would be too large its largest child's piece is cut off and becomes a piece of its own."""
    members = set(order)
    children: dict[Node, list[Node]] = {node: [] for node in order}
    for node in order:
        source = lattice.source_of(node)
        if source in members:
            children[source].append(node)
    size: dict[Node, int] = {}
    is_root = {node: lattice.source_of(node) not in members for node in order}
    for node in reversed(order):
        kept = list(children[node])
        total = 1 + sum(size[c] for c in kept)
        while total > limit:
            largest = max(kept, key=size.__getitem__)
            kept.remove(largest)
            is_root[largest] = True
            total -= size[largest]
        size[node] = total
    piece_of: dict[Node, Node] = {}
    pieces: dict[Node, list[Node]] = {}
    for node in order:
        root = node if is_root[node] else piece_of[lattice.source_of(node)]
        piece_of[node] = root
        pieces.setdefault(root, []).append(node)
    return list(pieces.values())


def search_minimum_loss(context: ReleaseContext, plan: ReleasePlan) -> list[NodeSummary]:
    """Deterministic search (kanon): summaries of the nodes it evaluated."""
    _, summaries = get_mechanism(plan.mechanism).optimal_node(context, plan.params)
    return summaries


def score_nodes(
    context: ReleaseContext, plan: ReleasePlan, nodes: Sequence[Node]
) -> list[NodeSummary]:
    """Perturb and score a batch of nodes; returns summaries only."""
    impl = get_mechanism(plan.mechanism)
    lattice = context.lattice
    out = []
    for table in lattice.iter_tables(nodes):  # (each candidate through the plan's steps)
        index = lattice.index(table.node)
        # a plan made for scores only (no node seeds: the audits) suits a score without draws
        seed = plan.node_seeds[index] if index < len(plan.node_seeds) else None
        out.append(impl.score_node(context, table, index, seed, plan.params,
                                   plan.budget_steps))
    return out


def select_node(plan: ReleasePlan, summaries: Sequence[NodeSummary]) -> tuple[int, np.ndarray]:
    """Pick the node to release; returns its index and each candidate's selection probability.

    ``exponential``: exponential mechanism over the mechanism's score (``ipa``: U, sensitivity
    one weight unit, monotone; ``ipa-paper``: u = 3 - IL, sensitivity 3). ``minimum_loss``:
    the feasible candidate of least IL (not private: a syntactic model). ``fixed`` mechanisms
    are never scored (``fixed_index``): their one draw is the release.
    """
    ordered = sorted(summaries, key=lambda s: s.index)
    selection = get_mechanism(plan.mechanism).selection
    if selection != "exponential":
        feasible = [s for s in ordered if s.feasible]
        if not feasible:
            raise ParameterError(f"{plan.mechanism}: no candidate node is feasible")
        best = min(feasible, key=lambda s: (s.il, s.height, s.index))
        return best.index, np.array([1.0 if s is best else 0.0 for s in ordered])
    utility, sensitivity, monotone = selection_utility(plan, ordered)
    rng = generator_for(plan.selection_seed)
    chosen = exponential_mechanism(rng, utility, plan.selection_epsilon, sensitivity, monotone)
    probs = selection_probabilities(utility, plan.selection_epsilon, sensitivity, monotone)
    return ordered[chosen].index, probs


def selection_utility(plan: ReleasePlan, ordered: Sequence[NodeSummary]
                      ) -> tuple[np.ndarray, float, bool]:
    """(scores, sensitivity, monotone): the mechanism's own score, else the paper's 3 - IL
    (``MechanismBase.selection_utility``)."""
    return get_mechanism(plan.mechanism).selection_utility(list(ordered), plan.params)


def fixed_index(context: ReleaseContext, plan: ReleasePlan) -> int | None:
    """The node of a ``fixed``-selection mechanism (chosen from public facts), else None.

    Such a node is not perturbed for scoring: the one noisy draw is what is released, and its
    summary is computed from that same draw (two draws would be two releases for one price).
    """
    impl = get_mechanism(plan.mechanism)
    if impl.selection != "fixed":
        return None
    return context.lattice.index(impl.fixed_node(context, plan.params))


def materialize(context: ReleaseContext, plan: ReleasePlan, index: int) -> ReleasedCells:
    """The released cells of the chosen node (replayed or fresh, as the mechanism says)."""
    return draw_release(context, plan, index)[0]


def draw_release(context: ReleaseContext, plan: ReleasePlan, index: int
                 ) -> tuple[ReleasedCells, dict[str, str]]:
    """The released cells and, for mechanisms that draw through the plan's steps, what became
    of each declared step (the selection's was drawn by ``select_node`` with its epsilon)."""
    cells, drawn, _ = draw_release_steps(context, plan, index)
    return cells, drawn


def draw_release_steps(context: ReleaseContext, plan: ReleasePlan, index: int
                       ) -> tuple[ReleasedCells, dict[str, str], dict[str, Any] | None]:
    """``draw_release``, and the published count of the rows the privacy unit's bound removed
    (its own declared step, drawn here once; None without a unit)."""
    impl = get_mechanism(plan.mechanism)
    node = context.lattice.nodes[index]
    table = context.lattice.from_finest(node) if sum(node) else context.lattice.bottom()
    replay = impl.capabilities.replays_scored_candidate
    seed = plan.node_seeds[index] if replay else plan.release_seed
    if not impl.capabilities.draws_declared_steps:
        return impl.materialize(context, table, seed, plan.params), {}, None
    draws = declared_draws(impl, plan.budget_steps)
    cells = impl.materialize(context, table, seed, plan.params, draws)
    cut = draw_unit_cut(draws, plan.unit, context.counts.unit_bound)
    return cells, draws.close(), cut


def cells_to_rows(
    context: ReleaseContext, node: Node, cells: ReleasedCells, shuffle_seed: np.random.SeedSequence
) -> ReleasedRows:
    """Released cells as distinct rows: readable labels for dimensions, raw informative values.

    Classes may belong to different nodes (``cells.class_node``: ipa's ladder); each column's
    categories are the labels of every level used, then ``*``. Rows come out in a uniformly
    shuffled order (``medrelease.storage.released_rows``), so that their order says nothing about which
    rows are noise or which rung placed them; nothing here grows with the number of rows.
    """
    counts = cells.released_counts
    nonzero = np.flatnonzero(counts > 0)
    counts = counts[nonzero]
    cell_class = cells.class_of_cell[nonzero]
    nodes = cells.nodes or (tuple(node),)
    class_node = (cells.class_node if cells.class_node is not None
                  else np.where(cells.class_keys < 0, -1, 0))
    cell_node = class_node[cell_class]
    cell_keys = np.where(cell_node < 0, 0, cells.class_keys[cell_class])
    codes = context.lattice.class_codes_from_keys(cell_keys)
    columns: dict[str, Any] = {}
    for i, (name, taxonomy) in enumerate(
        zip(context.counts.dimensions, context.lattice.taxonomies, strict=True)
    ):
        labels, lookups = _level_categories(taxonomy, sorted({n[i] for n in nodes}))
        cell_codes = np.full(counts.size, labels.index(SUPPRESSED), dtype=np.int64)
        for rung, rung_node in enumerate(nodes):
            here = cell_node == rung
            cell_codes[here] = lookups[rung_node[i]][codes[here, i]]
        columns[name] = pd.Categorical.from_codes(cell_codes, categories=labels)
    cell_inf = cells.inf_codes[nonzero]
    for name in context.counts.informative.columns:
        columns[name] = context.counts.informative[name].to_numpy()[cell_inf]
    return ReleasedRows(pd.DataFrame(columns), counts.astype(np.int64), shuffle_seed)


def cells_to_table(
    context: ReleaseContext, node: Node, cells: ReleasedCells, shuffle_seed: np.random.SeedSequence
) -> pd.DataFrame:
    """Every released row in memory (tests and small releases)."""
    return cells_to_rows(context, node, cells, shuffle_seed).to_frame()


def _level_categories(taxonomy, levels: list[int]) -> tuple[list[str], dict[int, np.ndarray]]:
    """Labels of the given levels (finest first, each once) and ``*``; code -> category maps."""
    labels: list[str] = []
    position: dict[str, int] = {}
    lookups = {}
    for level in levels:
        mapped = []
        for label in taxonomy.level_labels[level]:
            if label not in position:
                position[label] = len(labels)
                labels.append(label)
            mapped.append(position[label])
        lookups[level] = np.asarray(mapped, dtype=np.int64)
    if SUPPRESSED not in position:
        labels.append(SUPPRESSED)
    return labels, lookups


def materialize_table(context: ReleaseContext, plan: ReleasePlan, index: int) -> MaterializedRelease:
    cells, steps_drawn, cut = draw_release_steps(context, plan, index)
    node = context.lattice.nodes[index]
    impl = get_mechanism(plan.mechanism)
    rows = cells_to_rows(context, node, cells, plan.shuffle_seed)
    nodes = cells.nodes or (node,)
    details: dict[str, Any] = {}
    dims = context.counts.dimensions
    if steps_drawn:  # which declared steps were drawn (depends on the chosen nodes only)
        details["budget_steps_drawn"] = steps_drawn
    if len(nodes) > 1:  # the rungs' nodes are outputs of private choices: public
        details["ladder"] = [dict(zip(dims, map(int, n), strict=True)) for n in nodes[1:]]
    reason = degenerate_reason(rows, dims, plan.guarantee)
    if reason:
        details["degenerate"] = reason
    if cut is not None:  # the unit bound's cut, a DP count of its own step
        details["unit_cut"] = cut
    declared = INTERVALS in impl.capabilities.published_tables  # (a subclass may not)
    error_bars, tables = with_intervals(
        impl.error_bars(plan.params, context, node),
        impl.interval_table(plan.params, context, cells, rows, plan.analyses)
        if declared else None,
        plan.unit.scope() if plan.unit is not None else None)
    return MaterializedRelease(
        index=index,
        node=node,
        rows=rows,
        il=information_loss(cells),
        row_bounds=impl.row_bounds(plan.params, ReleaseShape(cells=cells)),
        details=details,
        summary=summarize(index, node, cells),
        nodes=tuple(nodes),
        error_bars=error_bars,
        tables=tables,
    )


def degenerate_reason(rows: ReleasedRows, dimensions: Sequence[str],
                      guarantee: Guarantee) -> str | None:
    """Why a release carries (almost) nothing, and what would help; None if it does not.

    Degenerate: no rows, or every released row is (*, ..., *) — one all-'*' class, no
    dimension below '*'. Computed from the released rows and public parameters only.
    """
    if not len(dimensions):
        return None
    released = len(rows)
    if released:
        labels = rows.cells.loc[rows.counts > 0, list(dimensions)]
        if any(bool((labels[c].astype(str) != SUPPRESSED).any()) for c in dimensions):
            return None
    what = "no rows were released" if not released else (
        f"all {released:,} released rows are (*, ..., *): no dimension is below '*'")
    return (f"DEGENERATE RELEASE: {what}. Too few rows per (class, value) cell for this epsilon "
            f"and delta ({guarantee.notes}). What would help: a larger epsilon, more rows (a "
            "longer period or more sites), coarser taxonomies, or fewer dimensions.")


def candidates_frame(
    context: ReleaseContext, summaries: Sequence[NodeSummary], probabilities: np.ndarray
) -> pd.DataFrame:
    """Per-node IL parts with the node's levels and its selection probability."""
    ordered = sorted(summaries, key=lambda s: s.index)
    frame = pd.DataFrame([s.as_dict() for s in ordered])
    levels = pd.DataFrame(
        [s.node for s in ordered], columns=[f"level_{d}" for d in context.counts.dimensions]
    )
    frame = pd.concat([frame.drop(columns=["node"]), levels], axis=1)
    frame["selection_probability"] = probabilities
    return frame


def release_from_counts(
    counts: CountTable,
    mechanism: str,
    params: dict[str, Any] | None = None,
    seed: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    workers: int = 1,
    progress: Progress | None = None,
    facts: PublicFacts | None = None,
) -> Release:
    """Run every stage of a lattice mechanism on an aggregated table (see ``release``)."""
    context = ReleaseContext.from_counts(counts)
    facts = facts or PublicFacts(public_domain=counts.public_domain)
    plan = plan_release(mechanism, params, len(context.lattice), seed, facts)
    return release_lattice(context, plan, batch_size, workers, progress)


def release_lattice(context: ReleaseContext, plan: ReleasePlan,
                    batch_size: int = DEFAULT_BATCH_SIZE, workers: int = 1,
                    progress: Progress | None = None) -> Release:
    """Kind ``lattice``: score the candidates (unless the node is fixed), select, materialize."""
    chosen, candidates = choose_on_lattice(context, plan, InProcess(workers),
                                           ProgressHooks(progress), batch_size)
    dimensions = context.counts.dimensions
    return finished_release(plan, chosen, context.counts.n_rows,
                            node=dict(zip(dimensions, chosen.node, strict=True)),
                            candidates=candidates)


@dataclass
class Inputs:
    """What the read stage hands the choice: the extract counted (kinds ``lattice`` and
    ``synthetic``) or its rows (kind ``rows``), with what the privacy unit's bound cut
    (``unit_bound``, for the cut's own noisy count) and the read's facts (``info``: steward
    side, never published)."""

    counts: CountTable | None = None
    frame: pd.DataFrame | None = None
    unit_bound: Any = None
    info: Any = None
    tables: dict[str, pd.DataFrame] | None = None  # kind ``relational``: the validated tables

    @cached_property
    def context(self) -> ReleaseContext | None:
        return ReleaseContext.from_counts(self.counts) if self.counts is not None else None

    @property
    def rows(self) -> int:
        if self.tables is not None:
            return sum(len(t) for t in self.tables.values())
        return self.counts.n_rows if self.counts is not None else len(self.frame)


def choose(inputs: Inputs, config: DatasetConfig, plan: ReleasePlan, pieces: Executor,
           hooks: Hooks | None = None, batch_size: int = DEFAULT_BATCH_SIZE,
           key: bytes | None = None) -> tuple[MaterializedRelease, pd.DataFrame]:
    """The release's choice and draw, by the mechanism's declared kind, with the steward's
    candidate table (empty outside the lattice): the one stage driver. Its loops and steps
    run through ``pieces`` (in this process for the driver, tests and benchmarks; as Prefect
    tasks for the flow), what the caller shows through ``hooks``. ``key``: the
    pseudonymization key when the caller holds it (the flow's task reads its own)."""
    hooks = hooks or Hooks()
    if plan.kind == "relational":
        with hooks.step(f"{plan.mechanism}: the models and the synthetic tables",
                        "one model per child table, then patients and their rows"):
            chosen = pieces.call(release_tables, frames=inputs.tables, config=config, plan=plan)
        return chosen, pd.DataFrame()
    if plan.kind == "rows":
        held = {"key": key} if key is not None else {}  # (the flow's task reads its own)
        with hooks.step(f"{plan.mechanism}: releasing from the rows"):
            chosen = pieces.call(release_without_lattice, table=inputs.frame, config=config,
                                 plan=plan, unit_bound=inputs.unit_bound, **held)
        return chosen, pd.DataFrame()
    if plan.kind == "synthetic":
        return synthesize(inputs.counts, config, plan, pieces, hooks), pd.DataFrame()
    return choose_on_lattice(inputs.context, plan, pieces, hooks, batch_size)


def choose_on_lattice(context: ReleaseContext, plan: ReleasePlan, pieces: Executor,
                      hooks: Hooks, batch_size: int = DEFAULT_BATCH_SIZE
                      ) -> tuple[MaterializedRelease, pd.DataFrame]:
    """Kind ``lattice``: score every candidate (fanned out), select privately, draw the
    chosen node's release. A fixed-node mechanism (histogram) is not scored: its one noisy
    draw is the release, and the candidate summary is computed from that very draw."""
    index = fixed_index(context, plan)
    if index is not None:
        chosen = pieces.call(materialize_table, context=context, plan=plan, index=index)
        return chosen, candidates_frame(context, [chosen.summary], np.array([1.0]))
    summaries = score_lattice(context, plan, pieces, batch_size,
                              hooks.scoring(len(context.lattice)), hooks.log)
    hooks.scored(summaries, get_mechanism(plan.mechanism).selection == "minimum_loss")
    index, probabilities = pieces.call(select_node, plan=plan, summaries=summaries)
    hooks.materializing(len(context.lattice))
    chosen = pieces.call(materialize_table, context=context, plan=plan, index=index)
    return chosen, candidates_frame(context, summaries, probabilities)


def release_tables(frames: dict[str, pd.DataFrame], config: DatasetConfig, plan: ReleasePlan
                   ) -> MaterializedRelease:
    """Kind ``relational``: every table released in one step (the mechanism's
    ``release_tables``)."""
    return get_mechanism(plan.mechanism).release_tables(frames, config, plan)


def start_rounds(counts: CountTable, config: DatasetConfig | None, plan: ReleasePlan
                 ) -> Any:
    """Kind ``synthetic``'s round 0 (the mechanism's ``start_rounds``)."""
    return get_mechanism(plan.mechanism).start_rounds(counts, config, plan)


def sample_rows(run: Any, counts: CountTable, plan: ReleasePlan) -> MaterializedRelease:
    """Kind ``synthetic``'s rows from the fitted model (the mechanism's ``sample``)."""
    return get_mechanism(plan.mechanism).sample(run, counts, plan)


def synthesize(counts: CountTable, config: DatasetConfig | None, plan: ReleasePlan,
               pieces: Executor, hooks: Hooks) -> MaterializedRelease:
    """Kind ``synthetic``: round 0, the rounds until the budget is spent (each round's
    scoring fanned out: ``run_rounds``), then the sampled rows."""
    columns = len(counts.dimensions) + len(counts.informative.columns)
    with hooks.step(f"{plan.mechanism}: round 0", f"one-way marginals of {columns} columns "
                    "and the candidates' true marginals"):
        run = pieces.call(start_rounds, counts=counts, config=config, plan=plan)
    hooks.rounds_started(run)
    run_rounds(run, pieces, lambda record: hooks.round_done(run, record))
    with hooks.step(f"{plan.mechanism}: sampling rows", "from the fitted model, then the "
                    "error bars"):
        chosen = pieces.call(sample_rows, run=run, counts=counts, plan=plan)
    hooks.rounds_finished(run, chosen)
    return chosen


def finished_release(plan: ReleasePlan, chosen: MaterializedRelease, input_rows: int,
                     node: dict[str, int] | None = None,
                     candidates: pd.DataFrame | None = None) -> Release:
    """The one place a ``Release`` is built, for every kind: the plan's guarantee, steps and
    seed policy with the chosen output (no node and no candidates outside the lattice)."""
    return Release(
        table=chosen.table,
        mechanism=plan.mechanism,
        params=plan.params.model_dump(),
        node=node or {},
        node_index=chosen.index,
        candidates=candidates if candidates is not None else pd.DataFrame(),
        guarantee=plan.guarantee,
        budget_steps=plan.budget_steps,
        seed_policy=plan.random.seed_policy,
        for_publication=plan.random.for_publication,
        input_rows=input_rows,
        released_il=chosen.il or ILParts(float("nan"), float("nan"), float("nan")),
        details=chosen.details,
    )


def score_node_piece(nodes: list[Node], context: ReleaseContext, plan: ReleasePlan
                     ) -> list[NodeSummary]:
    """One piece of the scoring: a batch of nodes perturbed and scored (summaries only)."""
    return score_nodes(context, plan, nodes)


def search_piece(context: ReleaseContext, plan: ReleasePlan) -> list[NodeSummary]:
    """``minimum_loss`` mechanisms (``kanon``): the deterministic search, one step."""
    return search_minimum_loss(context, plan)


def score_lattice(context: ReleaseContext, plan: ReleasePlan, pieces: Executor,
                  batch_size: int, progress: StageProgress | None = None,
                  log: Callable[[str], None] | None = None) -> list[NodeSummary]:
    """Every candidate's summary. A first wave (a piece of ``PROBE_NODES`` per worker, or of a
    quarter of a small lattice on two workers) measures the rate; the rest goes in pieces of
    about ``SCORING_TASK_SECONDS`` at that rate, at least one per worker:
    a Prefect task costs ~0.15 s of bookkeeping on two busy cores, and 288 tasks of 64 nodes
    made an 8,000-row cohort's 18,432 nodes take 53 s where 16 took 4 s (issue 55). The
    pieces keep the batches' roll-up pieces, so the summaries are the batches' own."""
    if get_mechanism(plan.mechanism).selection == "minimum_loss":
        if progress:
            progress(0, 0, f"{len(context.lattice):,} nodes")
        return pieces.call(search_piece, context=context, plan=plan)
    batches = node_batches(context, batch_size, plan)
    total = sum(len(b) for b in batches)
    summaries: list[NodeSummary] = []

    def scored(wave: list[list[Node]]) -> None:
        for result in pieces.map(score_node_piece, wave, context=context, plan=plan):
            summaries.extend(result)
            if progress:
                progress(len(summaries), total, None)

    if progress:
        progress(0, total, None)
    workers = max(1, pieces.workers)
    # a first-wave piece is at most a quarter of a two-worker lattice: a small lattice of dear
    # nodes (256 nodes of 1.2 million rows, 19 ms each) went as one piece to one worker
    probe = packed(batches, min(PROBE_NODES, -(-total // (2 * workers))))[:workers]
    started = time.perf_counter()
    scored(probe)
    took = time.perf_counter() - started
    per_node = took * min(workers, len(probe)) / max(1, len(summaries))
    left = total - len(summaries)
    if left:
        if log:
            log(f"scoring {total:,} lattice nodes: the first {len(summaries):,} took "
                f"{took:.1f} s, so about {per_node * left / workers:.0f} s for the other "
                f"{left:,} on {workers} worker(s)")
        if progress:
            progress(len(summaries), total, f"about {per_node * left / workers:.0f} s for the "
                     f"other {left:,} at the rate of the first")
        per_piece = int(SCORING_TASK_SECONDS / per_node) if per_node > 0 else left
        per_piece = min(per_piece, -(-left // workers))  # every worker gets a piece
        scored(packed(after(batches, sum(len(p) for p in probe)), max(batch_size, per_piece)))
    return summaries


def release_without_lattice(
    table: pd.DataFrame, config: DatasetConfig, plan: ReleasePlan, key: bytes | None = None,
    unit_bound: Any = None,
) -> MaterializedRelease:
    """Kind ``rows``: mechanisms that release from the rows in one pass (Mondrian on counts,
    DiffGen, pseudonymization), through their ``release_rows``. ``unit_bound``: what the
    privacy unit's bound cut (its report, or the input facts' dict), for the unit cut's step."""
    impl = get_mechanism(plan.mechanism)
    rng = generator_for(plan.release_seed)
    draws = (declared_draws(impl, plan.budget_steps)
             if impl.capabilities.draws_declared_steps else None)
    # the unit cut's own step first: the mechanism closes the plan's steps when it is done
    cut = draw_unit_cut(draws, plan.unit, unit_bound) if draws is not None else None
    out = impl.release_rows(table, config, plan.params, rng, draws, key)
    details = dict(out.details)
    if cut is not None:
        details["unit_cut"] = cut
    if draws is not None and "budget_steps_drawn" not in details:
        details["budget_steps_drawn"] = draws.close()
    error_bars, tables = with_intervals(
        impl.error_bars(plan.params),
        out.intervals if INTERVALS in impl.capabilities.published_tables else None,
        plan.unit.scope() if plan.unit is not None else None)
    return MaterializedRelease(index=-1, node=(), rows=ReleasedRows.from_frame(out.table),
                               il=out.il, row_bounds=impl.row_bounds(plan.params, out.shape),
                               details=details, error_bars=error_bars, tables=tables)


def release(
    table: pd.DataFrame,
    config: DatasetConfig,
    mechanism: str | None = None,
    params: dict[str, Any] | None = None,
    seed: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    workers: int = 1,
    progress: Progress | None = None,
    key: bytes | None = None,
) -> Release:
    """Release ``table`` under ``config`` (mechanism default: the config's, else the registry's
    rule for the dataset, ``default_mechanism``).

    Parameters not given come from the config's ``mechanism.params`` when the mechanism is the
    config's default. A ``seed`` makes the run reproducible and marks it not for publication.
    One plan, made before the table is touched (bad parameters never cost a pass); then the
    mechanism's declared kind decides the path.
    """
    resolved = resolve_mechanism(config, mechanism, None, params)
    check_fits(config, resolved.name)
    nodes = lattice_size(config) if uses_lattice(resolved.name) else 0
    plan = plan_release(resolved.name, resolved.params, nodes, seed, PublicFacts.of(config))
    bound = None
    if plan.unit is not None:  # the privacy unit's bound runs before anything else
        table, bound = bound_frame(table, plan.unit)
    if plan.kind == "relational":  # ``table``: the tables by name (each table's own bound)
        inputs = Inputs(tables=dict(table))  # type: ignore[arg-type]
    elif plan.kind == "rows":
        inputs = Inputs(frame=table, unit_bound=bound)
    else:
        inputs = Inputs(counts=replace(aggregate(table, config), unit_bound=bound))
    chosen, candidates = choose(inputs, config, plan, InProcess(workers),
                                ProgressHooks(progress), batch_size, key)
    node = (dict(zip(inputs.counts.dimensions, chosen.node, strict=True))
            if plan.kind == "lattice" else None)
    return finished_release(plan, chosen, inputs.rows, node=node, candidates=candidates)
