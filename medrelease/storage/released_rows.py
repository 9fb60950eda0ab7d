"""A released table held as distinct rows and their counts; rows come out in shuffled groups.

A thresholded cell release publishes n copies of each released (labels, value) cell, so the
table is fully described by its cells: memory follows the number of cells, not of rows. Rows
are produced a row group at a time, in an order that is a uniformly random arrangement of the
multiset, drawn exactly without a permutation of every row:

* the cells of the next ``size`` positions of a uniform arrangement follow the multivariate
  hypergeometric law over the rows still left (``numpy``'s ``multivariate_hypergeometric``);
* given which rows fill those positions, their order among themselves is uniform (a shuffle of
  the group).

By induction the whole sequence is a uniform arrangement of the multiset, the same law as one
permutation of all rows. No proof of privacy is needed for the order: it is a function of the
released multiset and of randomness independent of the data (post-processing), and a uniform
arrangement says nothing about which rows are noise or which ladder rung placed them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from medrelease.data.aggregate import value_counts_by
from medrelease.privacy.randomness import generator_for

ROW_GROUP = 1_000_000   # rows per group written to Parquet / CSV
SHUFFLE_BLOCK = 4_000_000  # rows whose arrangement is drawn at once (fixed: order = f(seed));
# up to it, one shuffle of the repeated cells (1.77M rows over 1.18M cells: 0.21 s of CPU
# against 0.45 s with a hypergeometric draw per million rows); 32 MB of row indices at most
ROWS = "__rows"         # the count column of a cell table


@dataclass
class ReleasedRows:
    """Distinct released rows (``cells``), how many times each is released (``counts``), and
    the seed of their shuffled order (None: a table that came materialized keeps its order)."""

    cells: pd.DataFrame
    counts: np.ndarray
    shuffle_seed: np.random.SeedSequence | None = None
    frame: pd.DataFrame | None = field(default=None, repr=False)
    _cells_counted: pd.DataFrame | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_frame(cls, frame: pd.DataFrame) -> ReleasedRows:
        """A table a mechanism produced row by row (DiffGen, k-anonymity, pseudonyms, ...)."""
        return cls(cells=frame, counts=np.ones(len(frame), dtype=np.int64), frame=frame)

    def __len__(self) -> int:
        return int(self.counts.sum())

    @property
    def columns(self) -> list[str]:
        return list(self.cells.columns)

    def cell_table(self) -> pd.DataFrame:
        """Distinct rows with their counts in ``__rows`` (missing values kept as a row);
        computed once (the output checks and the published risk figures both read it), so
        callers must not modify it."""
        if self._cells_counted is None:
            self._cells_counted = self._count_cells()
        return self._cells_counted

    def _count_cells(self) -> pd.DataFrame:
        if ROWS in self.cells.columns:
            raise ValueError(f"a released column may not be named {ROWS!r}")
        if not len(self.cells):
            return pd.DataFrame({**{c: pd.Series(dtype=object) for c in self.cells.columns},
                                 ROWS: pd.Series(dtype=np.int64)})
        if self.frame is not None:
            return value_counts_by(self.frame, self.columns, name=ROWS, keep_missing=True)
        distinct = _as_grouped(self.cells)
        if distinct is not None:  # what the grouping returns, in the same order (0.4 s)
            distinct[ROWS] = self.counts.astype(np.int64)
            return distinct
        table = self.cells.reset_index(drop=True).copy()
        table[ROWS] = self.counts.astype(np.int64)
        grouped = table.groupby(self.columns, observed=True, dropna=False, sort=False)[ROWS]
        return grouped.sum().reset_index()

    def group_indices(self, size: int = ROW_GROUP) -> Iterator[np.ndarray]:
        """Which distinct row (or frame row) each released row is, ``size`` rows at a time, in
        the released order; at least one (possibly empty) group."""
        if self.frame is not None:
            n = len(self.frame)
            for start in range(0, max(n, 1), size):
                yield np.arange(start, min(start + size, n))
            return
        if not len(self):
            yield np.zeros(0, dtype=np.int64)
            return
        yield from shuffled_cell_groups(self.counts, self.shuffle_seed, size)

    def take(self, indices: np.ndarray, source: pd.DataFrame | None = None) -> pd.DataFrame:
        """The rows at ``indices``, from ``source`` if given (a transformed copy of the distinct
        rows, or of the frame, in the same order: e.g. the CSV's formula-safe text)."""
        if source is None:
            source = self.cells if self.frame is None else self.frame
        return source.take(indices).reset_index(drop=True)

    def row_groups(self, size: int = ROW_GROUP) -> Iterator[pd.DataFrame]:
        """The rows, ``size`` at a time, in their released order."""
        for indices in self.group_indices(size):
            yield self.take(indices)

    def to_frame(self) -> pd.DataFrame:
        """Every row in memory (small releases, audits, benchmarks): the row groups joined."""
        if self.frame is not None:
            return self.frame
        groups = list(self.row_groups())
        return groups[0] if len(groups) == 1 else pd.concat(groups, ignore_index=True)


def _as_grouped(table: pd.DataFrame) -> pd.DataFrame | None:
    """``table`` as a grouping of its rows (``dropna=False``) returns it, when no two rows
    are equal: the same rows in the same order, text held as objects turned into ``str`` as
    the grouping turns it. Rows are told apart by one integer each, from each column's codes;
    None (the caller groups) when two rows are equal, when the codes do not fit in 64 bits,
    or for a column of another type than categories, integers and text."""
    keys = np.zeros(len(table), dtype=np.int64)
    span = 1
    out = {}
    for name in table.columns:
        column = table[name]
        if isinstance(column.dtype, pd.CategoricalDtype):
            codes = column.cat.codes.to_numpy().astype(np.int64) + 1
            size = len(column.cat.categories) + 1
        elif (pd.api.types.is_integer_dtype(column.dtype)
              or isinstance(column.dtype, pd.StringDtype)):
            codes, uniques = pd.factorize(column, use_na_sentinel=False)
            size = len(uniques)
        elif column.dtype == object:
            codes, uniques = pd.factorize(column, use_na_sentinel=False)
            size = len(uniques)
            if pd.api.types.infer_dtype(uniques, skipna=True) != "string":
                return None  # (a grouping infers another type for these: let it)
            column = column.astype("str")
        else:
            return None
        out[name] = column.reset_index(drop=True)
        span *= max(size, 1)
        if span >= 2**62:
            return None
        keys = keys * max(size, 1) + codes
    return pd.DataFrame(out) if pd.Index(keys).is_unique else None


def shuffled_cell_groups(counts: np.ndarray, seed: np.random.SeedSequence | None, size: int,
                         block: int | None = None) -> Iterator[np.ndarray]:
    """Cell index of each row, ``size`` rows at a time, uniformly arranged (module docstring).

    The arrangement is drawn ``block`` rows at a time whatever ``size`` is, so the order is a
    function of the seed alone: cutting it into other row groups never changes it.
    """
    pending: list[np.ndarray] = []
    held = 0
    for drawn in _shuffled_blocks(counts, seed, block or SHUFFLE_BLOCK):
        pending.append(drawn)
        held += drawn.size
        while held >= size:
            joined = np.concatenate(pending)
            yield joined[:size]
            pending, held = [joined[size:]], joined.size - size
    if held:
        yield np.concatenate(pending)


def _shuffled_blocks(counts: np.ndarray, seed: np.random.SeedSequence | None,
                     block: int) -> Iterator[np.ndarray]:
    rng = generator_for(seed)
    remaining = np.asarray(counts, dtype=np.int64).copy()
    left = int(remaining.sum())
    while left > 0:
        take = min(block, left)
        drawn = (remaining.copy() if take == left
                 else rng.multivariate_hypergeometric(remaining, take, method="marginals"))
        remaining -= drawn
        left -= take
        present = np.flatnonzero(drawn)
        cell_of_row = np.repeat(present, drawn[present])
        rng.shuffle(cell_of_row)
        yield cell_of_row
