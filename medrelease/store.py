"""The release store: a folder of finished releases, each published atomically.

A release is written into a hidden temporary folder next to its final place and renamed into
``<store>/<dataset>/<release_id>/`` only when every file is complete, so a reader never sees a
partial release: a crash leaves at most a hidden ``.partial-*`` folder, which the next publish
sweeps away. Names are checked so that neither a dataset name nor a destination can point
outside the store.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from medrelease.errors import MedreleaseError

SAFE_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
PARTIAL_PREFIX = ".partial-"


class StoreError(MedreleaseError):
    """The release could not be written (path outside the store, disk full, read-only...)."""


def safe_relative(path_text: str, what: str) -> Path:
    """A relative path made only of safe parts: no '..', no absolute path, no hidden names."""
    path = Path(path_text)
    if path.is_absolute() or not path.parts:
        raise StoreError(f"{what} {path_text!r} must be a relative path inside the release store")
    for part in path.parts:
        if part in ("..", ".") or not SAFE_PART.match(part):
            raise StoreError(
                f"{what} {path_text!r} is not allowed: use letters, digits, '-', '_' and '.' "
                f"(no '..', no hidden names), so it cannot leave the release store"
            )
    return path


@dataclass(frozen=True)
class PublishedRelease:
    release_id: str
    path: Path

    @property
    def manifest_path(self) -> Path:
        return self.path / "manifest.json"


class ReleaseStore:
    """A local folder of releases."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()

    def new_release_id(self, mechanism: str) -> str:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        return f"{stamp}-{mechanism}-{uuid.uuid4().hex[:8]}"

    def release_dir(self, dataset: str, release_id: str, destination: str | None = None) -> Path:
        parent = self._parent(dataset, destination)
        return parent / safe_relative(release_id, "release id")

    def _parent(self, dataset: str, destination: str | None) -> Path:
        base = self.root / safe_relative(destination, "destination") if destination else self.root
        parent = (base / safe_relative(dataset, "dataset name")).resolve()
        if self.root not in parent.parents:
            raise StoreError(f"release folder {parent} would lie outside the store {self.root}")
        return parent

    def publish(
        self,
        dataset: str,
        release_id: str,
        table: pd.DataFrame,
        manifest: dict[str, Any],
        extra_files: dict[str, str] | None = None,
        destination: str | None = None,
        before_rename: Callable[[Path], None] | None = None,
    ) -> PublishedRelease:
        """Write data (Parquet + CSV), manifest and extra text files, then rename into place.

        On any failure the partial folder is removed and ``StoreError`` says why; the store is
        unchanged. ``before_rename`` runs on the complete temporary folder (used for checks).
        """
        final = self.release_dir(dataset, release_id, destination)
        parent = final.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create release folder {parent}: {exc.strerror or exc}") from exc
        self.sweep_partial(parent)
        if final.exists():
            raise StoreError(f"release {final} already exists; release ids are never reused")
        partial = parent / f"{PARTIAL_PREFIX}{release_id}-{uuid.uuid4().hex[:6]}"
        try:
            partial.mkdir()
            table.to_parquet(partial / "data.parquet", index=False)
            table.to_csv(partial / "data.csv", index=False)
            for name, text in (extra_files or {}).items():
                (partial / safe_relative(name, "file name")).write_text(text, encoding="utf-8")
            # The manifest is written last: its presence means the data files are complete.
            _write_json(partial / "manifest.json", manifest)
            _fsync_dir(partial)
            if before_rename is not None:
                before_rename(partial)
            os.rename(partial, final)
            _fsync_dir(parent)
        except OSError as exc:
            shutil.rmtree(partial, ignore_errors=True)
            raise StoreError(
                f"could not write release {release_id} to {parent}: {exc.strerror or exc}; "
                f"nothing was published"
            ) from exc
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        return PublishedRelease(release_id, final)

    def sweep_partial(self, parent: Path) -> None:
        """Remove leftovers of crashed publishes (never visible as releases)."""
        for leftover in parent.glob(f"{PARTIAL_PREFIX}*"):
            shutil.rmtree(leftover, ignore_errors=True)

    def releases(self, dataset: str | None = None) -> list[Path]:
        """Published release folders (those with a manifest), oldest first."""
        pattern = f"{dataset}/*/manifest.json" if dataset else "**/manifest.json"
        found = [p.parent for p in self.root.glob(pattern) if PARTIAL_PREFIX not in str(p)]
        return sorted(found, key=lambda p: p.name)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    with path.open("w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, sort_keys=False, default=str)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
