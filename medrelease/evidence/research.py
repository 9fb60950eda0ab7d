"""What researchers need from a release, checked against its input — the steward's raw-data
evaluation (issue 53).

A user study found releases that misled researchers while the accuracy verdict stayed green:
a column's distribution collapsed to nearly uniform (age mean 51.6 released against 59.8),
rare values inflated (3 -> 38 rows), effects erased (an outcome rate by treatment 0.398 vs
0.548 in the input, 0.474 vs 0.482 released) and synthetic rows holding impossible
combinations (a cause of death for a person alive). Four checks answer them, for every
mechanism whose released values can be read as raw values:

* **collapsed 1-way distributions**: per released column, the total variation distance
  between the input's and the release's distribution on the column's raw values (leaves), a
  generalized label spreading its rows uniformly over the leaves it covers, ``*`` over the
  whole domain — the workload yardstick's rule (``workload.py``), whose label resolution is
  reused here. Above ``COLLAPSE_TVD`` (0.1) it is flagged. Numeric columns also get their mean,
  input against release (a generalized label counting at the mean of the values it covers);
* **inflated values**: a dimension's released label (at whatever level the release uses)
  carried by at least ``INFLATE_FACTOR`` (2) times the input rows it covers, and at least
  ``INFLATE_MIN_ROWS`` (5) rows more, and at least twice its input share of the rows (a
  release of three times the input's rows, ``histogram``'s noise rows, does not inflate every
  value; ``*`` never is). The informative column's values are checked value by value in
  ``accuracy.py``, next to lost, created and shrunk;
* **erased associations**: the informative column against each dimension (at the rate level
  of ``accuracy.rate_level``) and every declared analysis (``config.analyses``, at its
  levels): the rate of each value of the last column within each group of the others, input
  against release, on the groups with at least ``RATE_MIN_ROWS`` input rows that the release
  has rows for. The input's *spread* of a value's rate is its highest group rate minus its
  lowest. An association the input shows (spread at least ``ASSOCIATION_MIN_SPREAD`` and at
  least ``ASSOCIATION_MIN_Z`` standard errors of the difference between those two groups) is
  **erased** when the release's spread of that value's rate over the same groups is below
  ``ERASE_SHARE`` of the input's, and **reversed** when the release puts the input's
  highest-rate group below its lowest-rate one by at least that share. The joint
  distribution's TVD at the analysis's levels is given too;
* **impossible combinations**: released rows, and input rows (a data-quality finding), whose
  values lie wholly inside a combination the config declares impossible (``config.impossible``,
  ``medrelease.data.constraints``).

Everything is counted on per-column codes and per distinct label or label combination, never
row by row in Python. Everything here reads the raw input: the result belongs to the steward
record, and deciding from it whether to publish (or to rerun) falls outside the DP guarantee
(``accuracy.STEWARD_BASIS``, said wherever its findings are shown).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from medrelease.data.aggregate import MAX_KEY, group_sum, mixed_radix_digits
from medrelease.data.binning import NUMERIC_TYPES
from medrelease.data.config import DatasetConfig
from medrelease.data.constraints import ImpossibleCombos, describe, label_leaves
from medrelease.data.taxonomy import SUPPRESSED, Taxonomy
from medrelease.errors import ConfigError, InputValidationError
from medrelease.evidence.accuracy import (
    INFLATE_FACTOR,
    INFLATE_MIN_ROWS,
    RATE_MIN_ROWS,
    RATE_VALUES_MAX,
    Accuracy,
    _leaf_codes,
    _released_columns,
    informative_accuracy,
    not_comparable,
    rate_level,
    workload_accuracy,
)
from medrelease.evidence.text_codes import MISSING, CodedColumns
from medrelease.evidence.workload import _Domain, _segments, marginal_name

COLLAPSE_TVD = 0.10         # a column's 1-way TVD above this is flagged (0 = same distribution)
ERASE_SHARE = 0.5           # a release keeping less than this share of a rate spread erased it
ASSOCIATION_MIN_SPREAD = 0.02  # an input spread below this (2 points) is no association to keep
ASSOCIATION_MIN_Z = 3.0     # ... nor one within 3 standard errors of the input's own sampling
JOINT_CELLS_MAX = 4_000_000  # an analysis's cells at its levels beyond this: not compared
EXPAND_CHUNK = 4_000_000    # released (combination, group) pairs spread per numpy pass
INFLATED_SHOWN = 20         # inflated labels listed per dimension (worst first)
GROUPS_SHOWN = 24           # groups whose rates are listed per association (most input rows)
NAMED_IN_WARNING = 3        # values or associations named in one warning line

COLLAPSE_RULE = (f"flagged when the 1-way TVD is above {COLLAPSE_TVD:g} (total variation "
                 "distance on the column's raw values: 0 = the input's distribution, 1 = "
                 "nothing in common; a generalized label spreads its rows uniformly over the "
                 "values it covers, '*' over the whole domain). Means of numeric columns: a "
                 "generalized label counts at the mean of the values it covers; rows whose "
                 "value is not a number (top- or bottom-coded, missing) are left out")
INFLATE_RULE = (f"flagged when a value — a dimension's released label, at the release's own "
                f"level — is released at least {INFLATE_FACTOR:g}x its input count (the input "
                f"rows it covers), at least {INFLATE_MIN_ROWS} rows more, and at least "
                f"{INFLATE_FACTOR:g}x its input share of the rows")
ASSOCIATION_RULE = (
    f"the rate of each value of the last column within each group of the others, on the "
    f"groups with at least {RATE_MIN_ROWS} input rows the release has rows for; spread = the "
    "highest group rate minus the lowest. An association the input shows (spread at least "
    f"{100 * ASSOCIATION_MIN_SPREAD:g} points and at least {ASSOCIATION_MIN_Z:g} standard "
    "errors of the difference between its highest- and lowest-rate groups) is erased when the "
    f"release's spread over the same groups is below {ERASE_SHARE:g} of the input's, and "
    "reversed when the release puts the input's highest-rate group below its lowest-rate one "
    f"by at least {ERASE_SHARE:g} of the input's spread")
IMPOSSIBLE_RULE = ("counted: rows whose every named value lies wholly inside a combination "
                   "the dataset config declares impossible; a generalized label that also covers "
                   "possible values is not counted")


# -- findings ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Distribution:
    """One released column's 1-way distribution against the input's."""

    column: str
    tvd: float
    generalized_share: float  # released rows whose label covers more than one raw value
    input_mean: float | None = None
    released_mean: float | None = None

    @property
    def collapsed(self) -> bool:
        return self.tvd > COLLAPSE_TVD

    def in_words(self, with_means: bool = True) -> str:
        """'age 0.312 (mean 59.8 in the input, 51.6 released)'."""
        extra = []
        if with_means and self.input_mean is not None and self.released_mean is not None:
            extra.append(f"mean {_number(self.input_mean)} in the input, "
                         f"{_number(self.released_mean)} released")
        if self.generalized_share >= 0.01:
            extra.append(f"{100 * self.generalized_share:.0f} % of its released rows "
                         "generalized, spread over the values they cover")
        return f"{self.column} {self.tvd:.3f}" + (f" ({'; '.join(extra)})" if extra else "")


@dataclass(frozen=True)
class Inflated:
    """A released value (label) with at least twice its input rows."""

    column: str
    value: str
    input: int
    released: int

    @property
    def factor(self) -> float | None:
        """Released rows over input rows (None: the input has no row under the label)."""
        return self.released / self.input if self.input else None

    def in_words(self) -> str:
        """'99 (3 -> 38, ×12.7)'; a label the input has no row for: '(0 -> 7, new)'."""
        factor = "new" if self.factor is None else f"×{self.factor:.3g}"
        return f"{self.value} ({self.input:,} -> {self.released:,}, {factor})"


@dataclass
class Association:
    """One association (a declared analysis, or the informative column by a dimension): the
    rates of the last column's values within the groups of the others, input against release."""

    name: str
    columns: list[str]
    levels: list[int]
    declared: bool
    tvd: float | None = None
    groups: int = 0               # groups compared (enough input rows, some released rows)
    value: str | None = None      # the value summarized: a flagged one of the largest input
    #                               spread, else the one of the largest input spread
    input_spread: float | None = None
    released_spread: float | None = None
    released_contrast: float | None = None  # input's highest- minus lowest-rate group, released
    input_groups: tuple[str, str] | None = None  # the input's highest- and lowest-rate group
    input_rates: tuple[float, float] | None = None
    released_rates: tuple[float, float] | None = None
    shows: bool = False           # the input shows an association (the rule's thresholds)
    erased_values: list[str] = field(default_factory=list)
    reversed_values: list[str] = field(default_factory=list)
    largest_difference: float | None = None  # largest |released - input rate|, any value/group
    rates: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""

    @property
    def erased(self) -> bool:
        return bool(self.erased_values)

    @property
    def reversed(self) -> bool:
        return bool(self.reversed_values)

    @property
    def flagged(self) -> bool:
        return self.erased or self.reversed

    def in_words(self, named: bool) -> str:
        """'rx × status: status 1 rate 0.398 (rx A) to 0.548 (rx B) in the input, 0.474 to
        0.482 released'; ``named=False``: spreads only, no value or group."""
        what = "reversed" if self.reversed and not self.erased else "erased"
        if not named or self.input_rates is None or self.released_rates is None:
            return (f"{self.name} {what} (rate spread across groups {self.input_spread:.3f} "
                    f"in the input, {self.released_spread:.3f} released)")
        (high, low), (r_high, r_low), (o_high, o_low) = (self.input_groups, self.input_rates,
                                                        self.released_rates)
        more = len(set(self.erased_values) | set(self.reversed_values)) - 1
        return (f"{self.name} {what}: {self.columns[-1]} {self.value} rate {r_low:.3f} "
                f"({low}) to {r_high:.3f} ({high}) in the input, {o_low:.3f} to {o_high:.3f} "
                f"released" + (f"; {more} more value(s) of {self.columns[-1]}" if more > 0
                               else ""))

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "columns": self.columns, "levels": self.levels,
            "declared": self.declared, "tvd": self.tvd, "groups": self.groups,
            "value": self.value, "input_spread": self.input_spread,
            "released_spread": self.released_spread,
            "released_contrast": self.released_contrast,
            "input_groups": list(self.input_groups) if self.input_groups else None,
            "input_rates": list(self.input_rates) if self.input_rates else None,
            "released_rates": list(self.released_rates) if self.released_rates else None,
            "shows_association": self.shows, "erased": self.erased, "reversed": self.reversed,
            "erased_values": self.erased_values, "reversed_values": self.reversed_values,
            "largest_difference": self.largest_difference, "rates": self.rates,
            "note": self.note}


@dataclass(frozen=True)
class ImpossibleCount:
    """One declared impossible combination: the released rows and input rows holding it."""

    reason: str
    columns: list[str]
    released_rows: int
    input_rows: int


@dataclass
class ResearchAccuracy:
    """The four checks on one release (see the module's docstring for each rule)."""

    distributions: list[Distribution] = field(default_factory=list)
    inflated: dict[str, list[Inflated]] = field(default_factory=dict)  # per dimension, worst first
    inflated_counts: dict[str, int] = field(default_factory=dict)      # all of them, per dimension
    associations: list[Association] = field(default_factory=list)
    impossible: list[ImpossibleCount] | None = None  # None: the config declares none to check
    not_applicable: dict[str, str] = field(default_factory=dict)

    @property
    def collapsed(self) -> list[Distribution]:
        return sorted((d for d in self.distributions if d.collapsed), key=lambda d: -d.tvd)

    @property
    def flagged_associations(self) -> list[Association]:
        return [a for a in self.associations if a.flagged]

    @property
    def impossible_released(self) -> int:
        return sum(c.released_rows for c in self.impossible or [])

    @property
    def impossible_input(self) -> int:
        return sum(c.input_rows for c in self.impossible or [])

    def verdict_words(self, inflated_elsewhere: int = 0) -> list[str]:
        """Clauses for the verdict line, the first one saying 'for researchers:'; counts and
        column names only (log-safe);
        ``inflated_elsewhere``: the informative column's inflated values, counted with these."""
        parts = []
        collapsed = self.collapsed
        if collapsed:
            worst = collapsed[0]
            parts.append(f"1-way distribution far from the input's: {worst.column} (TVD "
                         f"{worst.tvd:.2f})" + _more(len(collapsed), 1))
        inflated = sum(self.inflated_counts.values()) + inflated_elsewhere
        if inflated:
            parts.append(f"{inflated:,} value(s) inflated {INFLATE_FACTOR:g}x or more")
        flagged = self.flagged_associations
        if flagged:
            parts.append(f"association{'s' if len(flagged) > 1 else ''} erased or reversed: "
                         + ", ".join(a.name for a in flagged[:NAMED_IN_WARNING])
                         + _more(len(flagged), NAMED_IN_WARNING))
        if self.impossible_released:
            parts.append(f"{self.impossible_released:,} released row(s) hold a combination "
                         "declared impossible")
        return [f"for researchers: {parts[0]}", *parts[1:]] if parts else []

    def warnings(self, named: bool = True) -> list[str]:
        """WARNING lines, one per kind of finding. ``named=False`` (Prefect's log): no value of
        the table and no input count, only column names, distances, spreads and the release's
        own counts."""
        lines = []
        collapsed = self.collapsed
        if collapsed:
            lines.append(
                f"WARNING: {len(collapsed):,} released column(s) with a 1-way distribution far "
                f"from the input's (TVD above {COLLAPSE_TVD:g}; 0 = the same distribution): "
                + ", ".join(d.in_words(with_means=named) for d in collapsed))
        if self.inflated_counts:
            if named:
                listed = "; ".join(
                    f"{column}: " + ", ".join(v.in_words() for v in values[:NAMED_IN_WARNING])
                    + _more(self.inflated_counts[column], min(len(values), NAMED_IN_WARNING))
                    for column, values in self.inflated.items())
            else:
                listed = ", ".join(f"{column} {n:,} value(s)"
                                   for column, n in self.inflated_counts.items())
                listed += " (named in the evidence report)"
            lines.append(f"WARNING: values released at least {INFLATE_FACTOR:g}x their input "
                         f"count and share of the rows (and at least {INFLATE_MIN_ROWS} rows "
                         f"more): {listed}")
        flagged = self.flagged_associations
        if flagged:
            lines.append(
                f"WARNING: {len(flagged):,} association(s) erased or reversed (the release "
                f"keeps less than {ERASE_SHARE:g} of the input's spread of a rate across "
                "groups): " + "; ".join(a.in_words(named) for a in flagged[:NAMED_IN_WARNING])
                + _more(len(flagged), NAMED_IN_WARNING))
        if self.impossible_released:
            lines.append(
                f"WARNING: {self.impossible_released:,} released row(s) hold a combination the "
                "config declares impossible: " + "; ".join(
                    f"{c.reason} ({c.released_rows:,})" for c in self.impossible or []
                    if c.released_rows))
        if self.impossible_input:
            if named:
                lines.append(
                    f"WARNING: {self.impossible_input:,} input row(s) hold a combination the "
                    "config declares impossible (a data-quality finding in the input, not the "
                    "release's doing): " + "; ".join(
                        f"{c.reason} ({c.input_rows:,})" for c in self.impossible or []
                        if c.input_rows))
            else:
                lines.append("WARNING: input rows hold a combination the config declares "
                             "impossible (a data-quality finding in the input; counted in the "
                             "evidence report)")
        return lines

    def as_json(self) -> dict[str, Any]:
        return {
            "distributions": {
                "rule": COLLAPSE_RULE, "threshold": COLLAPSE_TVD,
                "columns": [{"column": d.column, "tvd": d.tvd, "collapsed": d.collapsed,
                             "generalized_share": d.generalized_share,
                             "input_mean": d.input_mean, "released_mean": d.released_mean}
                            for d in self.distributions],
                "collapsed": [d.column for d in self.collapsed]},
            "inflated": {
                "rule": INFLATE_RULE, "factor": INFLATE_FACTOR, "min_rows": INFLATE_MIN_ROWS,
                "counts": self.inflated_counts,
                "values": {column: [{"value": v.value, "input": v.input,
                                     "released": v.released, "factor": v.factor}
                                    for v in values]
                           for column, values in self.inflated.items()}},
            "associations": {
                "rule": ASSOCIATION_RULE, "erase_share": ERASE_SHARE,
                "min_spread": ASSOCIATION_MIN_SPREAD, "min_z": ASSOCIATION_MIN_Z,
                "items": [a.as_json() for a in self.associations],
                "erased": [a.name for a in self.associations if a.erased],
                "reversed": [a.name for a in self.associations if a.reversed]},
            # input counts: the steward record only (evaluation.json under steward/…/evaluation;
            # the published verdict counts impossible rows in the released rows alone)
            "impossible": None if self.impossible is None else {
                "rule": IMPOSSIBLE_RULE,
                "released_rows": self.impossible_released, "input_rows": self.impossible_input,
                "combinations": [{"reason": c.reason, "columns": c.columns,
                                  "released_rows": c.released_rows, "input_rows": c.input_rows}
                                 for c in self.impossible]},
            "not_applicable": self.not_applicable,
        }


# -- one column: leaves, the input's leaf codes, the release's labels resolved -------------

@dataclass(eq=False)
class _Column:
    """A released column as the checks read it: its leaves (raw values), each input row's leaf
    (``MISSING``: none), each released row's label (an index into ``label_texts``) and, per
    label, the leaves it covers (``label_leaves[label_start[i]:][:label_count[i]]``; a count of
    0: the label covers no leaf of the domain)."""

    name: str
    taxonomy: Taxonomy | None
    leaves: np.ndarray
    input_leaf: np.ndarray
    label_texts: np.ndarray
    released_label: np.ndarray
    label_start: np.ndarray
    label_count: np.ndarray
    label_leaves: np.ndarray
    numbers: np.ndarray | None  # each leaf's number (NaN: not a number); None: not numeric
    _groups: dict[int, tuple[np.ndarray, ...]] = field(default_factory=dict, repr=False)
    _input_groups: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def n_leaves(self) -> int:
        return len(self.leaves)

    def has_level(self, level: int) -> bool:
        return level == 0 or (self.taxonomy is not None and level < len(
            self.taxonomy.level_codes))

    def group_of_leaf(self, level: int) -> np.ndarray:
        if level == 0 or self.taxonomy is None:
            return np.arange(self.n_leaves, dtype=np.int64)
        return np.asarray(self.taxonomy.level_codes[level], dtype=np.int64)

    @cached_property
    def _leaf_texts(self) -> list[str]:
        return [str(v) for v in self.leaves]

    def group_labels(self, level: int) -> Sequence[str]:
        if level == 0 or self.taxonomy is None:
            return self._leaf_texts
        return self.taxonomy.level_labels[level]

    def n_groups(self, level: int) -> int:
        return self.n_leaves if level == 0 else len(self.group_labels(level))

    @cached_property
    def input_missing(self) -> bool:
        """Whether some input row has no value here (then masked; else no mask at all)."""
        return bool((self.input_leaf == MISSING).any())

    @cached_property
    def released_missing(self) -> bool:
        return bool((self.released_label == MISSING).any())

    def input_groups(self, level: int) -> np.ndarray:
        """Each input row's group at ``level`` (``MISSING`` kept), computed once per level: the
        informative column's codes serve every association it is in."""
        if level not in self._input_groups:
            if level == 0 or self.taxonomy is None:
                self._input_groups[level] = self.input_leaf
            else:
                groups = self.group_of_leaf(level)[np.maximum(self.input_leaf, 0)]
                self._input_groups[level] = (np.where(self.input_leaf == MISSING, MISSING,
                                                      groups) if self.input_missing else groups)
        return self._input_groups[level]

    @cached_property
    def released_per_label(self) -> np.ndarray:
        labels = self.released_label
        present = labels[labels != MISSING] if self.released_missing else labels
        return np.bincount(present, minlength=len(self.label_texts))

    def label_groups(self, level: int) -> tuple[np.ndarray, ...]:
        """Per label, the groups at ``level`` it covers and the share of its leaves in each:
        (start, count, group, share), the groups of label i at ``start[i]:][:count[i]]``."""
        if level not in self._groups:
            n_labels, size = len(self.label_texts), self.n_groups(level)
            positions = _segments(self.label_start, self.label_count)
            label = np.repeat(np.arange(n_labels, dtype=np.int64), self.label_count)
            group = self.group_of_leaf(level)[self.label_leaves[positions]]
            keys, leaves = group_sum(label * size + group, np.ones(label.size, dtype=np.int64))
            label, group = np.divmod(keys, size)
            count = np.bincount(label, minlength=n_labels)
            start = np.cumsum(count) - count
            share = leaves / self.label_count[label] if label.size else np.zeros(0)
            self._groups[level] = (start, count, group, share)
        return self._groups[level]


def _columns(frame: pd.DataFrame, released: pd.DataFrame, config: DatasetConfig,
             coded_in: CodedColumns, coded_out: CodedColumns, names: list[str]
             ) -> dict[str, _Column]:
    """Every comparable column: dimensions by their taxonomy, the informative column by its
    taxonomy when it has one that covers the input, else (and the class column) by its values:
    the declared domain, the input's and the release's."""
    out: dict[str, _Column] = {}
    for name in names:
        taxonomy = config.taxonomies[name] if name in config.dimensions else (
            config.informative_taxonomy if name in config.informative else None)
        input_leaf = None
        if taxonomy is not None:
            try:
                input_leaf = np.asarray(_leaf_codes(coded_in, name, taxonomy), dtype=np.int64)
            except InputValidationError:
                if name in config.dimensions:
                    raise
                taxonomy = None  # an informative taxonomy that does not cover the input
        codes_out, texts_out = coded_out(name)
        if taxonomy is not None:
            leaves = np.asarray(taxonomy.level_labels[0], dtype=object)
            domain = _Domain.of_taxonomy(taxonomy)
        else:
            codes_in, texts_in = coded_in(name)
            declared = (config.informative_domain if name in config.informative
                        else config.class_domain) or []
            leaves = np.asarray(list(dict.fromkeys(
                [*map(str, declared), *map(str, texts_in),
                 *(str(t) for t in texts_out if t != SUPPRESSED)])), dtype=object)
            position = {text: i for i, text in enumerate(leaves)}
            lookup = np.array([position[str(t)] for t in texts_in] + [MISSING], dtype=np.int64)
            input_leaf = lookup[codes_in]
            domain = _Domain.of_values([str(v) for v in leaves])
        ids, resolved = domain.resolve(pd.Series([str(t) for t in texts_out], dtype=object))
        starts = np.append(resolved.label_start, 0)  # the last: labels outside the domain
        counts = np.append(resolved.label_count, 0)
        out[name] = _Column(name, taxonomy, leaves, input_leaf, np.asarray(texts_out, object),
                            np.asarray(codes_out, dtype=np.int64), starts[ids], counts[ids],
                            resolved.label_leaves, _leaf_numbers(name, config, taxonomy, leaves))
    return out


BIN = re.compile(r"^\[(-?\d+(?:\.\d+)?)-(-?\d+(?:\.\d+)?)\)$")


def _leaf_numbers(name: str, config: DatasetConfig, taxonomy: Taxonomy | None,
                  leaves: np.ndarray) -> np.ndarray | None:
    """Each leaf's number when the column is numeric: a numeric taxonomy's integers, a binned
    one's bin midpoints (NaN for its open top and bottom bins and its missing leaf), a column
    declared ``integer`` or ``decimal`` its values; None for a categorical column."""
    if taxonomy is not None:
        if taxonomy.kind == "numeric":
            return np.asarray(taxonomy.leaves, dtype=np.float64)
        if taxonomy.kind != "binned":
            return None
        numbers = pd.to_numeric(pd.Series(leaves, dtype=object), errors="coerce").to_numpy(
            dtype=np.float64, copy=True)  # (a view of an all-NaN column is read-only)
        for i, label in enumerate(leaves):
            if (found := BIN.match(str(label))) is not None:
                numbers[i] = (float(found.group(1)) + float(found.group(2))) / 2
        return numbers
    spec = config.columns.get(name)
    if spec is None or spec.type not in NUMERIC_TYPES:
        return None
    numbers = pd.to_numeric(pd.Series(leaves, dtype=object), errors="coerce").to_numpy(
        dtype=np.float64)
    return numbers if np.isfinite(numbers).any() else None


# -- joint distributions at given levels ---------------------------------------------------

@dataclass(frozen=True)
class _Joint:
    """Input rows and released rows per cell of the columns' groups at their levels (dense,
    the first column most significant), and all released rows (the TVD's denominator)."""

    sizes: list[int]
    input: np.ndarray
    released: np.ndarray
    released_total: int

    @property
    def tvd(self) -> float:
        """Released labels covering no leaf count as mass outside the input's domain."""
        total_in = float(self.input.sum())
        if total_in <= 0 or self.released_total <= 0:
            return 1.0
        p = self.input / total_in
        q = self.released / self.released_total
        return 0.5 * (float(np.abs(p - q).sum()) + max(0.0, 1.0 - float(q.sum())))


def _joint(columns: list[_Column], levels: list[int], weights: np.ndarray,
           released_total: int) -> _Joint:
    """The input's and the release's joint distribution on ``columns`` at ``levels``.

    The input: one weighted count of its group keys. The release: its rows counted per
    distinct combination of labels, then each combination's rows spread over the groups its
    labels cover (the share of their leaves), all combinations at once, in chunks of at most
    ``EXPAND_CHUNK`` (combination, group) pairs."""
    sizes = [c.n_groups(level) for c, level in zip(columns, levels, strict=True)]
    cells = math.prod(sizes)
    codes = [c.input_groups(level) for c, level in zip(columns, levels, strict=True)]
    key = _packed(codes, sizes)
    if any(c.input_missing for c in columns):
        keep = np.logical_and.reduce([code != MISSING for code in codes])
        joint_in = np.bincount(key[keep], weights=weights[keep], minlength=cells)
    else:
        joint_in = np.bincount(key, weights=weights, minlength=cells)

    radix = [len(c.label_texts) for c in columns]
    span = math.prod(radix)
    if span >= MAX_KEY:
        raise ValueError("too many distinct released labels to combine in 64-bit keys")
    if len(columns) == 1:
        per_combo = columns[0].released_per_label
        combos = np.flatnonzero(per_combo)
        rows = per_combo[combos]
    else:
        labels_out = [c.released_label for c in columns]
        key = _packed(labels_out, radix)
        if any(c.released_missing for c in columns):
            key = key[np.logical_and.reduce([label != MISSING for label in labels_out])]
        if span <= max(4 * key.size, 1 << 22):  # dense counting: no sort
            per_combo = np.bincount(key, minlength=span)
            combos = np.flatnonzero(per_combo)
            rows = per_combo[combos]
        else:
            combos, rows = group_sum(key, np.ones(key.size, dtype=np.int64))
    labels = mixed_radix_digits(combos, radix) if combos.size else [combos] * len(columns)
    parts = [c.label_groups(level) for c, level in zip(columns, levels, strict=True)]
    covered = [part[1][label] for part, label in zip(parts, labels, strict=True)]
    pairs = np.ones(combos.size, dtype=np.int64)
    for count in covered:
        pairs *= count  # 0: a label covering no leaf (outside the domain)
    inside = np.flatnonzero(pairs > 0)
    joint_out = np.zeros(cells)
    if inside.size:
        chunk = (np.cumsum(pairs[inside]) - 1) // EXPAND_CHUNK
        for piece in np.split(inside, np.flatnonzero(np.diff(chunk)) + 1):
            joint_out += _spread(piece, labels, parts, sizes, rows, cells)
    return _Joint(sizes, joint_in, joint_out, released_total)


def _packed(codes: list[np.ndarray], sizes: list[int]) -> np.ndarray:
    """Mixed-radix int64 keys of per-row codes, the first most significant (a ``MISSING``
    code gives a key the caller masks out)."""
    key = np.asarray(codes[0], dtype=np.int64)
    for code, size in zip(codes[1:], sizes[1:], strict=True):
        key = key * size + code
    return key


def _spread(combos: np.ndarray, labels: list[np.ndarray], parts: list[tuple[np.ndarray, ...]],
            sizes: list[int], rows: np.ndarray, cells: int) -> np.ndarray:
    """Released rows of ``combos`` per cell, each label's rows spread over its groups."""
    combo = combos
    key = np.zeros(combo.size, dtype=np.int64)
    mass = rows[combo].astype(np.float64)
    for label_of, (start, count, group, share), size in zip(labels, parts, sizes, strict=True):
        label = label_of[combo]
        width = count[label]
        if bool((width == 1).all()):
            first = start[label]
            key = key * size + group[first]
            mass = mass * share[first]
            continue
        positions = _segments(start[label], width)
        combo = np.repeat(combo, width)
        key = np.repeat(key, width) * size + group[positions]
        mass = np.repeat(mass, width) * share[positions]
    return np.bincount(key, weights=mass, minlength=cells)


# -- the checks ----------------------------------------------------------------------------

def research_accuracy(frame: pd.DataFrame, weights: np.ndarray | None, released: pd.DataFrame,
                      config: DatasetConfig,
                      coded: tuple[CodedColumns, CodedColumns] | None = None
                      ) -> tuple[ResearchAccuracy | None, dict[str, str]]:
    """The four checks of ``released`` against the input rows ``frame`` (each standing for
    ``weights`` rows), with why they do not apply when they do not. ``coded``: the input's and
    the release's columns as codes, when the caller has them (the evaluation shares them with
    the informative column's counts)."""
    not_applicable: dict[str, str] = {}
    names = [c for c in _released_columns(released, config) if c in frame.columns]
    if not names:
        not_applicable["research"] = ("the release carries no column that can be compared "
                                      "with the input")
        return None, not_applicable
    coded_in, coded_out = coded or (CodedColumns(frame), CodedColumns(released))
    w = (np.ones(len(frame), dtype=np.float64) if weights is None
         else np.asarray(weights, dtype=np.float64))
    columns = _columns(frame, released, config, coded_in, coded_out, names)
    research = ResearchAccuracy()
    one_way = {name: _joint([column], [0], w, len(released)) for name, column in columns.items()}
    for name, column in columns.items():
        research.distributions.append(_distribution(column, one_way[name]))
        if name in config.dimensions:
            found = _inflated(column, one_way[name].input)
            if found:
                research.inflated_counts[name] = len(found)
                research.inflated[name] = found[:INFLATED_SHOWN]
    _associations(research, columns, config, w, len(released))
    research.impossible = _impossible(research, columns, config, coded_in, coded_out, w)
    return research, not_applicable


def _distribution(column: _Column, joint: _Joint) -> Distribution:
    rows = column.released_per_label
    total = int(rows.sum())
    generalized = float(rows[column.label_count > 1].sum() / total) if total else 0.0
    input_mean = released_mean = None
    if column.numbers is not None:
        numeric = np.isfinite(column.numbers)
        input_mean = _mean(joint.input, column.numbers, numeric)
        released_mean = _mean(joint.released, column.numbers, numeric)
    return Distribution(column.name, joint.tvd, generalized, input_mean, released_mean)


def _mean(mass: np.ndarray, numbers: np.ndarray, numeric: np.ndarray) -> float | None:
    weight = float(mass[numeric].sum())
    return float((mass[numeric] * numbers[numeric]).sum() / weight) if weight > 0 else None


def _inflated(column: _Column, input_leaves: np.ndarray) -> list[Inflated]:
    """Released labels with at least ``INFLATE_FACTOR`` times the input rows they cover (and
    ``INFLATE_MIN_ROWS`` more) and times their share of the rows, the largest factor first
    (labels the input has no row for first of all), then the most rows added."""
    released = column.released_per_label
    summed = np.concatenate([[0.0], np.cumsum(input_leaves[column.label_leaves])])
    covered = np.rint(summed[column.label_start + column.label_count]
                      - summed[column.label_start]).astype(np.int64)
    total_in, total_out = float(input_leaves.sum()), float(released.sum())
    hit = np.flatnonzero((column.label_count > 0) & (released >= INFLATE_FACTOR * covered)
                         & (released - covered >= INFLATE_MIN_ROWS)
                         & (released * total_in >= INFLATE_FACTOR * covered * total_out))
    found = [Inflated(column.name, str(column.label_texts[i]), int(covered[i]),
                      int(released[i])) for i in hit]
    return sorted(found, key=lambda v: (v.factor is not None, -(v.factor or 0.0),
                                        -(v.released - v.input), v.value))


def _associations(research: ResearchAccuracy, columns: dict[str, _Column],
                  config: DatasetConfig, weights: np.ndarray, released_total: int) -> None:
    """The informative column by each dimension, then every declared analysis."""
    target = next((c for c in config.informative + config.class_columns if c in columns), None)
    wanted: list[tuple[str, list[str], list[int], bool]] = []
    if target is not None:
        for dim in config.dimensions:
            if dim in columns:
                wanted.append((marginal_name([dim, target]), [dim, target],
                               [rate_level(config.taxonomies[dim]), 0], False))
    for analysis in config.analyses:
        wanted.append((analysis.name, list(analysis.columns),
                       [analysis.level_of(c) for c in analysis.columns], True))
    if not wanted:
        research.not_applicable["associations"] = (
            "no informative or class column is released and no analysis is declared")
        return
    for name, names, levels, declared in wanted:
        association = Association(name, names, levels, declared)
        research.associations.append(association)
        missing = [c for c in names if c not in columns]
        if missing:
            association.note = (f"not compared: {', '.join(missing)} not released (or not in "
                                "the input)")
            continue
        chosen = [columns[c] for c in names]
        unknown = [c.name for c, level in zip(chosen, levels, strict=True)
                   if not c.has_level(level)]
        if unknown:
            association.note = (f"not compared: {', '.join(unknown)} has no such taxonomy "
                                "level")
            continue
        cells = math.prod(c.n_groups(level) for c, level in zip(chosen, levels, strict=True))
        if cells > JOINT_CELLS_MAX:
            association.note = (f"not compared: {cells:,} cells at these levels, more than "
                                f"the evaluation's limit of {JOINT_CELLS_MAX:,}")
            continue
        joint = _joint(chosen, levels, weights, released_total)
        association.tvd = joint.tvd
        if len(chosen) > 1:
            _rates(association, chosen, levels, joint)
        else:
            association.note = "one column: the distance of its distribution only"


def _rates(association: Association, columns: list[_Column], levels: list[int],
           joint: _Joint) -> None:
    """The last column's rates within the groups of the others, and the rule applied to each
    of its most frequent values (``RATE_VALUES_MAX``)."""
    n_values = joint.sizes[-1]
    joint_in = joint.input.reshape(-1, n_values)
    joint_out = joint.released.reshape(-1, n_values)
    rows_in, rows_out = joint_in.sum(axis=1), joint_out.sum(axis=1)
    eligible = np.flatnonzero((rows_in >= RATE_MIN_ROWS) & (rows_out > 0))
    by_value = joint_in.sum(axis=0)
    shown = [int(v) for v in np.argsort(-by_value, kind="stable")[:RATE_VALUES_MAX]
             if by_value[v] > 0]
    association.groups = int(eligible.size)
    if eligible.size < 2 or not shown:
        association.note = (f"not compared: fewer than two groups with at least "
                            f"{RATE_MIN_ROWS} input rows that the release has rows for")
        return
    r_in = joint_in[eligible][:, shown] / rows_in[eligible, None]
    r_out = joint_out[eligible][:, shown] / rows_out[eligible, None]
    n = rows_in[eligible]
    high, low = r_in.argmax(axis=0), r_in.argmin(axis=0)
    cols = np.arange(len(shown))
    spread_in = r_in[high, cols] - r_in[low, cols]
    spread_out = r_out.max(axis=0) - r_out.min(axis=0)
    contrast_out = r_out[high, cols] - r_out[low, cols]
    p_high, p_low = r_in[high, cols], r_in[low, cols]
    error = np.sqrt(p_high * (1 - p_high) / n[high] + p_low * (1 - p_low) / n[low])
    shows = (spread_in >= ASSOCIATION_MIN_SPREAD) & (spread_in >= ASSOCIATION_MIN_Z * error)
    erased = shows & (spread_out < ERASE_SHARE * spread_in)
    flipped = shows & (contrast_out <= -ERASE_SHARE * spread_in)
    value_labels = columns[-1].group_labels(levels[-1])
    group_labels = _group_labels(columns[:-1], levels[:-1], joint.sizes[:-1], eligible)
    flagged = np.flatnonzero(erased | flipped)
    # the value summarized: the flagged one with the largest input spread, else the largest
    pick = int(flagged[np.argmax(spread_in[flagged])]) if flagged.size else int(
        np.argmax(np.where(shows, spread_in, -1.0)) if shows.any() else np.argmax(spread_in))
    association.value = str(value_labels[shown[pick]])
    association.shows = bool(shows.any())
    association.input_spread = float(spread_in[pick])
    association.released_spread = float(spread_out[pick])
    association.released_contrast = float(contrast_out[pick])
    association.input_groups = (group_labels[high[pick]], group_labels[low[pick]])
    association.input_rates = (float(r_in[high[pick], pick]), float(r_in[low[pick], pick]))
    association.released_rates = (float(r_out[high[pick], pick]),
                                  float(r_out[low[pick], pick]))
    association.erased_values = [str(value_labels[shown[j]]) for j in np.flatnonzero(erased)]
    association.reversed_values = [str(value_labels[shown[j]])
                                   for j in np.flatnonzero(flipped)]
    association.largest_difference = float(np.abs(r_out - r_in).max())
    # the rates listed: every shown value of a declared analysis, the summarized one otherwise,
    # in the groups with the most input rows
    listed = range(len(shown)) if association.declared else [pick]
    top = np.argsort(-n, kind="stable")[:GROUPS_SHOWN]
    association.rates = [
        {"group": group_labels[g], "value": str(value_labels[shown[j]]),
         "input_rate": float(r_in[g, j]), "released_rate": float(r_out[g, j]),
         "difference": float(r_out[g, j] - r_in[g, j]), "group_rows": int(np.rint(n[g]))}
        for j in listed for g in sorted(top.tolist())]
    if not association.shows:
        association.note = ("the input shows no association above the rule's thresholds: "
                            "nothing to erase")


def _group_labels(columns: list[_Column], levels: list[int], sizes: list[int],
                  groups: np.ndarray) -> list[str]:
    """The groups' names: a label, or 'a=x, b=y' for groups of several columns."""
    digits = mixed_radix_digits(groups.astype(np.int64), sizes)
    labels = [np.asarray(c.group_labels(level), dtype=object)[d]
              for c, level, d in zip(columns, levels, digits, strict=True)]
    if len(columns) == 1:
        return [str(v) for v in labels[0]]
    return [", ".join(f"{c.name}={v}" for c, v in zip(columns, values, strict=True))
            for values in zip(*labels, strict=True)]


def _impossible(research: ResearchAccuracy, columns: dict[str, _Column],
                config: DatasetConfig, coded_in: CodedColumns, coded_out: CodedColumns,
                weights: np.ndarray) -> list[ImpossibleCount] | None:
    """Released and input rows per declared impossible combination, each tested once per
    distinct combination of its columns' values (``ImpossibleCombos.label_rows``)."""
    if not config.impossible:
        return None
    found: list[ImpossibleCount] = []
    skipped = []
    for spec in config.impossible:
        names = list(spec.when)
        if any(c not in columns for c in names):
            skipped.append(describe(spec))
            continue
        leaf_labels = {c: _impossible_leaves(config, columns[c], spec.when[c]) for c in names}
        try:
            combos = ImpossibleCombos.resolve(config.model_copy(update={"impossible": [spec]}),
                                              leaf_labels)
        except ConfigError as exc:  # (names config values only: they are public)
            research.not_applicable[f"impossible: {describe(spec)}"] = str(exc)
            continue
        found.append(ImpossibleCount(
            spec.reason or describe(spec), names,
            _rows_holding(combos, config, coded_out, names, None),
            _rows_holding(combos, config, coded_in, names, weights)))
    if skipped:
        research.not_applicable["impossible combinations"] = (
            "not checked (a column not released by this mechanism): " + "; ".join(skipped))
    return found


def _impossible_leaves(config: DatasetConfig, column: _Column, values: list[str]) -> list[str]:
    """The leaves ``ImpossibleCombos.resolve`` reads: the column's, plus any value the config
    names that no row holds and no taxonomy label covers (it matches no row: nothing to count,
    not an error for a domain taken from the data)."""
    leaves = [str(v) for v in column.leaves]
    if column.taxonomy is not None:
        return leaves
    extra = [v for v in values if not label_leaves(config, column.name, leaves, v).any()]
    return leaves + extra


def _rows_holding(combos: ImpossibleCombos, config: DatasetConfig, coded: CodedColumns,
                  names: list[str], weights: np.ndarray | None) -> int:
    """Rows (weighted) whose values on ``names`` form an impossible combination, tested on the
    distinct combinations of those values only."""
    rows = len(coded.frame)
    key = np.zeros(rows, dtype=np.int64)
    texts = []
    for name in names:
        codes, distinct = coded(name)
        key = key * (len(distinct) + 1) + np.where(codes == MISSING, len(distinct), codes)
        texts.append(np.append(np.asarray(distinct, dtype=object), None))
    mass = (np.ones(rows, dtype=np.int64) if weights is None
            else np.rint(weights).astype(np.int64))
    keys, sums = group_sum(key, mass)
    if not keys.size:
        return 0
    sizes = [len(t) for t in texts]
    digits = mixed_radix_digits(keys, sizes)
    distinct = pd.DataFrame({name: t[d] for name, t, d in zip(names, texts, digits,
                                                               strict=True)})
    return int(sums[combos.label_rows(config, distinct)].sum())


def _number(value: float) -> str:
    return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}"


def _more(count: int, shown: int) -> str:
    return f" and {count - shown:,} more" if count > shown else ""


def measure_accuracy(frame: pd.DataFrame, weights: np.ndarray | None, released: pd.DataFrame,
                     config: DatasetConfig, comparable: bool = True,
                     loss_reason: str = "") -> Accuracy:
    """Accuracy of ``released`` against the input rows ``frame`` (each standing for
    ``weights`` rows, default one), on the columns both carry.

    ``comparable`` is False for a release whose values cannot be read as raw values (keyed
    pseudonyms); ``loss_reason`` is the mechanism's own sentence for why rows of a value may be
    missing from the release (pooling, thresholds, suppression)."""
    if not comparable:
        return not_comparable()
    coded = (CodedColumns(frame), CodedColumns(released))
    return Accuracy.of(workload_accuracy(frame, weights, released, config),
                       informative_accuracy(frame, weights, released, config, loss_reason,
                                            coded=coded),
                       research_accuracy(frame, weights, released, config, coded=coded))
