"""The privacy unit: each unit's rows cut to at most ``m`` before anything else.

A dataset may declare ``privacy: {unit: patient_id, max_rows_per_unit: m}``. Neighbouring
extracts then differ in *all* rows of one patient, and every mechanism is calibrated for a
neighbour of up to ``m`` rows (docs/PRIVACY.md, "The privacy unit"). That calibration only
holds if no unit has more than ``m`` rows, so this bound runs first, on every path that reads
an extract (DuckDB's grouped pass, the row-wise pass, the frame of the row mechanisms).

Which rows stay is a uniformly random ``m``-subset of the unit's rows, drawn from the release's
own random source and independent of the values: an exact random permutation of the rows of
the units over the bound (Fisher-Yates, numpy's exact bounded integers), then, unit by unit,
the first ``m``. It works on counts: a group of identical rows of one unit is one entry with a
weight, expanded to rows only for units over the bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from medrelease.privacy.randomness import StreamSeed, generator_for

# The published count of rows the bound removed counts at most this many per unit, so that one
# unit moves it by at most this much (its sensitivity; a public constant, stated in the budget
# step). A unit with more rows over the bound still counts this many: the count is a floor.
UNIT_CUT_CAP = 4


@dataclass(frozen=True)
class UnitBound:
    """What the bound needs: the identifier column, ``m``, its random stream, and the config's
    words for one unit and one row (what every interval statement says it is about)."""

    column: str
    max_rows: int
    seed: StreamSeed = field(repr=False)
    unit_noun: str = "unit"
    row_noun: str = "row"

    def scope(self) -> str:
        """What every published count and interval is about, in words: the table the
        mechanism saw, not the input."""
        rows = f"{self.row_noun}s" if self.max_rows != 1 else self.row_noun
        return (f"the table after each {self.unit_noun}'s {self.row_noun}s were cut to at most "
                f"{self.max_rows} {rows} (chosen at random), not the whole input")


@dataclass(frozen=True)
class BoundReport:
    """Steward-only counts of what the bound did (never published: they describe the input)."""

    units: int
    rows_before: int
    rows_after: int
    units_over_bound: int
    # rows removed, counting at most UNIT_CUT_CAP per unit: what the "unit bound: rows removed"
    # budget step noises and publishes (sensitivity UNIT_CUT_CAP for one unit)
    rows_cut_capped: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"units": self.units, "rows before the bound": self.rows_before,
                "rows after the bound": self.rows_after,
                "units over the bound": self.units_over_bound,
                f"rows cut, at most {UNIT_CUT_CAP} per unit": self.rows_cut_capped}


def bounded_weights(unit_codes: np.ndarray, weights: np.ndarray, max_rows: int,
                    rng: np.random.Generator) -> tuple[np.ndarray, BoundReport]:
    """Per group (rows identical in every column read, one unit each), how many of its
    ``weights`` rows survive when each unit keeps a uniformly random ``max_rows`` of its rows."""
    unit_codes = np.asarray(unit_codes, dtype=np.int64)
    weights = np.asarray(weights, dtype=np.int64)
    n_units = int(unit_codes.max()) + 1 if unit_codes.size else 0
    totals = np.bincount(unit_codes, weights=weights, minlength=n_units).astype(np.int64)
    over_units = totals > max_rows
    out = weights.copy()
    groups = np.flatnonzero(over_units[unit_codes]) if unit_codes.size else unit_codes
    if groups.size:
        rows = np.repeat(groups, weights[groups])          # one entry per row, over-bound units
        rows = rows[rng.permutation(rows.size)]            # exact uniform order
        rows = rows[np.argsort(unit_codes[rows], kind="stable")]  # unit by unit, order kept
        units = unit_codes[rows]
        starts = np.flatnonzero(np.r_[True, units[1:] != units[:-1]])
        rank = np.arange(rows.size) - np.repeat(starts, np.diff(np.r_[starts, rows.size]))
        out[groups] = 0
        out += np.bincount(rows[rank < max_rows], minlength=out.size).astype(np.int64)
    cut = np.minimum(np.maximum(totals - max_rows, 0), UNIT_CUT_CAP)
    report = BoundReport(units=int((totals > 0).sum()), rows_before=int(weights.sum()),
                         rows_after=int(out.sum()), units_over_bound=int(over_units.sum()),
                         rows_cut_capped=int(cut.sum()))
    return out, report


def bound_frame(frame: pd.DataFrame, bound: UnitBound) -> tuple[pd.DataFrame, BoundReport]:
    """The rows that survive the bound (in their original order), without the unit column."""
    codes, _ = pd.factorize(frame[bound.column], sort=False)
    kept, report = bounded_weights(codes, np.ones(len(frame), dtype=np.int64), bound.max_rows,
                                   generator_for(bound.seed))
    # by position: ``.loc[mask].drop(columns=...)`` cost 3 ms on a 65-row frame (pandas 3's
    # label look-ups), which the step audit pays in each of its 4,000 bounded runs
    columns = np.flatnonzero(frame.columns != bound.column)
    out = frame.iloc[np.flatnonzero(kept), columns]
    return out.reset_index(drop=True), report


def unit_relation(unit_noun: str, row_noun: str, column: str, max_rows: int) -> str:
    """The neighbouring relation in words, for every guarantee statement."""
    rows = f"{row_noun}s" if max_rows != 1 else row_noun
    return (f"add/remove one {unit_noun} (all rows with one {column}; each {unit_noun} cut to "
            f"at most {max_rows} {rows}, chosen at random)")
