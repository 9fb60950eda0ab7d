"""Numeric taxonomies for real-world columns: decimal values, top/bottom coding, a missing leaf.

A YAML numeric taxonomy may declare, besides ``domain`` and ``levels``:

* ``resolution: 0.1`` — values are decimals; the leaves are the bins ``[min + k r, min + (k+1) r)``
  (labelled ``[0.8-0.9)``), and level rules (``width``/``cuts``) are in the values' units;
* ``top_code: 100`` — every value >= 100, also above the domain, is one leaf ``[100+]``;
* ``bottom_code: 1`` — every value below 1 is one leaf ``[<1]``;
* ``missing: unknown`` — one more leaf for missing values (the column's ``missing:`` names it),
  generalized straight to ``*``.

Such a taxonomy is compiled into a tree of labels (kind ``binned``) plus a ``Binning`` that maps
raw text to leaf codes exactly (decimal arithmetic, never floats, so 0.3 is never binned as
0.29999). Mechanisms treat it like a categorical taxonomy; NCP (leaves covered / all leaves)
equals the interval-width ratio because bins are equally wide.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd

from medrelease.errors import TaxonomyError

SUPPRESSED = "*"  # the top of every taxonomy: the value generalized away (one definition)
DECIMAL = re.compile(r"^\s*[+-]?(\d+(\.\d*)?|\.\d+)\s*$")
WHOLE = re.compile(r"^\s*[+-]?\d+(\.0*)?\s*$")
MAX_BINS = 5_000_000
NUMERIC_TYPES = ("integer", "decimal")


def canonical_number(text: object) -> object:
    """One spelling per number for an informative column declared ``type: integer`` or
    ``decimal``: ``3``, ``3.0``, ``+3`` and `` 3 `` are all ``3``; ``0.50`` is ``0.5``. Text
    that is not a plain number (and a missing value) is returned as it is, so the domain check
    still refuses it."""
    if isinstance(text, bool) or text is None:
        return text
    if isinstance(text, (int, float, np.integer, np.floating)):
        if not np.isfinite(text):
            return text
        text = repr(float(text)) if isinstance(text, (float, np.floating)) else str(int(text))
        if "e" in text:  # a float repr in exponent form: a number all the same
            return format(Decimal(text).normalize(), "f")
    if not isinstance(text, str) or not DECIMAL.match(text):
        return text
    number = Decimal(text.strip())
    return "0" if number == 0 else format(number.normalize(), "f")


def canonical_numbers(values: pd.Series) -> pd.Series:
    """``canonical_number`` of every value, computed once per distinct value."""
    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    if not len(uniques):
        return values
    mapped = np.array([canonical_number(v) for v in uniques] + [None], dtype=object)
    return pd.Series(mapped[codes], index=values.index, name=values.name, dtype=object)


@dataclass(frozen=True)
class Binning:
    """How raw text becomes a leaf code: [bottom leaf] + regular bins + [top leaf] + [missing]."""

    low: Fraction                 # start of the first regular bin
    resolution: Fraction
    n_regular: int
    bottom: Fraction | None       # values below it -> the bottom leaf
    top: Fraction | None          # values at or above it -> the top leaf
    high: Fraction                # largest value covered when there is no top code
    missing: str | None
    whole: bool                   # integer values only (resolution 1 on integers)

    @property
    def n_leaves(self) -> int:
        return (self.bottom is not None) + self.n_regular + (self.top is not None) + (
            self.missing is not None)

    def parse_ok(self, text: pd.Series) -> pd.Series:
        """Which present values are numbers of the right form (whole, or plain decimals)."""
        pattern = WHOLE if self.whole else DECIMAL
        return text.isna() | text.astype("string").str.match(pattern.pattern).fillna(False)

    def covered(self, text: pd.Series) -> pd.Series:
        """Which present, well-formed values fall into some leaf."""
        codes = self._codes_of_distinct(text)
        return text.isna() | (codes >= 0)

    def encode(self, text: pd.Series) -> np.ndarray:
        """Leaf code per value (-1: not a number / not covered; the caller reports it)."""
        return self._codes_of_distinct(text)

    def _codes_of_distinct(self, text: pd.Series) -> np.ndarray:
        codes, uniques = pd.factorize(text.astype("string"), use_na_sentinel=True)
        leaf = np.array([self._leaf_of(str(u)) for u in uniques] + [-1], dtype=np.int64)
        return leaf[codes]

    def _leaf_of(self, raw: str) -> int:
        if self.missing is not None and raw == self.missing:
            return self.n_leaves - 1
        if not (WHOLE if self.whole else DECIMAL).match(raw):
            return -1
        try:
            value = Fraction(Decimal(raw.strip()))
        except (InvalidOperation, ValueError):
            return -1
        offset = int(self.bottom is not None)
        if self.bottom is not None and value < self.bottom:
            return 0
        if self.top is not None and value >= self.top:
            return offset + self.n_regular
        if value < self.low or (self.top is None and value > self.high):
            return -1
        k = int((value - self.low) // self.resolution)
        return offset + k if 0 <= k < self.n_regular else -1


def _fraction(value: object, what: str, where: str) -> Fraction:
    try:
        return Fraction(Decimal(str(value)))
    except (InvalidOperation, ValueError, TypeError):
        raise TaxonomyError(f"numeric taxonomy{where}: {what} must be a number, got "
                            f"{value!r}") from None


def _number_text(value: Fraction) -> str:
    text = f"{Decimal(value.numerator) / Decimal(value.denominator):f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def check_leaf_count(attribute: str, leaves: int, max_leaves: int, source: str = "") -> None:
    """Refuse a taxonomy above the policy's size limit before building it (minutes of work
    and gigabytes for millions of bins, all before any budget is charged). Here, below
    ``taxonomy.py``, because a binned taxonomy counts its bins before computing any."""
    if leaves > max_leaves:
        where = f" ({Path(source).name})" if source else ""
        raise TaxonomyError(
            f"the taxonomy of {attribute!r}{where} would have {leaves:,} leaves, over the "
            f"limit of {max_leaves:,} (policy: max_taxonomy_leaves in the dataset config); "
            "use a coarser resolution or fewer values, or raise the limit. Nothing was read "
            "or spent.")


@dataclass(frozen=True)
class BinnedLeaves:
    """A numeric YAML spec compiled to what a binned taxonomy is built from: every leaf's
    label, each leaf's labels at levels 1..h (ending in ``*``), and the exact binning."""

    labels: list[str]
    paths: list[list[str]]
    binning: Binning


def binned_leaves(attribute: str, spec: dict, source: str = "",
                  max_leaves: int = MAX_BINS) -> BinnedLeaves:
    """Compile a numeric YAML spec with resolution / top / bottom / missing into leaves and
    their paths (``taxonomy.load_yaml_rules`` builds the ``binned`` taxonomy from them)."""
    where = f" for {attribute!r} in {source}" if source else f" for {attribute!r}"
    domain = spec["domain"]
    low = _fraction(domain.get("min"), "domain min", where)
    high = _fraction(domain.get("max"), "domain max", where)
    step = _fraction(spec.get("resolution", 1), "resolution", where)
    bottom = _fraction(spec["bottom_code"], "bottom_code", where) if "bottom_code" in spec else None
    top = _fraction(spec["top_code"], "top_code", where) if "top_code" in spec else None
    missing = spec.get("missing")
    if step <= 0 or high < low:
        raise TaxonomyError(f"numeric taxonomy{where}: needs resolution > 0 and max >= min")
    whole = step == 1 and low.denominator == 1
    start = max(low, bottom) if bottom is not None else low
    end = top if top is not None else high + (step if not whole else 1)
    if (start - low) % step or (end - low) % step:
        raise TaxonomyError(f"numeric taxonomy{where}: top_code and bottom_code must lie on the "
                            f"resolution grid ({_number_text(step)} from the domain minimum)")
    n_regular = int((end - start) / step)
    check_leaf_count(attribute, n_regular, max_leaves, source)
    if n_regular < 0 or n_regular > MAX_BINS:
        raise TaxonomyError(f"numeric taxonomy{where}: {n_regular:,} bins; between 0 and "
                            f"{MAX_BINS:,} are allowed (use a coarser resolution)")
    binning = Binning(start, step, n_regular, bottom, top, high, missing, whole)
    starts, ends = _leaf_spans(binning)
    paths = _level_paths(binning, starts, ends, spec.get("levels") or [], where)
    labels = [*_leaf_labels(binning, starts, ends)]
    if missing is not None:
        labels.append(str(missing))
        paths.append([str(missing)] * (len(paths[0]) - 1) + [SUPPRESSED] if paths else
                     [SUPPRESSED])
    return BinnedLeaves(labels, paths, binning)


def _leaf_spans(binning: Binning) -> tuple[list[Fraction], list[Fraction | None]]:
    """Start (inclusive) and end (exclusive; None = open) of every non-missing leaf."""
    starts: list[Fraction] = []
    ends: list[Fraction | None] = []
    if binning.bottom is not None:
        starts.append(binning.low - binning.resolution)  # stands for everything below
        ends.append(binning.low)
    for k in range(binning.n_regular):
        starts.append(binning.low + k * binning.resolution)
        ends.append(binning.low + (k + 1) * binning.resolution)
    if binning.top is not None:
        starts.append(binning.top)
        ends.append(None)
    return starts, ends


def _leaf_labels(binning: Binning, starts: list[Fraction], ends: list[Fraction | None]):
    for i, (a, b) in enumerate(zip(starts, ends, strict=True)):
        if binning.bottom is not None and i == 0:
            yield f"[<{_number_text(b)}]"
        elif b is None:
            yield f"[{_number_text(a)}+]"
        elif binning.whole:
            yield _number_text(a)
        else:
            yield f"[{_number_text(a)}-{_number_text(b)})"


def _level_paths(binning: Binning, starts: list[Fraction], ends: list[Fraction | None],
                 rules: list, where: str) -> list[list[str]]:
    """Each leaf's label at every rule level, then '*'; one pass per level over sorted leaves."""
    paths: list[list[str]] = [[] for _ in starts]
    for level, rule in enumerate(rules, start=1):
        group = [_group_start(rule, s, level, where) for s in starts]
        i = 0
        while i < len(starts):
            j = i
            while j + 1 < len(starts) and group[j + 1] == group[i]:
                j += 1
            label = _interval_label(binning, starts[i], ends[j],
                                    binning.bottom is not None and i == 0)
            for k in range(i, j + 1):
                paths[k].append(label)
            i = j + 1
    for path in paths:
        path.append(SUPPRESSED)
    return paths


def _group_start(rule: object, value: Fraction, level: int, where: str) -> Fraction:
    if not isinstance(rule, dict) or not ({"width", "cuts"} & set(rule)):
        raise TaxonomyError(f"numeric taxonomy{where}: level {level} needs 'width' or 'cuts'")
    if "width" in rule:
        width = _fraction(rule["width"], f"level {level} width", where)
        anchor = _fraction(rule.get("anchor", 0), f"level {level} anchor", where)
        if width <= 0:
            raise TaxonomyError(f"numeric taxonomy{where}: level {level} width must be > 0")
        return anchor + ((value - anchor) // width) * width
    cuts = sorted(_fraction(c, f"level {level} cut", where) for c in rule["cuts"])
    below = [c for c in cuts if c <= value]
    return below[-1] if below else cuts[0] - 1


def _interval_label(binning: Binning, first: Fraction, last: Fraction | None,
                    open_low: bool) -> str:
    if last is None:
        return "[all]" if open_low else f"[{_number_text(first)}+]"
    if open_low:
        return f"[<{_number_text(last)}]"
    if binning.whole:
        return f"[{_number_text(first)}-{_number_text(last - 1)}]"
    return f"[{_number_text(first)}-{_number_text(last)})"
