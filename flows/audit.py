"""The audit flows: an empirical lower bound on a mechanism's epsilon, and the publication audit.

``audit_flow``: each task runs the mechanism on one neighbouring table for a batch of seeds and
returns only the per-run statistics; the bound is computed once all batches are in (see
``medrelease.evidence.audit``), with the ceiling these runs can detect.

``publication_audit_flow``: the *whole release flow*, on neighbouring inputs with the same seed,
each in its own isolated home (ledger and stores), then every published byte inspected
(``medrelease.evidence.audit_publication``), followed by the statistical audit.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import as_completed
from prefect.task_runners import ThreadPoolTaskRunner

from flows.progress import report_progress
from medrelease.data.config import load_config
from medrelease.evidence.audit import (
    DESIGNS,
    AuditResult,
    bound_from_statistics,
    default_design,
    run_audit,
    run_batch,
    seeds_for,
)
from medrelease.evidence.audit_publication import (
    Finding,
    compare_neighbours,
    publication_designs,
    publication_neighbours,
    value_leaks,
    write_audit_dataset,
)
from medrelease.mechanisms import MECHANISMS, capabilities
from medrelease.settings import isolated_home
from medrelease.stages import workers_from_env
from tasks.artifacts import markdown_artifact


@task(name="audit-batch", cache_policy=NO_CACHE)
def audit_batch(mechanism: str, epsilon: float, design: str, table: str,
                seeds: list[int | None]) -> tuple[str, int, list[float]]:
    return table, len(seeds), run_batch(mechanism, epsilon, design, table, seeds)


def audit_markdown(result: AuditResult) -> str:
    return (f"# Audit of `{result.mechanism}` at claimed eps = {result.claimed_epsilon:g}\n\n"
            f"- design: {result.design}, {result.runs_per_table} runs per neighbouring table\n"
            f"- event: {result.event}\n"
            f"- second half: {result.hits_with} hits with the target, {result.hits_without} "
            "without\n"
            f"- **eps lower bound ({result.confidence:.0%}): "
            f"{result.epsilon_lower_bound:.2f}** -> {result.verdict}\n"
            f"- the most these runs can ever show: {result.ceiling:.2f} (a claim at or above "
            "it is inconclusive: use more runs)\n")


@flow(name="medrelease-audit", description="Empirical privacy audit of one mechanism",
      task_runner=ThreadPoolTaskRunner(max_workers=workers_from_env()),
      validate_parameters=True)
def audit_flow(mechanism: str = "ipa-paper", epsilon: float = 1.0, runs: int = 200,
               design: str | None = None, batch_size: int = 20, seed: int | None = None,
               confidence: float = 0.95) -> dict[str, Any]:
    """Run ``runs`` releases on each neighbour (batches fanned out) and bound epsilon."""
    logger = get_run_logger()
    design = design or default_design(mechanism)
    if design not in DESIGNS:
        raise ValueError(f"unknown audit design {design!r}; choose one of {', '.join(DESIGNS)}")
    seeds = dict(zip(("without", "with"), seeds_for(runs, seed), strict=True))
    futures = [audit_batch.submit(mechanism, epsilon, design, table,
                                  seeds[table][start:start + batch_size])
               for table in ("without", "with") for start in range(0, runs, batch_size)]
    progress = create_progress_artifact(0.0, description=f"audit runs of {mechanism}")
    by_start: dict[str, dict[int, list[float]]] = {"without": {}, "with": {}}
    index = {id(f): i for i, f in enumerate(futures)}
    done = 0
    for future in as_completed(futures):
        table, n, values = future.result()
        by_start[table][index[id(future)]] = values
        done += n
        update_progress_artifact(progress, progress=100.0 * done / (2 * runs))
        logger.info("audited %d of %d runs", done, 2 * runs)
        report_progress("auditing runs", done, 2 * runs, f"{done:,}/{2 * runs:,} runs")
    stats = {t: [v for i in sorted(parts) for v in parts[i]] for t, parts in by_start.items()}
    result = bound_from_statistics(mechanism, epsilon, design, stats["without"], stats["with"],
                                  confidence)
    markdown_artifact(audit_markdown(result), key=f"audit-{mechanism}",
                      description="Empirical privacy audit")
    return {**result.__dict__, "exceeds_claim": result.exceeds_claim,
            "ceiling": result.ceiling, "verdict": result.verdict}


def _release_in(home: Path, config_path: Path, table: pd.DataFrame, mechanism: str,
                epsilon: float, seed: int) -> Path:
    """One whole release flow run in its own isolated home; the published folder.

    The dataset folder is copied into the home's ``datasets/`` (a dataset root) and the
    extract written beside it, so the run passes the same path rules as a steward's."""
    from flows.release import ReleaseRequest, release_flow

    folder = home / "datasets" / config_path.parent.name
    shutil.copytree(config_path.parent, folder, dirs_exist_ok=True)
    extract = folder / "extract.csv"
    table.to_csv(extract, index=False)
    with isolated_home(home):
        result = release_flow(ReleaseRequest(
            dataset=str(folder / config_path.name), input_path=str(extract), seed=seed,
            evaluate=False, batch_size=64, mechanism={"mechanism": mechanism, "epsilon": epsilon},
            void_lifetime_guarantee=True))  # (a throwaway source in an isolated home)
    return Path(result["path"])


def inspect_pair(workdir: Path, config_path: Path, design: str, mechanism: str,
                 epsilon: float, seed: int) -> list[Finding]:
    """Both neighbours through the release flow with one seed; every published byte checked."""
    without, with_target, unique = publication_neighbours(design, mechanism, epsilon)
    base = workdir / f"{design}-{seed}"
    folder_a = _release_in(base / "without", config_path, without, mechanism, epsilon, seed)
    folder_b = _release_in(base / "with", config_path, with_target, mechanism, epsilon, seed)
    # the dataset config, for the publication verdict's re-derivation (its public declarations)
    findings = compare_neighbours(folder_a, folder_b, load_config(config_path))
    if unique is not None:
        findings += value_leaks(folder_b, unique)
    return [Finding(f"{design}: {f.check}", f.where, f.detail) for f in findings]


@flow(name="medrelease-publication-audit", validate_parameters=True,
      description="Whole release flow on neighbouring inputs: every published byte inspected")
def publication_audit_flow(mechanism: str = "ipa", epsilon: float = 1.0, pairs: int = 1,
                           runs: int = 200, seed: int = 0, designs: list[str] | None = None,
                           confidence: float = 0.95, keep_folders: bool = False
                           ) -> dict[str, Any]:
    """Publication audit of ``mechanism``: boundary, neighbour diff, unique value, statistics.

    ``runs`` = 0 skips the statistical part (checks 1 and 2 only). The neighbours' release
    folders are removed afterwards unless ``keep_folders``.
    """
    logger = get_run_logger()
    if not publication_designs(mechanism):
        covered = sorted(m for m in MECHANISMS if publication_designs(m))
        raise ValueError(f"the publication audit covers {', '.join(covered)}")
    designs = list(designs or publication_designs(mechanism))
    workdir = Path(tempfile.mkdtemp(prefix="medrelease-publication-audit-"))
    config_path = write_audit_dataset(workdir / "dataset", mechanism)
    findings: list[Finding] = []
    try:
        for design in designs:
            for pair in range(pairs):
                findings += inspect_pair(workdir, config_path, design, mechanism, epsilon,
                                         seed + pair)
                logger.info("publication audit of %s: design %s pair %d done (%d findings so "
                            "far)", mechanism, design, pair + 1, len(findings))
    finally:
        if not keep_folders:
            shutil.rmtree(workdir, ignore_errors=True)
    statistical = _statistical(mechanism, epsilon, runs, seed, confidence)
    verdict = _verdict(findings, statistical)
    markdown_artifact(_publication_markdown(mechanism, epsilon, designs, pairs, findings,
                                            statistical, verdict),
                      key=f"publication-audit-{mechanism}",
                      description=f"Publication audit of {mechanism}: {verdict}")
    return {"mechanism": mechanism, "epsilon": epsilon, "designs": designs, "pairs": pairs,
            "findings": [str(f) for f in findings], "verdict": verdict,
            "statistical": [{**r.__dict__, "verdict": r.verdict, "ceiling": r.ceiling}
                            for r in statistical],
            "workdir": str(workdir) if keep_folders else None}


def _statistical(mechanism: str, epsilon: float, runs: int, seed: int,
                 confidence: float) -> list[AuditResult]:
    if runs <= 0:
        return []
    designs = (("classification",) if capabilities(mechanism).needs_class_domain
               else ("unique", "tipping"))
    return [run_audit(mechanism, epsilon, runs=runs, seed=seed, confidence=confidence,
                      design=design) for design in designs]


def _verdict(findings: list[Finding], statistical: list[AuditResult]) -> str:
    if findings or any(r.exceeds_claim for r in statistical):
        return "FLAGGED"
    if any(r.verdict == "inconclusive" for r in statistical):
        return "inconclusive"
    return "passes"


def _publication_markdown(mechanism: str, epsilon: float, designs: list[str], pairs: int,
                          findings: list[Finding], statistical: list[AuditResult],
                          verdict: str) -> str:
    lines = [f"# Publication audit of `{mechanism}` at eps = {epsilon:g}: **{verdict}**", "",
             f"Whole release flow on neighbouring inputs ({', '.join(designs)}; {pairs} "
             "pair(s) each, same seed on both sides); every published file inspected.", ""]
    lines += [f"- {f}" for f in findings] or ["- no finding: only allow-listed files and "
                                              "fields; public fields identical; released "
                                              "figures re-derived; no unique value"]
    for result in statistical:
        lines += ["", audit_markdown(result)]
    return "\n".join(lines)
