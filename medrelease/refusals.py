"""Every rule that refuses a release before its charge, declared by stage in one place.

A release meets its refusals in stages, each before anything its stage would cost:

=========  ==========================================  ========================================
stage      when (what the rules may read)               rules
=========  ==========================================  ========================================
request    the mechanism named, before a plan exists     the mechanism fits the dataset
(plan)     ``plan_release``: the mechanism's own         ``parse_params`` and the budget numbers
           parameters and its guarantee                  (the mechanism's file, ``release.py``)
plan       the plan: public facts only                   policy, lattice size, joint domain, work
ledger     the plan and the ledger's figures, before a   source policy, first cap, void
           byte of the input is read                     confirmation, budget left
count      the extract counted (or read), before the     fixed node, noise rows, key
           charge: public facts about the count only
stores     the folders and the ledger's integrity        the stores' probe
(charge)   atomically, inside the ledger's transaction   overspend, content claims, the lock
(output)   the released rows, before publication         ``schemas/output.py``'s suite
=========  ==========================================  ========================================

A rule is a function from ``Facts`` to one sentence (refused with the rule's error type) or
nothing; a rule that asks a mechanism's own hook (``check_fits``, ``check_work``,
``fixed_node``) or the ledger returns the error that hook raised, in its own type. The flow runs
each stage's rules through ``refuse`` (the first refusal stops the release, nothing spent) and
``medrelease check`` runs the ledger, count and stores stages through ``refusals`` (every
refusal of the stage at once; the request and plan stages stop at their first, as the plan the
later rules read cannot be made past it). A new rule goes into its
stage's tuple below; ``tests/flow/test_check_equals_release.py`` holds the flow and ``check``
to this table.

The rows themselves are refused by the input schema (``medrelease/data/input_schema.py``) while
they are read, and what was drawn by the output suite; neither is a rule on facts, so neither is
here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from medrelease.data.aggregate import joint_domain_problem, public_informative_size
from medrelease.data.config import DatasetConfig, ReleasePolicy
from medrelease.errors import ConfigError, MedreleaseError, ParameterError, PolicyError
from medrelease.mechanisms import capabilities, check_fits, get_mechanism, uses_lattice
from medrelease.mechanisms.base import ReleaseContext
from medrelease.plan import PublicFacts, ReleasePlan
from medrelease.privacy.ledger import BudgetState, cap_bounds_problem, refuse_overspend
from medrelease.release import fixed_index, lattice_size, plan_release
from medrelease.request import check_stores_and_ledger, spend_request

VOID_CONFIRMATION = "void_lifetime_guarantee"


@dataclass(frozen=True)
class LedgerView:
    """What the ledger says of a source before a release reads anything: the policy it was
    first released with (and which config), whether it is known, its budget."""

    recorded_policy: str | None = None
    owner: str | None = None
    known: bool = False
    budget: BudgetState | None = None


@dataclass(frozen=True)
class Facts:
    """Everything a rule may read; a stage fills what its rules need."""

    config: DatasetConfig
    plan: ReleasePlan | None = None
    mechanism: str | None = None            # request stage: the mechanism named
    nodes: int = 0                          # plan stage: the lattice's size
    ledger: LedgerView | None = None        # ledger stage
    void_confirmed: bool = False
    budget_first: bool = True               # False: the budget waits for the charge
    context: ReleaseContext | None = None   # count stage: the counted extract (None: rows)
    key_found: bool | None = None           # count stage: a pseudonymization key (None: unseen)
    ledger_path: str | None = None          # stores stage
    destination: str | None = None


Said = str | MedreleaseError | None


@dataclass(frozen=True)
class Rule:
    name: str
    check: Callable[[Facts], Said]
    says: type[MedreleaseError] = PolicyError

    def refusal(self, facts: Facts) -> MedreleaseError | None:
        try:
            said = self.check(facts)
        except MedreleaseError as exc:  # a hook it asks refused on its own
            return exc
        if said is None or isinstance(said, MedreleaseError):
            return said
        return self.says(said)


def _hook(call: Callable[[], Any]) -> MedreleaseError | None:
    """A mechanism's hook or the ledger's rule, which raises its own error: that error."""
    try:
        call()
    except MedreleaseError as exc:
        return exc
    return None


# -- request ---------------------------------------------------------------------------------

def mechanism_misfit(facts: Facts) -> Said:
    """The mechanism cannot release the dataset as declared (the registry's ``check_fits``)."""
    return _hook(lambda: check_fits(facts.config, facts.mechanism))


# -- plan ------------------------------------------------------------------------------------

def policy_refusal(config: DatasetConfig, plan: ReleasePlan, where: str | None = None) -> Said:
    """What the dataset's policy does not allow (``where``: whose policy, in words)."""
    policy, name = config.policy, plan.mechanism
    where = where or f"the policy of dataset {config.name!r} (policy: in its config)"
    if name not in policy.mechanisms:
        return (f"mechanism {name!r} is not allowed by {where}, which allows "
                f"{', '.join(policy.mechanisms)}")
    guarantee = plan.guarantee
    if not guarantee.proven and not policy.allow_unproven:
        return (f"mechanism {name!r} here gives no proven DP guarantee ({guarantee.label}); "
                f"{where} needs allow_unproven: true for that")
    if guarantee.epsilon is not None and guarantee.epsilon > policy.max_epsilon:
        return (f"epsilon {guarantee.epsilon:g} is above the per-release cap "
                f"{policy.max_epsilon:g} of {where}")
    k = getattr(plan.params, "k", None)
    if k is not None and k < policy.min_k:
        return f"k = {k} is below the minimum k = {policy.min_k} of {where}"
    return None


def dataset_policy(facts: Facts) -> Said:
    return policy_refusal(facts.config, facts.plan)


def lattice_over_limit(facts: Facts) -> Said:
    """A lattice above the policy's node limit (a 10^5-node lattice was charged and then made
    no progress in minutes). Only the mechanisms that walk the lattice: ``aim`` measures
    marginals and never enumerates its nodes."""
    config, nodes = facts.config, facts.nodes
    if not uses_lattice(facts.plan.mechanism) or nodes <= config.policy.max_lattice_nodes:
        return None
    tallest = sorted(((config.taxonomies[c].height + 1, c) for c in config.dimensions),
                     reverse=True)[:4]
    return (f"dataset {config.name!r}: its lattice has {nodes:,} nodes (the product of each "
            f"dimension's taxonomy levels), over the limit of {config.policy.max_lattice_nodes:,}"
            " (policy: max_lattice_nodes in its config); use taxonomies with fewer levels (the "
            f"most: {', '.join(f'{c!r} {n}' for n, c in tallest)}), drop columns (role: drop) "
            f"or raise the limit; aim never walks the lattice. Nothing was read or spent.")


def joint_domain_too_large(facts: Facts) -> Said:
    """A lattice mechanism whose dimensions' combined domain is too large for the one count
    table it rolls up (``joint_domain_problem``: the columns to coarsen or drop); from the
    taxonomies and the declared domain only, with the streaming pass's room where no domain is
    declared, so no extract can pass this and fail when counted. ``aim`` reads its marginals
    from a wide table instead."""
    config, plan = facts.config, facts.plan
    if not uses_lattice(plan.mechanism):
        return None
    taxonomies = tuple(config.taxonomies[c] for c in config.dimensions)
    problem = joint_domain_problem(config.dimensions, taxonomies,
                                   public_informative_size(config), plan.mechanism)
    return f"dataset {config.name!r}: {problem}" if problem else None


def work_over_limits(facts: Facts) -> Said:
    """Work (cells drawn, rows sampled, noise epsilons) the mechanism bounds from public facts
    only — its parameters, the taxonomies, the declared domains and the policy's limits
    (``check_work``, the mechanism's own hook)."""
    plan = facts.plan
    return _hook(lambda: get_mechanism(plan.mechanism).check_work(facts.config, plan.params))


# -- ledger ----------------------------------------------------------------------------------

def source_policy(facts: Facts) -> Said:
    """A config of a source that another config released first obeys that config's policy
    too (the last one it released with): a second YAML naming the same source cannot loosen
    what its steward allowed."""
    config, view = facts.config, facts.ledger
    if view.recorded_policy is None or view.owner is None or view.owner == config.config_file:
        return None
    try:
        policy = ReleasePolicy.model_validate_json(view.recorded_policy)
    except ValueError:
        return (f"the policy recorded for source {config.source_id!r} in the ledger cannot be "
                "read; nothing was spent")
    owned = config.model_copy(update={"policy": policy})
    return policy_refusal(owned, facts.plan, where=(
        f"the policy of source {config.source_id!r}: it was first released with the policy of "
        f"{view.owner}, which also binds {config.config_file or 'this config'} (nothing was "
        "spent)"))


def first_cap(facts: Facts) -> Said:
    """A new source's lifetime cap is the YAML's, fixed at its first spend: held to the bounds
    ``medrelease ledger set-cap`` enforces (the ledger checks again when it fixes it). A known
    source's cap is the ledger's; the YAML's value is then only compared with it."""
    if facts.ledger.known:
        return None
    config = facts.config
    privacy = config.privacy
    problem = cap_bounds_problem(privacy.lifetime_epsilon, privacy.lifetime_delta)
    if not problem:
        return None
    return (f"privacy.lifetime_epsilon {privacy.lifetime_epsilon:g} / lifetime_delta "
            f"{privacy.lifetime_delta:g} in {config.config_file or 'the dataset config'} would "
            f"become the lifetime cap of the new source {config.source_id!r}, and a cap needs "
            f"{problem}; 'medrelease ledger set-cap' allows no more. Nothing was read or spent.")


def void_unconfirmed(facts: Facts) -> Said:
    """A release without a proven DP guarantee voids its source's lifetime guarantee for good
    (``Ledger.mark``): while that guarantee still holds, such a request is refused unless it
    carries the steward's confirmation. Once the guarantee is void, there is nothing left to
    lose and no confirmation is asked."""
    plan, budget = facts.plan, facts.ledger.budget
    guarantee = plan.guarantee
    if guarantee.proven or (budget is not None and budget.void_reason is not None) \
            or facts.void_confirmed:
        return None
    return (f"mechanism {plan.mechanism!r} gives no proven DP guarantee ({guarantee.label}): "
            f"publishing it voids the lifetime guarantee of source {facts.config.source_id!r} "
            "for good (every later release's manifest says VOID, and no total of its releases "
            "is a DP guarantee any more). To go ahead, confirm it: tick 'Void the lifetime "
            f"guarantee' in the form ({VOID_CONFIRMATION}: true; CLI --void-lifetime-guarantee)."
            " Nothing was read or spent.")


def budget_left(facts: Facts) -> Said:
    """A release its source's cap cannot take, from the plan's (public) epsilon and delta and
    the ledger's figures, before the extract is opened (the README promises a refusal "before
    anything is read"). The charge applies the same rule again, atomically. Waits for the
    charge when ``budget_first`` is False (a scheduled run that releases only a changed extract
    ends 'No new data' rather than in a budget refusal every time)."""
    if not facts.budget_first:
        return None
    config, budget = facts.config, facts.ledger.budget
    if budget is None:  # a source with no spends yet: its cap will be its YAML's
        privacy = config.privacy
        budget = BudgetState(config.source_id, 0.0, 0.0, privacy.lifetime_epsilon,
                             privacy.lifetime_delta)
    return _hook(lambda: refuse_overspend(spend_request(config, facts.plan, None), budget))


# -- count -----------------------------------------------------------------------------------

def fixed_node_outside(facts: Facts) -> Said:
    """A ``fixed``-selection mechanism's node (``fixed_node``, its own hook) must be one of the
    counted lattice's."""
    if facts.context is None:
        return None
    return _hook(lambda: fixed_index(facts.context, facts.plan))


def noise_rows_over_limit(facts: Facts) -> Said:
    """A release whose noise alone is expected to add more rows than the policy allows (the
    mechanism's ``expected_noise_rows``, from public facts: taxonomies, declared domain,
    parameters)."""
    config, context, plan = facts.config, facts.context, facts.plan
    if context is None:
        return None
    expected = get_mechanism(plan.mechanism).expected_noise_rows(context, plan.params)
    limit = config.policy.max_noise_rows
    if expected <= limit:
        return None
    return (f"{plan.mechanism} at epsilon {plan.guarantee.epsilon or 0:g} on dataset "
            f"{config.name!r} is expected to add {expected:,.0f} noise rows (noise alone, "
            "bounded from its parameters and the taxonomies or declared domain: empty cells "
            "released with a noisy count, or counterfeit rows in every class it could release), "
            f"over the limit of {limit:,} (policy: max_noise_rows in its config); use a larger "
            "epsilon or a coarser node, or raise the limit. Nothing was spent.")


def key_missing(facts: Facts) -> Said:
    """A mechanism that needs a key finds it before the charge (``key_found`` None: the
    caller cannot see the key's store, as ``check``, which never starts Prefect)."""
    plan = facts.plan
    if facts.key_found is not False or not capabilities(plan.mechanism).needs_secret:
        return None
    return (f"{plan.mechanism} needs a key: create a Prefect Secret block named "
            f"{plan.params.key_source!r} or set MEDRELEASE_PSEUDONYM_KEY. Nothing was spent.")


# -- stores ----------------------------------------------------------------------------------

def stores_not_ready(facts: Facts) -> Said:
    """Everything that could still fail after the charge: the ledger holds every spend the
    records show, and the release and steward folders can be written (a probe that leaves
    nothing behind)."""
    return _hook(lambda: check_stores_and_ledger(
        facts.config, facts.plan.random.test_release, facts.ledger_path, facts.destination))


STAGES: dict[str, tuple[Rule, ...]] = {
    "request": (Rule("the mechanism fits the dataset", mechanism_misfit),),
    "plan": (Rule("the dataset's policy", dataset_policy),
             Rule("the lattice's size", lattice_over_limit),
             Rule("the dimensions' joint domain", joint_domain_too_large),
             Rule("the mechanism's work", work_over_limits)),
    "ledger": (Rule("the source's recorded policy", source_policy),
               Rule("a new source's cap", first_cap, ConfigError),
               Rule("the void confirmation", void_unconfirmed),
               Rule("the budget left", budget_left)),
    "count": (Rule("the fixed node", fixed_node_outside),
              Rule("the noise rows", noise_rows_over_limit),
              Rule("the pseudonymization key", key_missing, ParameterError)),
    "stores": (Rule("the stores and the ledger's integrity", stores_not_ready),),
}


def refusals(stage: str, facts: Facts) -> list[MedreleaseError]:
    """Every refusal of ``stage`` (``medrelease check``: all of them at once), each sentence
    once (two rules may ask the same hook: the noise rows need the fixed node)."""
    found: dict[str, MedreleaseError] = {}
    for rule in STAGES[stage]:
        refusal = rule.refusal(facts)
        if refusal is not None:
            found.setdefault(str(refusal), refusal)
    return list(found.values())


def refuse(stage: str, facts: Facts) -> None:
    """The release's way: the first refusal of ``stage``, raised (nothing spent)."""
    for rule in STAGES[stage]:
        refusal = rule.refusal(facts)
        if refusal is not None:
            raise refusal


def plan_for_config(config: DatasetConfig, mechanism: str, params: dict[str, Any],
                    seed: int | None) -> ReleasePlan:
    """The release's plan, held to everything public facts can decide: the request stage (the
    mechanism fits the config), its parameters and guarantee (``plan_release``), then the plan
    stage (policy, lattice, joint domain, work). Reads no data and draws no noise; the flow's
    plan step and ``medrelease check`` both run exactly this."""
    refuse("request", Facts(config, mechanism=mechanism))
    nodes = lattice_size(config)
    # a seed per node only for a lattice the mechanism walks and the policy allows: aim has
    # none to walk, and a 40-column table's lattice has ~10^12 nodes (refused just below)
    walked = nodes if uses_lattice(mechanism) and nodes <= config.policy.max_lattice_nodes \
        else 0
    release_plan = plan_release(mechanism, params, walked, seed, PublicFacts.of(config))
    refuse("plan", Facts(config, release_plan, nodes=nodes))
    return release_plan


def ledger_view(ledger_path: str, source: str) -> LedgerView:
    """The ledger's figures for ``source``; reads the ledger when there is one, never
    creates it."""
    from medrelease.privacy.ledger_backends import ledger_exists, open_ledger

    if not ledger_exists(ledger_path):
        return LedgerView()
    book = open_ledger(ledger_path)
    recorded, owner = book.source_policy(source)
    known = book.knows_source(source)
    return LedgerView(recorded, owner, known, book.state(source) if known else None)


def ledger_facts(config: DatasetConfig, plan: ReleasePlan, ledger_path: str,
                 void_confirmed: bool = False, budget_first: bool = True) -> Facts:
    """The ledger stage's facts: the plan with what the ledger says of its source."""
    return Facts(config, plan, ledger=ledger_view(ledger_path, config.source_id),
                 void_confirmed=void_confirmed, budget_first=budget_first)
