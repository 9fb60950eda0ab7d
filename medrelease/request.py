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
from medrelease.privacy.ledger import cap_bounds_problem
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
