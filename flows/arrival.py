"""Release exactly the extract that arrived, then file it as released, rejected, held or failed.

Started by the ``on-arrival`` deployment's event trigger with the event's dataset, path and
hash. Before anything is read, moved or charged the run checks that the path is an announced
file of the inbox the service watches, that the dataset is the one that inbox was served for
(``serve --inbox DIR --dataset NAME``; a run cannot charge an arrival to another source) and
takes the content's claim (one run at a time per extract: a second one ends Refused).

Validation failures fail this run with the validation message, move the file to
``rejected/`` and spend no budget (the release flow validates before charging). A refusal for
the budget or the policy alone parks the file in ``held/``: a Retry of this run, or the same
file dropped again, releases it once the cap or the policy allows. A file whose content was
already released for the dataset is never released again: the same bytes, or the same rows
(their row digest, ``medrelease.data.content``: an LF and a CRLF copy, another quoting, another
spelling of its numbers); one run at a time releases a given set of rows.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run as current_run

from flows.release import ReleaseRequest, release_flow
from flows.states import REFUSALS, quiet_refusals, refused, result_of, skipped
from medrelease.data.config import find_config
from medrelease.data.content import row_digests
from medrelease.data.extract import check_extract_bounds
from medrelease.errors import (
    BudgetExceededError,
    ConfigError,
    InputValidationError,
    MedreleaseError,
    PolicyError,
)
from medrelease.privacy.ledger import LedgerIntegrityError, LedgerLockedError
from medrelease.settings import steward_root
from medrelease.storage.inbox import (
    ContentClaim,
    ExtractClaimedElsewhere,
    NotAnAnnouncedExtract,
    WrongInboxDataset,
    announced_path,
    check_inbox_dataset,
    locate_announced,
    move_to,
    unpark,
)
from medrelease.storage.io import file_sha256
from medrelease.storage.store import StewardRecords

# Refusals that say nothing against the file: the source's budget, the dataset's policy, a
# ledger that was busy or needs the steward. The extract waits in held/ for a Retry.
HELD_REFUSALS = (BudgetExceededError, PolicyError, LedgerLockedError, LedgerIntegrityError)


class DuplicateExtractError(MedreleaseError):
    """This exact file content was already released for the dataset."""


def _already_released(dataset: str, sha256: str) -> str | None:
    """From the steward records (the public manifest does not carry the input's hash)."""
    return StewardRecords(steward_root()).released_input(dataset, sha256)


def _released_rows_as(dataset: str, digests: tuple[str, ...]) -> str | None:
    """The real (not TEST) published release whose input had these rows (its steward
    record's row digest, or the digest earlier versions recorded), if any."""
    for record in StewardRecords(steward_root()).records(dataset):
        if (record.get("status") == "published" and not record.get("test_release")
                and record.get("input_rows_sha256") in digests
                and Path(record.get("published_path") or "").is_dir()):
            return record["release_id"]
    return None


def _released_as(dataset: str, sha256: str) -> str | None:
    """The release of this content for the inbox's dataset (named or a YAML path), if any."""
    try:
        return _already_released(find_config(dataset).name, sha256)
    except ConfigError:
        return None


@flow(name="medrelease-on-arrival", description="Release one newly arrived extract")
def arrival_release_flow(dataset: str, path: str, sha256: str) -> dict[str, Any]:
    """Release the announced file as its inbox's dataset; whatever happens to a claimed file,
    it leaves ``processing/``. A path that is not an announced file of the inbox this service
    watches, a dataset other than that inbox's, or an extract another run is releasing is
    refused before anything is read, moved or spent."""
    quiet_refusals()
    try:
        inbox, announced = announced_path(path, sha256)
        served = check_inbox_dataset(inbox, dataset)
        claim = ContentClaim.take(inbox, sha256, str(current_run.id or uuid.uuid4()))
    except (NotAnAnnouncedExtract, WrongInboxDataset, ExtractClaimedElsewhere,
            ConfigError) as exc:
        return refused(exc)
    try:
        return _claimed_arrival(served, inbox, announced, sha256)
    finally:
        claim.give_back()


def _claimed_arrival(dataset: str, inbox: Path, announced: Path,
                     sha256: str) -> dict[str, Any]:
    """Under the content's claim: find the file (a Retry finds it in ``held/``), release it,
    file it by the outcome."""
    try:
        where = locate_announced(inbox, announced)
    except NotAnAnnouncedExtract as exc:
        previous = _released_as(dataset, sha256)
        if previous:
            return skipped("Duplicate", f"{announced.name}: already released as {previous}; "
                           "not released again", {"release_id": None, "path": None})
        return refused(exc)
    extract = unpark(where, announced) if where != announced else announced
    try:
        return _release_arrival(dataset, extract, sha256, inbox)
    except DuplicateExtractError as exc:
        return skipped("Duplicate", str(exc), {"release_id": None, "path": None})
    except ExtractClaimedElsewhere as exc:  # the same rows, another file, another run
        _file_away(inbox, extract, "held", f"{exc}\n\nRetry this run once that run has "
                   "ended: if it published these rows, this file is then filed as a duplicate.")
        return refused(exc)
    except HELD_REFUSALS as exc:  # nothing against the file: it waits for a Retry
        target = _file_away(inbox, extract, "held", f"{exc}\n\nRetry this run, or drop the "
                            "file into the inbox again, once the cap or the policy allows it.")
        get_run_logger().warning("extract held, moved to %s: Retry this run (or drop the file "
                                 "again) once the cap or the policy allows it", target)
        return refused(exc)
    except REFUSALS as exc:  # refused before any spend: bad input, config, another source
        target = _file_away(inbox, extract, "rejected", str(exc))
        get_run_logger().error("extract rejected, moved to %s", target)
        return refused(exc)
    except BaseException as exc:
        _file_away(inbox, extract, "failed", f"{type(exc).__name__}: {exc}")
        raise


def _file_away(inbox: Path, extract: Path, outcome: str, reason: str) -> Path | None:
    if not extract.exists():
        return None
    return move_to(inbox, extract, outcome, reason, keep_claim_name=outcome == "held")


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
    check_extract_bounds(config, extract)  # before the file is parsed for its rows
    digests = row_digests(config, extract)
    rows_claim = None
    if digests:
        previous = _released_rows_as(config.name, digests)
        if previous:
            move_to(inbox, extract, "duplicates", f"the same rows already released as "
                                                  f"{previous}")
            raise DuplicateExtractError(
                f"{extract.name}: the same rows (row digest {digests[0][:12]}...) were already "
                f"released as {previous}, in another file; not released again")
        rows_claim = ContentClaim.take(inbox, f"rows-{digests[0]}",
                                       str(current_run.id or uuid.uuid4()))
    try:
        # its state, not its result: a release rejected at review ends 'Not published', a
        # CANCELLED state whose result() would raise (``flows/states.result_of``)
        result = result_of(release_flow(ReleaseRequest(dataset=dataset,
                                                       input_path=str(extract)),
                                        return_state=True))
    finally:
        if rows_claim is not None:
            rows_claim.give_back()
    if result.get("not_published"):  # review: required, and rejected or left open
        target = move_to(inbox, extract, "rejected", result["not_published"])
        logger.warning("%s not published after its review; extract moved to %s", extract.name,
                       target)
        return {"release_id": None, "not_published": result["not_published"]}
    target = move_to(inbox, extract, "released", f"released as {result['release_id']}")
    logger.info("released %s as %s; extract moved to %s", extract.name, result["release_id"],
                target)
    return {"release_id": result["release_id"], "path": result["path"]}
