"""Final states that say what happened, so a refusal or a skip does not look like a crash.

* ``Refused`` (type FAILED): the request was checked and refused before any budget was spent
  (bad input, policy, over budget, bad parameters). The run shows the reason, not a traceback;
  an in-process caller still gets the exception.
* ``No new data`` / ``Duplicate`` (type COMPLETED): nothing to release, nothing spent.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger
from prefect.states import Completed, Failed, State

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


def refused(exc: BaseException) -> State:
    """A FAILED state named 'Refused' carrying the reason (messages never hold raw values)."""
    get_run_logger().error("release refused, nothing spent: %s", exc)
    return Failed(name="Refused", message=f"{type(exc).__name__}: {exc}"[:2000], data=exc)


def skipped(name: str, reason: str, result: dict[str, Any]) -> State:
    """A COMPLETED state named for why nothing was released (no spend)."""
    get_run_logger().info("%s: %s", name, reason)
    return Completed(name=name, message=reason, data={**result, "skipped": reason})
