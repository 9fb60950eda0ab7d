"""Watch an inbox folder and announce each complete extract as a Prefect event.

The event ``medrelease.extract.arrived`` names the dataset, the claimed file and its hash; the
``on-arrival`` deployment's trigger turns it into a release of exactly that file. Runs as a
plain loop (``medrelease watch``) or as a long-lived flow (``watch_inbox_flow``).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.events import emit_event
from prefect.states import State

from flows.states import refused
from medrelease.errors import ConfigError
from medrelease.storage.inbox import (
    Arrival,
    InboxWatcher,
    WrongInboxDataset,
    check_inbox_dataset,
    configured_inboxes,
    original_name,
)

ARRIVED = "medrelease.extract.arrived"


def announce(watcher: InboxWatcher, arrival: Arrival, dataset: str) -> None:
    emit_event(
        event=ARRIVED,
        resource={
            # the Event Feed's card shows the id: the file's name first, then its content's
            # hash (short: the payload has it whole)
            "prefect.resource.id": f"medrelease.extract.{original_name(arrival.path)}."
                                   f"{arrival.sha256[:12]}",
            "prefect.resource.name": original_name(arrival.path),
            "medrelease.dataset": dataset,
        },
        payload={"dataset": dataset, "path": str(arrival.path), "sha256": arrival.sha256,
                 "size": arrival.size},
    )
    watcher.mark_announced(arrival)


FILED = "medrelease.extract.filed"


def report_filed(watcher: InboxWatcher) -> None:
    """Every file the watcher handled without a run gets a visible outcome: a log line and an
    event (in the UI's Event Feed) with its reason, beside the ``.reason.txt``."""
    logger = logging.getLogger("medrelease.inbox")
    for filed in watcher.filed:
        logger.warning("inbox: %s moved to %s/: %s", filed.name, filed.outcome, filed.reason)
        emit_event(event=FILED, resource={"prefect.resource.id": f"medrelease.inbox.{filed.name}",
                                          "prefect.resource.name": filed.name},
                   payload={"outcome": filed.outcome, "reason": filed.reason})


def watch_loop(inbox: Path, dataset: str, interval_s: float = 1.0, stable_polls: int = 2,
               stop: threading.Event | None = None, max_seconds: float | None = None,
               on_arrival=None) -> int:
    """Poll until stopped; returns how many extracts were announced."""
    watcher = InboxWatcher(inbox, stable_polls=stable_polls)
    announced = 0
    started = time.monotonic()
    stop = stop or threading.Event()
    while not stop.is_set():
        arrivals = watcher.poll()
        report_filed(watcher)
        for arrival in arrivals:
            announce(watcher, arrival, dataset)
            announced += 1
            if on_arrival:
                on_arrival(arrival)
        if max_seconds is not None and time.monotonic() - started > max_seconds:
            break
        stop.wait(interval_s)
    return announced


@flow(name="medrelease-watch-inbox", description="Announce complete extracts in the inbox the "
                                                "service was started with")
def watch_inbox_flow(dataset: str | None = None, interval_s: float = 2.0,
                     max_seconds: float | None = None) -> int | State:
    """Watch the inbox fixed when the service started (``serve --inbox``) for the dataset
    fixed with it (``serve --dataset``): a UI user can neither point the watcher at another
    folder (it creates folders and moves files there) nor announce its arrivals as another
    dataset (they would be charged to that dataset's source). ``dataset`` may be left empty;
    any other value than the inbox's ends the run Refused before the inbox is touched."""
    inboxes = configured_inboxes()
    if not inboxes:
        raise ConfigError("this service was started without an inbox (medrelease serve "
                          "--inbox FOLDER); the watcher has nothing to watch")
    try:
        served = check_inbox_dataset(inboxes[0], dataset)
    except (WrongInboxDataset, ConfigError) as exc:
        return refused(exc)
    logger = get_run_logger()
    count = watch_loop(inboxes[0], served, interval_s, max_seconds=max_seconds,
                       on_arrival=lambda a: logger.info("announced %s", a.path.name))
    return count
