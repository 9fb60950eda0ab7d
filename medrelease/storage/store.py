"""The release store: a folder of finished releases, each published atomically.

A release is written into a hidden temporary folder next to its final place and renamed into
``<store>/<dataset>/<release_id>/`` only when every file is complete, so a reader never sees a
partial release: a crash leaves at most a hidden ``.partial-*`` folder, which the next publish
sweeps away. Names are checked so that neither a dataset name nor a destination can point
outside the store.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from medrelease.errors import MedreleaseError
from medrelease.storage.released_rows import ROW_GROUP, ReleasedRows

SAFE_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
PARTIAL_PREFIX = ".partial-"
# A partial folder names the host and process writing it: a publish sweeps the leftovers of
# crashed ones, never a release another process (or, on a shared store, another host) is still
# writing. Another host's partial counts as a leftover once untouched this long.
STALE_PARTIAL_S = 3600.0
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
PLAIN_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
CSV_TEXT_SAFETY = (
    "text cells that start with =, +, -, @, a tab or a carriage return are prefixed with a "
    "single quote (OWASP CSV-injection guidance), unless they are plain numbers; the Parquet "
    "file keeps every value raw")


def _neutral(value: object) -> object:
    text = value if isinstance(value, str) else None
    if text and text.startswith(FORMULA_START) and not PLAIN_NUMBER.match(text):
        return "'" + text
    return value


def neutralise_formulas(table: pd.DataFrame) -> pd.DataFrame:
    """A copy safe to open in a spreadsheet: formula-like text cells made inert.

    Works on distinct values (categories, or factorized text), so the cost follows the
    number of distinct values, not rows.
    """
    out = {}
    for name in table.columns:
        column = table[name]
        if isinstance(column.dtype, pd.CategoricalDtype):
            out[name] = column.cat.rename_categories(
                [_neutral(c) for c in column.cat.categories]) if any(
                _neutral(c) is not c for c in column.cat.categories) else column
        elif column.dtype == object or pd.api.types.is_string_dtype(column.dtype):
            codes, uniques = pd.factorize(column, use_na_sentinel=True)
            safe = [_neutral(u) for u in uniques]
            if any(a is not b for a, b in zip(safe, uniques, strict=True)):
                values = np.asarray([*safe, None], dtype=object)
                column = pd.Series(values[codes], index=column.index, name=name)
            out[name] = column
        else:
            out[name] = column
    return pd.DataFrame(out, index=table.index)


def write_data_files(rows: ReleasedRows, parquet: Path, csv: Path,
                     size: int = ROW_GROUP) -> None:
    """Parquet and CSV, one row group at a time: memory follows the cells, not the rows.

    Formula-like text is neutralised once on the distinct rows. Each distinct row is turned
    into Arrow once and into its CSV line once (by pandas, so the text is what pandas writes
    for the whole table, encoded once); a row group is then a ``take`` of those by the group's
    indices. The Parquet group is written on a second thread while the CSV group is joined
    (Arrow's writer frees the GIL): one group in flight, so memory stays one group.
    """
    import pyarrow.parquet as pq

    source = rows.cells if rows.frame is None else rows.frame
    arrow = _arrow(source)
    safe = neutralise_formulas(source)
    lines = _csv_lines(safe, size) if rows.frame is None else None
    with pq.ParquetWriter(parquet, arrow.schema) as writer, \
            ThreadPoolExecutor(max_workers=1) as parquet_thread:
        pending = None
        groups = rows.group_indices(size)
        if lines is None:
            with csv.open("w", encoding="utf-8", newline="") as text:
                for number, indices in enumerate(groups):
                    pending = _next_parquet(parquet_thread, pending, writer, arrow, indices)
                    rows.take(indices, safe).to_csv(text, index=False, header=number == 0)
        else:
            header, body = lines
            with csv.open("wb") as binary:
                binary.write(header)
                for indices in groups:
                    pending = _next_parquet(parquet_thread, pending, writer, arrow, indices)
                    if indices.size:
                        binary.write(_joined(body.take(indices)))
        if pending is not None:
            pending.result()


def write_table(frame: pd.DataFrame, path: Path) -> None:
    """A table published beside the data (aim's measurements) as Parquet, without pandas'
    schema metadata: it records the index and so the row count, which would then differ
    between neighbouring inputs in bytes the audit compares. Categorical columns are written
    as plain text: a dictionary's unused categories would enter the row groups' statistics,
    which must be the values' own. A ``.csv`` name (``intervals.csv``) is written as CSV with
    data.csv's text safety (formula-like cells prefixed with ')."""
    import pyarrow.parquet as pq

    plain = frame.astype({c: object for c in frame.columns
                          if isinstance(frame[c].dtype, pd.CategoricalDtype)})
    if path.suffix == ".csv":  # a text table (intervals.csv): formula-like cells made inert
        neutralise_formulas(plain).to_csv(path, index=False, encoding="utf-8",
                                          lineterminator="\n")
        return
    pq.write_table(_arrow(plain).replace_schema_metadata(None), path)


def _binary_type(lengths: np.ndarray, group_rows: int):
    """Arrow's binary with 32-bit offsets when neither the distinct lines (of ``lengths``
    bytes) nor a group of them can reach 2 GiB (a take of those is 3-4x faster than of
    ``large_binary``: 0.03 s against 0.1 s for a million lines), else ``large_binary``."""
    import pyarrow as pa

    longest = int(lengths.max()) if lengths.size else 0
    total = int(lengths.sum())
    fits = max(total, longest * group_rows) < 2**31 - 1
    return pa.binary() if fits else pa.large_binary()


def _joined(lines) -> memoryview:
    """The bytes of a taken Arrow binary array, one after the other: its data buffer between
    its first and last offsets (a ``take`` lays the values out in order), with no Python
    object per line."""
    import pyarrow as pa

    width = np.int32 if pa.types.is_binary(lines.type) else np.int64
    offsets = np.frombuffer(lines.buffers()[1], dtype=width)[
        lines.offset:lines.offset + len(lines) + 1]
    return memoryview(lines.buffers()[2])[int(offsets[0]):int(offsets[-1])]


def _next_parquet(thread: ThreadPoolExecutor, pending: Future | None, writer, arrow,
                  indices: np.ndarray) -> Future:
    """Wait for the previous Parquet group (its errors surface here), then start this one."""
    if pending is not None:
        pending.result()
    return thread.submit(lambda: writer.write_table(arrow.take(indices)))


def _arrow(frame: pd.DataFrame):
    """The frame as Arrow. A text column of an empty release keeps the text type (an empty
    object column would become Arrow's ``null`` type: a schema that says the release is empty,
    and one a reader's code would trip on)."""
    import pyarrow as pa

    frame = frame.reset_index(drop=True)
    if frame.empty:
        frame = frame.astype({c: "str" for c in frame.columns if frame[c].dtype == object})
    return pa.Table.from_pandas(frame, preserve_index=False)


def _csv_lines(cells: pd.DataFrame, group_rows: int = ROW_GROUP):
    """The header line's bytes, and one CSV line per distinct row as an Arrow binary array
    (each line's bytes, its ``\\n`` included), as pandas writes the table; None when a value
    spans lines (quoted line breaks), where lines cannot be told apart by their ends.

    Text and integer columns are written by pandas value by distinct value and joined row by
    row in Arrow (``_joined_columns``); other tables are written whole by pandas and cut at
    their line ends. Either way no Python object is made per line (pandas writing 1.2M rows,
    then encoding and measuring each line, took 2.3 s of a 1,361,000-row release)."""
    import pyarrow as pa

    header = cells.head(0).to_csv(index=False, lineterminator="\n").encode("utf-8")
    if header.count(b"\n") != 1:
        return None
    joined = _joined_columns(cells)
    if joined is not None:
        data, offsets = joined
    else:
        text = cells.to_csv(index=False, lineterminator="\n").encode("utf-8")
        ends = np.flatnonzero(np.frombuffer(text, dtype=np.uint8) == ord("\n")) + 1
        if ends.size != len(cells) + 1 or int(ends[-1]) != len(text):
            return None  # (UTF-8 never has the byte of \n inside another character)
        data = pa.py_buffer(text[ends[0]:])
        offsets = np.concatenate([[0], ends[1:] - ends[0]])  # the lines after the header
    kind = _binary_type(np.diff(offsets), group_rows)
    width = np.int32 if kind == pa.binary() else np.int64
    body = pa.Array.from_buffers(kind, len(cells), [None, pa.py_buffer(offsets.astype(width)),
                                                    data])
    return header, body


def _joined_columns(cells: pd.DataFrame):
    """Every row's CSV line from its columns' distinct values, each written once by pandas
    (the same text: ``to_csv`` writes a text or integer value the same whatever the other
    rows hold), taken per row and joined with commas by Arrow: the data buffer and the line
    offsets, or None for a table this does not cover (one column: pandas quotes a lone empty
    field; other types; a value with a line break)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(cells.columns) < 2 or not len(cells):
        return None
    written = []
    total = 0  # the body's bytes: 32-bit offsets while they fit
    for position, name in enumerate(cells.columns):
        distinct = _distinct_texts(cells[name])
        if distinct is None:
            return None
        codes, texts = distinct
        if position == len(cells.columns) - 1:
            texts = [text + "\n" for text in texts]
        sizes = np.asarray([len(text.encode("utf-8")) for text in texts], dtype=np.int64)
        total += int(sizes[codes].sum()) + (position > 0) * len(cells)
        written.append((codes, texts))
    kind, width = ((pa.string(), np.int32) if total < 2**31 - 1
                   else (pa.large_string(), np.int64))
    lines = pc.binary_join_element_wise(
        *[pa.array(texts, type=kind).take(pa.array(codes)) for codes, texts in written], ",")
    if lines.null_count or len(lines) != len(cells):
        return None
    offsets = np.frombuffer(lines.buffers()[1], dtype=width)[
        lines.offset:lines.offset + len(lines) + 1]
    data = lines.buffers()[2]
    return data.slice(int(offsets[0]), int(offsets[-1] - offsets[0])), offsets - offsets[0]


def _distinct_texts(column: pd.Series) -> tuple[np.ndarray, list[str]] | None:
    """A text or integer column as codes (int64) and each code's text as ``to_csv`` writes
    it in a table of two or more columns (a missing value: the empty field, the last code)."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        codes, values = column.cat.codes.to_numpy(), column.cat.categories
    elif (pd.api.types.is_integer_dtype(column.dtype)
          or (pd.api.types.is_string_dtype(column.dtype)
              # checked on the rows, not the distinct values: 1, 1.0 and True are one value
              # to factorize but three texts to to_csv
              and pd.api.types.infer_dtype(column, skipna=True) in ("string", "empty"))):
        codes, values = pd.factorize(column)
    else:
        return None
    if pd.api.types.infer_dtype(values, skipna=False) not in ("string", "integer"):
        return None  # (mixed objects, floats, dates: written whole)
    pair = pd.DataFrame({"value": pd.Series(values), "_": np.zeros(len(values), np.int8)})
    text = pair.to_csv(index=False, header=False, lineterminator="\n")
    lines = text.split("\n")
    if len(lines) != len(values) + 1 or not all(line.endswith(",0") for line in lines[:-1]):
        return None  # a value with a line break
    texts = [line[:-2] for line in lines[:-1]] + [""]
    codes = np.asarray(codes, dtype=np.int64)
    return np.where(codes < 0, len(values), codes), texts


class StoreError(MedreleaseError):
    """The release could not be written (path outside the store, disk full, read-only...)."""


MAX_PARTS = 6


def safe_relative(path_text: str, what: str) -> Path:
    """A relative path made only of safe parts: no '..', no absolute path, no hidden names,
    at most six folders of at most 128 characters each."""
    path = Path(path_text)
    if path.is_absolute() or not path.parts:
        raise StoreError(f"{what} {path_text!r} must be a relative path inside the release store")
    if len(path.parts) > MAX_PARTS:
        raise StoreError(f"{what} has {len(path.parts)} folder levels; at most {MAX_PARTS}")
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


TEST_PREFIX = "TEST-"
DATA_FILES = ("data.parquet", "data.csv")


def data_file_names(test: bool) -> tuple[str, str]:
    """(Parquet, CSV) names: a TEST release's files say so at a glance."""
    return tuple(f"{TEST_PREFIX}{name}" if test else name for name in DATA_FILES)


def table_file_names(table: str, test: bool) -> tuple[str, str]:
    """A relational release's (Parquet, CSV) names of one table: ``admissions.parquet``, or
    ``TEST-admissions.parquet``."""
    prefix = TEST_PREFIX if test else ""
    return f"{prefix}{table}.parquet", f"{prefix}{table}.csv"


def find_data_file(folder: Path, suffix: str = ".parquet") -> Path:
    """A release folder's data file (``data.*`` or ``TEST-data.*``)."""
    for name in (f"data{suffix}", f"{TEST_PREFIX}data{suffix}"):
        if (folder / name).is_file():
            return folder / name
    raise StoreError(f"{folder} holds no data{suffix} file")


def _this_host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"


def partial_folder(parent: Path, release_id: str) -> Path:
    """Where a publish writes before its rename: named by host and process, so that another
    publish's sweep (``sweep_partial``) knows it is still being written and leaves it."""
    return parent / (f"{PARTIAL_PREFIX}{release_id}@{_this_host()}@{os.getpid()}@"
                     f"{uuid.uuid4().hex[:6]}")


def process_running(pid: int) -> bool:
    """Whether ``pid`` is a process of this machine that has not ended (a zombie, ended but
    not yet reaped by whoever inherited it, has ended; another user's process counts)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _still_being_written(partial: Path) -> bool:
    """Whether a partial release folder belongs to a publish still in progress."""
    parts = partial.name.rsplit("@", 3)
    if len(parts) != 4 or not parts[2].isdigit():
        return False  # an older version's leftover
    _, host, pid, _ = parts
    if host == _this_host():
        return process_running(int(pid))
    try:
        touched = max([partial.stat().st_ctime,
                       *(p.stat().st_ctime for p in partial.rglob("*"))])
    except OSError:
        return True  # changing under us: being written
    return time.time() - touched < STALE_PARTIAL_S


def new_release_id(mechanism: str, requested_at: datetime | None = None,
                   test: bool = False) -> str:
    """Stamped with the time the request was made (before any data was read), not the
    publish time: that would tell how long the run took, which grows with the rows. Drawn
    when the request is resolved, so the run's first log lines can name its release."""
    stamp = (requested_at or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    prefix = TEST_PREFIX if test else ""
    return f"{prefix}{stamp}-{mechanism}-{uuid.uuid4().hex[:8]}"


class ReleaseStore:
    """A local folder of releases: the publishable store, or (``test=True``) the test store.

    The two are separate folders; the publish path for real releases never reads or writes
    the test store. TEST releases carry ``TEST-`` in their id and data file names.
    """

    def __init__(self, root: str | Path, test: bool = False) -> None:
        self.root = Path(root).resolve()
        self.test = test

    def new_release_id(self, mechanism: str, requested_at: datetime | None = None) -> str:
        return new_release_id(mechanism, requested_at, self.test)

    @property
    def data_files(self) -> tuple[str, str]:
        return data_file_names(self.test)

    def table_files(self, table: str) -> tuple[str, str]:
        return table_file_names(table, self.test)

    def release_dir(self, dataset: str, release_id: str, destination: str | None = None) -> Path:
        parent = self._parent(dataset, destination)
        return parent / safe_relative(release_id, "release id")

    def prepare(self, dataset: str, destination: str | None = None) -> Path:
        """Create and check the folder a release will go into — before any budget is spent.

        It must lie inside the store once symbolic links are resolved, not inside an existing
        release, be reachable through folders only, and be writable; otherwise ``StoreError``.
        """
        parent = self._parent(dataset, destination)
        self._check_not_in_a_release(parent)
        created = [f for f in [parent, *parent.parents] if not f.exists()]
        try:
            parent.mkdir(parents=True, exist_ok=True)
            probe = parent / f".probe-{uuid.uuid4().hex[:8]}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise StoreError(f"the release folder {parent} cannot be created or written "
                             f"({exc.strerror or type(exc).__name__}); nothing was spent") from None
        finally:  # a refused or failed run leaves no empty folders behind; publish re-creates
            for folder in created:
                with contextlib.suppress(OSError):
                    folder.rmdir()
        real = Path(os.path.realpath(parent))
        if not real.is_relative_to(os.path.realpath(self.root)):
            raise StoreError(f"the release folder {parent} leads outside the store {self.root} "
                             "through a symbolic link; nothing was spent")
        return parent

    def _check_not_in_a_release(self, parent: Path) -> None:
        for folder in [parent, *parent.parents]:
            if folder == self.root or not folder.is_relative_to(self.root):
                break
            if (folder / "manifest.json").exists():
                raise StoreError(f"{folder} is a published release: a destination may not lie "
                                 "inside one; nothing was spent")
            if folder.exists() and not folder.is_dir():
                raise StoreError(f"{folder} is a file, not a folder: choose another "
                                 "destination; nothing was spent")

    def _parent(self, dataset: str, destination: str | None) -> Path:
        base = self.root / safe_relative(destination, "destination") if destination else self.root
        parent = (base / safe_relative(dataset, "dataset name")).resolve()
        if self.root not in parent.parents:
            raise StoreError(f"release folder {parent} would lie outside the store {self.root} "
                             "(a symbolic link leads out); nothing was spent")
        return parent

    def publish(
        self,
        dataset: str,
        release_id: str,
        table: ReleasedRows | pd.DataFrame,
        manifest: dict[str, Any],
        extra_files: dict[str, str] | None = None,
        destination: str | None = None,
        tables: dict[str, pd.DataFrame] | None = None,
        before_rename: Callable[[Path], None] | None = None,
        released_on: datetime | None = None,
        data_tables: dict[str, pd.DataFrame] | None = None,
    ) -> PublishedRelease:
        """Write data (Parquet + CSV, streamed in row groups), manifest and extra text files,
        then rename into place.

        On any failure the partial folder is removed and ``StoreError`` says why; the store is
        unchanged. ``before_rename`` runs on the complete temporary folder (used for checks).
        Every file and the release folder carry the release's day (``released_on``, the
        request's time; default now) as their times, not when they were written.
        """
        day = release_day(released_on)
        final = self.release_dir(dataset, release_id, destination)
        parent = final.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create release folder {parent}: {exc.strerror or exc}") from exc
        self.sweep_partial(parent)
        if final.exists():
            raise StoreError(f"release {final} already exists; release ids are never reused")
        partial = partial_folder(parent, release_id)
        try:
            partial.mkdir()
            if data_tables:  # a relational release: each table its own pair of files
                for name, frame in data_tables.items():
                    parquet, csv = self.table_files(name)
                    write_data_files(ReleasedRows.from_frame(frame), partial / parquet,
                                     partial / csv)
            else:
                parquet, csv = self.data_files
                rows = (table if isinstance(table, ReleasedRows)
                        else ReleasedRows.from_frame(table))
                write_data_files(rows, partial / parquet, partial / csv)
            for name, text in (extra_files or {}).items():
                (partial / safe_relative(name, "file name")).write_text(text, encoding="utf-8")
            for name, frame in (tables or {}).items():
                write_table(frame, partial / safe_relative(name, "file name"))
            # The manifest is written last: its presence means the data files are complete.
            _write_json(partial / "manifest.json", manifest)
            _fsync_dir(partial)
            if before_rename is not None:
                before_rename(partial)
            _stamp_day(partial, day)
            os.rename(partial, final)
            for folder in (final, parent):  # a rename may touch both folders' times
                os.utime(folder, (day, day))
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

    def publish_folder(self, dataset: str, release_id: str, staged: Path,
                       destination: str | None = None,
                       released_on: datetime | None = None) -> PublishedRelease:
        """Publish a complete release folder built elsewhere (a reviewed release's staging
        folder): copied into a partial folder of the store, then renamed into place, as
        ``publish`` does; the staged folder is removed only after the rename."""
        day = release_day(released_on)
        final = self.release_dir(dataset, release_id, destination)
        parent = final.parent
        if not (Path(staged) / "manifest.json").is_file():
            raise StoreError(f"the staged release {staged} is incomplete (no manifest.json); "
                             "nothing was published")
        if final.exists():
            raise StoreError(f"release {final} already exists; release ids are never reused")
        partial = partial_folder(parent, release_id)  # never swept while this one copies
        try:
            parent.mkdir(parents=True, exist_ok=True)
            partial.mkdir()
            names = sorted(p.name for p in Path(staged).iterdir() if p.is_file())
            for name in [n for n in names if n != "manifest.json"] + ["manifest.json"]:
                shutil.copyfile(Path(staged) / name, partial / name)  # manifest last
            _fsync_dir(partial)
            _stamp_day(partial, day)
            os.rename(partial, final)
            for folder in (final, parent):
                os.utime(folder, (day, day))
            _fsync_dir(parent)
        except OSError as exc:
            shutil.rmtree(partial, ignore_errors=True)
            raise StoreError(f"could not publish the staged release {release_id} to {parent}: "
                             f"{exc.strerror or exc}; nothing was published") from exc
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        shutil.rmtree(staged, ignore_errors=True)
        return PublishedRelease(release_id, final)

    def sweep_partial(self, parent: Path) -> None:
        """Remove leftovers of crashed publishes (never visible as releases): a partial folder
        of this host whose process is gone, another host's untouched for ``STALE_PARTIAL_S``,
        or one of an older version (its name says neither)."""
        for leftover in parent.glob(f"{PARTIAL_PREFIX}*"):
            if _still_being_written(leftover):
                continue
            shutil.rmtree(leftover, ignore_errors=True)

    def releases(self, dataset: str | None = None) -> list[Path]:
        """Published release folders (those with a manifest), oldest first."""
        pattern = f"{dataset}/*/manifest.json" if dataset else "**/manifest.json"
        found = [p.parent for p in self.root.glob(pattern) if PARTIAL_PREFIX not in str(p)]
        return sorted(found, key=lambda p: p.name)


def published_manifests(store: str | Path, test_store: str | Path) -> list[dict]:
    """The manifests of every release in both stores (each names its source and charge).

    Here, not in the budget task, so that ``medrelease ledger verify`` and ``restore`` read
    them without importing Prefect (issue 37: commands that run no flow start in a second).
    """
    manifests = []
    for root, test in ((store, False), (test_store, True)):
        for folder in ReleaseStore(root, test=test).releases():
            try:
                manifests.append(json.loads((folder / "manifest.json").read_text()))
            except (OSError, ValueError):
                continue  # a damaged manifest is the store's problem, not the ledger's
    return manifests


class StewardRecords:
    """Per-release evidence that is never published, kept apart from both release stores.

    ``<root>/<dataset>/<release_id>/record.json`` holds what was computed from the raw input
    (input path, hash and row count, information loss, selection, full output checks, flow-run
    and ledger ids); ``candidates.csv`` and ``checks.json`` sit beside it, and the evaluation
    report goes into ``evaluation/``. Written atomically like releases.
    """

    RECORD = "record.json"

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()

    def released_input(self, dataset: str, sha256: str) -> str | None:
        """The real (not TEST) published release of this exact input content, if any."""
        for record in self.records(dataset):
            if (record.get("status") == "published" and not record.get("test_release")
                    and record.get("input_sha256") == sha256
                    and Path(record.get("published_path") or "").is_dir()):
                return record["release_id"]
        return None

    def folder(self, dataset: str, release_id: str) -> Path:
        return self.root / safe_relative(dataset, "dataset name") / safe_relative(
            release_id, "release id")

    def write(self, dataset: str, release_id: str, record: dict[str, Any],
              files: dict[str, str] | None = None) -> Path:
        """Create the record folder atomically (record.json written last)."""
        final = self.folder(dataset, release_id)
        final.parent.mkdir(parents=True, exist_ok=True)
        partial = final.parent / f"{PARTIAL_PREFIX}{release_id}-{uuid.uuid4().hex[:6]}"
        try:
            partial.mkdir()
            for name, text in (files or {}).items():
                (partial / safe_relative(name, "file name")).write_text(text, encoding="utf-8")
            _write_json(partial / self.RECORD, record)
            os.rename(partial, final)
        except OSError as exc:
            shutil.rmtree(partial, ignore_errors=True)
            raise StoreError(f"could not write the steward record of {release_id}: "
                             f"{exc.strerror or exc}; nothing was published") from exc
        return final

    def update(self, dataset: str, release_id: str, **changes: Any) -> dict[str, Any]:
        """Rewrite record.json with ``changes`` applied (atomic replace)."""
        path = self.folder(dataset, release_id) / self.RECORD
        record = {**json.loads(path.read_text(encoding="utf-8")), **changes}
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:6]}")
        _write_json(tmp, record)
        os.replace(tmp, path)
        return record

    def read(self, dataset: str, release_id: str) -> dict[str, Any]:
        path = self.folder(dataset, release_id) / self.RECORD
        if not path.is_file():
            raise StoreError(f"no steward record for release {release_id} of {dataset} under "
                             f"{self.root}")
        return json.loads(path.read_text(encoding="utf-8"))

    def records(self, dataset: str | None = None) -> list[dict[str, Any]]:
        """Every record (of one dataset), oldest first."""
        pattern = f"{dataset}/*/{self.RECORD}" if dataset else f"*/*/{self.RECORD}"
        found = [p for p in self.root.glob(pattern) if PARTIAL_PREFIX not in str(p)]
        return [json.loads(p.read_text(encoding="utf-8"))
                for p in sorted(found, key=lambda p: p.parent.name)]

    def for_release(self, release_folder: str | Path) -> dict[str, Any]:
        """The record of a published (or test) release folder, found via its public manifest."""
        manifest = json.loads((Path(release_folder) / "manifest.json").read_text(
            encoding="utf-8"))
        return self.read(manifest["dataset"], manifest["release_id"])


def release_day(moment: datetime | None = None) -> float:
    """Midnight (UTC) of the release's day, as a file time. A file's own time, to the
    nanosecond, is when it was written: with the request's time in the release id, that is
    how long the run took, which grows with the input's rows (issue 36, case 18)."""
    when = (moment or datetime.now(UTC)).astimezone(UTC)
    return datetime(when.year, when.month, when.day, tzinfo=UTC).timestamp()


def _stamp_day(folder: Path, day: float) -> None:
    """Every file and folder under ``folder`` (and it) dated ``day``, files first."""
    for path in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        os.utime(path, (day, day), follow_symlinks=False)
    os.utime(folder, (day, day))


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
