"""One release request, resolved once: the dataset config (from one dataset root), the files
it reads (private snapshots taken at resolution) with their content hashes (bytes and parsed
rows), the source and its policy, the mechanism with its validated
parameters and privacy map, and the expected work. Every later step of a release reads this
value; none resolves a path or a config again (what is charged is what is read).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from medrelease.data.config import DatasetConfig, ReleasePolicy
from medrelease.data.extract import ResolvedExtract
from medrelease.errors import ConfigError, PolicyError
from medrelease.plan import ReleasePlan
from medrelease.privacy.ledger import (
    BudgetState,
    SpendRequest,
    cap_bounds_problem,
    refuse_overspend,
)
from medrelease.release import enforce_policy


@dataclass(frozen=True)
class ResolvedRequest:
    config: DatasetConfig
    extract: ResolvedExtract
    plan: ReleasePlan
    lattice_nodes: int
    requested_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    @property
    def source(self) -> str:
        return self.config.source_id

    @property
    def mechanism(self) -> str:
        return self.plan.mechanism


def enforce_source_policy(config: DatasetConfig, plan: ReleasePlan, recorded: str | None,
                          owner: str | None) -> None:
    """A config of a source that another config released first obeys that config's policy
    too (the last one it released with): a second YAML naming the same source cannot loosen
    what its steward allowed."""
    if recorded is None or owner is None or owner == config.config_file:
        return
    try:
        policy = ReleasePolicy.model_validate_json(recorded)
    except ValueError:
        raise PolicyError(f"the policy recorded for source {config.source_id!r} in the ledger "
                          "cannot be read; nothing was spent") from None
    owned = config.model_copy(update={"policy": policy})
    enforce_policy(owned, plan, where=(
        f"the policy of source {config.source_id!r}: it was first released with the policy of "
        f"{owner}, which also binds {config.config_file or 'this config'} (nothing was spent)"))


VOID_CONFIRMATION = "void_lifetime_guarantee"


def enforce_void_confirmation(config: DatasetConfig, plan: ReleasePlan, void_reason: str | None,
                              confirmed: bool) -> None:
    """A release without a proven DP guarantee voids its source's lifetime guarantee for good
    (``Ledger.mark``): while that guarantee still holds (``void_reason`` None), such a request
    is refused unless it carries the steward's confirmation, before anything is read or spent.
    Once the guarantee is void, there is nothing left to lose and no confirmation is asked."""
    guarantee = plan.guarantee
    if guarantee.proven or void_reason is not None or confirmed:
        return
    raise PolicyError(
        f"mechanism {plan.mechanism!r} gives no proven DP guarantee ({guarantee.label}): "
        f"publishing it voids the lifetime guarantee of source {config.source_id!r} for good "
        "(every later release's manifest says VOID, and no total of its releases is a DP "
        "guarantee any more). To go ahead, confirm it: tick 'Void the lifetime guarantee' in "
        f"the form ({VOID_CONFIRMATION}: true; CLI --void-lifetime-guarantee). Nothing was read "
        "or spent.")


def enforce_first_cap(config: DatasetConfig, known: bool) -> None:
    """A new source's lifetime cap is the YAML's, fixed at its first spend: held to the bounds
    ``medrelease ledger set-cap`` enforces (the ledger checks again when it fixes it). A known
    source's cap is the ledger's; the YAML's value is then only compared with it."""
    if known:
        return
    privacy = config.privacy
    problem = cap_bounds_problem(privacy.lifetime_epsilon, privacy.lifetime_delta)
    if problem:
        raise ConfigError(
            f"privacy.lifetime_epsilon {privacy.lifetime_epsilon:g} / lifetime_delta "
            f"{privacy.lifetime_delta:g} in {config.config_file or 'the dataset config'} would "
            f"become the lifetime cap of the new source {config.source_id!r}, and a cap needs "
            f"{problem}; 'medrelease ledger set-cap' allows no more. Nothing was read or spent.")


def spend_request(config: DatasetConfig, release_plan: ReleasePlan,
                  flow_run_id: str | None, content: tuple[str, ...] = ()) -> SpendRequest:
    """The charge a release asks of the ledger (``tasks/budget.py`` charges it; the pre-read
    budget rule and ``medrelease check`` read it too)."""
    guarantee = release_plan.guarantee
    return SpendRequest(
        source=config.source_id, dataset=config.name, mechanism=release_plan.mechanism,
        epsilon=float(guarantee.epsilon or 0.0), delta=float(guarantee.delta or 0.0),
        lifetime_epsilon=config.privacy.lifetime_epsilon,
        lifetime_delta=config.privacy.lifetime_delta, dp=guarantee.proven,
        test=release_plan.random.test_release, input_key=config.input_key,
        flow_run_id=flow_run_id, content=content,
        policy=config.policy.model_dump_json(), config_path=config.config_file or None,
        privacy_unit=guarantee.neighbouring)


def enforce_budget_left(config: DatasetConfig, release_plan: ReleasePlan,
                        budget: BudgetState | None) -> None:
    """A release its source's cap cannot take is refused here, from the plan's (public) epsilon
    and delta and the ledger's figures, before the extract is opened: the README promises a
    refusal "before anything is read", and a large extract took its copy, hash and row digest
    first. The charge applies the same rule again, atomically (another run may spend in
    between). ``budget`` None: a source with no spends yet, whose cap will be its YAML's."""
    if budget is None:
        privacy = config.privacy
        budget = BudgetState(config.source_id, 0.0, 0.0, privacy.lifetime_epsilon,
                             privacy.lifetime_delta)
    refuse_overspend(spend_request(config, release_plan, None), budget)


def enforce_ledger_rules(config: DatasetConfig, release_plan: ReleasePlan, ledger_path: str,
                         void_confirmed: bool = False, budget_first: bool = True) -> None:
    """The ledger's rules on a planned release, before a byte of the input is read: the policy
    the source was first released with, a new source's first cap, the confirmation a
    guarantee-voiding mechanism needs, the budget left. The flow's resolve step and
    ``medrelease check`` both run exactly this (issue 55: check = release). Reads the ledger
    when there is one; never creates it. ``budget_first`` False (a scheduled run that releases
    only a changed extract, ``skip_unchanged``): the budget waits for the charge, so that an
    unchanged extract still ends 'No new data' rather than in a budget refusal every time."""
    from medrelease.privacy.ledger_backends import ledger_exists, open_ledger

    book = open_ledger(ledger_path) if ledger_exists(ledger_path) else None
    recorded, owner = book.source_policy(config.source_id) if book else (None, None)
    enforce_source_policy(config, release_plan, recorded, owner)
    known = book is not None and book.knows_source(config.source_id)
    enforce_first_cap(config, known=known)
    budget = book.state(config.source_id) if known else None
    enforce_void_confirmation(config, release_plan, budget.void_reason if budget else None,
                              void_confirmed)
    if budget_first:
        enforce_budget_left(config, release_plan, budget)


def check_stores_and_ledger(config: DatasetConfig, test_release: bool, ledger_path: str,
                            destination: str | None) -> None:
    """Everything that could still fail after the charge, checked before it: the ledger holds
    every spend the records show (and agrees with its journal), and the release and steward
    folders can be written. The flow's last step before the charge and ``medrelease check``
    both run this (nothing is left behind: the store's probe folders are removed)."""
    import os

    from medrelease.privacy.ledger_backends import reconcile
    from medrelease.settings import steward_root, store_root, test_store_root
    from medrelease.storage.store import ReleaseStore, StewardRecords, StoreError
    from medrelease.storage.store import published_manifests as manifests_in_stores

    # manifests, then records, then (in reconcile) the ledger: a release another run publishes
    # meanwhile wrote its record before its manifest and charged before both, so whatever is
    # read here is already accounted for in what is read after it
    manifests = manifests_in_stores(store_root(), test_store_root())
    records = StewardRecords(steward_root())
    reconcile(ledger_path, records.records(), manifests)
    ReleaseStore(test_store_root() if test_release else store_root(), test=test_release
                 ).prepare(config.name, destination)
    try:
        records.root.mkdir(parents=True, exist_ok=True)
        probe = records.root / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise StoreError(f"the steward records folder {records.root} is not writable "
                         f"({exc.strerror}); nothing was spent") from None
