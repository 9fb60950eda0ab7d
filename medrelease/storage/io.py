"""Reading an extract as its dataset config says, with errors that say how to fix the file.

Everything is read as text first; types are checked and coerced by the input schema
(``medrelease/data/input_schema.py``), so a non-numeric age is reported with its rows instead of silently
turning the whole column into text. Only the columns a release reads (``extract.read_columns``)
are kept in memory: a ``drop`` column, an identifier that is not the privacy unit and any
undeclared column are dropped from each chunk as it is parsed (Parquet: never decoded), so a
wide or heavy column nobody releases is never held whole.
"""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from medrelease.data.config import DatasetConfig
from medrelease.errors import InputValidationError, positions_counted_as

CANDIDATE_DELIMITERS = [",", ";", "\t", "|"]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_snapshot(path: str | Path) -> bool:
    """Whether ``path`` is a snapshot a resolution took (``medrelease.data.extract``): readers
    take it as resolved. A request cannot name one (its input path obeys the input-folder
    rule); only the resolved extract hands them to the steps that read."""
    from medrelease.settings import snapshot_root

    return Path(path).resolve().parent.parent == snapshot_root().resolve()


def extract_source(config: DatasetConfig, path: str | Path | None) -> Path:
    """The file to read: a snapshot as it is, any other path under the input-folder rule."""
    if path is not None and is_snapshot(path):
        return Path(path)
    return config.extract_path(str(path) if path else None)


def _existing_source(config: DatasetConfig, path: str | Path | None) -> Path:
    """The extract's path: in a declared input folder (or a snapshot of one), a regular
    file, not empty."""
    source = extract_source(config, path)
    if not source.is_file():
        raise InputValidationError(f"input file not found (or not a regular file): {source}")
    if source.stat().st_size == 0:
        raise InputValidationError(f"input file {source} is empty (0 bytes): nothing to release")
    return source


def _is_parquet(config: DatasetConfig, source: Path) -> bool:
    return config.input.format == "parquet" or source.suffix.lower() == ".parquet"


def counting_positions(config: DatasetConfig, path: str | Path | None = None):
    """A block in which validation messages name the extract's positions as people find them:
    file lines for CSV (header = line 1), rows for Parquet."""
    source = extract_source(config, path)
    if _is_parquet(config, source):
        return positions_counted_as("row", 1)
    return positions_counted_as("file line", 2)


def _wanted(config: DatasetConfig) -> set[str]:
    """The read columns (``extract.read_columns``: what the input schema checks)."""
    from medrelease.data.input_schema import schema_columns

    return set(schema_columns(config))


def _parquet_columns(config: DatasetConfig, parquet) -> list[str]:
    """The read columns a Parquet file holds, in its order (the others are never decoded)."""
    wanted = _wanted(config)
    return [name for name in parquet.schema_arrow.names if name in wanted]


def read_input(config: DatasetConfig, path: str | Path | None = None) -> pd.DataFrame:
    """The extract's read columns as a frame of text columns (Parquet keeps its own types)."""
    source = _existing_source(config, path)
    if _is_parquet(config, source):
        import pyarrow.parquet as pq

        try:
            parquet = pq.ParquetFile(source)
            return parquet.read(columns=_parquet_columns(config, parquet)).to_pandas()
        except Exception as exc:  # pyarrow raises several unrelated types
            raise _unreadable_parquet(source, exc) from None
    return _read_csv(config, source)


def read_validated_input(config: DatasetConfig, path: str | Path | None = None) -> pd.DataFrame:
    """An extract that already passed validation (its hash checked by the caller), read with
    pandas' multi-threaded pyarrow engine: about 5x faster than ``read_input`` on a million
    rows, same frame. Falls back to ``read_input`` for anything that engine refuses."""
    source = _existing_source(config, path)
    if _is_parquet(config, source):
        return read_input(config, source)
    try:
        wanted = _wanted(config)
        header = [name.removeprefix("\ufeff") for name in  # (a byte-order mark)
                  _raw_header(source, config.input.encoding, config.input.delimiter)]
        return pd.read_csv(source, engine="pyarrow", **_csv_options(config),
                           usecols=[c for c in header if c in wanted])
    except Exception:  # the C engine reads what pyarrow's will not
        return read_input(config, source)


def _unreadable_parquet(source: Path, exc: Exception) -> InputValidationError:
    """pyarrow's own messages may quote bytes of the file: only the kind of error is shown."""
    return InputValidationError(f"cannot read {source} as Parquet ({type(exc).__name__}); "
                                "check input.format and that the file is complete")


@contextmanager
def _csv_errors(config: DatasetConfig, source: Path) -> Iterator[None]:
    """Turn pandas' CSV exceptions into messages that say how to fix the file or the config."""
    try:
        yield
    except UnicodeDecodeError as exc:
        raise InputValidationError(
            f"{source} is not valid {config.input.encoding} text (byte {exc.start}): "
            f"set input.encoding in the dataset config to the file's encoding "
            f"(for example latin-1)"
        ) from None
    except pd.errors.EmptyDataError:
        raise InputValidationError(f"input file {source} has no header and no rows") from None
    except pd.errors.ParserError as exc:
        detail = str(exc).split("\n")[0][:200]  # "Expected 7 fields in line 5, saw 8"
        raise InputValidationError(f"cannot parse {source} as CSV: {detail}") from None
    except csv.Error:
        raise InputValidationError(
            f"cannot parse {source} as CSV: a field of the header is longer than "
            f"{csv.field_size_limit():,} characters — not a header of this dataset") from None


def _csv_options(config: DatasetConfig) -> dict:
    return {"sep": config.input.delimiter, "dtype": str, "encoding": config.input.encoding,
            "keep_default_na": False, "na_values": [""]}


# A CSV is parsed in chunks of about this many cells, each cut to the read columns before the
# next is parsed: the parser's own ``usecols`` would skip the other columns but also stop
# refusing a row with more fields than the header (a ragged row).
CELLS_PER_CHUNK = 5_000_000


def _csv_chunks(config: DatasetConfig, source: Path, rows_per_chunk: int):
    """The CSV in chunks of its read columns (row labels continuing across chunks), the file
    checks run on the first; within ``_csv_errors``."""
    wanted = _wanted(config)
    width = max(1, len(_raw_header(source, config.input.encoding, config.input.delimiter)))
    rows = max(1_000, min(rows_per_chunk, CELLS_PER_CHUNK // width))
    reader = pd.read_csv(source, engine="c", chunksize=rows, **_csv_options(config))
    for position, chunk in enumerate(reader):
        if position == 0:
            _check_header(config, source, chunk, config.input.delimiter)
        yield chunk[[c for c in chunk.columns if c in wanted]]


def _read_csv(config: DatasetConfig, source: Path) -> pd.DataFrame:
    with _csv_errors(config, source):
        parts = list(_csv_chunks(config, source, CELLS_PER_CHUNK))
    return pd.concat(parts) if len(parts) > 1 else parts[0]


def _check_header(config: DatasetConfig, source: Path, frame: pd.DataFrame, delimiter: str) -> None:
    """Catch the common file mistakes before column-level validation (on the file's own
    header: the frame holds the read columns only)."""
    raw_header = _raw_header(source, config.input.encoding, delimiter)
    header = raw_header
    repeated = sorted({c for c in raw_header if raw_header.count(c) > 1})
    if repeated:
        named = [c for c in repeated if c in config.columns]
        raise InputValidationError(
            f"{source}: the header repeats {len(repeated)} column name(s)"
            + (f", among them declared column(s) {', '.join(map(repr, named))}" if named else ""))
    needed = config.dimensions + config.informative
    if len(header) == 1 and len(needed) > 1:
        guess = next((d for d in CANDIDATE_DELIMITERS if d != delimiter and d in header[0]), None)
        hint = f"; the header contains {guess!r} — set input.delimiter: {guess!r}" if guess else ""
        raise InputValidationError(
            f"{source}: the header has a single column with delimiter {delimiter!r}, the "
            f"config declares {len(needed)}{hint}"
        )


def _raw_header(source: Path, encoding: str, delimiter: str) -> list[str]:
    with source.open(encoding=encoding, newline="") as handle:
        return next(csv.reader(handle, delimiter=delimiter), [])



def iter_chunks(config: DatasetConfig, path: str | Path | None = None,
                rows_per_chunk: int = 500_000):
    """The extract in chunks (Parquet row groups / CSV chunks), columns as in ``read_input``.

    The same file checks as ``read_input`` run on the first chunk; row labels continue across
    chunks, so validation messages name rows of the whole file.
    """
    source = _existing_source(config, path)
    if _is_parquet(config, source):
        import pyarrow.parquet as pq

        try:
            parquet = pq.ParquetFile(source)
        except Exception as exc:  # pyarrow raises several unrelated types
            raise _unreadable_parquet(source, exc) from None
        offset = 0
        for batch in parquet.iter_batches(batch_size=rows_per_chunk,
                                          columns=_parquet_columns(config, parquet)):
            chunk = batch.to_pandas()
            chunk.index = pd.RangeIndex(offset, offset + len(chunk))  # rows of the whole file
            offset += len(chunk)
            yield chunk
        return
    with _csv_errors(config, source):
        yield from _csv_chunks(config, source, rows_per_chunk)
