"""The files a release reads, resolved once: where they are, that they may be read, and what
they hold (their content hashes), before any byte is validated or any budget is charged.

Every later step reads this value instead of resolving the config's path again, so what is
charged in the ledger (the content hashes) is what was read. A file with more than one hard
link is refused: a hard link makes another folder's file (another hospital's extract) appear
inside this dataset's input folder, and no path check can tell them apart. Two partitions with
identical content are refused: every patient in them would count twice while the budget is
charged once.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from medrelease.data.config import DatasetConfig
from medrelease.errors import ConfigError, InputValidationError
from medrelease.storage.io import file_sha256


@dataclass(frozen=True)
class ExtractFile:
    """One file of an extract: its resolved path and the SHA-256 of its bytes."""

    path: str
    sha256: str


@dataclass(frozen=True)
class ResolvedExtract:
    """An extract as the release will read it (one file, or the partitions of a pattern)."""

    pattern: str
    files: tuple[ExtractFile, ...]

    @property
    def paths(self) -> list[Path]:
        return [Path(f.path) for f in self.files]

    @property
    def hashes(self) -> tuple[str, ...]:
        return tuple(f.sha256 for f in self.files)

    @property
    def digest(self) -> str:
        return extract_digest([(f.path, f.sha256) for f in self.files])


def extract_digest(files: list[tuple[str, str]]) -> str:
    """An extract's identity from its (path, SHA-256) files: a one-file extract's own hash,
    else the hash of the list of its files' names and hashes (what the steward records
    compare)."""
    if len(files) == 1:
        return files[0][1]
    listing = "".join(f"{Path(path).name}\0{sha}\n" for path, sha in files)
    return hashlib.sha256(listing.encode()).hexdigest()


def check_single_link(path: Path, what: str = "input file") -> None:
    """Refuse anything but a regular file with exactly one hard link (no value in the text)."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise InputValidationError(f"{what} not found or unreadable: {path} "
                                   f"({exc.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise InputValidationError(f"{what} {path} is not a regular file")
    if info.st_nlink != 1:
        raise ConfigError(
            f"{what} {path.name} has {info.st_nlink} hard links: a hard link can make a file "
            "kept elsewhere (another dataset's extract) appear in this folder, so it is not "
            "read. Copy the file instead of linking it. Nothing was read or spent.")


def resolve_extract(config: DatasetConfig, override: str | None = None) -> ResolvedExtract:
    """The extract's files (input-folder rule, regular, one hard link), hashed, duplicates
    refused. Raises ``ConfigError`` / ``InputValidationError`` naming the file and the rule."""
    pattern = config.extract_path(override)
    files = [Path(p).resolve() for p in config.extract_files(override)]
    hashed = []
    for path in files:
        check_single_link(path)
        hashed.append(ExtractFile(str(path), file_sha256(path)))
    _refuse_identical_partitions(hashed)
    return ResolvedExtract(str(pattern), tuple(hashed))


def _refuse_identical_partitions(files: list[ExtractFile]) -> None:
    seen: dict[str, str] = {}
    for entry in files:
        name = Path(entry.path).name
        if entry.sha256 in seen:
            raise InputValidationError(
                f"input files {seen[entry.sha256]} and {name} have identical content: every "
                "patient in them would be counted twice while the budget is charged once. "
                "Remove the copy from the input folder. Nothing was read or spent.")
        seen[entry.sha256] = name
