"""One release request, resolved once: the dataset config (from one dataset root), the files
it reads (private snapshots taken at resolution) with their content hashes (bytes and parsed
rows), the source and its policy, the mechanism with its validated
parameters and privacy map, and the expected work. Every later step of a release reads this
value; none resolves a path or a config again (what is charged is what is read).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from medrelease.data.config import DatasetConfig
from medrelease.data.extract import ResolvedExtract
from medrelease.plan import ReleasePlan
from medrelease.privacy.ledger import SpendRequest


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
