"""How a release run ends, once its release is drawn: the release's artifacts and the budget's,
the evaluation (steward only), the result a caller gets and the state the run shows; and a
Retry of a run that was already charged, answered before anything is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
from prefect import get_run_logger
from prefect.runtime import flow_run
from prefect.utilities.annotations import quote

from flows.evaluate import evaluate_steps
from flows.progress import ticking
from flows.request_form import ReleaseRequest
from flows.states import not_published
from flows.states import published as published_state
from medrelease.errors import PolicyError
from medrelease.evidence.verdict import verdict_of_manifest
from medrelease.privacy.ledger_backends import ledger_exists, open_ledger
from medrelease.storage.links import release_link
from tasks.publish import PublishResult
from tasks.report import publish_artifacts, publish_budget_artifacts, publish_release_summary


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


REVIEW_ENDINGS = ("rejected at review", "review timed out")


def retry_of_a_charged_run(ledger: str, run_id: str | None) -> Any:
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


def result_of(request: ReleaseRequest, published: PublishResult, run_id: str | None,
            evaluated: dict[str, Any] | None) -> dict[str, Any]:
    evaluated = evaluated or {}
    return {"release_id": published.release_id, "path": published.path,
            "manifest": published.manifest, "record": published.record,
            "test_release": published.test_release, "flow_run_id": run_id,
            "evaluation": evaluated.get("report"),
            "accuracy": {key: evaluated.get(key) for key in
                         ("verdict", "warnings", "log_verdict", "log_warnings")}
            if evaluated else None}


def evaluate_after(request: ReleaseRequest, release_path: str, counts: Any = None
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


def with_artifacts(request: ReleaseRequest, published: PublishResult, run_id: str | None,
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
        evaluated = evaluate_after(request, published.path, counts)
    summary = publish_release_summary.submit(published.manifest, published.record,
                                             quote(candidates), evaluated)
    artifacts.result()  # their failure, if any, is the run's
    summary.result()
    return result_of(request, published, run_id, evaluated)


def artifacts_of_run(flow_run_id: str) -> list[tuple[str, str, str]]:
    """(key, type, description) of every artifact a flow run created, read from the Prefect API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return [(a.key or "-", a.type or "-", (a.description or "")[:80]) for a in found]
