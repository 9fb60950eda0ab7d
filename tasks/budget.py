"""Plan the release (parameters, guarantee, budget steps) and charge the ledger."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from medrelease.data.config import DatasetConfig
from medrelease.mechanisms import capabilities
from medrelease.mechanisms.base import ReleaseContext
from medrelease.plan import ReleasePlan
from medrelease.privacy.ledger import Charge, request_record
from medrelease.privacy.ledger_backends import open_ledger
from medrelease.refusals import Facts, plan_for_config, refuse
from medrelease.request import spend_request
from medrelease.settings import store_root, test_store_root
from medrelease.storage.store import published_manifests as manifests_in_stores
from tasks.artifacts import markdown_artifact
from tasks.lattice import load_pseudonym_key


def artifact_key(dataset: str, what: str) -> str:
    """Artifact keys allow lower-case letters, digits and dashes only."""
    return f"{dataset.replace('_', '-')}-{what}"


@task(name="plan-release", cache_policy=NO_CACHE)
def plan(config: DatasetConfig, mechanism: str, params: dict, seed: int | None) -> ReleasePlan:
    """Validate parameters, state the guarantee from public facts only, and hold the request
    to the dataset's policy and limits (``plan_for_config``); reads no data, draws no noise."""
    return plan_for_config(config, mechanism, params, seed)


@task(name="check-before-charge", cache_policy=NO_CACHE)
def check_before_charge(config: DatasetConfig, release_plan: ReleasePlan,
                        context: ReleaseContext | None, ledger_path: str,
                        destination: str | None) -> None:
    """The count stage's rules (a fixed node outside its lattice, the noise rows over the
    policy's limit, a missing pseudonymization key, looked for in its Prefect Secret block
    here) and the stores stage's (the ledger holds every spend the records show; the release
    and steward folders can be written): ``medrelease/refusals.py``, which ``medrelease check``
    runs too."""
    key_found = (load_pseudonym_key(release_plan.params) is not None
                 if capabilities(release_plan.mechanism).needs_secret else None)
    refuse("count", Facts(config, release_plan, context=context, key_found=key_found))
    refuse("stores", Facts(config, release_plan, ledger_path=ledger_path,
                           destination=destination))


def published_manifests() -> list[dict]:
    """The manifests of every release in both stores (each names its source and charge)."""
    return manifests_in_stores(store_root(), test_store_root())


@task(name="charge-budget", cache_policy=NO_CACHE)
def charge_budget(
    config: DatasetConfig, release_plan: ReleasePlan, ledger_path: str, flow_run_id: str | None,
    content: tuple[str, ...] = (),
) -> Charge:
    """Reserve the release's (eps, delta) against its source and the content it reads (every
    file's SHA-256 and row digest: ``ResolvedExtract.claims``), or refuse; log it as an
    artifact. The lifetime it returns is the one the release's own manifest states: with this
    release counted, and void if this release's mechanism makes no proven DP claim."""
    guarantee = release_plan.guarantee
    ledger = open_ledger(ledger_path)
    request = spend_request(config, release_plan, flow_run_id, content)
    spend_id = ledger.reserve(request)
    lifetime = ledger.state(config.source_id, config.privacy.lifetime_epsilon,
                            config.privacy.lifetime_delta, publishing=spend_id)
    void_before = ledger.state(config.source_id).void  # (the reservation itself voids nothing)
    markdown_artifact(  # a narrow table and a list: it fits a laptop screen
        markdown="\n".join(
            ["| step | epsilon | delta |", "|---|---|---|"]
            + [f"| {s.step} | {s.epsilon:.4g} | {s.delta:.3g} |" for s in release_plan.budget_steps]
            + ["", *(f"- **{s.step}** ({s.mechanism}): {s.description}"
                     for s in release_plan.budget_steps)]),
        key=artifact_key(config.name, "budget-steps"),
        description=(
            f"Privacy budget spent by this release of {config.name} "
            f"(ledger spend {spend_id}; guarantee: {guarantee.statement()})"
        ),
    )
    logger = get_run_logger()
    logger.info("budget reserved on source %s: eps=%g delta=%g (spend %s)%s",
                config.source_id, guarantee.epsilon or 0, guarantee.delta or 0, spend_id,
                " [TEST]" if release_plan.random.test_release else "")
    if lifetime.cap_note:
        logger.warning(lifetime.cap_note)
    return Charge(spend_id, lifetime, request_record(request),
                  voids_lifetime=lifetime.void and not void_before)


@task(name="finalize-spend", cache_policy=NO_CACHE)
def finalize_spend(ledger_path: str, spend_id: str, status: str, release_id: str | None = None,
                   note: str | None = None) -> None:
    open_ledger(ledger_path).mark(spend_id, status, release_id=release_id, note=note)


@contextmanager
def charged(ledger: str, charge: Charge) -> Iterator[None]:
    """The work after a charge: any failure, a cancellation included, marks the spend
    'failed' and re-raises. The reservation stays counted (noise may have been drawn before the
    failure); marked directly, not as a task, so it also happens while the run is cancelled."""
    try:
        yield
    except BaseException as exc:
        open_ledger(ledger).mark(charge.spend_id, "failed",
                                 note=f"{type(exc).__name__}: {exc}"[:500])
        raise
