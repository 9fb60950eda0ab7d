"""The publication audit's checks of ``intervals.csv``: what the published folder determines.

``intervals.csv`` is post-processing of the release's outputs (``privacy/interval_table.py``);
these checks hold it to that from the folder alone, the way the audit re-derives a Parquet
file's statistics from its values:

* its header is exactly ``COLUMNS``; ``what``, ``holds`` and ``level`` take only their public
  values; ``columns`` names only released columns (with a taxonomy level for aim's coarser
  1-way marginals);
* ``released`` is re-derived from the data file: the ``count`` rows are the data's distinct
  rows with their counts (every released count has its row: no gaps, nothing extra); a
  ``total`` is the data's count of its value; an ``aim`` ``marginal`` the synthetic rows' count
  of its cell (at its level, through the config's taxonomies);
* a ``count`` row's interval is the one its count gets under a noise law and threshold the
  manifest declares (``error_bars.cells``): nothing there can come from a true count;
* every interval is ordered and non-negative.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from medrelease.data.config import DatasetConfig
from medrelease.data.constraints import column_taxonomy
from medrelease.privacy.interval_table import (
    COLUMN_SEP,
    COLUMNS,
    FILE,
    KINDS,
    PER_ESTIMATE,
    SIMULTANEOUS,
    joined_cells,
)
from medrelease.privacy.intervals import LEVEL, thresholded_bounds
from medrelease.storage.store import neutralise_formulas

LEVELLED = re.compile(r"^(?P<column>.+) \(level (?P<level>\d+)\)$")


def read_intervals(path: Path) -> pd.DataFrame:
    """The file as text (every cell a string, nothing parsed away)."""
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def header_of(path: Path) -> str:
    """The file's first line, as written (the schema a neighbour must share byte for byte)."""
    with path.open(encoding="utf-8") as text:
        return text.readline()


def intervals_findings(folder: Path, manifest: dict[str, Any], data: pd.DataFrame,
                       config: DatasetConfig | None) -> list[tuple[str, str]]:
    """(where, what is wrong) for every check of the module docstring that fails."""
    path = Path(folder) / FILE
    out: list[tuple[str, str]] = []
    if header_of(path).rstrip("\r\n") != ",".join(COLUMNS):
        return [(f"{FILE} header", f"is not {','.join(COLUMNS)}")]
    table = read_intervals(path)
    released_columns = list(manifest["columns"])
    for name, allowed in (("what", set(KINDS)), ("holds", {PER_ESTIMATE, SIMULTANEOUS})):
        bad = sorted(set(table[name]) - allowed)
        if bad:
            out.append((f"{FILE} column {name!r}", f"{len(bad)} value(s) outside its public "
                                                    "vocabulary"))
    if len(table) and not np.allclose(table["level"].astype(float), LEVEL):
        out.append((f"{FILE} column 'level'", f"a level other than {LEVEL}"))
    for joined in sorted(set(table["columns"])):
        names = [LEVELLED.match(c).group("column") if LEVELLED.match(c) else c
                 for c in joined.split(COLUMN_SEP)]
        if any(n not in released_columns for n in names):
            out.append((f"{FILE} column 'columns'", "names a column that is not released"))
    numbers = {}
    for name in ("released", "lower", "upper"):
        try:
            numbers[name] = table[name].astype(np.int64).to_numpy()
        except (TypeError, ValueError):
            return [*out, (f"{FILE} column {name!r}", "holds a value that is not a whole "
                                                      "number")]
    if np.any(numbers["lower"] < 0) or np.any(numbers["lower"] > numbers["upper"]):
        out.append((FILE, "an interval with lower < 0 or lower > upper"))
    table = table.assign(**numbers)
    out += _counts_rederived(table, manifest, data)
    out += _totals_rederived(table, manifest, data)
    out += _marginals_rederived(table, data, config)
    return out


def _as_written(labels: np.ndarray) -> pd.Series:
    """Joined labels as the CSV writer writes them (formula-like text prefixed with ')."""
    return neutralise_formulas(pd.DataFrame({"cell": labels}))["cell"]


def _data_cells(data: pd.DataFrame, columns: list[str]) -> pd.Series:
    """The data's distinct rows on ``columns`` (joined labels, as written) and how many times
    each is released."""
    if not len(data):
        return pd.Series(dtype=np.int64)
    labels = joined_cells([data[c].to_numpy(dtype=object) for c in columns])
    return _as_written(labels).value_counts()


def _counts_rederived(table: pd.DataFrame, manifest: dict[str, Any],
                      data: pd.DataFrame) -> list[tuple[str, str]]:
    counts = table[table["what"] == "count"]
    if not len(counts) and manifest.get("mechanism") == "aim":
        return []
    columns = [c for c in manifest["columns"] if c in data.columns]
    expected = _data_cells(data, columns)
    stated = counts.groupby("cell")["released"].sum()
    out = []
    if set(counts["columns"]) - {COLUMN_SEP.join(columns)}:
        out.append((f"{FILE} count rows", "are not about every released column"))
    if not stated.sort_index().equals(expected.sort_index().rename_axis("cell")
                                      .rename("released").astype(np.int64)):
        out.append((f"{FILE} count rows", "are not the data file's distinct rows with their "
                                          "counts (a released count without its interval, or "
                                          "a count the data does not hold)"))
    laws = [(float(c["noise_epsilon"]), c.get("threshold"))
            for c in (manifest.get("error_bars") or {}).get("cells") or []]
    if len(counts) and laws:
        released = counts["released"].to_numpy()
        fits = np.zeros(len(counts), dtype=bool)
        for eps, tau in laws:
            # a count clipped at 0 is listed because R >= 1: the selective law at tau = 1
            tau = 1 if tau is None else int(tau)
            ok = released >= tau
            if ok.any():
                low, high = thresholded_bounds(released[ok], eps, tau)
                fits[ok] |= ((low == counts["lower"].to_numpy()[ok])
                             & (high == counts["upper"].to_numpy()[ok]))
        if not fits.all():
            out.append((f"{FILE} count rows", f"{int((~fits).sum())} interval(s) are not "
                                              "their count's under any noise law and threshold "
                                              "the manifest declares"))
    return out


def _totals_rederived(table: pd.DataFrame, manifest: dict[str, Any],
                      data: pd.DataFrame) -> list[tuple[str, str]]:
    totals = table[table["what"] == "total"]
    out = []
    for columns, rows in totals.groupby("columns"):
        names = columns.split(COLUMN_SEP)
        if any(n not in data.columns for n in names):
            out.append((f"{FILE} total rows", f"about {columns!r}, not a released column"))
            continue
        expected = _data_cells(data, names)
        got = expected.reindex(rows["cell"].to_numpy()).fillna(0).astype(np.int64).to_numpy()
        if not np.array_equal(got, rows["released"].to_numpy()):
            out.append((f"{FILE} total rows", f"of {columns!r} differ from the data file's "
                                              "counts"))
    return out


def _marginals_rederived(table: pd.DataFrame, data: pd.DataFrame,
                         config: DatasetConfig | None) -> list[tuple[str, str]]:
    marginals = table[table["what"] == "marginal"]
    out = []
    for columns, rows in marginals.groupby("columns"):
        parts = columns.split(COLUMN_SEP)
        labels = []
        for part in parts:
            match = LEVELLED.match(part)
            name, level = (match.group("column"), int(match.group("level"))) if match \
                else (part, 0)
            if name not in data.columns:
                out.append((f"{FILE} marginal rows", f"about {columns!r}, not released"))
                break
            values = data[name].astype(str).to_numpy(dtype=object)
            if level:
                taxonomy = column_taxonomy(config, name) if config is not None else None
                if taxonomy is None:
                    labels = None  # cannot re-derive without the taxonomy: skipped
                    break
                # released values are leaf labels: their level's label, through the taxonomy
                leaf = {label: code for code, label in enumerate(taxonomy.level_labels[0])}
                lookup = np.asarray(taxonomy.level_labels[level], dtype=object)[
                    np.asarray(taxonomy.level_codes[level], dtype=np.int64)]
                distinct, inverse = np.unique(values.astype(str), return_inverse=True)
                codes = np.array([leaf.get(v, -1) for v in distinct],
                                 dtype=np.int64)[inverse.reshape(-1)]
                if (codes < 0).any():
                    out.append((f"{FILE} marginal rows", f"of {columns!r}: released values "
                                                         "outside the taxonomy"))
                    labels = None
                    break
                values = lookup[codes]
            labels.append(values)
        else:  # every part resolved (a break skips a column group it cannot re-derive)
            expected = (_as_written(joined_cells(labels)).value_counts() if len(data)
                        else pd.Series(dtype=np.int64))
            got = expected.reindex(rows["cell"].to_numpy()).fillna(0).astype(np.int64)
            if not np.array_equal(got.to_numpy(), rows["released"].to_numpy()):
                out.append((f"{FILE} marginal rows", f"of {columns!r} differ from the "
                                                     "data file's counts"))
    return out
