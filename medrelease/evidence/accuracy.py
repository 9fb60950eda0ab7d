"""How good a release is, measured against its input — for the steward (EVALUATION.md,
"Accuracy evidence with every release").

Three questions a privacy officer and a biostatistician ask before a release goes out, each
answered on the release's own columns for every dataset and every mechanism:

* **workload error**: how far every 1-, 2- and 3-way marginal of the released rows is from the
  input's (mean total variation distance, one yardstick for every tool: ``workload.py``), the
  steward's declared workload, and the worst marginals by name;
* **the informative column, value by value**: input count against released count, the values
  lost (in the input, not released) and created, those shrunk by more than 10 %, and the
  column's rate by each dimension (an outcome's rate by age band) input against release;
* **one verdict line** that comes first, and a WARNING line whenever a value shrinks by more
  than 10 % or is dropped — the silent bias a default must never publish;
* **what researchers need** (``research.py``, issue 53): collapsed 1-way distributions, values
  inflated at least twofold (the informative column's here, next to lost, created and shrunk),
  erased associations and rows holding a combination the config declares impossible, each a
  WARNING line too.

Everything here reads the raw input: the result belongs to the steward record, never to the
published folder, and it is no basis for deciding whether to publish (``STEWARD_BASIS``).
Sections that do not apply (no informative column, pseudonyms that cannot be compared with raw
values) are left out with one sentence saying why.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from medrelease.data.config import DatasetConfig
from medrelease.data.taxonomy import SUPPRESSED, Taxonomy
from medrelease.errors import InputValidationError
from medrelease.evidence.text_codes import MISSING, CodedColumns, code_of
from medrelease.evidence.workload import Yardstick, marginal_name

SHRINK_WARNING = 0.10   # a value released more than this share below its input count is named
WORST_SHOWN = 10        # marginals named in the report, worst first
RATE_GROUPS_MAX = 12    # a dimension's rates are shown at its finest level with this many groups
RATE_VALUES_MAX = 12    # informative values whose rates are shown (the most frequent ones)
RATE_MIN_ROWS = 30      # groups with fewer input rows are left out of the rate table (noise)
RATE_ROWS_SHOWN = 15
INFLATE_FACTOR = 2.0    # a value released at least this many times its input count ...
INFLATE_MIN_ROWS = 5    # ... and at least this many rows more is inflated (research.py too)
# Said wherever the evaluation's verdict is shown: the evaluation reads the raw input, so a
# decision taken from it (publish, rerun until it looks right) would use the data outside the
# privacy guarantee. The publication verdict (manifest, from DP outputs only) may gate.
STEWARD_BASIS = ("steward's raw-data evaluation — it compares the release with the raw input, "
                 "so deciding from it whether to publish (or to rerun) falls outside the DP "
                 "guarantee; the publication verdict in the release's manifest is the one that "
                 "may gate publication")


@dataclass(frozen=True)
class ValueCount:
    """One informative value: rows in the input, rows released, and of those, rows released
    under an all-'*' class (pooled: the value kept, every dimension suppressed)."""

    value: str
    input: int
    released: int
    pooled: int = 0

    @property
    def change(self) -> float | None:
        """Relative change of the count (None for a value the input does not have)."""
        return (self.released - self.input) / self.input if self.input else None

    @property
    def lost(self) -> bool:
        return self.input > 0 and self.released == 0

    @property
    def created(self) -> bool:
        return self.input == 0 and self.released > 0

    @property
    def shrunk(self) -> bool:
        """Released, but more than ``SHRINK_WARNING`` below the input's count."""
        return self.input > 0 and 0 < self.released < (1 - SHRINK_WARNING) * self.input

    @property
    def inflated(self) -> bool:
        """Released at least ``INFLATE_FACTOR`` times the input's count and at least
        ``INFLATE_MIN_ROWS`` rows more: a rare value a researcher would take for a common one
        (a value the input lacks is ``created`` instead). ``InformativeAccuracy.inflated`` also
        asks for twice its share of the rows (a release of three times the input's rows does
        not inflate every value)."""
        return (self.input > 0 and self.released >= INFLATE_FACTOR * self.input
                and self.released - self.input >= INFLATE_MIN_ROWS)

    @property
    def factor(self) -> float | None:
        """Released count over input count (None for a value the input does not have)."""
        return self.released / self.input if self.input else None

    def in_words(self) -> str:
        """'5: 1,200 in the input, 900 released (-25 %)'."""
        change = "" if self.change is None else f" ({100 * self.change:+.0f} %)"
        pooled = f", {self.pooled:,} of them pooled under '*'" if self.pooled else ""
        return (f"{self.value}: {self.input:,} in the input, {self.released:,} released"
                f"{change}{pooled}")


@dataclass(frozen=True)
class RateRow:
    """The informative value's share among one group of a dimension, input against release."""

    dimension: str
    group: str
    value: str
    input_rate: float
    released_rate: float
    group_rows: int  # input rows of the group

    @property
    def difference(self) -> float:
        return self.released_rate - self.input_rate


@dataclass
class InformativeAccuracy:
    """The informative (or class) column value by value, and its rate by each dimension."""

    column: str
    values: list[ValueCount]
    rates: list[RateRow] = field(default_factory=list)
    rate_levels: dict[str, str] = field(default_factory=dict)
    loss_reason: str = ""   # what removes rows of a value in this mechanism, in plain words
    rates_note: str = ""
    # Values from a declared public domain may be named in Prefect's logs; values taken from
    # the data are raw values, named only in the steward's report and artifacts.
    public_values: bool = False

    @property
    def lost(self) -> list[ValueCount]:
        return [v for v in self.values if v.lost]

    @property
    def created(self) -> list[ValueCount]:
        return [v for v in self.values if v.created]

    @property
    def shrunk(self) -> list[ValueCount]:
        """Released more than 10 % below the input's count, most rows lost first."""
        return sorted((v for v in self.values if v.shrunk), key=lambda v: v.released - v.input)

    @property
    def inflated(self) -> list[ValueCount]:
        """Released at least twice the input's count (and 5 rows more) and at least twice its
        share of the rows (``histogram``'s noise rows triple a table without inflating any
        value in particular), largest factor first."""
        total_in = sum(v.input for v in self.values)
        total_out = sum(v.released for v in self.values)
        return sorted((v for v in self.values if v.inflated
                       and v.released * total_in >= INFLATE_FACTOR * v.input * total_out),
                      key=lambda v: (-(v.factor or 0.0), v.input - v.released))

    def inflated_warning(self, named: bool = True) -> str | None:
        """One WARNING line naming the inflated values with their factor (3 -> 38, ×12.7);
        ``named=False``: their number only (for logs, values not from a public domain)."""
        inflated = self.inflated
        if not inflated:
            return None
        head = (f"WARNING: {self.column}: {len(inflated):,} value(s) released at least "
                f"{INFLATE_FACTOR:g}x their input count and share of the rows (and at least "
                f"{INFLATE_MIN_ROWS} rows more)")
        if not named:
            return head + " (named in the evidence report)"
        listed = ", ".join(f"{v.value} ({v.input:,} -> {v.released:,}, ×{v.factor or 0:.3g})"
                           for v in inflated[:3])
        return f"{head}: {listed}{_more(len(inflated), 3)}"

    def warning(self, named: bool = True) -> str | None:
        """One WARNING line naming the values dropped or shrunk by more than 10 %, with the size
        of the change; None when every value kept at least 90 % of its rows. ``named=False``:
        counts only, no value (for logs, when the values are not a declared public domain)."""
        lost, shrunk = self.lost, self.shrunk
        if not lost and not shrunk:
            return None
        if not named:
            return (f"WARNING: {self.column}: {len(lost):,} value(s) not released and "
                    f"{len(shrunk):,} released more than {100 * SHRINK_WARNING:.0f} % below "
                    "their input count (named in the evidence report)")
        parts = []
        if lost:
            named = ", ".join(f"{v.value} ({v.input:,} input rows)"
                              for v in sorted(lost, key=lambda v: -v.input)[:3])
            parts.append(f"{len(lost):,} value(s) not released: {named}{_more(len(lost), 3)}")
        if shrunk:
            named = ", ".join(f"{v.value} ({v.input:,} -> {v.released:,}, "
                              f"{100 * (v.change or 0):+.0f} %)" for v in shrunk[:3])
            parts.append(f"{len(shrunk):,} value(s) released more than "
                         f"{100 * SHRINK_WARNING:.0f} % below their input count: {named}"
                         f"{_more(len(shrunk), 3)}")
        of = f" (of {sum(1 for v in self.values if v.input):,} values in the input)"
        reason = f"; {self.loss_reason}" if self.loss_reason else ""
        return f"WARNING: {self.column}{of}: " + "; ".join(parts) + reason

    def loss_lines(self, limit: int = 10) -> list[str]:
        """Plain words for mechanisms that drop or pool rows (``loss_reason``): why, once; then
        the values that lost more than 1 % of their rows, most rows first; then the total."""
        if not self.loss_reason:
            return []
        hit = sorted((v for v in self.values if v.input and v.released < 0.99 * v.input),
                     key=lambda v: v.released - v.input)
        lines = [f"Why rows of a value can be missing: {self.loss_reason}."]
        lines += [f"{self.column} {v.in_words()}" for v in hit[:limit]]
        if len(hit) > limit:
            lines.append(f"... and {len(hit) - limit:,} more {self.column} values with fewer "
                         "rows released than in the input")
        total_in = sum(v.input for v in self.values)
        total_out = sum(v.released for v in self.values)
        pooled = sum(v.pooled for v in self.values)
        lines.append(f"all {self.column} values: {total_in:,} rows in the input, {total_out:,} "
                     f"released ({_percent(total_out, total_in)}), {pooled:,} of them pooled "
                     f"under '*'")
        return lines

    def as_json(self) -> dict[str, Any]:
        return {
            "column": self.column,
            # (asdict, field by field: 0.3 s for 2,500 values)
            "values": [{"value": v.value, "input": v.input, "released": v.released,
                        "pooled": v.pooled, "change": v.change} for v in self.values],
            "lost": [v.value for v in self.lost],
            "created": [v.value for v in self.created],
            "shrunk": [{"value": v.value, "input": v.input, "released": v.released,
                        "change": v.change} for v in self.shrunk],
            "inflated": [{"value": v.value, "input": v.input, "released": v.released,
                          "factor": v.factor} for v in self.inflated],
            "rates": [{**asdict(r), "difference": r.difference} for r in self.rates],
            "rate_levels": self.rate_levels,
            "rates_note": self.rates_note,
            "loss_reason": self.loss_reason,
            "suppression": self.loss_lines(),
        }


@dataclass
class WorkloadAccuracy:
    """Mean TVD per marginal size over the released columns, every marginal, the worst."""

    columns: list[str]
    marginals: dict[str, float]
    sizes: dict[str, int]
    declared: dict[str, float] | None = None
    left_out: dict[str, str] = field(default_factory=dict)

    def mean(self, way: int) -> float | None:
        values = [tvd for name, tvd in self.marginals.items() if self.sizes[name] == way]
        return float(np.mean(values)) if values else None

    def worst_of(self, way: int) -> tuple[str, float]:
        """The marginal of ``way`` columns furthest from the input's."""
        return max(((n, t) for n, t in self.marginals.items() if self.sizes[n] == way),
                   key=lambda item: item[1])

    @property
    def worst(self) -> list[tuple[str, float]]:
        ranked = sorted(self.marginals.items(), key=lambda item: -item[1])
        return ranked[:WORST_SHOWN]

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {f"mean_{way}way": self.mean(way) for way in (1, 2, 3)}
        out.update(columns=self.columns,
                   worst=[{"marginal": name, "tvd": tvd} for name, tvd in self.worst],
                   marginals=self.marginals, left_out=self.left_out,
                   yardstick="total variation distance on the input's raw values; a "
                             "generalized label spreads its rows uniformly over the raw "
                             "values it covers, '*' over the whole domain; 0 = the input's "
                             "distribution exactly, 1 = nothing in common")
        if self.declared is not None:
            out["declared"] = {"mean": float(np.mean(list(self.declared.values())))
                               if self.declared else None, "marginals": self.declared}
        return out


@dataclass
class Accuracy:
    """A release's accuracy against its input: the workload error, the informative column, and
    what does not apply (with why). Its verdict and warnings come first wherever it is shown;
    the ``log_`` variants name values only from a declared public domain."""

    workload: WorkloadAccuracy | None
    informative: InformativeAccuracy | None
    not_applicable: dict[str, str] = field(default_factory=dict)
    # research.ResearchAccuracy (research.py builds on this module: named, not imported)
    research: Any = None

    @classmethod
    def of(cls, workload: tuple[WorkloadAccuracy | None, dict[str, str]],
           informative: tuple[InformativeAccuracy | None, dict[str, str]],
           research: tuple[Any, dict[str, str]] = (None, {})) -> Accuracy:
        """The halves (``workload_accuracy``, ``informative_accuracy``) and what researchers
        need (``research.research_accuracy``) as one accuracy; what does not apply in the
        order they say it."""
        return cls(workload[0], informative[0], {**workload[1], **informative[1], **research[1]},
                   research[0])

    @property
    def verdict(self) -> str:
        """'2-way error 0.012 (mean TVD: 0 = the input's distributions, 1 = nothing in
        common); worst 2-way: age × outcome 0.055; outcome values 5, 6 not released'."""
        return self.verdict_text(named=True)

    @property
    def names_may_be_logged(self) -> bool:
        return self.informative is None or self.informative.public_values

    def verdict_text(self, named: bool) -> str:
        """The verdict; ``named=False`` counts lost values instead of naming them. Findings
        for researchers (collapsed, inflated, erased, impossible) are counted at its end."""
        return "; ".join([self._workload_words(), *self._informative_words(named),
                          *self._research_words()])

    def _research_words(self) -> list[str]:
        inflated = len(self.informative.inflated) if self.informative is not None else 0
        if self.research is not None:
            return self.research.verdict_words(inflated)
        return ([f"for researchers: {inflated:,} value(s) inflated {INFLATE_FACTOR:g}x or more"]
                if inflated else [])

    def _workload_words(self) -> str:
        if self.workload is None or not self.workload.marginals:
            return "workload error not measured: " + self.not_applicable.get(
                "workload", "no released column can be compared with the input")
        main = next((w for w in (2, 1) if self.workload.mean(w) is not None), 1)
        name, tvd = self.workload.worst_of(main)
        return (f"{main}-way error {self.workload.mean(main):.3f} (mean TVD: 0 = the input's "
                f"distributions, 1 = nothing in common); worst {main}-way: {name} {tvd:.3f}")

    def _informative_words(self, named: bool) -> list[str]:
        info = self.informative
        if info is None:
            return []
        if not named and (info.lost or info.shrunk):
            return [f"{len(info.lost):,} {info.column} value(s) not released, "
                    f"{len(info.shrunk):,} shrunk by more than {100 * SHRINK_WARNING:.0f} %"]
        if info.lost:
            names = ", ".join(v.value for v in sorted(info.lost, key=lambda v: -v.input)[:5])
            return [f"{info.column} value{'s' if len(info.lost) > 1 else ''} {names}"
                    f"{_more(len(info.lost), 5)} not released"]
        if info.shrunk:
            v = info.shrunk[0]
            return [f"{info.column} value {v.value}: {v.input:,} -> {v.released:,} "
                    f"({100 * (v.change or 0):+.0f} %)"]
        if info.inflated:  # (inflated values are counted in the research clause)
            return [f"no {info.column} value lost or shrunk by more than "
                    f"{100 * SHRINK_WARNING:.0f} %"]
        return [f"every {info.column} value kept within {100 * SHRINK_WARNING:.0f} % of its "
                "input count"]

    @property
    def warnings(self) -> list[str]:
        return self.warning_lines(named=True)

    def warning_lines(self, named: bool) -> list[str]:
        """The WARNING lines: the informative column's lost or shrunk values first, then its
        inflated ones, then the findings for researchers. ``named=False`` (logs): informative
        values named only from a public domain (``names_may_be_logged``), never a dimension's
        value nor an input count of the research findings."""
        lines: list[str | None] = []
        if self.informative is not None:
            public = named or self.informative.public_values
            lines += [self.informative.warning(public), self.informative.inflated_warning(public)]
        if self.research is not None:
            lines += self.research.warnings(named)
        return [line for line in lines if line]

    def as_json(self) -> dict[str, Any]:
        named = self.names_may_be_logged
        return {"verdict": self.verdict, "warnings": self.warnings,
                # for Prefect's log (its database): value names only from a public domain
                "log_verdict": self.verdict_text(named),
                "log_warnings": self.warning_lines(named=False),
                "workload": self.workload.as_json() if self.workload is not None else None,
                "informative": (self.informative.as_json() if self.informative is not None
                                else None),
                "not_applicable": self.not_applicable,
                # what researchers need (issue 53), and what the verdict is not a basis for
                "research": self.research.as_json() if self.research is not None else None,
                "basis": STEWARD_BASIS}


# -- measuring ---------------------------------------------------------------------------------

def not_comparable() -> Accuracy:
    """The accuracy of a release whose values are keyed pseudonyms: nothing to compare."""
    reason = ("every released value is a keyed pseudonym: it cannot be compared with the "
              "input's values (see the frequency-matching attack for what it keeps)")
    return Accuracy(None, None, {"workload": reason, "informative": reason, "research": reason})


def workload_accuracy(frame: pd.DataFrame, weights: np.ndarray | None, released: pd.DataFrame,
                      config: DatasetConfig) -> tuple[WorkloadAccuracy | None, dict[str, str]]:
    """The workload half of ``measure_accuracy`` (every 1- to 3-way marginal's TVD), with why
    it does not apply when it does not. A half of its own: the evaluation runs it on a second
    thread beside the informative half and its other sections (they share no state)."""
    not_applicable: dict[str, str] = {}
    return _workload(frame, weights, released, config, not_applicable), not_applicable


def informative_accuracy(frame: pd.DataFrame, weights: np.ndarray | None,
                         released: pd.DataFrame, config: DatasetConfig, loss_reason: str = "",
                         coded: tuple[CodedColumns, CodedColumns] | None = None
                         ) -> tuple[InformativeAccuracy | None, dict[str, str]]:
    """The informative half of ``measure_accuracy`` (the column's values, counts and rates),
    with why it does not apply when it does not. ``coded``: the input's and the release's
    columns as codes, shared with ``research_accuracy`` (each column coded once)."""
    not_applicable: dict[str, str] = {}
    return (_informative(frame, weights, released, config, loss_reason, not_applicable, coded),
            not_applicable)


def _released_columns(released: pd.DataFrame, config: DatasetConfig) -> list[str]:
    """The released columns the yardstick can read, in the config's order."""
    roles = config.dimensions + config.informative + config.class_columns
    return [c for c in roles if c in released.columns]


def _taxonomies(config: DatasetConfig, columns: list[str]) -> dict[str, Taxonomy | None]:
    """Dimensions by their taxonomy; informative and class columns by their values (a released
    informative value is raw in every mechanism here)."""
    return {c: config.taxonomies[c] if c in config.dimensions else None for c in columns}


def _domains(config: DatasetConfig) -> dict[str, list[str]]:
    domains: dict[str, list[str]] = {}
    if config.informative and config.informative_domain is not None:
        domains[config.informative[0]] = list(config.informative_domain)
    if config.class_columns and config.class_domain:
        domains[config.class_columns[0]] = list(config.class_domain)
    return domains


def _workload(frame: pd.DataFrame, weights: np.ndarray | None, released: pd.DataFrame,
              config: DatasetConfig, not_applicable: dict[str, str]) -> WorkloadAccuracy | None:
    columns = _released_columns(released, config)
    left_out = {c: "a set-valued column (an item set per row): its marginals are not defined "
                   "on single values" for c in config.set_valued if c in released.columns}
    if not columns:
        not_applicable["workload"] = "the release carries no column the yardstick can compare"
        return None
    yardstick = Yardstick.from_rows(frame[columns], released[columns], _taxonomies(config, columns),
                                    weights=weights, domains=_domains(config))
    marginals: dict[str, float] = {}
    sizes: dict[str, int] = {}
    for combo, tvd in yardstick.marginals(max_way=3).items():
        name = marginal_name(combo)
        marginals[name], sizes[name] = float(tvd), len(combo)
    declared = None
    if config.workload:
        declared = {}
        for entry in config.workload:
            combo = tuple(entry.columns)
            if set(combo) <= set(columns):
                declared[marginal_name(combo)] = float(yardstick.tvd(combo))
    return WorkloadAccuracy(columns, marginals, sizes, declared, left_out)


def _informative_column(released: pd.DataFrame, config: DatasetConfig) -> str | None:
    for column in config.informative + config.class_columns:
        if column in released.columns:
            return column
    return None


def _value_counts(coded: CodedColumns, column: str, weights: np.ndarray | None,
                 rows: np.ndarray | None = None) -> pd.Series:
    """Rows per value of ``column`` as text (a missing value left out), over ``rows`` (a mask)
    when given: counted on the column's codes."""
    codes, texts = coded(column)
    keep = codes != MISSING if rows is None else (codes != MISSING) & rows
    kept = codes[keep]
    w = None if weights is None else np.asarray(weights, dtype=np.float64)[keep]
    sums = np.bincount(kept, weights=w, minlength=len(texts))
    # every text occurs in the column; under a mask, only those of its rows
    present = (np.bincount(kept, minlength=len(texts)) > 0 if rows is not None
               else np.ones(len(texts), dtype=bool))
    return pd.Series(np.rint(sums[present]).astype(np.int64), index=texts[present])


def _informative(frame: pd.DataFrame, weights: np.ndarray | None, released: pd.DataFrame,
                 config: DatasetConfig, loss_reason: str,
                 not_applicable: dict[str, str],
                 coded: tuple[CodedColumns, CodedColumns] | None = None
                 ) -> InformativeAccuracy | None:
    column = _informative_column(released, config)
    if column is None or column not in frame.columns:
        not_applicable["informative"] = ("the dataset declares no informative or class column "
                                         "that the release carries")
        return None
    coded_in, coded_out = coded or (CodedColumns(frame), CodedColumns(released))
    before = _value_counts(coded_in, column, weights)
    after = _value_counts(coded_out, column, None)
    dims = [d for d in config.dimensions if d in released.columns]
    pooled = (_value_counts(coded_out, column, None, _all_suppressed(coded_out, dims))
              if dims else pd.Series(dtype=np.int64))
    # as dicts: 2,500 values looked up three times each in a Series took 0.5 s
    before, after, pooled = (dict(zip(s.index, s.to_numpy().tolist(), strict=True))
                             for s in (before, after, pooled))
    values = sorted(set(before) | set(after),
                    key=lambda v: (-before.get(v, 0), -after.get(v, 0), v))
    counts = [ValueCount(v, int(before.get(v, 0)), int(after.get(v, 0)), int(pooled.get(v, 0)))
              for v in values]
    public = (config.informative_domain is not None if column in config.informative
              else bool(config.class_domain))
    info = InformativeAccuracy(column, counts, loss_reason=loss_reason, public_values=public)
    _rates(info, coded_in, weights, coded_out, config, dims)
    return info


def _all_suppressed(coded: CodedColumns, dims: list[str]) -> np.ndarray:
    """Rows whose every dimension in ``dims`` reads '*'."""
    out = np.ones(len(coded.frame), dtype=bool)
    for dim in dims:
        codes, texts = coded(dim)
        suppressed = code_of(texts, [SUPPRESSED])[0]
        if suppressed == MISSING:  # no row of this dimension reads '*'
            return np.zeros(len(coded.frame), dtype=bool)
        out &= codes == suppressed
    return out


def rate_level(taxonomy: Taxonomy) -> int:
    """The finest level with at most ``RATE_GROUPS_MAX`` groups (age bands, not single ages),
    below '*'; the coarsest level below '*' when every level is larger."""
    below_top = range(max(taxonomy.height, 1))
    for level in below_top:
        if taxonomy.cardinality(level) <= RATE_GROUPS_MAX:
            return level
    return max(below_top)


def _rates(info: InformativeAccuracy, coded_in: CodedColumns, weights: np.ndarray | None,
           coded_out: CodedColumns, config: DatasetConfig, dims: list[str]) -> None:
    """The informative value's share in each group of each dimension, input against release.

    A released label finer than the group maps into it; a coarser one (a band across groups,
    '*') spreads its rows over the groups by the raw values it covers, as the workload
    yardstick does."""
    shown = [v.value for v in info.values if v.input][:RATE_VALUES_MAX]
    if not shown or not dims:
        info.rates_note = "no dimension is released: rates by dimension do not apply"
        return
    rows: list[RateRow] = []
    w = (np.ones(len(coded_in.frame)) if weights is None
         else np.asarray(weights, dtype=np.float64))
    inf_in = _shown_index(*coded_in(info.column), shown)
    inf_out = _shown_index(*coded_out(info.column), shown)
    for dim in dims:
        taxonomy = config.taxonomies[dim]
        level = rate_level(taxonomy)
        groups = taxonomy.level_labels[level]
        info.rate_levels[dim] = (f"level {level} ({len(groups)} groups)" if level
                                 else f"raw values ({len(groups)})")
        group_in = taxonomy.level_codes[level][_leaf_codes(coded_in, dim, taxonomy)]
        joint_in = _joint(group_in, inf_in, w, len(groups), len(shown))
        labels, label_texts = coded_out(dim)
        spread = _label_spread(label_texts, taxonomy, level)
        joint_out = _spread_joint(labels, inf_out, spread, len(groups), len(shown))
        rows_in = np.bincount(group_in, weights=w, minlength=len(groups))
        rows_out = _spread_rows(labels, spread, len(groups))
        for g, label in enumerate(groups):
            if rows_in[g] < RATE_MIN_ROWS:
                continue
            for j, value in enumerate(shown):
                rate_out = joint_out[g, j] / rows_out[g] if rows_out[g] > 0 else float("nan")
                rows.append(RateRow(dim, str(label), value, float(joint_in[g, j] / rows_in[g]),
                                    float(rate_out), int(rows_in[g])))
    rows.sort(key=lambda r: -abs(r.difference) if math.isfinite(r.difference) else -2.0)
    info.rates = rows[:RATE_ROWS_SHOWN]
    info.rates_note = (f"shares of the {len(shown)} most frequent {info.column} value(s) in "
                       f"each group with at least {RATE_MIN_ROWS} input rows; largest "
                       "differences first (a group the release has no row for shows no rate)")


def _shown_index(codes: np.ndarray, texts: np.ndarray, shown: list[str]) -> np.ndarray:
    """Per row: the position of its value in ``shown``, -1 for any other value or none."""
    position = np.full(len(texts) + 1, -1, dtype=np.int64)  # last entry: a missing value
    for j, code in enumerate(code_of(texts, shown)):
        if code != MISSING:
            position[code] = j
    return position[codes]


def _leaf_codes(coded: CodedColumns, column: str, taxonomy: Taxonomy) -> np.ndarray:
    """The input's leaf codes of ``column``: its distinct texts encoded once. A missing or
    uncovered value (the input passed validation, so none) raises as ``Taxonomy.encode`` does,
    naming the rows."""
    codes, texts = coded(column)
    if (codes == MISSING).any():
        return taxonomy.encode(coded.frame[column].astype(str))
    try:
        leaves = taxonomy.encode(pd.Series(texts, dtype=object))
    except InputValidationError:
        # an input read from the count table holds leaves by their labels (a decimal's bin
        # "[9.5-9.55)", not its raw values): those are their own codes
        position = {str(label): i for i, label in enumerate(taxonomy.level_labels[0])}
        if all(str(t) in position for t in texts):
            return np.array([position[str(t)] for t in texts], dtype=np.int64)[codes]
        return taxonomy.encode(coded.frame[column].astype(str))
    return leaves[codes]


def _joint(groups: np.ndarray, shown_index: np.ndarray, weights: np.ndarray, n_groups: int,
           n_shown: int) -> np.ndarray:
    """Input rows per (group, shown value): one weighted count, each cell summed in row order
    (as one count per value would)."""
    hit = shown_index >= 0
    flat = np.bincount(groups[hit] * n_shown + shown_index[hit], weights=weights[hit],
                       minlength=n_groups * n_shown)
    return flat.reshape(n_groups, n_shown)


def _label_spread(labels: np.ndarray, taxonomy: Taxonomy, level: int) -> np.ndarray:
    """Per distinct released label (its code): the share of its raw values in each group at
    ``level`` (all zero for a label the taxonomy does not know: outside the input's domain)."""
    codes = taxonomy.level_codes[level]
    n_groups = taxonomy.cardinality(level)
    out = np.zeros((len(labels), n_groups))
    for i, label in enumerate(labels):
        mask = taxonomy.leaf_mask(str(label))
        covered = int(mask.sum())
        if covered:
            out[i] = np.bincount(codes[mask], minlength=n_groups) / covered
    return out


def _spread_joint(labels: np.ndarray, shown_index: np.ndarray, spread: np.ndarray,
                  n_groups: int, n_shown: int) -> np.ndarray:
    """Released rows per (group, shown value), each label's rows spread by ``spread``; the
    (label, value) pairs added in the order the rows first show them, so every sum is the one
    a row-by-row grouping gives, to the last bit."""
    hit = (shown_index >= 0) & (labels != MISSING)
    pair, pairs = pd.factorize(labels[hit] * n_shown + shown_index[hit])  # first-seen order
    rows = np.bincount(pair, minlength=len(pairs))
    out = np.zeros((n_groups, n_shown))
    for key, n in zip(pairs, rows, strict=True):
        label, j = divmod(int(key), n_shown)
        out[:, j] += int(n) * spread[label]
    return out


def _spread_rows(labels: np.ndarray, spread: np.ndarray, n_groups: int) -> np.ndarray:
    """Released rows per group, each label's rows spread by ``spread`` (labels in the order the
    rows first show them)."""
    out = np.zeros(n_groups)
    label, distinct = pd.factorize(labels[labels != MISSING])
    for code, n in zip(distinct, np.bincount(label, minlength=len(distinct)), strict=True):
        out += int(n) * spread[code]
    return out


def _more(count: int, shown: int) -> str:
    return f" and {count - shown:,} more" if count > shown else ""


def _percent(part: int, whole: int) -> str:
    return f"{100 * (part - whole) / whole:+.1f} %" if whole else "-"


# -- the steward's summary, as Markdown (Prefect artifact) -------------------------------------

def accuracy_markdown(accuracy: dict[str, Any], release_id: str, values_shown: int = 15) -> str:
    """The accuracy section as a steward reads it in Prefect's UI: verdict (and what it is no
    basis for), warnings, the mean errors, the worst marginals, the informative column's
    largest changes and what researchers need."""
    lines = [f"# Accuracy of {release_id} (steward only: compares with the input)", "",
             f"**{accuracy['verdict']}**", "", f"_Not a basis for publishing: {STEWARD_BASIS}._",
             ""]
    lines += [f"- **{w}**" for w in accuracy.get("warnings", [])]
    workload = accuracy.get("workload")
    if workload:
        means = ", ".join(f"{way}-way {workload[f'mean_{way}way']:.3f}" for way in (1, 2, 3)
                          if workload.get(f"mean_{way}way") is not None)
        lines += ["", f"Workload error (mean TVD, 0 = same as the input): {means}"]
        if workload.get("declared"):
            lines.append(f"Declared workload: mean TVD {workload['declared']['mean']:.3f}")
        lines += ["", "| worst marginals | TVD |", "|---|---|"]
        lines += [f"| {w['marginal']} | {w['tvd']:.3f} |" for w in workload["worst"]]
    info = accuracy.get("informative")
    if info:
        changed = sorted(info["values"], key=lambda v: -abs(v["released"] - v["input"]))
        lines += ["", f"`{info['column']}` values with the largest changes:", "",
                  "| value | input | released | change |", "|---|---|---|---|"]
        for v in changed[:values_shown]:
            change = "new" if v["change"] is None else f"{100 * v['change']:+.1f} %"
            lines.append(f"| {v['value']} | {v['input']:,} | {v['released']:,} | {change} |")
        lines += [f"- {line}" for line in info.get("suppression", [])]
    lines += research_markdown(accuracy.get("research"), info)
    for section, reason in accuracy.get("not_applicable", {}).items():
        lines.append(f"- {section}: not measured — {reason}")
    return "\n".join(lines)


def research_markdown(research: dict[str, Any] | None, info: dict[str, Any] | None = None
                      ) -> list[str]:
    """What researchers need (``research.py``) as Markdown lines: each column's 1-way distance
    and means, inflated values, associations input against release, impossible rows."""
    if not research:
        return []
    lines = ["", "## What researchers need (steward only)", ""]
    distributions = research["distributions"]
    lines += [f"1-way distributions: {distributions['rule']}.", "",
              "| column | TVD | input mean | released mean | generalized rows | |",
              "|---|---|---|---|---|---|"]
    for d in distributions["columns"]:
        lines.append(f"| {d['column']} | {d['tvd']:.3f} | {_maybe(d['input_mean'])} | "
                     f"{_maybe(d['released_mean'])} | {100 * d['generalized_share']:.0f} % | "
                     f"{'**collapsed**' if d['collapsed'] else ''} |")
    inflated = [(info["column"], v) for v in (info or {}).get("inflated", [])]
    inflated += [(column, v) for column, values in research["inflated"]["values"].items()
                 for v in values]
    lines += ["", f"Inflated values: {len(inflated):,} listed — "
                  f"{research['inflated']['rule']}.", ""]
    if inflated:
        lines += ["| column | value | input | released | factor |", "|---|---|---|---|---|"]
        lines += [f"| {column} | {v['value']} | {v['input']:,} | {v['released']:,} | "
                  f"{_factor(v['factor'])} |" for column, v in inflated]
    associations = research["associations"]
    lines += ["", f"Associations: {associations['rule']}.", "",
              "| association | value | input rates (high, low group) | released rates | "
              "spread input / released | largest difference | TVD | finding |",
              "|---|---|---|---|---|---|---|---|"]
    for a in associations["items"]:
        if a["input_rates"] is None:
            lines.append(f"| {a['name']} | | | | | | {_maybe(a['tvd'])} | {a['note']} |")
            continue
        finding = ("**erased**" if a["erased"] else "**reversed**" if a["reversed"]
                   else "kept" if a["shows_association"] else "no association in the input")
        lines.append(
            f"| {a['name']} | {a['value']} | {a['input_rates'][0]:.3f} ({a['input_groups'][0]}), "
            f"{a['input_rates'][1]:.3f} ({a['input_groups'][1]}) | "
            f"{a['released_rates'][0]:.3f}, {a['released_rates'][1]:.3f} | "
            f"{a['input_spread']:.3f} / {a['released_spread']:.3f} | "
            f"{a['largest_difference']:.3f} | {_maybe(a['tvd'])} | {finding} |")
    impossible = research.get("impossible")
    if impossible:
        lines += ["", f"Impossible combinations: {impossible['released_rows']:,} released "
                      f"row(s), {impossible['input_rows']:,} input row(s) — "
                      f"{impossible['rule']}.", "",
                  "| combination | released rows | input rows |", "|---|---|---|"]
        lines += [f"| {c['reason']} | {c['released_rows']:,} | {c['input_rows']:,} |"
                  for c in impossible["combinations"]]
    for section, reason in research.get("not_applicable", {}).items():
        lines.append(f"- {section}: {reason}")
    return lines


def _factor(factor: float | None) -> str:
    """'×12.7'; 'new' for a value the input does not have."""
    return "new" if factor is None else f"×{factor:.3g}"


def _maybe(value: float | None) -> str:
    """A number to three decimals, '-' when it was not computable."""
    return "-" if value is None or value != value else f"{value:.3f}"
