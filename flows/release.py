"""The release flow: validate + aggregate (one streamed pass) -> charge budget -> score nodes
(fan-out) -> select -> materialize -> check -> publish, with the budget steps, per-node IL and a
summary as artifacts. Mechanisms without a lattice (Mondrian, pseudonymization, DiffGen) read
the validated rows instead.

Parameters are one pydantic model, so the Prefect UI renders a form: a mechanism dropdown
labelled with its guarantee, epsilon, and advanced parameters the chosen mechanism checks.

Engine objects go to tasks inside ``quote(...)``: Prefect otherwise walks every element of
every task argument looking for futures, and a dataset's taxonomies (a 5-digit zip code has
100,000 leaves) made each task call cost about a second before it started.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
import pandas as pd
from prefect import flow, get_run_logger, unmapped
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.annotations import quote
from pydantic import (
    Field,
    ValidationError,
)

from flows.evaluate import evaluate_steps
from flows.prepare import refuse_missing_input
from flows.progress import report_progress, ticking
from flows.request_form import (
    ReleaseRequest,
)
from flows.review import await_review, summary_of
from flows.states import REFUSALS, not_published, quiet_refusals, refused, skipped
from flows.states import published as published_state
from medrelease.errors import ParameterError, PolicyError
from medrelease.evidence.verdict import verdict_of_manifest
from medrelease.mechanisms import (
    capabilities,
    get_mechanism,
    uses_counts,
)
from medrelease.mechanisms.base import ReleaseContext
from medrelease.privacy.ledger_backends import ledger_exists, open_ledger
from medrelease.release import (
    candidates_frame,
    enforce_noise_rows,
    fixed_index,
    resolve_mechanism,
    score_lattice,
)
from medrelease.request import ResolvedRequest
from medrelease.settings import ledger_location
from medrelease.stages import run_rounds, workers_from_env
from medrelease.storage.links import release_link
from medrelease.storage.store import new_release_id
from tasks.artifacts import table_artifact
from tasks.budget import (
    Charge,
    artifact_key,
    charge_budget,
    charged,
    check_before_charge,
    finalize_spend,
)
from tasks.checks import check_output
from tasks.executor import PrefectPieces
from tasks.inputs import (
    aggregate_partition,
    load_and_validate_input,
    merge_partitions,
    released_before,
    validate_and_aggregate,
)
from tasks.lattice import (
    check_secret_available,
    materialize_release,
    release_rows,
    select_candidate,
)
from tasks.publish import (
    PublishResult,
    RunFacts,
    publish_release,
    publish_staged,
    stage_release,
    withdraw_ended,
    withdraw_staged,
)
from tasks.report import publish_artifacts, publish_budget_artifacts, publish_release_summary
from tasks.request import resolve_request
from tasks.runners import connect, fan_out_runner
from tasks.synthetic import sample_rows, start_rounds


def run_name() -> str:
    """'<dataset> · <mechanism> · eps <epsilon>': the run is findable in the Runs list by what
    it releases (the dataset's own mechanism and epsilon when the request names none). A
    request that cannot be read is named by its dataset only; the run itself refuses it."""
    given = (flow_run.parameters or {}).get("request")
    dataset = _dataset_named(given)
    try:
        from medrelease.data.config import find_config

        request = as_request(given)
        config = find_config(request.dataset)
        resolved = resolve_mechanism(config, request.mechanism, request.epsilon,
                                     request.parameters)
    except Exception:  # refused inside the run, with its reason
        return f"{dataset} · request to check"[:120]
    epsilon = resolved.params.get("epsilon")
    if epsilon is None and "epsilon" in get_mechanism(resolved.name).Params.model_fields:
        epsilon = get_mechanism(resolved.name).Params.model_fields["epsilon"].default
    eps = f" · eps {epsilon:g}" if isinstance(epsilon, int | float) else ""
    return f"{config.name} · {resolved.name}{eps}"[:120]


# The flow's one parameter, as the form shows it: titled "Release request" (Prefect titles a
# parameter by its Python name) and required (every release deployment gives it), through
# pydantic's public ``json_schema_extra``, not Prefect's private deployment schema (issue 27).
FormRequest = Annotated[ReleaseRequest,
                        Field(json_schema_extra={"title": "Release request"})]

@flow(
    name="medrelease-release",
    description="Differentially private microdata release of one dataset extract",
    flow_run_name=run_name,
    task_runner=ThreadPoolTaskRunner(max_workers=workers_from_env()),
    log_prints=False,
    # validated inside the flow, so that a wrong field ends Refused with one sentence (and the
    # budget artifacts refreshed) instead of Prefect's ParameterTypeError traceback
    validate_parameters=False,
)
def release_flow(request: FormRequest) -> Any:
    """Run one release; returns the release id, folder and manifest. A request refused before
    any spend ends in state 'Refused' (an in-process caller gets the exception); an unchanged
    extract with ``skip_unchanged`` ends in 'No new data'."""
    quiet_refusals()  # before any task can log a refusal as a crash
    budget = BudgetInView(_dataset_named(request))
    try:
        return with_accuracy_message(_release(as_request(request), budget))
    except REFUSALS as exc:
        return refused(exc)
    finally:  # budget and release catalogue in the UI after every run, refused ones included
        budget.finish()


def with_accuracy_message(result: Any) -> Any:
    """A released run ends 'Published' (publication verdict fit) or 'Published with warnings'
    (``flows/states.published``), the verdict's headline in the state's message, which the run
    page shows beside the state; then the steward's accuracy verdict (and warnings), labelled
    as the raw-data evaluation, in the log-safe wording (values named only from a declared
    public domain: Prefect stores the message)."""
    if not isinstance(result, dict) or not result.get("release_id"):
        return result
    manifest = result.get("manifest") or {}
    where = release_link(manifest.get("dataset", ""), result["release_id"])
    accuracy = result.get("accuracy") or {}
    steward = [accuracy["log_verdict"], *accuracy.get("log_warnings", [])] \
        if accuracy.get("log_verdict") else []
    return published_state(where, verdict_of_manifest(manifest), steward, result)


def as_request(given: Any) -> ReleaseRequest:
    """The request as the form or an API caller sent it, checked field by field; what is wrong
    is refused as one sentence per field (which field, what is allowed)."""
    if isinstance(given, ReleaseRequest):
        return given
    try:
        return ReleaseRequest.model_validate(given if given is not None else {})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or 'request'}: "
            f"{str(error['msg']).removeprefix('Value error, ')}" for error in exc.errors())
        raise ParameterError(f"the request cannot be run — {problems}. Nothing was read or "
                             "spent.") from None


def _dataset_named(given: Any) -> str:
    """The dataset whose budget artifacts to refresh, even when the request is refused."""
    if isinstance(given, ReleaseRequest):
        return given.dataset
    named = given.get("dataset") if isinstance(given, dict) else None
    return named if isinstance(named, str) and named else ReleaseRequest().dataset


@dataclass
class BudgetInView:
    """The dataset's budget and release catalogue artifacts, written once per run: as soon as a
    release's spend is final (on the flow's task runner, while its evaluation runs), else at
    the run's end, refused runs included. Never hides the run's own outcome."""

    dataset: str
    pending: Any = None  # the write started after the publication

    def start(self) -> None:
        self.pending = publish_budget_artifacts.submit(self.dataset)

    def finish(self) -> None:
        try:
            if self.pending is not None:
                self.pending.result()
            else:
                publish_budget_artifacts(self.dataset)
        except Exception as exc:  # the ledger itself is checked by the release steps
            get_run_logger().warning("budget artifacts not written (%s)", type(exc).__name__)


def _release(request: ReleaseRequest, budget: BudgetInView) -> Any:
    run_id = str(flow_run.id) if flow_run.id else None
    ledger = ledger_location()
    decided = _retry_of_a_charged_run(ledger, run_id)
    if decided is not None:
        return decided
    refuse_missing_input(request.dataset, request.input_path)
    with ticking("resolving the request", "the plan, then the extract's files (copied and "
                 "hashed)"):
        resolved = resolve_request(request.dataset, request.mechanism, request.epsilon,
                                   request.parameters, request.input_path, request.seed,
                                   ledger, void_confirmed=request.void_lifetime_guarantee,
                                   # a scheduled run's unchanged extract ends 'No new data'
                                   budget_first=not request.skip_unchanged)
    test = resolved.plan.random.test_release
    release_id = new_release_id(resolved.mechanism, resolved.requested_at, test)
    # no link yet: a release refused or rejected later would leave a link to nothing in the
    # log; the state message (and a last log line) give it once the release is published
    get_run_logger().info(
        "release %s of %s started; %s", release_id, resolved.config.name,
        "after a review (the run pauses for its form), its portal link comes with its "
        "publication" if resolved.config.review == "required"
        else "its portal link comes with its publication (the run's state says how it ended)")
    try:
        return _release_resolved(request, budget, resolved, run_id, ledger, release_id)
    finally:  # the run's private copies of the extract (raw data) go with it
        resolved.extract.discard()


REVIEW_ENDINGS = ("rejected at review", "review timed out")


def _retry_of_a_charged_run(ledger: str, run_id: str | None) -> Any:
    """Prefect's Retry runs a finished run again, with its parameters and its id. A run that
    was already charged never charges again (the ledger refuses it at the charge); here, before
    anything is read, the retry is answered in the words of what happened: a rejected or
    unreviewed release ends 'Not published' again (its badge stays what it was, and it says a
    new run is a new spend), a published one or one that failed after its charge is refused
    naming it. A first run, or a retry of a run refused before its charge, goes on."""
    if run_id is None or flow_run.run_count == 1 or not ledger_exists(ledger):
        return None
    spend = next((s for s in open_ledger(ledger).spends() if s.flow_run_id == run_id), None)
    if spend is None:
        return None
    new_run = ("To release again, start a new run (Deployments → on-demand → Run): a new run "
               "is a new spend of the source's budget.")
    if spend.status == "failed" and (spend.note or "").startswith(REVIEW_ENDINGS):
        return not_published(
            f"Retry: this run's release was {spend.note} — it stays not published, and this "
            f"retry spent nothing. Its spend (epsilon {spend.epsilon:g}) stays counted: the "
            f"noise was drawn. {new_run}",
            {"release_id": None, "flow_run_id": run_id, "retried": True})
    if spend.status == "released":
        raise PolicyError(f"Retry: this run already published release {spend.release_id}; "
                          f"retrying it would spend the budget a second time. {new_run}")
    raise PolicyError(
        f"Retry: this run was already charged (epsilon {spend.epsilon:g}, now "
        f"'{spend.status}': {spend.note or 'no note'}); its spend stays counted because noise "
        "may have been drawn before it stopped, and a retry would charge it a second time. "
        f"Fix the cause shown in its log, then {new_run[0].lower()}{new_run[1:]}")


def _release_resolved(request: ReleaseRequest, budget: BudgetInView, resolved: ResolvedRequest,
                      run_id: str | None, ledger: str, release_id: str | None = None) -> Any:
    """The release of a resolved request: every step reads the extract's snapshots."""
    config, release_plan, extract = resolved.config, resolved.plan, resolved.extract
    if request.skip_unchanged:
        previous = released_before(quote(config), quote(extract))
        if previous:
            return skipped("No new data", f"the extract of {config.name} is unchanged since "
                           f"release {previous}; nothing released, nothing spent (run without "
                           "'skip if unchanged' to release it again)", {"release_id": None})
    if not uses_counts(resolved.mechanism):
        with ticking("reading and checking the extract"):
            frame, input_info = load_and_validate_input(quote(config), quote(extract),
                                                        release_plan.unit)
        check_secret_available(release_plan)
        check_before_charge(quote(config), release_plan, ledger, request.destination)
        charge = charge_budget(quote(config), release_plan, ledger, run_id, extract.claims)
        return _release_directly(request, budget, config, frame, input_info, release_plan,
                                 charge, ledger, run_id, resolved.requested_at, release_id)
    # Lattice mechanisms: one streamed pass validates and aggregates before any budget is spent
    # (on the Dask workers, one file each, when the extract is several files).
    fan_out = contextlib.ExitStack()
    runner = fan_out.enter_context(fan_out_runner(request.task_runner))
    try:
        connect(runner, request.task_runner)  # a runner that cannot start costs no budget
        with ticking("reading and counting the extract", f"{len(extract.files)} file(s)"):
            counts, input_info = _validate_and_aggregate(request, resolved, runner)
        extract = extract.counted(input_info.rows_sha256,  # the digests the count took
                                  input_info.text_rows_sha256)
        context = ReleaseContext.from_counts(counts)
        fixed = fixed_index(context, release_plan)  # a fixed node outside its limits fails here
        enforce_noise_rows(config, context, release_plan)
        check_before_charge(quote(config), release_plan, ledger, request.destination)
        charge = charge_budget(quote(config), release_plan, ledger, run_id, extract.claims)
    except BaseException:
        fan_out.close()
        raise
    try:
        with charged(ledger, charge):
            with fan_out:  # the runner started before the charge; closed after the fan-out
                pieces = PrefectPieces(runner, quoted=request.task_runner == "thread")
                if capabilities(resolved.mechanism).kind == "synthetic":
                    chosen, candidates = _synthesize(config, counts, release_plan, pieces)
                else:
                    chosen, candidates = _choose_and_materialize(request, config, context,
                                                                 release_plan, pieces, fixed)
            checks = check_output(quote(config), quote(context), quote(chosen),
                                  release_plan.mechanism)
            facts = RunFacts(config, input_info, release_plan, context, chosen, charge, checks,
                             candidates, run_id, resolved.requested_at, release_id)
            if config.review == "required":
                return _reviewed(request, budget, facts, ledger, counts)
            published = publish_release(quote(facts), request.destination)
            finalize_spend(ledger, charge.spend_id, "released", release_id=published.release_id)
    finally:
        fan_out.close()  # no-op when the fan-out already closed it
    return _with_artifacts(request, published, run_id, candidates, budget, counts)


def _choose_and_materialize(request: ReleaseRequest, config, context: ReleaseContext,
                            release_plan, pieces: PrefectPieces, index: int | None
                            ) -> tuple[Any, pd.DataFrame]:
    """Score the candidates (fanned out), select privately, draw the chosen node's release.

    A fixed-node mechanism (histogram, ``index`` given) is not scored: its one noisy draw is
    the release, and the steward's candidate summary is computed from that very draw.
    """
    if index is not None:
        chosen = materialize_release(quote(context), release_plan, index)
        return chosen, candidates_frame(context, [chosen.summary], np.array([1.0]))
    summaries = _score_candidates(request, config, context, release_plan, pieces)
    index, probabilities = select_candidate(release_plan, quote(summaries))
    report_progress("materializing the chosen node", 0, None,
                    f"of a {len(context.lattice):,}-node lattice")
    chosen = materialize_release(quote(context), release_plan, index)
    return chosen, candidates_frame(context, summaries, probabilities)


def _synthesize(config, counts, release_plan, pieces: PrefectPieces) -> tuple[Any, pd.DataFrame]:
    """``aim``'s rounds: each round's candidates scored as tasks fanned out over batches, one
    selected and measured, the model re-fitted; rounds logged and shown as an artifact."""
    logger = get_run_logger()
    columns = len(counts.dimensions) + len(counts.informative.columns)
    with ticking("aim: round 0", f"one-way marginals of {columns} columns and the "
                 "candidates' true marginals"):
        run = start_rounds(quote(counts), quote(config), release_plan)
    progress_id = create_progress_artifact(
        progress=0.0, key=artifact_key(config.name, "aim-budget-used"),
        description="aim: share of the release's rho spent by the rounds so far")
    _report_rounds(run, 0)

    def after_round(record) -> None:
        update_progress_artifact(progress_id, progress=min(100.0, 100.0 * record.rho_used
                                                           / run.settings.rho))
        _report_rounds(run, record.round)

    run_rounds(run, pieces, after_round)
    with ticking("aim: sampling rows", "from the fitted model, then the error bars"):
        chosen = sample_rows(quote(run), quote(counts), release_plan)
    _rounds_artifact(config.name, run)
    sampled = len(chosen.rows)  # a DP output: the noisy total (capped), never the input's count
    logger.info("aim: %d rounds, %s synthetic rows sampled from the model",
                len(run.state.records), f"{sampled:,}")
    return chosen, pd.DataFrame()


def _report_rounds(run, done: int) -> None:
    """Round ``done`` of about the rounds the run's budget left buys at its current cost
    (``AIMRounds.rounds_estimate``: it falls as rounds anneal, where the nominal number
    stayed; issue 55: "of about 44" ended at 16); the share of rho spent is the progress,
    and its time left is measured from it."""
    share = min(1.0, run.state.rho_used / run.settings.rho)
    report_progress(f"aim round {done} of about {run.rounds_estimate()}", share, 1.0,
                    f"rho used {share:.0%}")


def _rounds_artifact(dataset: str, run) -> None:
    """Every round as a table (public: columns, levels, sigma, selection epsilon, rho)."""
    rows = [{"round": r.round, "marginal": " x ".join(r.columns),
             "levels": ", ".join(str(x) for x in r.levels), "cells": r.cells,
             "sigma": round(r.sigma, 2), "selection eps": round(r.selection_epsilon, 4),
             "rho used": f"{r.rho_used / run.settings.rho:.0%}",
             "annealed": "yes" if r.annealed else ""} for r in run.state.records]
    table_artifact(key=artifact_key(dataset, "aim-rounds"), table=rows,
                   description="aim: the marginals measured, round by round (DP outputs)")


def _validate_and_aggregate(request: ReleaseRequest, resolved: ResolvedRequest,
                            runner) -> tuple[Any, Any]:
    """The count table: in this process, or file by file on the Dask workers (each reads and
    aggregates its own files; a bad row in any file stops the run before any spend)."""
    config, extract = resolved.config, resolved.extract
    unit = resolved.plan.unit
    if request.task_runner != "dask" or len(extract.files) < 2 or unit is not None:
        return validate_and_aggregate(quote(config), quote(extract), unit=unit)
    futures = runner.map(aggregate_partition, {"config": unmapped(config),
                                               "file": list(extract.files)})
    parts = [future.result() for future in futures]
    return merge_partitions(quote(config), quote(parts), extract.pattern)


def _score_candidates(request: ReleaseRequest, config, context: ReleaseContext, release_plan,
                      pieces: PrefectPieces) -> list:
    """The engine's scoring loop (``score_lattice``) with its pieces as tasks, its progress on
    the bar and in a progress artifact."""
    logger = get_run_logger()
    progress_id = create_progress_artifact(
        progress=0.0, key=artifact_key(config.name, "scoring-progress"),
        description=f"Lattice nodes scored ({len(context.lattice):,} nodes)")

    def progress(done: int, total: int, note: str | None) -> None:
        if total == 0:  # the deterministic search (kanon): one step in the flow
            report_progress("searching the lattice", 0, None, note)
            return
        if done == 0:
            logger.info("scoring on the %s task runner", request.task_runner)
        elif note is None:
            update_progress_artifact(progress_id, progress=100.0 * done / total)
        report_progress("scoring lattice nodes", done, total,
                        f"{done:,}/{total:,} nodes" + (f"; {note}" if note else ""),
                        headline=note is not None)

    summaries = score_lattice(context, release_plan, pieces, request.batch_size, progress,
                              logger.info)
    if get_mechanism(release_plan.mechanism).selection == "minimum_loss":
        update_progress_artifact(progress_id, progress=100.0)
    else:
        logger.info("scored all %d candidate lattice nodes", len(summaries))
    return summaries


def _result(request: ReleaseRequest, published: PublishResult, run_id: str | None,
            evaluated: dict[str, Any] | None) -> dict[str, Any]:
    evaluated = evaluated or {}
    return {"release_id": published.release_id, "path": published.path,
            "manifest": published.manifest, "record": published.record,
            "test_release": published.test_release, "flow_run_id": run_id,
            "evaluation": evaluated.get("report"),
            "accuracy": {key: evaluated.get(key) for key in
                         ("verdict", "warnings", "log_verdict", "log_warnings")}
            if evaluated else None}


def _evaluate_after(request: ReleaseRequest, release_path: str, counts: Any = None
                    ) -> dict[str, Any] | None:
    """Evaluate the release (the evaluate flow's tasks, run in this flow, from the run's count
    table when it has one): the report's path, the accuracy verdict and its warnings. The
    release stands even if its evaluation fails."""
    if not request.evaluate:
        return None
    try:
        with ticking("evaluating the release", "against the input (steward only)"):
            return evaluate_steps(release_path, counts=counts)
    except Exception as exc:  # evidence is best effort; the release is already published
        get_run_logger().warning("evaluation of %s failed: %s: %s", release_path,
                                 type(exc).__name__, exc)
        return None


def _release_directly(request: ReleaseRequest, budget: BudgetInView, config, frame,
                      input_info, release_plan, charge: Charge, ledger: str,
                      run_id: str | None, requested_at=None,
                      release_id: str | None = None) -> dict[str, Any]:
    """Mechanisms without a lattice search (Mondrian, pseudonymization, DiffGen)."""
    with charged(ledger, charge):
        with ticking(f"{release_plan.mechanism}: releasing from the rows"):
            chosen = release_rows(quote(config), quote(frame), release_plan,
                                  quote(input_info.unit_bound))
        checks = check_output(quote(config), None, quote(chosen), release_plan.mechanism)
        facts = RunFacts(config, input_info, release_plan, None, chosen, charge, checks,
                         pd.DataFrame(), run_id, requested_at, release_id)
        if config.review == "required":
            return _reviewed(request, budget, facts, ledger, None)
        published = publish_release(quote(facts), request.destination)
        finalize_spend(ledger, charge.spend_id, "released", release_id=published.release_id)
    return _with_artifacts(request, published, run_id, pd.DataFrame(), budget)


def _reviewed(request: ReleaseRequest, budget: BudgetInView, facts: RunFacts, ledger: str,
              counts: Any) -> Any:
    """``review: required``: stage the release, write its evidence, pause for the decision;
    approve publishes the staged folder atomically, reject or a timeout publishes nothing.
    The spend stays counted either way (its noise was drawn); the decision and its reason go
    to the steward record and the ledger's note, with the publication verdict the reviewer
    saw. The form shows that verdict and no raw-data evidence (``flows/review.py``): the
    evaluation is written to the steward record before the pause, but the gate never reads
    it, so the decision is post-processing of the release."""
    config, spend_id = facts.config, facts.charge.spend_id
    staged = stage_release(quote(facts))
    try:
        evaluated = _evaluate_after(request, staged.path, counts)
        summary = summary_of(staged, evaluated, config.review_timeout_hours)
        review = {**await_review(summary), "publication_verdict": summary.verdict_level}
        if review["decision"] == "approve":
            published = publish_staged(staged, config.name, request.destination, review)
        else:
            withdraw_staged(staged, config.name, review)
    except BaseException as exc:  # a crash, or a cancellation while paused (SIGTERM)
        _withdraw_after(staged, config.name, exc)
        raise
    if review["decision"] == "approve":
        finalize_spend(ledger, spend_id, "released", release_id=published.release_id,
                       note=f"approved at review: {review['reason']}"[:500])
        return _with_artifacts(request, published, facts.flow_run_id, facts.candidates,
                               budget, evaluated=evaluated)
    what = ("rejected at review" if review["decision"] == "reject" else "review timed out")
    finalize_spend(ledger, spend_id, "failed",
                   note=f"{what} (release {staged.release_id} not published): "
                        f"{review['reason']}"[:500])
    return not_published(
        f"release {staged.release_id} of {config.name} was not published: {what} "
        f"({review['reason']}). Its spend (epsilon {facts.release_plan.guarantee.epsilon or 0:g})"
        f" stays counted: the noise was drawn. Its publication verdict was: "
        f"{summary.verdict_headline}",
        {"release_id": None, "staged_release_id": staged.release_id, "review": review,
         "flow_run_id": facts.flow_run_id, "evaluation": (evaluated or {}).get("report")})


def _withdraw_after(staged: PublishResult, dataset: str, exc: BaseException) -> None:
    """A review that ended before its decision was carried out: the staged data goes (called
    directly, not as a task, so that it also runs while the run is being cancelled)."""
    withdraw_ended(staged, dataset, f"the run ended before a decision was carried out "
                                    f"({type(exc).__name__}: {exc})"[:500])


def _with_artifacts(request: ReleaseRequest, published: PublishResult, run_id: str | None,
                    candidates: pd.DataFrame, budget: BudgetInView,
                    counts: Any = None, evaluated: dict[str, Any] | None = None
                    ) -> dict[str, Any]:
    """The release's artifacts and the budget's, written on the flow's task runner while the
    evaluation runs here: their calls wait on the API while the evaluation computes. The
    release summary comes after the evaluation, so that it opens with the accuracy verdict
    and its warnings."""
    artifacts = publish_artifacts.submit(published.manifest, published.record, quote(candidates))
    budget.start()
    if evaluated is None:  # (a reviewed release was evaluated before its review)
        evaluated = _evaluate_after(request, published.path, counts)
    summary = publish_release_summary.submit(published.manifest, published.record,
                                             quote(candidates), evaluated)
    artifacts.result()  # their failure, if any, is the run's
    summary.result()
    return _result(request, published, run_id, evaluated)


def artifacts_of_run(flow_run_id: str) -> list[tuple[str, str, str]]:
    """(key, type, description) of every artifact a flow run created, read from the Prefect API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return [(a.key or "-", a.type or "-", (a.description or "")[:80]) for a in found]
