"""Encode the input once into integer codes and counts; everything after works on counts.

A *cell* is one (finest dimension vector, informative value) combination. Cells are kept as one
sorted ``int64`` key per cell — the dimension leaf codes and the informative code packed in a
mixed radix, informative code least significant — plus a row count. Generalizing to a lattice
node then only rewrites digits of the keys and merges equal keys (see ``lattice.py``).

A *wide* table — twenty columns, nine of them continuous — has more combinations than a 64-bit
key holds. Its cells keep one code per column instead (``CountTable.wide_codes``): ``aim``
reads only the marginals it measures (``MarginalSpace``: codes per attribute, a weight per
cell), so it releases such a table; the lattice mechanisms, which rewrite key digits, are
refused before anything is read, with the columns to coarsen or drop
(``joint_domain_problem``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from medrelease.data.binning import NUMERIC_TYPES, canonical_numbers
from medrelease.data.config import DatasetConfig
from medrelease.data.taxonomy import Taxonomy
from medrelease.errors import InputValidationError, format_rows, position_numbers

MAX_KEY = 2**62
# numpy's default sort of int64 (x86-simd-sort where the CPU has AVX2/AVX-512): packed values
# need no stability (equal values are equal keys and weights). Measured on 1.17M values: random
# 6.7 ms against timsort's ("stable") 78 ms; a roll-up's 1,170 sorted runs 7 ms against 42 ms.
SORT_KIND = "quicksort"


def group_sum(keys: np.ndarray, weights: np.ndarray,
              scratch: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct keys and the summed (non-negative integer) weights per key.

    ``scratch``: ``keys`` is a temporary of the caller's (a roll-up's new keys) and may be
    overwritten, which saves one array of the table's size per roll-up.

    Three strategies, fastest first (measured on 1M-cell roll-ups: dense 4 ms, packed sort
    20 ms, pandas hashing 100-160 ms):
    * dense counting when the key range is at most 4x the number of keys (output comes out
      sorted); below 262,144 keys the floor is 1,024, not 2^20: a dense pass over a 2^20 range
      cost a 40-row table's roll-up 3.4 ms against the sort's 0.05 ms, at every lattice node;
    * otherwise, when ``key * (max weight + 1) + weight`` fits in 63 bits, one in-place sort of
      that packed value (``SORT_KIND``);
    * else an argsort.
    """
    keys = np.asarray(keys, dtype=np.int64)
    weights = np.asarray(weights, dtype=np.int64)
    if keys.size == 0:
        return keys, np.zeros(0, dtype=np.int64)
    low = int(keys.min())
    span = int(keys.max()) - low + 1
    if span <= max(4 * keys.size, 1 << 10):
        sums = np.bincount(keys - low, weights=weights, minlength=span)
        present = np.flatnonzero(sums)
        return present.astype(np.int64) + low, np.rint(sums[present]).astype(np.int64)
    weight_bits = int(weights.max()).bit_length()
    if (span << weight_bits) < MAX_KEY:
        # In place where numpy allows: at 14M cells each array is 112 MB, and two scoring
        # threads run this at once (benchmarks/scale_bench.py, 30M rows). Shifts, not
        # divisions: the weight takes the packed value's low bits.
        packed = keys if scratch and keys.flags.writeable and keys.flags.c_contiguous \
            else keys.copy()
        del keys
        packed -= low
        packed <<= weight_bits
        packed += weights
        packed.sort(kind=SORT_KIND)
        sorted_keys = packed >> weight_bits
        sorted_weights = np.bitwise_and(packed, (1 << weight_bits) - 1, out=packed)
        del packed
    else:
        order = np.argsort(keys, kind="stable")
        sorted_keys, sorted_weights = keys[order] - low, weights[order]
    # Sums by differences of a running total at each run's last element: one vectorized
    # pass, where reduceat pays a call per run (1M runs of one row at the lower nodes).
    is_end = np.empty(sorted_keys.size, dtype=bool)
    is_end[-1] = True
    np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=is_end[:-1])
    if np.count_nonzero(is_end) == is_end.size:  # every key distinct (the lower nodes): done
        sorted_keys += low
        return sorted_keys, sorted_weights
    # A boolean mask, not the runs' positions: one array of the table's size fewer at the
    # peak (two scoring threads, 14M cells: 112 MB each).
    distinct = sorted_keys[is_end]
    del sorted_keys
    distinct += low
    running = np.cumsum(sorted_weights, out=sorted_weights)  # a fresh array on both paths
    sums = running[is_end]
    del running, sorted_weights, is_end
    _difference_in_place(sums)
    return distinct, sums


def _difference_in_place(totals: np.ndarray, block: int = 1 << 20) -> None:
    """Running totals -> the differences of consecutive ones, in place and from the end, a
    block at a time (``np.diff`` would hold two more arrays of the table's size)."""
    for end in range(totals.size, 1, -block):
        start = max(end - block, 1)
        totals[start:end] -= totals[start - 1:end - 1].copy()


@dataclass(frozen=True)
class CountTable:
    """The input, aggregated: sorted cell keys, their row counts, and how to unpack keys.

    ``radices[i]`` is the place value of dimension ``i`` in a key (the informative code has place
    value 1 and ``n_inf`` distinct values). ``informative`` holds one row per informative code
    with the raw informative columns (so released rows carry raw values).
    """

    dimensions: tuple[str, ...]
    taxonomies: tuple[Taxonomy, ...]
    cell_keys: np.ndarray
    counts: np.ndarray
    informative: pd.DataFrame
    n_rows: int
    public_domain: bool = False
    dropped_rows: int = 0  # by missing: drop_rows (n_rows counts the rows kept)
    unit_bound: Any = None  # the privacy unit's BoundReport (steward only), when one ran
    # A wide table (its combinations overflow a 64-bit key): per cell, each dimension's leaf
    # code and then the informative code; ``cell_keys`` are then the cells' positions.
    wide_codes: tuple[np.ndarray, ...] | None = None

    @property
    def n_inf(self) -> int:
        return len(self.informative)

    @property
    def wide(self) -> bool:
        """Whether the cells carry codes per column instead of one packed key."""
        return self.wide_codes is not None

    @property
    def radices(self) -> np.ndarray:
        """Place values of the packed key; a wide table has none (the lattice mechanisms that
        need them are refused at the plan, ``joint_domain_problem``: this is the backstop)."""
        if self.wide:
            raise InputValidationError(
                joint_domain_problem(self.dimensions, self.taxonomies, self.n_inf)
                or "the dimensions' combined domain is too large for one count table")
        return place_values(self.taxonomies, self.n_inf)

    def dimension_codes(self, keys: np.ndarray | None = None) -> np.ndarray:
        """Leaf (or node-level) codes per dimension, shape (cells, q)."""
        keys = self.cell_keys if keys is None else keys
        return stacked(self.dimension_columns(keys), len(keys))

    def dimension_columns(self, keys: np.ndarray | None = None) -> list[np.ndarray]:
        """The same codes, one array per dimension."""
        if self.wide_codes is not None:
            columns = list(self.wide_codes[:len(self.dimensions)])
            return columns if keys is None else [c[np.asarray(keys)] for c in columns]
        keys = self.cell_keys if keys is None else keys
        sizes = [t.n_leaves for t in self.taxonomies]
        return mixed_radix_digits(np.asarray(keys, dtype=np.int64) // max(self.n_inf, 1), sizes)

    def inf_codes(self, keys: np.ndarray | None = None) -> np.ndarray:
        if self.wide_codes is not None:
            codes = self.wide_codes[-1]
            return codes if keys is None else codes[np.asarray(keys)]
        keys = self.cell_keys if keys is None else keys
        return keys % self.n_inf


def distinct_cells(codes: list[np.ndarray], sizes: list[int], weights: np.ndarray
                   ) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """The distinct combinations of ``codes`` (one array per column, codes below ``sizes``)
    and their summed ``weights``, without one key over all columns: the key of the columns
    so far is packed with the next column's code while it fits in 63 bits, and renumbered
    densely (at most one number per row) when it would not. So any number of columns of any
    size is grouped exactly, at a sort per renumbering."""
    weights = np.asarray(weights, dtype=np.int64)
    key = np.zeros(weights.size, dtype=np.int64)
    span = 1
    for code, size in zip(codes, sizes, strict=True):
        size = max(int(size), 1)
        if span * size >= MAX_KEY:
            _, key = np.unique(key, return_inverse=True)
            key = np.asarray(key, dtype=np.int64).reshape(-1)
            span = int(key.max()) + 1 if key.size else 1
        key = key * size + np.asarray(code, dtype=np.int64)
        span *= size
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    sums = np.bincount(np.asarray(inverse).reshape(-1), weights=weights, minlength=first.size)
    return (tuple(np.asarray(c, dtype=np.int64)[first] for c in codes),
            np.rint(sums).astype(np.int64))


def wide_count_table(dimensions: list[str] | tuple[str, ...], taxonomies: tuple[Taxonomy, ...],
                     dimension_codes: list[np.ndarray], inf_codes: np.ndarray,
                     weights: np.ndarray, informative: pd.DataFrame, public_domain: bool,
                     dropped_rows: int = 0) -> CountTable:
    """A count table whose cells keep a code per column (``CountTable.wide_codes``): for a
    table whose combinations overflow the packed key. Rows with equal codes are one cell."""
    sizes = [t.n_leaves for t in taxonomies] + [max(len(informative), 1)]
    codes, counts = distinct_cells([*dimension_codes, inf_codes], sizes, weights)
    return CountTable(
        dimensions=tuple(dimensions), taxonomies=taxonomies,
        cell_keys=np.arange(counts.size, dtype=np.int64), counts=counts,
        informative=informative, n_rows=int(np.asarray(weights, dtype=np.int64).sum()),
        public_domain=public_domain, dropped_rows=dropped_rows, wide_codes=codes)


# The lattice mechanisms stream an extract with room for this many informative codes when no
# domain is declared (``aggregate_chunks``), so their joint domain is held to it.
def public_informative_size(config: DatasetConfig) -> int:
    """How many informative codes a count table of ``config`` may need, from the config alone:
    the declared domain's size, else the streaming pass's room (``INF_RADIX``)."""
    if not config.informative:
        return 1
    domain = config.informative_domain
    return max(len(domain), 1) if domain is not None else INF_RADIX


def joint_domain_problem(dimensions: list[str] | tuple[str, ...],
                         taxonomies: tuple[Taxonomy, ...], n_inf: int,
                         mechanism: str | None = None) -> str | None:
    """Why the dimensions' combined domain (the product of their leaves, times ``n_inf``
    informative codes) is too large for one packed count table, naming the columns to coarsen
    or drop — the fewest, largest first, whose removal would make it fit — and that ``aim``
    (which reads only marginals) releases it; None when it fits. Public facts only."""
    if key_space(taxonomies, n_inf) < MAX_KEY:
        return None
    leaves = sorted(((t.n_leaves, name) for name, t in zip(dimensions, taxonomies,
                                                            strict=True)), reverse=True)
    space, named = key_space(taxonomies, n_inf), []
    for size, name in leaves:
        if space < MAX_KEY:
            break
        named.append(f"{name!r} ({size:,} values)")
        space //= max(size, 1)
    who = f"{mechanism} needs" if mechanism else "the lattice mechanisms need"
    return (f"the dimensions' combined domain is too large to stream: {len(dimensions)} "
            f"dimensions whose values multiply to about 10^{_digits(taxonomies)} combinations, "
            f"and {who} one count table over all of them (at most 2^62 keys); coarsen the "
            f"finest level of, or drop (role: drop), {', '.join(named)}; or release it with "
            "aim, which reads only the marginals it measures. Nothing was read or spent.")


def _digits(taxonomies: tuple[Taxonomy, ...]) -> int:
    """The order of magnitude of the dimensions' combined domain (public)."""
    import math

    return int(sum(math.log10(max(t.n_leaves, 1)) for t in taxonomies))


def mixed_radix_digits(numbers: np.ndarray, sizes: list[int] | np.ndarray
                       ) -> list[np.ndarray]:
    """The digits of non-negative ``numbers`` in the mixed radix ``sizes``, one array per
    digit, most significant first. A division and a multiply-subtract per digit: numpy's ``%``
    and ``divmod`` on int64 take three times as long as ``//``; and each digit is written to
    its own array (writing a column of a fresh 2-D array first-touched it at 50 ms for 1M
    rows)."""
    digits: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * len(sizes)
    rest = np.asarray(numbers, dtype=np.int64)
    if rest.size and int(rest.min()) >= 0 and int(rest.max()) < 2**31:
        rest = rest.astype(np.int32)  # half the memory to touch: the same digits, faster
    for i in range(len(sizes) - 1, -1, -1):
        quotient = rest // int(sizes[i])
        quotient_times_size = quotient * int(sizes[i])
        digits[i] = np.subtract(rest, quotient_times_size, out=quotient_times_size)
        rest = quotient
    return digits


def stacked(columns: list[np.ndarray], rows: int) -> np.ndarray:
    """Columns as one (rows, len(columns)) array."""
    if not columns:
        return np.zeros((rows, 0), dtype=np.int64)
    return np.stack([np.asarray(c, dtype=np.int64) for c in columns], axis=1)


def place_values(taxonomies: tuple[Taxonomy, ...], n_inf: int) -> np.ndarray:
    """Mixed-radix place value of each dimension in a cell key."""
    radices = np.zeros(len(taxonomies), dtype=np.int64)
    place = max(n_inf, 1)
    for i in range(len(taxonomies) - 1, -1, -1):
        radices[i] = place
        place *= taxonomies[i].n_leaves
    return radices


def key_space(taxonomies: tuple[Taxonomy, ...], n_inf: int) -> int:
    size = max(n_inf, 1)
    for t in taxonomies:
        size *= t.n_leaves
    return size


def numeric_informative(config: DatasetConfig) -> list[str]:
    """Informative columns declared ``type: integer`` or ``decimal``: their values are numbers,
    compared as numbers (``3`` and ``3.0`` are one value, released as ``3``)."""
    return [c for c in config.informative if config.columns[c].type in NUMERIC_TYPES]


def canonical_informative_numbers(frame: pd.DataFrame, config: DatasetConfig) -> pd.DataFrame:
    """``frame`` with each numeric informative column in one spelling per number (the domain
    file is read the same way: ``DatasetConfig.informative_domain``)."""
    columns = [c for c in numeric_informative(config) if c in frame.columns]
    if not columns:
        return frame
    return frame.assign(**{c: canonical_numbers(frame[c]) for c in columns})


def prepare_table(table: pd.DataFrame, config: DatasetConfig,
                  include_class: bool = False) -> pd.DataFrame:
    """The declared columns with the missing-value policy applied (see ``prepare_counted``)."""
    return prepare_counted(table, config, include_class)[0]


def prepare_counted(table: pd.DataFrame, config: DatasetConfig,
                    include_class: bool = False) -> tuple[pd.DataFrame, int]:
    """Check the columns the config needs are present and apply the missing-value policy.

    Returns the declared dimension and informative columns (with ``include_class`` also the class
    and set-valued ones) only — undeclared columns never go further than this function — and
    how many rows ``missing: drop_rows`` dropped. Messages name declared columns only: the
    extract's own header is file content.
    """
    needed = config.dimensions + config.informative
    if include_class:
        needed = needed + config.class_columns
    sets = [c for c in config.set_valued if include_class]
    _check_columns(table, config, needed + sets)
    # A blank set-valued cell is an empty item set, not a missing value.
    frame = table[needed + sets].fillna({c: "" for c in sets}) if sets else table[needed]
    frame = canonical_informative_numbers(frame, config)
    labels = {c: config.columns[c].missing for c in needed if config.columns[c].missing}
    if labels:
        frame = frame.fillna(labels)
    if frame.empty:
        raise InputValidationError("input table has no rows: there is nothing to release")
    nulls = frame.isna()
    if not nulls.to_numpy().any():
        return frame, 0
    if config.missing == "drop_rows":
        incomplete = nulls.any(axis=1)
        return frame[~incomplete], int(incomplete.sum())
    problems, lines = [], []
    for column in needed:
        rows = frame.index.to_numpy()[np.flatnonzero(nulls[column].to_numpy())]
        if rows.size:
            problems.append({"column": column, "rows": int(rows.size),
                             "first_positions": position_numbers(rows),
                             "problem": "missing value"})
            lines.append(f"  column {column!r}: {rows.size} missing value(s), first at "
                         f"{format_rows(rows.tolist())}")
    raise InputValidationError(
        "missing values where the dataset config does not allow them (missing: reject; "
        "use missing: drop_rows, or a 'missing:' category on the column):\n" + "\n".join(lines),
        problems)


def _check_columns(table: pd.DataFrame, config: DatasetConfig, declared: list[str]) -> None:
    if len(table.columns) != len(set(table.columns)):
        repeated = table.columns[table.columns.duplicated()].unique().tolist()
        named = [c for c in repeated if c in config.columns]
        raise InputValidationError(
            f"the input's header repeats {len(repeated)} column name(s)"
            + (f", among them declared column(s) {', '.join(map(repr, named))}" if named else ""))
    missing = [c for c in declared if c not in table.columns]
    if missing:
        raise InputValidationError(
            f"input lacks column(s) {', '.join(repr(c) for c in missing)} declared in dataset "
            f"config {config.name!r} (its header has {len(table.columns)} column(s))",
            [{"column": c, "problem": "missing column"} for c in missing],
        )


def check_drop_limit(dropped: int, rows: int, config: DatasetConfig) -> None:
    """``missing: drop_rows`` may drop at most ``drop_limit`` of the rows, and never all."""
    if dropped == 0:
        return
    if dropped >= rows:
        raise InputValidationError(
            f"every one of the {rows:,} rows has a missing value in a declared column "
            "(missing: drop_rows): nothing is left to release")
    if dropped > config.drop_limit * rows:
        raise InputValidationError(
            f"missing: drop_rows would drop {dropped:,} of {rows:,} rows "
            f"({dropped / rows:.1%}), more than the config's drop_limit "
            f"{config.drop_limit:.1%}: declare a 'missing:' category for the columns with gaps, "
            "or raise drop_limit if dropping them is intended")


def aggregate(table: pd.DataFrame, config: DatasetConfig) -> CountTable:
    """Encode ``table`` per its config and count rows per (finest dimension vector, informative)."""
    frame, dropped = prepare_counted(table, config)
    check_drop_limit(dropped, len(table), config)
    taxonomies = tuple(config.taxonomies[c] for c in config.dimensions)
    counts = aggregate_frame(frame, config.dimensions, config.informative, taxonomies,
                             config.informative_domain)
    return replace(counts, dropped_rows=dropped)


def aggregate_frame(
    frame: pd.DataFrame,
    dimensions: list[str],
    informative: list[str],
    taxonomies: tuple[Taxonomy, ...],
    informative_domain: list[str] | None = None,
) -> CountTable:
    """Aggregation proper, for an already checked frame (also used on chunks)."""
    if informative and informative_domain is not None:
        inf_codes, inf_domain = _codes_in_domain(frame[informative[0]], informative_domain)
    elif informative:
        inf_codes, inf_domain = _factorize_informative(frame, informative)
    else:
        inf_codes = np.zeros(len(frame), dtype=np.int64)
        inf_domain = pd.DataFrame(index=pd.RangeIndex(1))
    n_inf = max(len(inf_domain), 1)
    public = bool(informative) and informative_domain is not None
    if key_space(taxonomies, n_inf) >= MAX_KEY:  # a wide table: a code per column
        return wide_count_table(
            dimensions, taxonomies,
            [t.encode(frame[c]).astype(np.int64) for c, t in zip(dimensions, taxonomies,
                                                                 strict=True)],
            inf_codes.astype(np.int64), np.ones(len(frame), dtype=np.int64), inf_domain, public)
    radices = place_values(taxonomies, n_inf)
    keys = inf_codes.astype(np.int64)
    for column, taxonomy, radix in zip(dimensions, taxonomies, radices, strict=True):
        keys += taxonomy.encode(frame[column]).astype(np.int64) * radix
    cell_keys, counts = group_sum(keys, np.ones(len(keys), dtype=np.int64))
    return CountTable(
        dimensions=tuple(dimensions),
        taxonomies=taxonomies,
        cell_keys=cell_keys,
        counts=counts,
        informative=inf_domain,
        n_rows=len(frame),
        public_domain=bool(informative) and informative_domain is not None,
    )


def _codes_in_domain(values: pd.Series, domain: list[str]) -> tuple[np.ndarray, pd.DataFrame]:
    """Codes into a declared public domain; a value outside it is an input error (counts and
    file lines in the message, the values only in the steward log)."""
    codes = pd.Categorical(values.astype("string"), categories=pd.Index(domain, dtype="string")).codes
    if (codes < 0).any():
        bad = values[codes < 0].astype(str)
        rows = values.index.to_numpy()[np.flatnonzero(codes < 0)]
        raise InputValidationError(
            f"column {values.name!r}: {bad.nunique()} distinct value(s) outside its declared "
            f"domain, in {len(rows)} row(s), first at {format_rows(rows)}",
            [{"column": values.name, "problem": "outside the declared domain",
              "rows": len(rows), "first_positions": position_numbers(rows),
              "values": bad.drop_duplicates().head(10).tolist()}])
    return codes.astype(np.int64), pd.DataFrame({values.name: np.asarray(domain, dtype=object)})


def _factorize_informative(
    frame: pd.DataFrame, informative: list[str]
) -> tuple[np.ndarray, pd.DataFrame]:
    """One code per distinct informative value (or value tuple), in canonical order."""
    if len(informative) == 1:
        codes, uniques = pd.factorize(frame[informative[0]], sort=False)
        found = pd.DataFrame({informative[0]: np.asarray(uniques, dtype=object)})
    else:
        grouped = frame.groupby(informative, sort=False, dropna=False)
        codes = grouped.ngroup().to_numpy(dtype=np.int64)
        found = grouped.size().reset_index()[informative].reset_index(drop=True)
    domain, rank = canonical_informative(found)
    return rank[codes.astype(np.int64)], domain


def canonical_informative(found: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """Distinct informative values sorted by their values, and ``rank[code found] = code``.

    Codes follow the values, not the file's row order, so every reading path (in memory,
    chunked, grouped by DuckDB, per partition) gives the same count table, key for key.
    """
    columns = list(found.columns)
    order = found.sort_values(columns, kind="stable").index.to_numpy()
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order), dtype=np.int64)
    return found.iloc[order].reset_index(drop=True).astype(object), rank


INF_RADIX = 1 << 22  # streaming: room for 4M distinct informative values while chunks arrive


def aggregate_chunks(chunks, config: DatasetConfig) -> CountTable:
    """Aggregate an extract chunk by chunk; memory is bounded by the count table, not the rows.

    Informative values get global codes as they are first seen (or the declared domain's codes);
    each chunk's cells are merged into the running table at once. The result equals
    ``aggregate`` on the whole table.
    """
    taxonomies = tuple(config.taxonomies[c] for c in config.dimensions)
    domain = config.informative_domain
    known: dict = {}
    values: list = []
    merged_keys = np.zeros(0, dtype=np.int64)
    merged_counts = np.zeros(0, dtype=np.int64)
    n_rows = 0
    # Informative codes: the declared domain's (known up front), else global codes as values
    # are first seen, with room for INF_RADIX of them while chunks arrive.
    radix = len(domain) if domain is not None else INF_RADIX
    wide = key_space(taxonomies, radix) >= MAX_KEY  # a code per column (``wide_count_table``)
    radices = None if wide else place_values(taxonomies, radix)
    wide_codes: list[np.ndarray] = []
    dropped = seen = 0
    for chunk in chunks:
        if not len(chunk):
            continue
        frame, chunk_dropped = prepare_counted(chunk, config)
        dropped, seen = dropped + chunk_dropped, seen + len(chunk)
        if frame.empty:
            continue
        if domain is not None:
            inf_codes, _ = _codes_in_domain(frame[config.informative[0]], domain)
        elif config.informative:
            local, uniques = _factorize_informative(frame, config.informative)
            rows = uniques.itertuples(index=False, name=None)
            lookup = np.array([known.setdefault(r, len(known)) for r in rows], dtype=np.int64)
            if len(known) > len(values):
                values.extend(list(known)[len(values):])
            inf_codes = lookup[local]
        else:
            inf_codes = np.zeros(len(frame), dtype=np.int64)
        if len(known) >= INF_RADIX:
            raise InputValidationError("more than 4,194,304 distinct informative values")
        n_rows += len(frame)
        if radices is None:  # wide: the chunk's codes, merged into the cells so far
            codes = [t.encode(frame[c]).astype(np.int64)
                     for c, t in zip(config.dimensions, taxonomies, strict=True)]
            codes.append(inf_codes.astype(np.int64))
            sizes = [t.n_leaves for t in taxonomies] + [radix]
            if wide_codes:
                codes = [np.concatenate([a, b]) for a, b in zip(wide_codes, codes, strict=True)]
            weights = np.concatenate([merged_counts, np.ones(len(frame), dtype=np.int64)])
            cells, merged_counts = distinct_cells(codes, sizes, weights)
            wide_codes = list(cells)
            continue
        keys = inf_codes.astype(np.int64)
        for column, taxonomy, place in zip(config.dimensions, taxonomies, radices, strict=True):
            keys += taxonomy.encode(frame[column]).astype(np.int64) * place
        chunk_keys, chunk_counts = group_sum(keys, np.ones(len(keys), dtype=np.int64))
        merged_keys, merged_counts = group_sum(np.concatenate([merged_keys, chunk_keys]),
                                               np.concatenate([merged_counts, chunk_counts]))
    if seen == 0:
        raise InputValidationError(
            "the input has no data rows (empty file or header only): nothing to release")
    check_drop_limit(dropped, seen, config)
    if domain is not None:
        informative = pd.DataFrame({config.informative[0]: np.asarray(domain, dtype=object)})
    else:
        informative = pd.DataFrame(index=pd.RangeIndex(1))
    if wide:
        inf_part = wide_codes[-1] if wide_codes else np.zeros(0, dtype=np.int64)
        if domain is None and config.informative:
            informative, rank = canonical_informative(
                pd.DataFrame(values, columns=config.informative).astype(object))
            inf_part = rank[inf_part]
        return wide_count_table(
            config.dimensions, taxonomies, wide_codes[:-1] or
            [np.zeros(0, dtype=np.int64) for _ in taxonomies], inf_part, merged_counts,
            informative, bool(config.informative) and domain is not None, dropped)
    dims_part, inf_part = np.divmod(merged_keys, radix)
    if domain is None and config.informative:
        informative, rank = canonical_informative(
            pd.DataFrame(values, columns=config.informative).astype(object))
        inf_part = rank[inf_part]
    n_inf = max(len(informative), 1)
    # Repack from the streaming radix to the final one (inf code least significant, n_inf wide).
    final_keys, final_counts = group_sum(dims_part * n_inf + inf_part, merged_counts)
    return CountTable(
        dimensions=tuple(config.dimensions), taxonomies=taxonomies, cell_keys=final_keys,
        counts=final_counts, informative=informative, n_rows=n_rows,
        public_domain=bool(config.informative) and domain is not None, dropped_rows=dropped,
    )


def value_counts_by(table: pd.DataFrame, columns: list[str], name: str = "n",
                    keep_missing: bool = False, weights: np.ndarray | None = None
                    ) -> pd.DataFrame:
    """Rows per distinct combination of ``columns``, values as text, rows with a missing value
    left out (as ``table[columns].astype(str).value_counts()``, about 5x faster on a million
    rows); with ``keep_missing`` a missing value is kept as ``None``. ``weights``: how many
    rows each row of ``table`` stands for (distinct cells and their counts); default one each.

    Each column is factorized once (categoricals use their codes), the codes are packed into
    one integer key per row and counted with ``group_sum``; the text of the few distinct values
    is formed afterwards.
    """
    if not columns:
        return pd.DataFrame({name: [len(table) if weights is None else int(weights.sum())]})
    parts, texts, counts = _distinct_codes(table, columns, keep_missing, weights)
    frame = pd.DataFrame({c: t[p] for c, t, p in zip(columns, texts, parts, strict=True)})
    frame[name] = counts.astype(np.int64)
    if _texts_repeat(texts):
        frame = frame.groupby(columns, sort=False, as_index=False)[name].sum()
    return frame


def class_sizes(table: pd.DataFrame, columns: list[str],
                weights: np.ndarray | None = None) -> np.ndarray:
    """Rows per distinct combination of ``columns`` (as ``value_counts_by(...)["n"]``) without
    forming the text of each combination: risk figures need only the sizes."""
    if not columns:
        return np.asarray([len(table) if weights is None else int(weights.sum())],
                          dtype=np.int64)
    _, texts, counts = _distinct_codes(table, columns, False, weights)
    if _texts_repeat(texts):
        return value_counts_by(table, columns, weights=weights)["n"].to_numpy()
    return counts.astype(np.int64)


def _texts_repeat(texts: list[np.ndarray]) -> bool:
    """Two raw values with one text (1 and "1"): their rows are one combination as text."""
    return any(len(set(t)) < len(t) for t in texts)


def _distinct_codes(table: pd.DataFrame, columns: list[str], keep_missing: bool,
                    weights: np.ndarray | None = None
                    ) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    """Per column, the code of each distinct combination and the text of each code; and the
    rows of each combination (summing ``weights`` when given)."""
    codes, texts = [], []
    present = None  # rows with no missing value, once one is seen
    for column in columns:
        values = table[column]
        if isinstance(values.dtype, pd.CategoricalDtype):
            code = values.cat.codes.to_numpy()  # int8/int16: widened where keys are formed
            text = [str(v) for v in values.cat.categories]
        else:
            code, uniques = pd.factorize(values)
            text = [str(v) for v in uniques]
        if keep_missing and (code < 0).any():
            code = np.where(code < 0, len(text), code)
            text = [*text, None]
        if (code < 0).any():
            present = (code >= 0) if present is None else present & (code >= 0)
        codes.append(code)
        texts.append(np.asarray(text, dtype=object))
    # Unweighted: one row each, as a read-only view of a single 1 (no array of the table's size)
    weights = (np.broadcast_to(np.int64(1), (len(table),)) if weights is None
               else np.asarray(weights, dtype=np.int64))
    if present is not None:
        codes = [code[present] for code in codes]
        weights = weights[present]
    rows = len(weights)
    sizes = [max(len(t), 1) for t in texts]
    if float(np.prod(np.asarray(sizes, dtype=np.float64))) < MAX_KEY:
        keys = np.zeros(rows, dtype=np.int64)
        for code, size in zip(codes, sizes, strict=True):
            keys *= size
            keys += code
        distinct, counts = group_sum(keys, weights, scratch=True)
        parts = []
        for size in reversed(sizes):
            distinct, part = np.divmod(distinct, size)
            parts.append(part)
        parts.reverse()
    else:
        stacked, inverse = np.unique(np.stack(codes, axis=1), axis=0, return_inverse=True)
        counts = np.bincount(inverse.ravel(), weights=weights).round().astype(np.int64)
        parts = [stacked[:, i] for i in range(len(columns))]
    return parts, texts, counts


def merge_count_tables(parts: list[CountTable]) -> CountTable:
    """One count table from the count tables of an extract's partitions (files read apart).

    Dimension codes come from the taxonomies, so they agree across parts; informative codes are
    re-derived from the union of the parts' values (``canonical_informative``), so the merged
    table equals the table of all rows read at once, key for key.
    """
    if not parts:
        raise InputValidationError("an extract with no partitions: nothing to release")
    first = parts[0]
    if len(parts) == 1:
        return first
    if first.public_domain or not len(first.informative.columns):
        informative, remaps = first.informative, [np.arange(p.n_inf) for p in parts]
    else:
        informative, remaps = _united_informative([p.informative for p in parts])
    n_inf = max(len(informative), 1)
    if any(p.wide for p in parts) or key_space(first.taxonomies, n_inf) >= MAX_KEY:
        columns = [np.concatenate(c) for c in zip(*(p.dimension_columns() for p in parts),
                                                  strict=True)]
        inf = np.concatenate([remap[p.inf_codes()] for p, remap in zip(parts, remaps,
                                                                        strict=True)])
        return wide_count_table(first.dimensions, first.taxonomies, columns, inf,
                                np.concatenate([p.counts for p in parts]), informative,
                                first.public_domain, sum(p.dropped_rows for p in parts))
    keys, counts = [], []
    for part, remap in zip(parts, remaps, strict=True):
        dims_part, inf_part = np.divmod(part.cell_keys, part.n_inf)
        keys.append(dims_part * n_inf + remap[inf_part])
        counts.append(part.counts)
    merged_keys, merged_counts = group_sum(np.concatenate(keys), np.concatenate(counts))
    return CountTable(
        dimensions=first.dimensions, taxonomies=first.taxonomies, cell_keys=merged_keys,
        counts=merged_counts, informative=informative,
        n_rows=sum(p.n_rows for p in parts), public_domain=first.public_domain,
        dropped_rows=sum(p.dropped_rows for p in parts))


def _united_informative(frames: list[pd.DataFrame]) -> tuple[pd.DataFrame, list[np.ndarray]]:
    """Sorted union of the parts' informative values, and each part's code -> united code."""
    known: dict = {}
    found = []
    for frame in frames:
        found.append(np.array([known.setdefault(row, len(known))
                               for row in frame.itertuples(index=False, name=None)],
                              dtype=np.int64))
    united, rank = canonical_informative(
        pd.DataFrame(list(known), columns=list(frames[0].columns)).astype(object))
    return united, [rank[codes] for codes in found]
