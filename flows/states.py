"""Final states that say what happened, so a refusal or a skip does not look like a crash.

* ``Refused`` (type FAILED): the request was checked and refused before any budget was spent
  (bad input, policy, over budget, bad parameters). The run shows the reason, not a traceback;
  an in-process caller still gets the exception.
* ``No new data`` / ``Duplicate`` (type COMPLETED): nothing to release, nothing spent.
* ``Published`` / ``Published with warnings`` (type COMPLETED): released; the name follows the
  release's publication verdict (fit, or not), its headline in the message.
* ``Not published`` (type CANCELLED): a reviewed release rejected or left unreviewed; its
  spend stays counted. Prefect colours a run by its state's *type* (the name is free, the
  colour is not): COMPLETED green, FAILED red, CRASHED orange, CANCELLED grey. As COMPLETED it
  was the green of a publication; CANCELLED is the one final type that is neither success nor
  an error, and Prefect offers Retry on it as on the others (its run then ends 'Not published'
  again: ``flows/release.py``). An in-process caller reads its result with ``result_of``.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from prefect import get_run_logger
from prefect.runtime import flow_run as current_run
from prefect.states import Cancelled, Completed, Failed, State

from medrelease.errors import (
    BudgetExceededError,
    ConfigError,
    InputValidationError,
    ParameterError,
    PolicyError,
    TaxonomyError,
)
from medrelease.privacy.ledger import LedgerIntegrityError, LedgerLockedError, LedgerSourceError

# Raised only by the checks that run before the charge: nothing was spent when they occur.
REFUSALS = (ConfigError, TaxonomyError, InputValidationError, ParameterError, PolicyError,
            BudgetExceededError, LedgerSourceError, LedgerIntegrityError, LedgerLockedError)


# Flows that log every refusal themselves, in one line (``refused``): what their tasks' engine
# says about the same refusal is dropped from their logs, and so is what the engine says after
# a run that said its refusal (its records name the run, not the flow).
SAYS_ITS_REFUSALS = ("medrelease-release", "medrelease-on-arrival")
_RUNS_THAT_SAID_IT: set[str] = set()


class RefusalsWithoutTracebacks(logging.Filter):
    """A refusal is an answer, not a crash: Prefect's task and flow engines log the exception
    that ends a refused task or run with its traceback, at ERROR ("Task run failed with
    exception", "Finished in state Failed", and in a served run "Engine execution exited with
    unexpected exception"). This filter, on every handler of Prefect's loggers (console and
    API), drops those records from the runs of a flow that logs the refusal itself
    (``SAYS_ITS_REFUSALS``: the run's log then holds the one WARNING line ``refused`` writes),
    and turns them into WARNING lines without a traceback elsewhere; every other record passes
    unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        text = record.getMessage() if record.levelno >= logging.ERROR else ""
        if isinstance(error, REFUSALS) or any(f"exception {cls.__name__}:" in text
                                               or f"with exception: {cls.__name__}(" in text
                                               for cls in REFUSALS):
            if (getattr(record, "flow_name", None) in SAYS_ITS_REFUSALS
                    or getattr(record, "flow_run_id", None) in _RUNS_THAT_SAID_IT):
                return False
            record.exc_info, record.exc_text, record.stack_info = None, None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def quiet_refusals() -> None:
    """Install the filter on the handlers of Prefect's loggers (idempotent)."""
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
               if name.startswith("prefect")] + [logging.getLogger("prefect"), logging.root]
    for logger in loggers:
        for handler in logger.handlers:
            if not any(isinstance(f, RefusalsWithoutTracebacks) for f in handler.filters):
                handler.addFilter(RefusalsWithoutTracebacks())


def refused(exc: BaseException) -> State:
    """A FAILED state named 'Refused' carrying the reason (messages never hold raw values)."""
    quiet_refusals()
    what_to_do = _what_to_do(exc)
    get_run_logger().warning("release refused, nothing spent: %s%s", exc, what_to_do)
    if current_run.id:
        _RUNS_THAT_SAID_IT.add(str(current_run.id))
    # the sentence first: the run page's Details tab shows the message's start on one line,
    # and "BudgetExceededError: …" told a steward nothing (the exception is the state's data)
    return Failed(name="Refused", message=f"Nothing spent: {exc}{what_to_do}"[:2000], data=exc)


def _what_to_do(exc: BaseException) -> str:
    """After a budget refusal (which says what is left): where the cap is raised, in the UI
    first (issue 56: the refusal said "left: 0" and nothing about what to do)."""
    if not isinstance(exc, BudgetExceededError):
        return ""
    from flows.cap import how_to_raise

    named = re.search(r"source '([^']+)'", str(exc))
    return ("" if str(exc).rstrip().endswith(".") else ".") + " " + \
        how_to_raise(named.group(1) if named else None)


PUBLISHED = "Published"
PUBLISHED_WITH_WARNINGS = "Published with warnings"


def published(where: str, verdict: dict[str, Any] | None, steward_lines: list[str],
              result: dict[str, Any]) -> State:
    """A COMPLETED state named 'Published' when the publication verdict is *fit*, 'Published
    with warnings' otherwise, with the verdict's headline after the link. The name follows the
    verdict alone (computed from what is published: post-processing); the steward's raw-data
    evaluation, in its log-safe wording, comes after it, labelled, and decides nothing."""
    level = (verdict or {}).get("level")
    name = PUBLISHED if level in (None, "fit") else PUBLISHED_WITH_WARNINGS
    parts = []
    if verdict:
        parts.append(f"publication verdict: {verdict.get('headline') or level}")
    if steward_lines:
        parts.append("steward's raw-data evaluation: " + "; ".join(steward_lines))
    get_run_logger().info("published: %s%s", where,
                          f" — publication verdict: {verdict.get('headline') or level}"
                          if verdict else "")
    # " — " after the link, not ";": Prefect's UI makes a link of a URL in a log line up to
    # the next space, and "…/<release-id>;" led to no release (issue 56, no dead links)
    message = f"Published: {where}" + (" — " + "; ".join(parts) if parts else "")
    return Completed(name=name, message=message[:2000], data=result)


NOT_PUBLISHED = "Not published"


def not_published(reason: str, result: dict[str, Any]) -> State:
    """A CANCELLED state named 'Not published' (grey in the run list, not success's green):
    a reviewed release that was rejected or left unreviewed. The run did its work (and spent
    its budget); nothing was published."""
    get_run_logger().warning("Not published: %s", reason)
    return Cancelled(name=NOT_PUBLISHED, message=reason[:2000],
                     data={**result, "not_published": reason})


def result_of(state: State) -> Any:
    """A release run's result for an in-process caller (``release_flow(...,
    return_state=True)``): its data, 'Not published' included (Prefect's ``result()``
    raises ``CancelledRun`` for a CANCELLED state); a refusal or a failure raises its
    exception as ``release_flow(...)`` itself does."""
    # _sync: its callers are synchronous (Prefect's dispatch would hand back a coroutine in a
    # thread where some other library keeps an event loop running)
    if state.is_cancelled() and state.name == NOT_PUBLISHED:
        return state.result(raise_on_failure=False, _sync=True)
    if state.is_failed() or state.is_crashed():
        # the refusal itself (e.g. BudgetExceededError, which the arrival flow holds the
        # extract for), not Prefect's FailedRun: ``result()`` raises FailedRun where the
        # state's data was persisted rather than kept in memory (a served run)
        data = state.result(raise_on_failure=False, _sync=True)
        if isinstance(data, BaseException):
            raise data
    return state.result(_sync=True)


def skipped(name: str, reason: str, result: dict[str, Any]) -> State:
    """A COMPLETED state named for why nothing was released (no spend)."""
    get_run_logger().info("%s: %s", name, reason)
    return Completed(name=name, message=reason, data={**result, "skipped": reason})
