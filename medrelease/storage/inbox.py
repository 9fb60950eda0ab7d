"""The data-arrival inbox: notice complete extracts once, and file them after processing.

An extract counts as *complete* when a ``<file>.done`` marker exists, or when its size and
modification time have not changed over ``stable_polls`` consecutive polls (a copy in progress
keeps growing). Each complete file is announced once per content hash (the state lives in
``<inbox>/.medrelease/announced.json``), so the same bytes are never released twice even when
dropped again under another name; repeats go to ``duplicates/``. A complete file is claimed by
moving it to ``processing/<sha256>-<name>``; after its run the arrival flow moves it on to
``released/``, ``rejected/`` (with a ``.reason.txt``) or ``failed/``.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from medrelease.errors import MedreleaseError
from medrelease.storage.io import file_sha256

DONE_SUFFIX = ".done"
STATE_DIR = ".medrelease"
OUTCOME_DIRS = ("processing", "released", "rejected", "failed", "duplicates")
EXTRACT_SUFFIXES = (".csv", ".parquet")


@dataclass(frozen=True)
class Arrival:
    """A complete, not yet announced extract."""

    path: Path
    sha256: str
    size: int


@dataclass(frozen=True)
class Filed:
    """A file the watcher handled without announcing it: where it went and why."""

    name: str
    outcome: str
    reason: str


@dataclass
class InboxWatcher:
    inbox: Path
    stable_polls: int = 2
    _seen: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    filed: list[Filed] = field(default_factory=list)  # since the last poll, for the log/events

    def __post_init__(self) -> None:
        self.inbox = Path(self.inbox).resolve()
        if not self.inbox.is_dir():
            raise FileNotFoundError(f"inbox folder not found: {self.inbox}")
        for name in (STATE_DIR, *OUTCOME_DIRS):
            (self.inbox / name).mkdir(exist_ok=True)

    @property
    def state_path(self) -> Path:
        return self.inbox / STATE_DIR / "announced.json"

    def announced(self) -> dict[str, dict]:
        if not self.state_path.exists():
            return {}
        return json.loads(self.state_path.read_text(encoding="utf-8"))

    def _record(self, arrival: Arrival) -> None:
        state = self.announced()
        state[arrival.sha256] = {"file": original_name(arrival.path),
                                 "at": datetime.now(UTC).isoformat(timespec="seconds")}
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1), encoding="utf-8")
        os.replace(tmp, self.state_path)

    def poll(self) -> list[Arrival]:
        """Extracts that became complete since the last poll and were never announced.

        Each is moved into ``processing/`` (named by its hash) before it is returned, so the top
        of the inbox only ever holds files nobody has claimed. Files left in ``processing/``
        without an announcement (the watcher stopped before emitting) are returned again.
        """
        announced = self.announced()
        self.filed = []
        ready = [
            Arrival(path=p, sha256=p.name.split("-", 1)[0], size=p.stat().st_size)
            for p in sorted((self.inbox / "processing").iterdir())
            if p.is_file() and "-" in p.name and p.name.split("-", 1)[0] not in announced
            and len(p.name.split("-", 1)[0]) == 64
        ]
        present = set()
        for path in sorted(self.inbox.iterdir()):
            if path.is_symlink():  # never followed: it could lead to any file on the machine
                if not path.name.startswith("."):
                    self._move(path, "rejected", "a symbolic link: links are not followed; "
                                                 "copy the extract into the inbox instead")
                continue
            if not path.is_file() or path.name.startswith(".") or path.suffix == DONE_SUFFIX:
                continue
            if path.suffix.lower() not in EXTRACT_SUFFIXES:
                continue
            present.add(path.name)
            stat = path.stat()
            if stat.st_nlink != 1:  # a hard link can be another folder's (hospital's) file
                self._move(path, "rejected", f"{stat.st_nlink} hard links: links are not "
                                             "followed; copy the extract into the inbox instead")
                continue
            marker = path.with_name(path.name + DONE_SUFFIX)
            signature = (stat.st_size, stat.st_mtime_ns)
            previous = self._seen.get(path.name)
            polls = previous[2] + 1 if previous and previous[:2] == signature else 1
            self._seen[path.name] = (*signature, polls)
            if not marker.exists() and polls < self.stable_polls:
                continue
            sha = file_sha256(path)
            marker.unlink(missing_ok=True)
            self._seen.pop(path.name, None)
            if sha in announced or any(a.sha256 == sha for a in ready):
                first = announced.get(sha, {}).get("file") or next(
                    original_name(a.path) for a in ready if a.sha256 == sha)
                self._move(path, "duplicates", f"the same content (SHA-256 {sha[:12]}...) as "
                           f"{first}, already announced: it is never released twice")
                continue
            claimed = self.inbox / "processing" / f"{sha}-{path.name}"
            os.replace(path, claimed)
            ready.append(Arrival(path=claimed, sha256=sha, size=stat.st_size))
        for gone in set(self._seen) - present:
            del self._seen[gone]
        return ready

    def mark_announced(self, arrival: Arrival) -> None:
        """Record the hash once the arrival event was emitted."""
        self._record(arrival)

    def _move(self, path: Path, outcome: str, reason: str | None = None) -> Path:
        self.filed.append(Filed(path.name, outcome, reason or outcome))
        return move_to(self.inbox, path, outcome, reason)


def configured_inboxes() -> list[Path]:
    """The inboxes the service was started with (``serve --inbox`` sets MEDRELEASE_INBOX; a
    form or API caller cannot)."""
    return [Path(p).resolve() for p in os.environ.get("MEDRELEASE_INBOX", "").split(os.pathsep)
            if p]


class NotAnAnnouncedExtract(MedreleaseError):
    """A path given to the arrival flow that is not a claimed file of a configured inbox."""


def claimed_extract(path_text: str) -> tuple[Path, Path]:
    """(inbox, extract) for a path the arrival flow was given, or refuse before touching it:
    the path must be ``<inbox>/processing/<file>`` for an inbox the service was started with,
    written without links (no symbolic link on the way, one hard link), a regular file."""
    inboxes = configured_inboxes()
    path = Path(path_text)
    where = (f"the processing/ folder of the inbox the service watches "
             f"({', '.join(str(i) for i in inboxes)})" if inboxes
             else "an inbox, and this service was started without one (serve --inbox)")
    refusal = NotAnAnnouncedExtract(
        f"path {path_text!r} is not an extract announced by the inbox watcher: the on-arrival "
        f"flow only releases files in {where}. Nothing was read, moved or spent.")
    if not path.is_absolute() or path.parent.name != "processing":
        raise refusal
    try:
        real = path.parent.resolve(strict=True) / path.name
        info = os.lstat(real)
    except OSError:
        raise refusal from None
    if real != path or real.parent.parent not in inboxes:
        raise refusal
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        raise NotAnAnnouncedExtract(
            f"{path.name} in the inbox is not a regular file with one hard link (a link can "
            "lead to another folder's file); nothing was read, moved or spent")
    return real.parent.parent, real


def original_name(path: Path) -> str:
    """The name an extract was dropped under (without the ``<sha256>-`` claim prefix)."""
    head, _, rest = path.name.partition("-")
    return rest if len(head) == 64 and rest else path.name


def move_to(inbox: Path, path: Path, outcome: str, reason: str | None = None) -> Path:
    """Move ``path`` into ``<inbox>/<outcome>/`` (never overwriting); write a reason file."""
    if outcome not in OUTCOME_DIRS:
        raise ValueError(f"outcome must be one of {OUTCOME_DIRS}")
    folder = Path(inbox) / outcome
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / original_name(path)
    if target.exists():
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
        target = folder / f"{target.stem}-{stamp}{target.suffix}"
    shutil.move(str(path), target)
    if reason is not None:
        target.with_name(target.name + ".reason.txt").write_text(reason + "\n", encoding="utf-8")
    return target
