"""Review before publishing (a dataset's ``review: required``): the release and its evidence are
built into the staging area, then the run pauses with a form (Prefect's ``pause_flow_run`` with
``wait_for_input``) until a steward approves or rejects it, with a reason.

The form says, before the choice, that the spend stays counted: the noise was drawn when the
release was built, so rejecting it gives no budget back. A review left open past the dataset's
``review_timeout_hours`` ends the run as *Not published*.

What the form shows is the staged release's public facts and its **publication verdict**
(``medrelease.evidence.verdict``: computed from the released rows, the mechanism's published
outputs and public parameters), never the steward's accuracy report, which compares with the
raw input: a decision taken on that report would choose which noisy run gets published with
the true data, outside the guarantee (docs/PRIVACY.md, "What the review may look at").

``medrelease release`` answers the same pause from the terminal (or its ``--approve`` /
``--reject`` flags): it registers a *local reviewer* for the run it starts in-process, which
resumes the paused run with its decision through Prefect's API, exactly as the UI's form does.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from prefect import get_run_logger
from prefect.context import FlowRunContext
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run, resume_flow_run
from prefect.input import RunInput
from prefect.utilities.annotations import quote
from pydantic import Field

from flows.outcome import BudgetInView, evaluate_after, with_artifacts
from flows.request_form import ReleaseRequest
from flows.states import not_published
from medrelease.evidence.verdict import verdict_of_manifest
from medrelease.storage.links import staged_link
from tasks.artifacts import inert
from tasks.budget import finalize_spend
from tasks.publish import (
    PublishResult,
    RunFacts,
    publish_staged,
    stage_release,
    withdraw_ended,
    withdraw_staged,
)

POLL_S = 2  # how often the paused run looks for the decision (Prefect's default is 10 s)
PREFECT_MARGIN_S = 3600  # Prefect's pause deadline after ours (it fails a run left past it)


class ReviewDecision(RunInput):
    """The review form: approve or reject, and why (both go to the steward record and the
    ledger)."""

    decision: Literal["approve", "reject"] = Field(
        title="Decision",
        description="approve: publish this release now, exactly as staged. reject: publish "
                    "nothing. Either way the privacy budget it spent stays counted: its noise "
                    "was drawn when it was built.")
    reason: str = Field(
        default="", max_length=1000, title="Reason",
        description="Why (kept in the steward record and the ledger; never published)")


# What the form says instead of the steward's raw-data evaluation (docs/PRIVACY.md).
RAW_EVALUATION_NOTE = (
    "The steward's raw-data evaluation is in the steward record; deciding from it whether to "
    "publish, or rerunning after a rejection because of it, falls outside the guarantee "
    "(docs: PRIVACY.md, 'What the review may look at').")


@dataclass(frozen=True)
class ReviewSummary:
    """What the reviewer sees before choosing: public facts of the staged release and its
    publication verdict — nothing computed from the raw input.

    Why not the steward's accuracy report: it compares the release with the input, so a
    decision taken on it chooses which noisy run gets published with the true data, which no
    budget step pays for (docs/PRIVACY.md, "What the review may look at"). Every field here is
    in the staged manifest (public parameters, DP outputs, the verdict computed from them and
    the released rows) or names the staged folder: two neighbouring inputs that gave the same
    release give the same summary, so deciding on it is post-processing."""

    dataset: str
    release_id: str
    mechanism: str
    guarantee: str
    epsilon_spent: float
    released_rows: int
    lifetime: str
    staged_path: str
    staged_url: str
    verdict_level: str
    verdict_headline: str
    verdict_analyses: tuple[str, ...]
    timeout_hours: float
    test_release: bool = False

    def verdict_lines(self) -> list[str]:
        """The verdict in plain text, for the terminal's reviewer (same words as the form)."""
        return [f"publication verdict: {self.verdict_headline}",
                *(f"  - {line}" for line in self.verdict_analyses)]

    def markdown(self) -> str:
        """The text above the form in Prefect's UI (Markdown), made inert as every artifact's
        (``tasks.artifacts.inert``): the verdict names released values, which may be written
        as HTML or markdown (an image, a link)."""
        analyses = [f"  - {_markdown(line)}" for line in self.verdict_analyses]
        return inert("\n".join([
            f"### Review release `{self.release_id}` of `{self.dataset}` before it is published",
            "",
            f"**The budget is already spent and stays counted whichever you choose** "
            f"(epsilon {self.epsilon_spent:g} on this source): its noise was drawn when the "
            "release was built. *Approve* publishes it exactly as staged; *Reject* publishes "
            "nothing.",
            "",
            f"**Publication verdict: {self.verdict_level}** — {_markdown(self.verdict_headline)}",
            *(["", "Declared analyses:", *analyses] if analyses else []),
            "",
            "The verdict is computed from the staged release alone (its rows, the mechanism's "
            "published outputs, public parameters and declarations), so deciding on it keeps "
            "the guarantee.",
            "",
            f"- mechanism: `{self.mechanism}` — {self.guarantee}",
            f"- rows released: {self.released_rows:,}",
            f"- staged release (data, manifest, report): [open it in the portal]"
            f"({self.staged_url})",
            f"- staged folder: `{self.staged_path}`",
            f"- lifetime of the source: {self.lifetime}",
            "",
            RAW_EVALUATION_NOTE,
            "",
            f"Left open for {self.timeout_hours:g} h, the run ends *Not published*.",
        ]))


def _markdown(text: str) -> str:
    """Verdict text shown as itself: '*' (the suppressed label) and '_' escaped."""
    return text.replace("\\", "\\\\").replace("*", "\\*").replace("_", "\\_")


def summary_of(staged: Any, evaluated: dict[str, Any] | None, timeout_hours: float
               ) -> ReviewSummary:
    """``staged``: the ``PublishResult`` of ``stage_release``. The summary is read from its
    manifest alone: ``evaluated`` (the steward's raw-data evaluation, which the run keeps in the
    steward record) is accepted and deliberately not read — see ``ReviewSummary``."""
    del evaluated  # raw-data evidence: never a publication criterion
    manifest = staged.manifest
    verdict = verdict_of_manifest(manifest) or {}
    return ReviewSummary(
        dataset=manifest["dataset"], release_id=staged.release_id,
        mechanism=manifest["mechanism"], guarantee=manifest["guarantee"]["statement"],
        epsilon_spent=float(manifest["epsilon_spent"]),
        released_rows=int(manifest["released_rows"]),
        lifetime=manifest["lifetime"]["statement"], staged_path=staged.path,
        staged_url=staged_link(manifest["dataset"], staged.release_id),
        verdict_level=str(verdict.get("level") or "not computed"),
        verdict_headline=str(verdict.get("headline") or "no publication verdict in the manifest"),
        verdict_analyses=tuple(f"{a['name']}: {a['status']} — {a['why']}"
                               for a in verdict.get("analyses") or []),
        timeout_hours=timeout_hours, test_release=bool(manifest["test_release"]))


# medrelease release registers one for the run it starts in this process: given the summary,
# it returns the decision (or None: leave the run waiting for the UI's form).
LocalReviewer = Callable[[ReviewSummary], "ReviewDecision | dict | None"]
_local_reviewer: LocalReviewer | None = None


def set_local_reviewer(reviewer: LocalReviewer | None) -> None:
    global _local_reviewer
    _local_reviewer = reviewer


def await_review(summary: ReviewSummary) -> dict[str, Any]:
    """Pause the run until the steward decides; the decision as the steward record and the
    ledger keep it: {"decision": approve | reject | timeout, "reason", "decided_at"}."""
    logger = get_run_logger()
    logger.warning("waiting for review: release %s of %s is staged at %s; approve or reject "
                   "it in this run's form (Resume), within %g h. The spend stays counted either "
                   "way.", summary.release_id, summary.dataset, summary.staged_url,
                   summary.timeout_hours)
    context = FlowRunContext.get()
    run_id = context.flow_run.id if context and context.flow_run else None
    if _local_reviewer is not None and run_id is not None:
        threading.Thread(target=_answer_locally, args=(_local_reviewer, summary, run_id),
                         name="medrelease-local-review", daemon=True).start()
    timeout = max(1, round(summary.timeout_hours * 3600))
    timed_out = f"(timeout {uuid.uuid4().hex})"  # the watchdog's reason: no form sends it
    watchdog = threading.Timer(timeout, _end_at_timeout, args=(run_id, timed_out))
    watchdog.daemon = True
    if run_id is not None:
        watchdog.start()
    left_open = {"decision": "timeout", "decided_at": _now(),
                 "reason": f"the review was left open past {summary.timeout_hours:g} h"}
    try:
        # Prefect's own deadline is later than ours: a run whose pause expired can only end
        # Failed, while ours ends it 'Not published' (the watchdog resumes it, as a form would).
        decision = pause_flow_run(
            wait_for_input=ReviewDecision.with_initial_data(description=summary.markdown()),
            timeout=timeout + PREFECT_MARGIN_S, poll_interval=min(POLL_S, timeout),
            key="review")
    except FlowPauseTimeout:
        return left_open
    finally:
        watchdog.cancel()
    if decision.reason == timed_out:
        return {**left_open, "decided_at": _now()}
    reason = decision.reason.strip() or "(no reason given)"
    logger.info("review: %s (%s)", decision.decision, reason)
    return {"decision": decision.decision, "reason": reason, "decided_at": _now()}


def _answer_locally(reviewer: LocalReviewer, summary: ReviewSummary, run_id: Any) -> None:
    """The terminal's (or a flag's) decision, sent once the run is paused, as the form sends
    it. Nothing is sent when the reviewer leaves it to the UI (returns None)."""
    from prefect.client.orchestration import get_client

    answer = reviewer(summary)
    if answer is None:
        return
    run_input = answer.model_dump(include={"decision", "reason"}) \
        if isinstance(answer, ReviewDecision) else dict(answer)
    deadline = time.monotonic() + 600
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            state = client.read_flow_run(run_id).state
            keyset = state.state_details.run_input_keyset if state is not None else None
            if state is not None and state.is_paused() and keyset:
                try:  # the form's schema is saved just after the pause
                    client.read_flow_run_input(run_id, keyset["schema"])
                    break
                except Exception:
                    pass
            time.sleep(0.3)
    resume_flow_run(run_id, run_input=run_input)


def _end_at_timeout(run_id: Any, token: str) -> None:
    """At the review's deadline, resume the run with the watchdog's reason (a steward who
    answered first wins: the run is then no longer paused)."""
    try:
        resume_flow_run(run_id, run_input={"decision": "reject", "reason": token})
    except Exception:  # already resumed by a steward, or the API is gone: nothing to end
        return


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def reviewed(request: ReleaseRequest, budget: BudgetInView, facts: RunFacts, ledger: str,
              counts: Any) -> Any:
    """``review: required``: stage the release, write its evidence, pause for the decision;
    approve publishes the staged folder atomically, reject or a timeout publishes nothing.
    The spend stays counted either way (its noise was drawn); the decision and its reason go
    to the steward record and the ledger's note, with the publication verdict the reviewer
    saw. The form shows that verdict and no raw-data evidence (``await_review``): the
    evaluation is written to the steward record before the pause, but the gate never reads
    it, so the decision is post-processing of the release."""
    config, spend_id = facts.config, facts.charge.spend_id
    staged = stage_release(quote(facts))
    try:
        evaluated = evaluate_after(request, staged.path, counts)
        summary = summary_of(staged, evaluated, config.review_timeout_hours)
        review = {**await_review(summary), "publication_verdict": summary.verdict_level}
        if review["decision"] == "approve":
            published = publish_staged(staged, config.name, request.destination, review)
        else:
            withdraw_staged(staged, config.name, review)
    except BaseException as exc:  # a crash, or a cancellation while paused (SIGTERM)
        withdraw_after(staged, config.name, exc)
        raise
    if review["decision"] == "approve":
        finalize_spend(ledger, spend_id, "released", release_id=published.release_id,
                       note=f"approved at review: {review['reason']}"[:500])
        return with_artifacts(request, published, facts.flow_run_id, facts.candidates,
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


def withdraw_after(staged: PublishResult, dataset: str, exc: BaseException) -> None:
    """A review that ended before its decision was carried out: the staged data goes (called
    directly, not as a task, so that it also runs while the run is being cancelled)."""
    withdraw_ended(staged, dataset, f"the run ended before a decision was carried out "
                                    f"({type(exc).__name__}: {exc})"[:500])
