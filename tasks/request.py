"""Resolve a release request once, before anything is read or spent (``medrelease.request``)."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from medrelease.data.config import find_config
from medrelease.data.extract import resolve_extract
from medrelease.mechanisms import uses_counts
from medrelease.privacy.ledger_backends import ledger_exists, open_ledger
from medrelease.release import lattice_size, resolve_mechanism
from medrelease.request import (
    ResolvedRequest,
    enforce_first_cap,
    enforce_source_policy,
    enforce_void_confirmation,
)
from tasks.budget import plan


@task(name="resolve-request", cache_policy=NO_CACHE)
def resolve_request(dataset: str, mechanism: str | None, epsilon: float | None,
                    parameters: dict[str, Any], input_path: str | None, seed: int | None,
                    ledger_path: str, void_confirmed: bool = False) -> ResolvedRequest:
    """Config (one dataset root), mechanism and plan (policy, the source's recorded policy,
    work limits, the confirmation a guarantee-voiding mechanism needs), then the files with
    their hashes: every refusal here spends nothing."""
    config = find_config(dataset)
    resolved = resolve_mechanism(config, mechanism, epsilon, parameters)
    release_plan = plan.fn(config, resolved.name, resolved.params, seed)
    book = open_ledger(ledger_path) if ledger_exists(ledger_path) else None
    recorded, owner = book.source_policy(config.source_id) if book else (None, None)
    enforce_source_policy(config, release_plan, recorded, owner)
    known = book is not None and book.knows_source(config.source_id)
    enforce_first_cap(config, known=known)
    void_reason = book.state(config.source_id).void_reason if known else None
    enforce_void_confirmation(config, release_plan, void_reason, void_confirmed)
    # a release that counts the extract digests its rows in that count's pass (one read)
    extract = resolve_extract(config, input_path, rows_by_count=uses_counts(resolved.name))
    request = ResolvedRequest(config, extract, release_plan, lattice_size(config))
    get_run_logger().info("request resolved: dataset %s, source %s, %s, %d file(s), %d "
                          "lattice nodes", config.name, request.source, request.mechanism,
                          len(extract.files), request.lattice_nodes)
    return request
