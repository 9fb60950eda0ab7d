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
from typing import Annotated, Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.annotations import quote
from pydantic import Field

from flows.outcome import (
    BudgetInView,
    retry_of_a_charged_run,
    with_accuracy_message,
    with_artifacts,
)
from flows.prepare import refuse_missing_input
from flows.progress import ticking
from flows.request_form import ReleaseRequest, as_request, dataset_named, run_name
from flows.review import reviewed
from flows.stage_hooks import FlowHooks
from flows.states import REFUSALS, quiet_refusals, refused, skipped
from medrelease.release import choose
from medrelease.request import ResolvedRequest
from medrelease.settings import ledger_location
from medrelease.stages import workers_from_env
from medrelease.storage.store import new_release_id
from tasks.budget import (
    charge_budget,
    charged,
    check_before_charge,
    finalize_spend,
)
from tasks.checks import check_output
from tasks.executor import PrefectPieces
from tasks.inputs import read_extract, read_step, released_before
from tasks.publish import (
    RunFacts,
    publish_release,
)
from tasks.request import resolve_request
from tasks.runners import connect, fan_out_runner, runner_kind

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
    budget = BudgetInView(dataset_named(request))
    try:
        return with_accuracy_message(_release(as_request(request), budget))
    except REFUSALS as exc:
        return refused(exc)
    finally:  # budget and release catalogue in the UI after every run, refused ones included
        budget.finish()


def _release(request: ReleaseRequest, budget: BudgetInView) -> Any:
    run_id = str(flow_run.id) if flow_run.id else None
    ledger = ledger_location()
    decided = retry_of_a_charged_run(ledger, run_id)
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


def _release_resolved(request: ReleaseRequest, budget: BudgetInView, resolved: ResolvedRequest,
                      run_id: str | None, ledger: str, release_id: str | None = None) -> Any:
    """The release of a resolved request, in the engine's stages (``medrelease/refusals.py``
    for what refuses where): read the extract's snapshots, refuse before the charge, charge,
    choose and draw (``choose``: the mechanism's kind decides, the pieces run as tasks), check
    the output, then publish or pause for review."""
    config, release_plan, extract = resolved.config, resolved.plan, resolved.extract
    if request.skip_unchanged:
        previous = released_before(quote(config), quote(extract))
        if previous:
            return skipped("No new data", f"the extract of {config.name} is unchanged since "
                           f"release {previous}; nothing released, nothing spent (run without "
                           "'skip if unchanged' to release it again)", {"release_id": None})
    kind = runner_kind(request.task_runner, release_plan)
    fan_out = contextlib.ExitStack()  # (Dask: workers read the files, then score the nodes)
    runner = fan_out.enter_context(fan_out_runner(kind))
    try:
        connect(runner, kind)  # a runner that cannot start costs no budget
        with ticking(read_step(release_plan), f"{len(extract.files)} file(s)"):
            inputs = read_extract(config, extract, release_plan, runner, kind)
        if inputs.counts is not None:  # the digests the count took
            extract = extract.counted(inputs.info.rows_sha256, inputs.info.text_rows_sha256)
        check_before_charge(quote(config), release_plan, quote(inputs.context), ledger,
                            request.destination)
        charge = charge_budget(quote(config), release_plan, ledger, run_id, extract.claims)
    except BaseException:
        fan_out.close()
        raise
    try:
        with charged(ledger, charge):
            with fan_out:  # the runner started before the charge; closed after the fan-out
                pieces = PrefectPieces(runner, quoted=kind == "thread")
                chosen, candidates = choose(inputs, config, release_plan, pieces,
                                            FlowHooks(config.name, kind), request.batch_size)
            checks = check_output(quote(config), quote(inputs.context), quote(chosen),
                                  release_plan.mechanism)
            facts = RunFacts(config, inputs.info, release_plan, inputs.context, chosen, charge,
                             checks, candidates, run_id, resolved.requested_at, release_id)
            if config.review == "required":
                return reviewed(request, budget, facts, ledger, inputs.counts)
            published = publish_release(quote(facts), request.destination)
            finalize_spend(ledger, charge.spend_id, "released", release_id=published.release_id)
    finally:
        fan_out.close()  # no-op when the fan-out already closed it
    return with_artifacts(request, published, run_id, candidates, budget, inputs.counts)
