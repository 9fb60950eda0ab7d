"""The data-arrival inbox: notice complete extracts once, and file them after processing.

An extract counts as *complete* when a ``<file>.done`` marker exists, or when its size and
modification time have not changed over ``stable_polls`` consecutive polls (a copy in progress
keeps growing). Each complete file is announced once per content hash (the state lives in
``<inbox>/.medrelease/announced.json``), so the same bytes are never released twice even when
dropped again under another name; repeats go to ``duplicates/``. A complete file is claimed by
moving it to ``processing/<sha256>-<name>``; after its run the arrival flow moves it on to
``released/``, ``rejected/`` (with a ``.reason.txt``), ``held/`` or ``failed/``.

``held/<sha256>-<name>`` parks an extract refused only for the budget or the policy (nothing
is wrong with the file): a Retry of its run, or the same content dropped again, releases it
once the cap or the policy allows. Which dataset an inbox's extracts belong to is fixed when
``medrelease serve --inbox DIR --dataset NAME`` starts (``MEDRELEASE_INBOX_DATASETS``), never by
a run's parameters; and one run at a time owns a content hash (``.medrelease/claims/``), so two
runs for the same extract never both release it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from medrelease.errors import ConfigError, MedreleaseError, ParameterError
from medrelease.storage.io import file_sha256

DONE_SUFFIX = ".done"
STATE_DIR = ".medrelease"
OUTCOME_DIRS = ("processing", "released", "rejected", "held", "failed", "duplicates")
INBOX_ENV = "MEDRELEASE_INBOX"
INBOX_DATASETS_ENV = "MEDRELEASE_INBOX_DATASETS"
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
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
            held = held_copies(self.inbox, sha)
            if held and not any(a.sha256 == sha for a in ready):
                # refused for the budget or the policy, never released: dropping it again is
                # a request to try again. The new drop is announced; the held copy (the same
                # bytes) steps aside so that one file of this content is in play.
                for copy in held:
                    with contextlib.suppress(FileNotFoundError):  # a Retry took it meanwhile
                        self._move(copy, "duplicates", f"dropped again as {path.name}, which "
                                   "is announced for another try; this held copy steps aside")
                        reason_file(copy).unlink(missing_ok=True)
            elif sha in announced or any(a.sha256 == sha for a in ready):
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
        target = move_to(self.inbox, path, outcome, reason)
        self.filed.append(Filed(path.name, outcome, reason or outcome))
        return target


def configured_inboxes() -> list[Path]:
    """The inboxes the service was started with (``serve --inbox`` sets MEDRELEASE_INBOX; a
    form or API caller cannot)."""
    return [Path(p).resolve() for p in os.environ.get(INBOX_ENV, "").split(os.pathsep) if p]


def inbox_settings(inbox: Path, dataset: str,
                   environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that makes ``inbox`` a served inbox whose extracts belong to
    ``dataset`` (added to any inboxes already in ``environ``): what ``serve --inbox
    --dataset`` sets, and what a work pool's worker needs to release arrivals."""
    environ = os.environ if environ is None else environ
    folder = str(Path(inbox).resolve())
    known = [p for p in environ.get(INBOX_ENV, "").split(os.pathsep) if p and p != folder]
    bindings = _bindings(environ)
    bindings[folder] = dataset
    return {INBOX_ENV: os.pathsep.join([*known, folder]),
            INBOX_DATASETS_ENV: json.dumps(bindings, sort_keys=True)}


def _bindings(environ) -> dict[str, str]:
    text = environ.get(INBOX_DATASETS_ENV, "").strip()
    if not text:
        return {}
    try:
        bindings = json.loads(text)
    except json.JSONDecodeError:
        bindings = None
    if not isinstance(bindings, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v for k, v in bindings.items()):
        raise ConfigError(f"{INBOX_DATASETS_ENV} must be a JSON object mapping each inbox folder "
                          "to its dataset, as 'medrelease serve --inbox DIR --dataset NAME' "
                          "sets it")
    return {str(Path(k).resolve()): v for k, v in bindings.items()}


def inbox_dataset(inbox: Path) -> str:
    """The dataset an inbox's extracts are released as, fixed when the service started: the
    budget an arrival is charged to is never a run's (a form's, an API caller's) choice."""
    folder = str(Path(inbox).resolve())
    dataset = _bindings(os.environ).get(folder)
    if not dataset:
        raise ConfigError(
            f"the inbox {folder} has no dataset fixed for it: start the service with "
            f"'medrelease serve --inbox {folder} --dataset NAME' (or set {INBOX_DATASETS_ENV} "
            "for the workers). Nothing was read, moved or spent.")
    return dataset


class WrongInboxDataset(ParameterError):
    """A run named another dataset than the one its inbox was served with."""


def check_inbox_dataset(inbox: Path, named: str | None) -> str:
    """The inbox's own dataset; a run that names another one is refused before anything is
    read, moved or charged (the arrival would otherwise be charged to that other source)."""
    served = inbox_dataset(inbox)
    if named not in (None, "", served):
        raise WrongInboxDataset(
            f"parameter 'dataset' is {named!r}, but the inbox {inbox} was served for dataset "
            f"{served!r}: its extracts are released and charged as {served!r} only (fixed by "
            "'medrelease serve --inbox DIR --dataset NAME', not by a run). Nothing was read, "
            "moved or spent.")
    return served


class NotAnAnnouncedExtract(MedreleaseError):
    """A path given to the arrival flow that is not a claimed file of a configured inbox."""


def announced_path(path_text: str, sha256: str) -> tuple[Path, Path]:
    """(inbox, ``<inbox>/processing/<sha256>-<name>``) for the path and hash an arrival run
    was given, or refuse before touching anything: the path must be in the ``processing/``
    folder of an inbox the service was started with, written without links, and named for the
    hash (the watcher's claim name), so the hash the run claims is the file's."""
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
    except OSError:
        raise refusal from None
    if real != path or real.parent.parent not in inboxes:
        raise refusal
    if not (isinstance(sha256, str) and SHA256_HEX.fullmatch(sha256)
            and real.name.startswith(f"{sha256}-")):
        raise NotAnAnnouncedExtract(
            f"parameter 'sha256' must be the 64 hex digits the watcher named {path.name} for "
            "(its SHA-256); nothing was read, moved or spent")
    return real.parent.parent, real


def locate_announced(inbox: Path, announced: Path) -> Path:
    """Where an announced extract is now: still in ``processing/``, or parked in ``held/``
    by an earlier refusal (a Retry of its run). A regular file with one hard link, or refused
    (a link can lead to another folder's file)."""
    for candidate in (announced, inbox / "held" / announced.name):
        try:
            info = os.lstat(candidate)
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise NotAnAnnouncedExtract(
                f"{announced.name} in the inbox is not a regular file with one hard link (a "
                "link can lead to another folder's file); nothing was read, moved or spent")
        return candidate
    raise NotAnAnnouncedExtract(
        f"{announced.name} is no longer in the inbox's processing/ or held/ folder (released, "
        "rejected or filed by another run: see the inbox's outcome folders). Nothing was read "
        "or spent.")


def held_copies(inbox: Path, sha256: str) -> list[Path]:
    """The extracts of this content parked in ``held/`` (refused for budget or policy)."""
    folder = Path(inbox) / "held"
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob(f"{sha256}-*")
                  if p.is_file() and not p.name.endswith(".reason.txt"))


def reason_file(path: Path) -> Path:
    """The ``.reason.txt`` written beside a filed extract."""
    return path.with_name(path.name + ".reason.txt")


def unpark(held: Path, announced: Path) -> Path:
    """Move a held extract back to its ``processing/`` name for another try (its reason file
    goes: the new try writes its own outcome)."""
    os.replace(held, announced)
    reason_file(held).unlink(missing_ok=True)
    return announced


class ExtractClaimedElsewhere(MedreleaseError):
    """Another run owns this content's claim: only one run at a time may release it."""


@dataclass(frozen=True)
class ContentClaim:
    """One run's exclusive claim on one content hash of an inbox, taken before the file is
    moved, read or charged, and given back when the run has filed the file. A run that was
    killed leaves its claim; a Retry of that run (same run id) takes it over."""

    marker: Path
    owner: str

    @classmethod
    def take(cls, inbox: Path, sha256: str, owner: str) -> ContentClaim:
        """Create ``.medrelease/claims/<sha256>`` holding ``owner``, atomically: written under
        a private name and hard-linked into place, which fails if any run holds it."""
        folder = Path(inbox) / STATE_DIR / "claims"
        folder.mkdir(parents=True, exist_ok=True)
        marker = folder / sha256
        draft = folder / f".{sha256}.{os.getpid()}.{uuid.uuid4().hex}"
        draft.write_text(owner, encoding="utf-8")
        try:
            os.link(draft, marker)
        except FileExistsError:
            holder = marker.read_text(encoding="utf-8").strip() if marker.exists() else ""
            if holder != owner:
                raise ExtractClaimedElsewhere(
                    f"this extract (SHA-256 {sha256[:12]}...) is being released by flow run "
                    f"{holder or 'another run'}: one run at a time releases an extract, so "
                    "this run does nothing. If that run is no longer running, Retry it. "
                    "Nothing was read, moved or spent.") from None
        finally:
            draft.unlink(missing_ok=True)
        return cls(marker, owner)

    def give_back(self) -> None:
        """Remove the claim if this run still holds it."""
        with contextlib.suppress(FileNotFoundError):
            if self.marker.read_text(encoding="utf-8").strip() == self.owner:
                self.marker.unlink()


def original_name(path: Path) -> str:
    """The name an extract was dropped under (without the ``<sha256>-`` claim prefix)."""
    head, _, rest = path.name.partition("-")
    return rest if len(head) == 64 and rest else path.name


def move_to(inbox: Path, path: Path, outcome: str, reason: str | None = None,
            keep_claim_name: bool = False) -> Path:
    """Move ``path`` into ``<inbox>/<outcome>/`` (never overwriting); write a reason file.
    ``keep_claim_name`` keeps the ``<sha256>-`` prefix (``held/``: its run finds it again)."""
    if outcome not in OUTCOME_DIRS:
        raise ValueError(f"outcome must be one of {OUTCOME_DIRS}")
    folder = Path(inbox) / outcome
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / (path.name if keep_claim_name else original_name(path))
    if target.exists():
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
        target = folder / f"{target.stem}-{stamp}{target.suffix}"
    shutil.move(str(path), target)
    if reason is not None:
        reason_file(target).write_text(reason + "\n", encoding="utf-8")
    return target
