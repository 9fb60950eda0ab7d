"""Release exactly the extract that arrived, then file it as released, rejected or failed.

Started by the ``on-arrival`` deployment's event trigger with the event's dataset, path and
hash. Validation failures fail this run with the validation message, move the file to
``rejected/`` and spend no budget (the release flow validates before charging). A file whose
content was already released for the dataset is never released again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from flows.release import ReleaseRequest, release_flow
from flows.states import REFUSALS, quiet_refusals, refused, skipped
from medrelease.data.config import find_config
from medrelease.errors import InputValidationError, MedreleaseError
from medrelease.settings import steward_root
from medrelease.storage.inbox import NotAnAnnouncedExtract, claimed_extract, move_to
from medrelease.storage.io import file_sha256
from medrelease.storage.store import StewardRecords


class DuplicateExtractError(MedreleaseError):
    """This exact file content was already released for the dataset."""


def _already_released(dataset: str, sha256: str) -> str | None:
    """From the steward records (the public manifest does not carry the input's hash)."""
    return StewardRecords(steward_root()).released_input(dataset, sha256)


@flow(name="medrelease-on-arrival", description="Release one newly arrived extract")
def arrival_release_flow(dataset: str, path: str, sha256: str) -> dict[str, Any]:
    """Release the announced file; whatever happens, it leaves ``processing/``. A path that is
    not a claimed file of the inbox this service watches is refused before it is touched."""
    quiet_refusals()
    try:
        inbox, extract = claimed_extract(path)
    except NotAnAnnouncedExtract as exc:
        return refused(exc)
    try:
        return _release_arrival(dataset, extract, sha256, inbox)
    except DuplicateExtractError as exc:
        return skipped("Duplicate", str(exc), {"release_id": None, "path": None})
    except REFUSALS as exc:  # refused before any spend: bad input, policy, budget, ledger
        target = _file_away(inbox, extract, "rejected", str(exc))
        get_run_logger().error("extract rejected, moved to %s", target)
        return refused(exc)
    except BaseException as exc:
        _file_away(inbox, extract, "failed", f"{type(exc).__name__}: {exc}")
        raise


def _file_away(inbox: Path, extract: Path, outcome: str, reason: str) -> Path | None:
    return move_to(inbox, extract, outcome, reason) if extract.exists() else None


def _release_arrival(dataset: str, extract: Path, sha256: str, inbox: Path) -> dict[str, Any]:
    logger = get_run_logger()
    if file_sha256(extract) != sha256:
        raise InputValidationError(f"{extract.name} changed after it was announced; rejected")
    config = find_config(dataset)  # a wrong dataset name fails here, before anything else
    previous = _already_released(config.name, sha256)
    if previous:
        move_to(inbox, extract, "duplicates", f"already released as {previous}")
        raise DuplicateExtractError(
            f"{extract.name}: this content was already released as {previous}; not released again"
        )
    result = release_flow(ReleaseRequest(dataset=dataset, input_path=str(extract)))
    target = move_to(inbox, extract, "released", f"released as {result['release_id']}")
    logger.info("released %s as %s; extract moved to %s", extract.name, result["release_id"],
                target)
    return {"release_id": result["release_id"], "path": result["path"]}
