"""``intervals.csv``: every estimate a researcher reads from a release, with its 95 % interval.

One row per estimate, published beside ``data.csv`` by every DP mechanism:

* ``what``: ``count`` (a released cell's count), ``total`` (an informative value's total, or a
  class value's for DiffGen), ``marginal`` (a cell of a declared analysis or of a column's
  1-way marginal, ``aim``);
* ``columns``: the columns it is about, joined by `` × ``; ``cell``: their values in the same
  order, joined by `` | ``;
* ``released``: what the release says (the cell's count; the value's total over the released
  rows; the synthetic rows' count in the marginal cell);
* ``lower``, ``upper``: the interval of the true count, whole numbers;
* ``level``: 0.95; ``holds``: ``per estimate`` (each row on its own) or ``simultaneous`` (every
  row of its family — one declared analysis, or the informative column's totals — at once).

Everything here is a function of the mechanism's outputs and public parameters (the callers
pass released counts, step epsilons and thresholds, noisy measurements), so the file is
post-processing and may be published; ``publication.PUBLISHED_TABLES`` lists its columns with
their basis and the publication audit re-derives what the data file determines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from medrelease.privacy.intervals import LEVEL

FILE = "intervals.csv"
COLUMNS = ("what", "columns", "cell", "released", "lower", "upper", "level", "holds")
KINDS = ("count", "total", "marginal")
PER_ESTIMATE, SIMULTANEOUS = "per estimate", "simultaneous"
COLUMN_SEP, CELL_SEP = " × ", " | "


def joined_cells(labels: Sequence[Sequence[Any] | np.ndarray | pd.Series]) -> np.ndarray:
    """Each row's labels joined by `` | `` (vectorised: a million cells in well under a
    second). ``labels``: one sequence per column, all of one length."""
    if not labels:
        return np.zeros(0, dtype=object)
    text = pd.Series(np.asarray(labels[0], dtype=object)).astype(str)
    for column in labels[1:]:
        text = text + CELL_SEP + pd.Series(np.asarray(column, dtype=object)).astype(str).values
    return text.to_numpy(dtype=object)


@dataclass
class IntervalTable:
    """The rows of ``intervals.csv``, added a block at a time (arrays, not Python rows)."""

    level: float = LEVEL
    blocks: list[pd.DataFrame] = field(default_factory=list)

    def add(self, what: str, columns: Sequence[str], cells: np.ndarray | Sequence[str],
            released: np.ndarray | Sequence[float], lower: np.ndarray | Sequence[float],
            upper: np.ndarray | Sequence[float], holds: str = PER_ESTIMATE) -> None:
        """A block of rows about the same columns. Bounds are rounded outwards to whole
        numbers (a count is whole) and the lower end cut at 0."""
        if what not in KINDS or holds not in (PER_ESTIMATE, SIMULTANEOUS):
            raise ValueError(f"unknown kind of estimate {what!r} / {holds!r}")
        cells = np.asarray(cells, dtype=object)
        n = cells.size
        if not n:
            return
        lower = np.maximum(0, np.floor(np.asarray(lower, dtype=np.float64))).astype(np.int64)
        upper = np.ceil(np.asarray(upper, dtype=np.float64)).astype(np.int64)
        self.blocks.append(pd.DataFrame({
            "what": np.full(n, what, dtype=object),
            "columns": np.full(n, COLUMN_SEP.join(columns), dtype=object),
            "cell": cells,
            "released": np.rint(np.asarray(released, dtype=np.float64)).astype(np.int64),
            "lower": lower, "upper": np.maximum(upper, lower),
            "level": np.full(n, float(self.level)),
            "holds": np.full(n, holds, dtype=object)}))

    def frame(self) -> pd.DataFrame:
        """The file's rows, in the order added; the columns exactly ``COLUMNS``."""
        if not self.blocks:
            return pd.DataFrame({c: pd.Series(dtype=t) for c, t in zip(
                COLUMNS, (object, object, object, np.int64, np.int64, np.int64, np.float64,
                          object), strict=True)})
        return pd.concat(self.blocks, ignore_index=True)[list(COLUMNS)]

    def summary(self, about: str) -> dict[str, Any]:
        """What the manifest says about the file (``error_bars.intervals``): how many rows of
        each kind, what they are about, and one worked example taken from the file itself.
        The same keys and types for every release, so neighbours' manifests have one shape."""
        frame = self.frame()
        rows = {f"{what}, {holds}": int(((frame["what"] == what)
                                         & (frame["holds"] == holds)).sum())
                for what in KINDS for holds in (PER_ESTIMATE, SIMULTANEOUS)}
        return {"file": FILE, "columns": list(COLUMNS), "level": float(self.level),
                "rows": rows, "about": about, "example": example_row(frame)}


def example_row(frame: pd.DataFrame) -> dict[str, Any]:
    """One row to explain the file with (``report.md``'s worked example): the per-estimate
    total with the most released rows, else such a count, else such a marginal cell; every
    key present even when the file is empty."""
    chosen = None
    for what in ("total", "count", "marginal"):
        mine = frame[(frame["what"] == what) & (frame["holds"] == PER_ESTIMATE)
                     & (frame["released"] > 0)]
        if len(mine):
            chosen = mine.iloc[int(np.argmax(mine["released"].to_numpy()))]
            break
    if chosen is None:
        return {"what": "", "columns": "", "cell": "", "released": 0, "lower": 0, "upper": 0,
                "level": LEVEL, "holds": PER_ESTIMATE}
    return {"what": str(chosen["what"]), "columns": str(chosen["columns"]),
            "cell": str(chosen["cell"]), "released": int(chosen["released"]),
            "lower": int(chosen["lower"]), "upper": int(chosen["upper"]),
            "level": float(chosen["level"]), "holds": str(chosen["holds"])}


def bonferroni_level(level: float, family: int) -> float:
    """The level each of ``family`` intervals needs for all of them to hold at ``level``
    together (Bonferroni: the misses' probabilities add up)."""
    return 1 - (1 - level) / max(1, int(family))


def scope_sentence(scope: str | None) -> str:
    """What every interval of a release is about, in words (``UnitBound.scope``)."""
    if scope is None:
        return "Every interval is about the input table the release was made from."
    return (f"Every interval is about {scope}: a count of the input can be larger by the rows "
            "the bound removed (mechanism_details.unit_cut says how many, as a DP count).")


def with_intervals(error_bars: dict[str, Any], table: IntervalTable | None,
                   scope: str | None) -> tuple[dict[str, Any], dict[str, pd.DataFrame]]:
    """The manifest's error bars with what they are about and the summary of
    ``intervals.csv``, and the published tables (``{FILE: rows}``; none without a table)."""
    bars = dict(error_bars)
    about = scope_sentence(scope)
    bars["about"] = about
    if bars.get("statement"):
        bars["statement"] = f"{bars['statement']} {about}"
    if table is None:
        return bars, {}
    bars["statement"] = (f"{bars.get('statement', '')} Each interval holds on its own (per "
                         "estimate): among many, about 5 in 100 miss; the rows of "
                         f"{FILE} marked simultaneous hold all together.").strip()
    bars["intervals"] = table.summary(about)
    return bars, {FILE: table.frame()}
