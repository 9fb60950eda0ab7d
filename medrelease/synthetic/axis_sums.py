"""Sums of a table's axis by group (a taxonomy level's leaf -> parent code): one pass, no BLAS.

``aim`` rolls marginals up to taxonomy levels thousands of times a release (every candidate's
score at every level, the model's level measurements, the researcher's error bars). It did so
with a product by a one-hot matrix (``np.tensordot``): OpenBLAS then woke its threads for each
product of a few thousand numbers. On 2 cores with anything else running that costs 20-40x the
sum (836 roll-ups of a 1,361,000-row release: 2.07 s of CPU against 0.08 s with BLAS on one
thread; ``docs/results/aim.md``), and the result depended on BLAS's thread count in its last
bits. ``np.add.reduceat`` over the axis, its entries taken in group order, adds the same numbers
in a fixed order on one thread: the same sums to rounding (2e-15 relative; exact for counts).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

FEW_GROUPS = 64  # up to this many groups on the first axis: summed run by run


@dataclass(frozen=True)
class AxisGroups:
    """A group code per index of an axis, prepared for ``reduceat``: the order that puts each
    group's indices together (``None`` when they already are), where each present group starts
    in that order, and which groups are present (a level may have a code no leaf maps to)."""

    order: np.ndarray | None
    starts: np.ndarray
    present: np.ndarray
    n_groups: int

    @staticmethod
    def of(groups: np.ndarray | tuple[int, ...], n_groups: int) -> AxisGroups:
        codes = np.asarray(groups, dtype=np.int64)
        if codes.size and not (int(codes.min()) >= 0 and int(codes.max()) < n_groups):
            raise ValueError(f"group codes must lie in [0, {n_groups}), got "
                             f"[{int(codes.min())}, {int(codes.max())}]")
        order = np.argsort(codes, kind="stable")
        ordered = codes[order]
        present, starts = np.unique(ordered, return_index=True)
        in_order = bool(np.array_equal(order, np.arange(order.size)))
        return AxisGroups(None if in_order else order, starts, present, n_groups)

    def sum(self, array: np.ndarray, axis: int) -> np.ndarray:
        """``array`` with ``axis`` summed by group: float64, the group codes' order on the axis."""
        shape = list(array.shape)
        shape[axis] = self.n_groups
        if not self.starts.size:
            return np.zeros(shape)
        if self.order is None and axis == 0 and self.starts.size <= FEW_GROUPS:
            # the first axis in a few runs: each run's block summed whole (a (100, 1,884) table
            # to 11 age bands: 0.11 ms, against 0.41 ms for reduceat along axis 0)
            ends = [*self.starts[1:].tolist(), array.shape[0]]
            summed = np.stack([array[s:e].sum(axis=0, dtype=np.float64)
                               for s, e in zip(self.starts.tolist(), ends, strict=True)])
        else:
            source = array if self.order is None else np.take(array, self.order, axis=axis)
            summed = np.add.reduceat(source, self.starts, axis=axis, dtype=np.float64)
        if self.present.size == self.n_groups:
            return summed
        out = np.zeros(shape)
        where = [slice(None)] * array.ndim
        where[axis] = self.present
        out[tuple(where)] = summed
        return out


# A release asks for a few dozen code maps (attributes x levels, merged ones included); the
# cache keeps a release's worth, not a serving process's history (a 20,000-leaf map: 0.35 MB)
@lru_cache(maxsize=64)
def _prepared(groups: bytes, n_groups: int) -> AxisGroups:
    return AxisGroups.of(np.frombuffer(groups, dtype=np.int64), n_groups)


def sum_axis(array: np.ndarray, axis: int, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """Sum the entries of ``axis`` that share a group code (``groups`` per index of the axis).

    The preparation (a sort of the codes) is kept per distinct code map: a release asks for
    the same few taxonomy levels again and again."""
    codes = np.ascontiguousarray(groups, dtype=np.int64)
    return _prepared(codes.tobytes(), n_groups).sum(array, axis)


def marginal_of_subset(table: np.ndarray, source: tuple[int, ...],
                       columns: tuple[int, ...]) -> np.ndarray:
    """The marginal on ``columns`` (axes in that order) of ``table``, a marginal on ``source``
    (a superset of ``columns``): its other axes summed out. Whole-number counts give the same
    numbers as counting the rows again, from a table that is smaller than the rows."""
    summed = table.sum(axis=tuple(i for i, c in enumerate(source) if c not in columns))
    kept = [c for c in source if c in columns]
    return np.ascontiguousarray(np.transpose(summed, [kept.index(c) for c in columns]))
