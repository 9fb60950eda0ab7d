"""Raise or lower a source's lifetime cap from the Prefect UI (issue 56): the ``set-cap``
deployment's form, with what ``medrelease ledger set-cap`` takes (source, new epsilon, delta,
a reason) and the same engine call, so the same rules hold (a reason of 10+ characters, the
product's bounds, never below what is spent) and the change is journaled beside the ledger
and stated in every later manifest. A budget refusal names this deployment
(``flows/states.refused``); after the change, Retry on the refused run checks it again.
"""

from __future__ import annotations

from typing import Annotated, Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run
from prefect.states import Completed, Failed, State
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from flows.request_form import CAP_DEPLOYMENT, _bundled_configs, _plain
from medrelease.errors import MedreleaseError
from medrelease.privacy.budget_glance import source_budgets
from medrelease.privacy.ledger import MAX_CAP_DELTA, MAX_CAP_EPSILON, MIN_REASON_CHARS
from medrelease.settings import ledger_location

CAP_FLOW = "medrelease-set-cap"
CAP_CHANGED = "Cap changed"


def how_to_raise(source: str | None) -> str:
    """The sentence a budget refusal ends with: where a steward raises the cap, in the UI
    first (the terminal command is for whoever has a shell on the serving host)."""
    named = f"'{source}'" if source else "named above"
    return (f"To raise the cap of source {named}: in the Prefect UI, Deployments → "
            f"{CAP_DEPLOYMENT} → Run → Custom run (source, the new total epsilon, a reason), "
            "then Retry this run; from a terminal: medrelease ledger set-cap "
            f"{source or 'SOURCE'} --epsilon E --delta D --reason TEXT.")


def _sources_help(schema: dict[str, Any]) -> None:
    """Every source the ledger knows with its cap, spend and what is left, and each bundled
    dataset's source: read each time the schema is built (``serve`` rebuilds it every few
    seconds, ``flows/forms.py``), so the form shows the ledger as it is when it opens."""
    budgets = source_budgets(ledger_location())
    if budgets is None:
        known = "the ledger cannot be read just now (the run will say why)"
    elif not budgets:
        known = "none yet: a source's cap is its dataset YAML's until its first release"
    else:
        known = "; ".join(f"**{b.source}**: {b.words()}" for b in budgets)
    owners = "; ".join(f"{c.name} → {c.source_id}" for c in _bundled_configs())
    schema["description"] = (
        "The ledger source whose lifetime cap changes (a budget refusal names it: \"source "
        f"'...'\"). In the ledger now: {known}. Datasets and their sources: {owners}. A source "
        "with no release yet takes its cap from its dataset YAML (privacy.lifetime_epsilon).")


# One model rather than four flow parameters: Prefect titles a flow's plain parameters by
# their Python names and drops their help; a model's fields keep both.
class CapChange(BaseModel):
    """Raise or lower a source's lifetime privacy budget, as 'medrelease ledger set-cap' does:
    the same rules (a reason, the product's bounds, never below what is spent) and the same
    journal. After Submit, the run says the new cap and what is left; a release refused for
    this budget is then checked again by its Retry button."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field(title="Source", min_length=1, json_schema_extra=_sources_help)
    epsilon: float = Field(
        title="New lifetime epsilon (the new total, not an increase)", gt=0,
        le=MAX_CAP_EPSILON,
        description="The source's new total budget: raise it to allow more releases, lower it "
                    "(never below what is already spent) to stop sooner. At most "
                    f"{MAX_CAP_EPSILON:g}. It holds from the next charge on; every later "
                    "manifest of the source states the change, its date and its reason.")
    delta: float | None = Field(
        default=None, title="New lifetime delta (empty = unchanged)", ge=0, le=MAX_CAP_DELTA,
        json_schema_extra=_plain("number"),
        description=f"At most {MAX_CAP_DELTA:g}; leave empty to keep the source's delta.")
    reason: str = Field(
        title="Reason", min_length=MIN_REASON_CHARS,
        description=f"Why (at least {MIN_REASON_CHARS} characters, e.g. 'release board, minute "
                    "12'): kept in the ledger and its journal with the time, and stated in "
                    "every later manifest of the source. Never paste data values here.")


# The flow's one parameter, titled as the form should say it (``flows/release.FormRequest``).
FormCapChange = Annotated[CapChange, Field(json_schema_extra={"title": "Cap change"})]


def cap_run_name() -> str:
    """'cap of <source> → eps <E>': the change findable in the Runs list by what it did."""
    given = (flow_run.parameters or {}).get("change")
    given = given.model_dump() if isinstance(given, CapChange) else given
    given = given if isinstance(given, dict) else {}
    epsilon = given.get("epsilon")
    eps = f" → eps {epsilon:g}" if isinstance(epsilon, int | float) else ""
    return f"cap of {given.get('source') or '?'}{eps}"[:120]


def as_change(given: Any) -> CapChange:
    """The change as the form or an API caller sent it; what is wrong is refused in one
    sentence per field (``MedreleaseError``), as the ledger's own rules are."""
    if isinstance(given, CapChange):
        return given
    try:
        return CapChange.model_validate(given if given is not None else {})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in error['loc']) or 'change'}: "
                             f"{error['msg']}" for error in exc.errors())
        raise MedreleaseError(f"the cap change cannot be made — {problems}") from None


@flow(name=CAP_FLOW, flow_run_name=cap_run_name, log_prints=False,
      description="Raise or lower a source's lifetime privacy budget, with a reason "
                  "(as 'medrelease ledger set-cap')",
      # checked inside: a wrong field ends 'Refused' in one sentence, not in Prefect's
      # parameter-validation traceback
      validate_parameters=False)
def set_cap_flow(change: FormCapChange) -> State:
    """Change the cap with the ledger's own ``set_cap`` (its rules, its journal). Ends 'Cap
    changed' with the source's budget after the change, or 'Refused' with the ledger's one
    sentence and nothing changed; the budget artifacts of the source's datasets follow."""
    from medrelease.privacy.ledger_backends import ledger_exists, open_ledger

    logger = get_run_logger()
    location = ledger_location()
    try:
        change = as_change(change)
        source = change.source
        if not ledger_exists(location):  # opening a missing SQLite ledger would create one
            raise MedreleaseError(f"no ledger at {location} yet: a source's cap is its dataset "
                                  "YAML's until its first release")
        book = open_ledger(location)
        before = book.state(source) if book.knows_source(source) else None
        delta = change.delta if change.delta is not None \
            else before.lifetime_delta if before else 0.0
        book.set_cap(source, float(change.epsilon), float(delta), change.reason)
        after = book.state(source)
        datasets = sorted({spend.dataset for spend in book.spends(source)})
    except MedreleaseError as exc:
        logger.warning("cap not changed: %s", exc)
        return Failed(name="Refused", message=f"Nothing changed: {exc}"[:2000])
    message = (f"cap of source {source!r}: epsilon {before.lifetime_epsilon:g} -> "
               f"{after.lifetime_epsilon:g}, delta {before.lifetime_delta:g} -> "
               f"{after.lifetime_delta:g} ({change.reason.strip()}); spent "
               f"{after.epsilon_spent:g}, left {after.epsilon_left:g}. A run refused for this "
               "budget: open it and click Retry (its request is checked again).")
    logger.info(message)
    _refresh_budget_artifacts(datasets)
    return Completed(name=CAP_CHANGED, message=message[:2000],
                     data={"source": source, "epsilon": after.lifetime_epsilon,
                           "delta": after.lifetime_delta, "left": after.epsilon_left})


def _refresh_budget_artifacts(datasets: list[str]) -> None:
    """The '<dataset>-budget' artifacts of the source's datasets show the new cap at once."""
    from tasks.report import publish_budget_artifacts

    for dataset in datasets:
        try:
            publish_budget_artifacts(dataset)
        except Exception as exc:  # the cap changed; an artifact is a view of it
            get_run_logger().warning("budget artifact of %s not written (%s)", dataset,
                                     type(exc).__name__)
