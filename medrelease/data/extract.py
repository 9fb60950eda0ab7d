"""The files a release reads, resolved once: where they are, that they may be read, and what
they hold (their content hashes), before any byte is validated or any budget is charged.

Every later step reads this value instead of resolving the config's path again, so what is
charged in the ledger (the content hashes) is what was read. Each file is copied, and hashed
while it is copied, into a private *snapshot* under the steward folder
(``medrelease.settings.snapshot_root``); every later step reads the snapshot, so a file
replaced in the input folder after resolution (``mv`` of another source's extract over it)
changes nothing the run reads or charges. Two hashes name each file's content: the SHA-256 of
its bytes and the digest of its parsed rows (``medrelease.data.content``), which stays the
same in another format, with other line ends, quoting or column order; the ledger claims
both. A file with more than one hard link is refused: a hard link makes another folder's file
(another hospital's extract) appear inside this dataset's input folder, and no path check can
tell them apart. Two partitions with identical content (bytes or rows) are refused: every
patient in them would count twice while the budget is charged once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from medrelease.data.config import DatasetConfig
from medrelease.data.content import row_digests
from medrelease.errors import ConfigError, InputValidationError

ROWS_CLAIM = "rows:"  # the ledger's claim key of a row digest (a byte hash has no prefix)
STALE_SNAPSHOT_S = 24 * 3600  # a snapshot this old is a crashed run's: swept at resolution


@dataclass(frozen=True)
class ExtractFile:
    """One file of an extract: its resolved path (named in messages and records), the SHA-256
    of its bytes, the digest of its parsed rows (``None`` when it cannot be parsed: its
    validation refuses it) and the snapshot every later step reads.

    ``rows_by_count``: the row digest is taken by the count's own pass over the file instead
    of a pass of its own at resolution (``rows_sha256`` is ``None`` until
    ``ResolvedExtract.counted`` fills it in); the ledger's claims cannot be read before.
    ``text_rows_sha256``: the text digest, where a number was spelled otherwise than in its
    one spelling (``content``: what earlier versions recorded as the row digest)."""

    path: str
    sha256: str
    rows_sha256: str | None = None
    snapshot: str | None = None
    rows_by_count: bool = False
    text_rows_sha256: str | None = None
    more_rows_sha256: tuple[str, ...] = ()  # a relational table's other row digests (claims)
    claimed: bool = True  # False: a relational child table without rows (claims nothing)

    @property
    def read_from(self) -> Path:
        """What a release step reads: the snapshot taken at resolution."""
        return Path(self.snapshot or self.path)


@dataclass(frozen=True)
class ResolvedExtract:
    """An extract as the release will read it (one file, or the partitions of a pattern)."""

    pattern: str
    files: tuple[ExtractFile, ...]
    snapshot_dir: str | None = None

    @property
    def paths(self) -> list[Path]:
        return [Path(f.path) for f in self.files]

    @property
    def hashes(self) -> tuple[str, ...]:
        return tuple(f.sha256 for f in self.files)

    @property
    def claims(self) -> tuple[str, ...]:
        """What the ledger ties to the source charged: every file's byte hash and its row
        digest (``rows:<hex>``), so a copy in another format cannot open a fresh budget."""
        if any(f.rows_by_count for f in self.files):
            raise RuntimeError("the extract's row digest is taken by its count: charge after "
                               "the count (ResolvedExtract.counted)")
        return (*(f.sha256 for f in self.files if f.claimed),
                *(ROWS_CLAIM + f.rows_sha256 for f in self.files if f.rows_sha256),
                *(ROWS_CLAIM + f.text_rows_sha256 for f in self.files if f.text_rows_sha256),
                *(ROWS_CLAIM + d for f in self.files for d in f.more_rows_sha256))

    @property
    def rows_digest(self) -> str | None:
        """The extract's row digest (a one-file extract's own; several files' digests hashed
        in name order), for the steward record."""
        if any(f.rows_by_count for f in self.files):
            raise RuntimeError("the extract's row digest is taken by its count: read it after "
                               "the count (ResolvedExtract.counted)")
        digests = [f.rows_sha256 for f in self.files]
        if not digests or None in digests:
            return None
        if len(digests) == 1:
            return digests[0]
        return hashlib.sha256("\n".join(digests).encode()).hexdigest()

    def counted(self, rows_sha256: str | None,
                text_rows_sha256: str | None = None) -> ResolvedExtract:
        """The extract with the row digest (and text digest) its count took
        (``rows_by_count``: a one-file extract); unchanged when it was digested at
        resolution."""
        if not any(f.rows_by_count for f in self.files):
            return self
        (file,) = self.files
        return replace(self, files=(replace(file, rows_sha256=rows_sha256,
                                            text_rows_sha256=text_rows_sha256,
                                            rows_by_count=False),))

    def discard(self) -> None:
        """Remove the run's snapshots (called when the run ends, whatever its outcome)."""
        if self.snapshot_dir:
            shutil.rmtree(self.snapshot_dir, ignore_errors=True)

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
    _check_single_link(info, path, what)


def _check_single_link(info: os.stat_result, path: Path, what: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise InputValidationError(f"{what} {path} is not a regular file")
    if info.st_nlink != 1:
        raise ConfigError(
            f"{what} {path.name} has {info.st_nlink} hard links: a hard link can make a file "
            "kept elsewhere (another dataset's extract) appear in this folder, so it is not "
            "read. Copy the file instead of linking it. Nothing was read or spent.")


# A Parquet footer (the file's schema and statistics) is read whole to count its columns: one
# larger than this is refused before it is parsed (a footer of 10^6 columns is ~100 MB).
MAX_PARQUET_FOOTER = 64 * 2**20
HEADER_BLOCK = 1 << 16


def check_extract_bounds(config: DatasetConfig, path: Path) -> None:
    """Refuse (``InputValidationError``, with the numbers and the policy field to change) an
    extract wider than ``policy.max_input_columns`` or larger unpacked than
    ``policy.max_input_bytes``, reading only its size, its CSV header or its Parquet footer.

    Why before reading: the readers hold what they read, so a file of 10^6 columns, or a small
    Parquet file whose columns decompress to gigabytes, ran out of memory (the process
    aborted) instead of being refused. A file the checks cannot read is left to the readers,
    whose messages say what is wrong with it."""
    policy = config.policy
    try:
        size = os.stat(path).st_size
    except OSError:
        return  # the readers say "not found"
    name = Path(path).name
    if size > policy.max_input_bytes:
        raise InputValidationError(
            f"input file {name} is {size:,} bytes, more than the {policy.max_input_bytes:,} "
            "the dataset's policy allows (policy.max_input_bytes): it was not read. Send a "
            "smaller extract (only the declared columns), or raise the limit. Nothing was read "
            "or spent.")
    if config.input.format == "parquet" or Path(path).suffix.lower() == ".parquet":
        _check_parquet_bounds(config, Path(path), size)
        return
    columns = _csv_header_width(Path(path), config.input.delimiter, config.input.encoding,
                                policy.max_input_columns)
    if columns is not None and columns > policy.max_input_columns:
        raise InputValidationError(
            f"input file {name} has more than {policy.max_input_columns:,} columns (counted in "
            "its header), more than the dataset's policy allows (policy.max_input_columns): it "
            "was not read. Send an extract of the declared columns, or raise the limit. "
            "Nothing was read or spent.")


def _csv_header_width(path: Path, delimiter: str, encoding: str, limit: int) -> int | None:
    """The fields of a CSV file's first record, counted as it streams by (quotes respected)
    and no further than ``limit + 1``; None when it cannot be decoded (the reader says so)."""
    fields, quoted = 1, False
    try:
        with path.open(encoding=encoding, newline="") as handle:
            while block := handle.read(HEADER_BLOCK):
                for char in block:
                    if char == '"':
                        quoted = not quoted
                    elif not quoted and char == delimiter:
                        fields += 1
                        if fields > limit:
                            return fields
                    elif not quoted and char in "\r\n":
                        return fields
    except (OSError, UnicodeDecodeError, LookupError):
        return None
    return fields


def _check_parquet_bounds(config: DatasetConfig, path: Path, size: int) -> None:
    """A Parquet file's column count and its read columns' uncompressed size, from its footer
    (the footer's own length read first, from the file's last 8 bytes)."""
    import pyarrow.parquet as pq

    policy, name = config.policy, path.name
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, size - 8))
            tail = handle.read(8)
    except OSError:
        return
    if len(tail) < 8 or tail[4:] != b"PAR1":
        return  # not Parquet: its reader says so
    footer = int.from_bytes(tail[:4], "little")
    if footer > min(MAX_PARQUET_FOOTER, size):
        raise InputValidationError(
            f"input file {name} has a Parquet footer (its schema) of {footer:,} bytes, more "
            f"than the {MAX_PARQUET_FOOTER:,} this reader allows (a table of many thousands "
            "of columns): it was not read. Send an extract of the declared columns. Nothing "
            "was read or spent.")
    try:
        metadata = pq.ParquetFile(path).metadata
    except Exception:  # pyarrow raises several unrelated types: the reader explains
        return
    if metadata.num_columns > policy.max_input_columns:
        raise InputValidationError(
            f"input file {name} has {metadata.num_columns:,} columns (in its Parquet schema), "
            f"more than the {policy.max_input_columns:,} the dataset's policy allows "
            "(policy.max_input_columns): it was not read. Send an extract of the declared "
            "columns, or raise the limit. Nothing was read or spent.")
    read = set(read_columns(config))
    unpacked = sum(group.column(i).total_uncompressed_size
                   for group in (metadata.row_group(g) for g in range(metadata.num_row_groups))
                   for i in range(group.num_columns)
                   if group.column(i).path_in_schema.split(".", 1)[0] in read)
    if unpacked > policy.max_input_bytes:
        raise InputValidationError(
            f"input file {name} unpacks to {unpacked:,} bytes in the columns a release reads "
            f"(its footer says so), more than the {policy.max_input_bytes:,} the dataset's "
            "policy allows (policy.max_input_bytes): it was not read. Send a smaller extract, "
            "or raise the limit. Nothing was read or spent.")


def read_columns(config: DatasetConfig) -> list[str]:
    """The columns a release reads from an extract (what its input schema checks); a
    ``drop`` column, an identifier that is not the privacy unit and any undeclared column
    are never read into memory."""
    from medrelease.data.input_schema import schema_columns

    return list(dict.fromkeys(schema_columns(config)))


def resolve_extract(config: DatasetConfig, override: str | None = None,
                    rows_by_count: bool = False) -> ResolvedExtract:
    """The extract's files (input-folder rule, regular, one hard link), each copied to a
    snapshot in the steward folder and hashed while copied, its
    rows digested from the snapshot, duplicates refused. Raises ``ConfigError`` /
    ``InputValidationError`` naming the file and the rule; nothing is left behind then.

    ``rows_by_count`` (a release that counts the extract): a one-file extract's rows are
    digested by that count's own pass over the file (one read of the file instead of two, the
    digest bit for bit the same); several files are digested here, where identical
    partitions are refused."""
    from medrelease.settings import snapshot_root

    pattern = config.extract_path(override)
    relational = config.relational is not None
    if relational:  # one file per table, the parent table first (``DatasetConfig.table_files``)
        files = [Path(p).resolve() for p in config.table_files(override).values()]
    else:
        files = [Path(p).resolve() for p in config.extract_files(override)]
    root = snapshot_root()
    _sweep_stale(root)
    folder = root / uuid.uuid4().hex
    try:
        folder.mkdir(parents=True, mode=0o700)
        resolved = []
        later = rows_by_count and len(files) == 1
        for path in files:
            check_single_link(path)
            check_extract_bounds(config, path)  # its size and width, before the copy
            copy, sha256 = snapshot_file(path, folder)
            check_extract_bounds(config, copy)  # what is read: the copy
            # a relational dataset's parent table: the config's columns; each other table: its
            # own (with and without its key, as a one-table config over it would read it)
            digests = () if later else (child_digests(config, len(resolved), copy)
                                        if relational and resolved else
                                        row_digests(config, copy))
            resolved.append(ExtractFile(str(path), sha256, digests[0] if digests else None,
                                        str(copy), later,
                                        digests[1] if len(digests) > 1 else None,
                                        tuple(digests[2:]),
                                        not (relational and resolved and not digests
                                             and _no_rows(copy))))
        _refuse_identical_partitions(resolved)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return ResolvedExtract(str(pattern), tuple(resolved), str(folder))


def _no_rows(copy: Path) -> bool:
    """A relational child table's file holds a header and no row (its bytes are every such
    file's: claiming them would tie unrelated sources together)."""
    import pandas as pd

    try:
        if copy.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(copy).metadata.num_rows == 0
        return pd.read_csv(copy, nrows=1, dtype=str).empty
    except (OSError, ValueError, UnicodeDecodeError):
        return False


def child_digests(config: DatasetConfig, index: int, copy: Path) -> tuple[str, ...]:
    """The row digests of a relational dataset's ``index``-th table (a child table): its
    reference and released columns, and the same with its own key."""
    from medrelease.data.content import table_digests

    spec = config.relational.tables[index - 1]  # type: ignore[union-attr]
    columns = [spec.references, *spec.columns]
    sets = [columns] + ([[spec.key, *columns]] if spec.key else [])
    return table_digests(copy, sets, spec.format, spec.delimiter, config.input.encoding)


def snapshot_file(path: Path, folder: Path) -> tuple[Path, str]:
    """Copy ``path`` into ``folder`` (same name) and return the copy and the SHA-256 of the
    bytes copied: the hash is of exactly what later steps read. The opened file itself is
    checked (regular, one hard link), so a swap between the path check and the open is
    caught too."""
    target = folder / path.name
    digest = hashlib.sha256()
    try:
        source = path.open("rb")
    except OSError as exc:
        raise InputValidationError(f"input file not found or unreadable: {path} "
                                   f"({exc.strerror})") from None
    with source, target.open("xb") as copy:
        _check_single_link(os.fstat(source.fileno()), path, "input file")
        for block in iter(lambda: source.read(1 << 20), b""):
            digest.update(block)
            copy.write(block)
    target.chmod(0o400)
    return target, digest.hexdigest()


def _sweep_stale(root: Path) -> None:
    """Snapshots left by runs that crashed (a run removes its own when it ends)."""
    if not root.is_dir():
        return
    now = time.time()
    for folder in root.iterdir():
        with contextlib.suppress(OSError):
            if now - folder.stat().st_mtime > STALE_SNAPSHOT_S:
                shutil.rmtree(folder, ignore_errors=True)


def _refuse_identical_partitions(files: list[ExtractFile]) -> None:
    seen: dict[str, str] = {}
    for entry in files:
        name = Path(entry.path).name
        for key in (entry.sha256, ROWS_CLAIM + entry.rows_sha256 if entry.rows_sha256 else None):
            if key is None:
                continue
            if key in seen:
                same = "identical content" if key == entry.sha256 else \
                    "identical content (the same rows, in another format, line ends, quoting " \
                    "or column order)"
                raise InputValidationError(
                    f"input files {seen[key]} and {name} have {same}: every patient in them "
                    "would be counted twice while the budget is charged once. Remove the copy "
                    "from the input folder. Nothing was read or spent.")
            seen[key] = name


@dataclass(frozen=True)
class InputInfo:
    """What the run read: the extract's path and hashes, its rows, and what validation and the
    privacy unit's bound dropped (steward facts: never published)."""

    path: str
    sha256: str
    rows: int
    dropped_rows: int = 0
    unit_bound: dict | None = None  # what the privacy unit's bound cut (steward only)
    rows_sha256: str | None = None  # the digest of the parsed rows (steward only)
    text_rows_sha256: str | None = None  # their text digest, where it differs (content)


def refuse_several_files(extract: ResolvedExtract, config: DatasetConfig, rows_kind: bool,
                         unit_column: str | None) -> None:
    """What an extract of several files cannot be read as, before anything is counted or
    spent: a mechanism that releases from the rows reads one file, and a privacy unit's rows
    (which may lie in several files) must be bounded together. The flow's input steps and
    ``medrelease check`` both ask this (``tasks/inputs.py``, ``medrelease/checkup.py``)."""
    if len(extract.files) < 2:
        return
    pattern = Path(extract.pattern).name
    if rows_kind:
        raise InputValidationError(
            f"{len(extract.files)} files match {pattern!r}: this mechanism reads one file; "
            "extracts in several files are read by the mechanisms that search the lattice "
            "(ipa, ipa-paper, kanon)")
    if unit_column is not None:
        raise InputValidationError(
            f"{len(extract.files)} files match {pattern!r}, and dataset {config.name!r} "
            f"declares the privacy unit {unit_column!r}: one unit's rows may lie in several "
            "files and must be bounded together, which is not built yet; merge the files into "
            "one extract")
