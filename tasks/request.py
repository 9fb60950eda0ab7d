"""Resolve a release request once, before anything is read or spent (``medrelease.request``)."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from medrelease.data.config import find_config
from medrelease.data.extract import resolve_extract
from medrelease.mechanisms import uses_counts
from medrelease.refusals import ledger_facts, refuse
from medrelease.release import lattice_size, resolve_mechanism
from medrelease.request import ResolvedRequest
from tasks.budget import plan


@task(name="resolve-request", cache_policy=NO_CACHE)
def resolve_request(dataset: str, mechanism: str | None, epsilon: float | None,
                    parameters: dict[str, Any], input_path: str | None, seed: int | None,
                    ledger_path: str, void_confirmed: bool = False,
                    budget_first: bool = True) -> ResolvedRequest:
    """Config (one dataset root), mechanism and plan (policy, the source's recorded policy,
    work limits, the confirmation a guarantee-voiding mechanism needs, the budget left), then
    the files with their hashes: every refusal here spends nothing, and every one but the
    files' own comes before a byte of the input is read."""
    config = find_config(dataset)
    resolved = resolve_mechanism(config, mechanism, epsilon, parameters)
    release_plan = plan.fn(config, resolved.name, resolved.params, seed)
    # the ledger stage: the source's policy, a new source's cap, the void confirmation, the
    # budget left (medrelease check runs the same rules)
    refuse("ledger", ledger_facts(config, release_plan, ledger_path, void_confirmed,
                                  budget_first))
    # a release that counts the extract digests its rows in that count's pass (one read)
    extract = resolve_extract(config, input_path, rows_by_count=uses_counts(resolved.name))
    request = ResolvedRequest(config, extract, release_plan, lattice_size(config))
    get_run_logger().info("request resolved: dataset %s, source %s, %s, %d file(s)%s",
                          config.name, request.source, request.mechanism, len(extract.files),
                          "" if release_plan.kind == "relational" else
                          f", {request.lattice_nodes} lattice nodes")
    return request
