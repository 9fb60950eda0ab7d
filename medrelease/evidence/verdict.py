"""The publication verdict: how fit a release is for the analyses it was made for, judged from
what is published and nothing else.

Why it exists. A review that decides publication from the steward's accuracy report (which
compares the release with the raw input) selects among noisy runs with the true data: a
rejection followed by a rerun pays the budget of every run, but the choice of which run gets
published is a function of the input that no budget step covers. One histogram cell at
eps 1, a steward who rejects "when a value shrank by more than 10 %" and up to 3 tries: a
published 5 has probability 0.62 when the true count is 5 and 0 when it is 6 — an unbounded
privacy loss (docs/PRIVACY.md, "What the review may look at").

The verdict is therefore a pure function of

* the public manifest's fields (mechanism, chosen node, mechanism details, error bars, released
  columns, parameters): public parameters and outputs of the mechanism's private steps;
* the released rows, as published;
* public config facts: the declared analyses, the declared domains, the taxonomies and the
  declared impossible combinations (written by the steward, never read from the data).

It never sees the input. Acting on it — publishing, rejecting, running again — is
post-processing of the release and its DP outputs, so the guarantee still holds whatever the
reviewer decides (the budget of every run stays counted).

Levels: ``fit``; ``use with care`` (with reasons); ``not fit`` (for named analyses, or because a
released row holds a declared impossible combination). Each rule's threshold is a constant
below, documented where it is defined; docs/PRIVACY.md lists them as a table. The engine never
imports Prefect, and neither does this module: the flow, the review form, the CLI and the
portal read the verdict from the manifest.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from medrelease.data.aggregate import value_counts_by
from medrelease.data.binning import NUMERIC_TYPES, canonical_number
from medrelease.data.config import AnalysisSpec, DatasetConfig
from medrelease.data.constraints import ImpossibleCombos
from medrelease.data.taxonomy import SUPPRESSED, Taxonomy
from medrelease.errors import MedreleaseError
from medrelease.storage.released_rows import ROWS, ReleasedRows

# -- levels --------------------------------------------------------------------------------
FIT = "fit"
CARE = "use with care"
NOT_FIT = "not fit"
LEVELS = (FIT, CARE, NOT_FIT)  # from best to worst

# -- thresholds (docs/PRIVACY.md, "What the review may look at", lists them) ----------------
# A declared domain (the informative column's domain file, the class column's ``values:``)
# with more than this share of its values absent from the released rows: "use with care".
# A default ipa release of the NPS sample dropped 1,884 of 1,969 diagnosis codes; a researcher
# must not read such a table as covering the domain.
DOMAIN_ABSENT_CARE = 0.10
# ... and above this share, every declared analysis naming that column is "not fit": most of
# its cells can only read zero.
DOMAIN_ABSENT_NOT_FIT = 0.50
# Row mechanisms: an analysis column kept at the chosen node whose label is still coarser than
# the declared level in more than this share of the released rows (ipa's ladder rungs and
# pooled (*, ..., *, v) rows, k-anonymity's suppressed rows, Mondrian's wide groups): "use
# with care" — that share of the rows cannot be placed in the analysis's cells.
COARSER_ROWS_CARE = 0.10
# aim, per declared analysis: the mass-weighted median over its cells of the 95 % interval's
# half-width relative to the released count (max(released, 1)). Above 0.2 a typical cell is
# known only to within +-20 %: "use with care"; above 0.5 it is not readable: "not fit".
INTERVAL_CARE = 0.2
INTERVAL_NOT_FIT = 0.5
# aim, per declared analysis: more than this share of its released rows in cells whose released
# count lies outside the 95 % interval of the true count (the sampled rows drifted from the
# measurement): "use with care". At 95 % per cell about 5 % would by chance.
DRIFT_CARE = 0.10
# aim, per declared analysis: the total variation distance its measurement's noise alone is
# expected to put between the measured and the true table, sqrt(2/pi) sigma cells / (2 R) (R
# its released rows). A large sparse table (440 cells, most below 10 rows, sigma 27: 0.24)
# can read "fit" by the mass-weighted rule above while its small cells are mostly noise:
# above 0.1 "use with care", above 0.25 "not fit".
NOISE_TVD_CARE = 0.10
NOISE_TVD_NOT_FIT = 0.25
# aim, per released column: the released rows' 1-way distribution further than this (TVD)
# from the column's noisy 1-way measurement: "use with care".
MOVED_TVD_CARE = 0.05

THRESHOLDS: dict[str, float] = {
    "domain_absent_care": DOMAIN_ABSENT_CARE,
    "domain_absent_not_fit": DOMAIN_ABSENT_NOT_FIT,
    "coarser_rows_care": COARSER_ROWS_CARE,
    "interval_care": INTERVAL_CARE,
    "interval_not_fit": INTERVAL_NOT_FIT,
    "drift_care": DRIFT_CARE,
    "noise_tvd_care": NOISE_TVD_CARE,
    "noise_tvd_not_fit": NOISE_TVD_NOT_FIT,
    "moved_tvd_care": MOVED_TVD_CARE,
}

BASIS = ("computed from the released rows, the mechanism's published outputs (chosen node, "
         "details, error bars) and public parameters and config facts (declared analyses, "
         "domains, taxonomies, impossible combinations), never from the input: acting on it "
         "is post-processing")
# The headline names at most this many "use with care" reasons (the rest: "and N more").
HEADLINE_REASONS = 3


@dataclass(frozen=True)
class ColumnService:
    """How a release serves one column of a declared analysis."""

    column: str
    declared_level: int
    released_level: int | None  # None: not released, or no taxonomy level applies
    how: str  # kept | coarser | generalized away | not released | synthetic | pseudonyms
    #          | other labels

    def as_dict(self) -> dict[str, Any]:
        return {"column": self.column, "declared_level": self.declared_level,
                "released_level": self.released_level, "how": self.how}


@dataclass(frozen=True)
class AnalysisVerdict:
    """One declared analysis: fit, use with care or not fit, and why."""

    name: str
    columns: tuple[str, ...]
    levels: tuple[int, ...]
    status: str
    why: str
    short: str = ""  # the why in a few words, for the headline
    served: tuple[ColumnService, ...] = ()
    figures: Mapping[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "columns": list(self.columns), "levels": list(self.levels),
                "status": self.status, "why": self.why, "short": self.short,
                "served": [s.as_dict() for s in self.served], "figures": dict(self.figures)}

    def line(self) -> str:
        """``rx × status: use with care — status generalized to level 1, declared 0``."""
        return f"{self.name}: {self.status} — {self.why}"


@dataclass(frozen=True)
class PublicationVerdict:
    """The verdict as the manifest publishes it (``as_dict``) and the gate reads it."""

    level: str
    headline: str
    reasons: tuple[str, ...]
    analyses: tuple[AnalysisVerdict, ...]
    thresholds: Mapping[str, float]
    domains: tuple[Mapping[str, Any], ...] = ()
    impossible_rows: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"level": self.level, "headline": self.headline, "reasons": list(self.reasons),
                "analyses": [a.as_dict() for a in self.analyses],
                "domains": [dict(d) for d in self.domains],
                "impossible_rows": self.impossible_rows,
                "thresholds": dict(self.thresholds), "basis": BASIS}

    @property
    def fit(self) -> bool:
        return self.level == FIT

    def lines(self) -> list[str]:
        """The headline, then one line per declared analysis (review form, CLI, report)."""
        return [self.headline, *(a.line() for a in self.analyses)]


def verdict_of_manifest(manifest: Mapping[str, Any]) -> dict[str, Any] | None:
    """The published verdict of a manifest (None for a manifest written before it existed)."""
    verdict = manifest.get("verdict")
    return verdict if isinstance(verdict, dict) and verdict.get("level") in LEVELS else None


# -- the verdict ---------------------------------------------------------------------------

def publication_verdict(manifest: Mapping[str, Any], rows: ReleasedRows | pd.DataFrame,
                        config: DatasetConfig) -> PublicationVerdict:
    """The verdict of a release from its public manifest fields, its released rows and public
    config facts (module docstring). ``manifest`` needs ``mechanism``, ``columns``,
    ``chosen_node``, ``mechanism_details`` and ``error_bars``; ``rows`` are the rows as
    published (or the release's ``ReleasedRows``: counted per distinct row)."""
    cells = _cell_table(rows)
    released = [c for c in (manifest.get("columns") or {}) if c in cells.columns] \
        or [c for c in cells.columns if c != ROWS]
    mechanism = str(manifest.get("mechanism") or "")
    details = manifest.get("mechanism_details") or {}
    bars = manifest.get("error_bars") or {}
    judge = _Judge(config, cells, released, mechanism, manifest.get("chosen_node") or {},
                   details)
    domains, domain_care = judge.domains()
    analyses = [judge.analysis(a, bars) for a in config.analyses]
    care = list(domain_care)
    care += [f"{a.name}: {a.why}" for a in analyses if a.status == CARE]
    care += judge.synthetic_reasons(bars)
    if not config.analyses:
        care += judge.everything_generalized_away()
    impossible, impossible_reason = judge.impossible()
    if impossible_reason:
        care.append(impossible_reason)
    not_fit = [a for a in analyses if a.status == NOT_FIT]
    return _assemble(care, not_fit, analyses, domains, impossible, empty=not judge.total)


def _assemble(care: list[str], not_fit: list[AnalysisVerdict],
              analyses: list[AnalysisVerdict], domains: list[dict[str, Any]],
              impossible: int | None, empty: bool = False) -> PublicationVerdict:
    """Level, headline and reasons from the rules' findings."""
    parts, reasons = [], []
    if empty:
        parts.append("not fit: no rows released")
        reasons.append("no rows released")
    if impossible:
        text = (f"{impossible:,} released row{'s' if impossible != 1 else ''} hold a declared "
                "impossible combination")
        parts.append(f"not fit: {text}")
        reasons.append(text)
    if care:
        shown = care[:HEADLINE_REASONS]
        more = len(care) - len(shown)
        parts.append(f"{CARE}: " + "; ".join(shown) + (f"; and {more} more" if more else ""))
        reasons += care
    if not_fit:
        parts.append("not fit for: " + ", ".join(f"{a.name} ({a.short or a.why})"
                                                  for a in not_fit))
        reasons += [f"not fit for {a.name}: {a.why}" for a in not_fit]
    level = NOT_FIT if (empty or impossible or not_fit) else CARE if care else FIT
    if level == FIT:
        parts.append(f"{FIT}: " + ("every declared analysis served at its declared levels"
                                   if analyses else "no declared analysis; nothing flagged"))
    return PublicationVerdict(level=level, headline="; ".join(parts), reasons=tuple(reasons),
                              analyses=tuple(analyses), thresholds=dict(THRESHOLDS),
                              domains=tuple(domains), impossible_rows=impossible)


def _cell_table(rows: ReleasedRows | pd.DataFrame) -> pd.DataFrame:
    """Distinct released rows with their counts (``__rows``): what every rule counts on."""
    if isinstance(rows, pd.DataFrame):
        rows = ReleasedRows.from_frame(rows)
    return rows.cell_table()


class _Judge:
    """The rules, over one release's public facts."""

    def __init__(self, config: DatasetConfig, cells: pd.DataFrame, released: list[str],
                 mechanism: str, node: Mapping[str, Any], details: Mapping[str, Any]) -> None:
        self.config, self.cells, self.released = config, cells, released
        self.mechanism, self.node, self.details = mechanism, node, details
        self.weights = cells[ROWS].to_numpy(dtype=np.int64) if ROWS in cells else \
            np.ones(len(cells), dtype=np.int64)
        self.total = int(self.weights.sum())
        self.kind, self.raw_values = _kind(mechanism)
        self._counts: dict[str, pd.Series] = {}
        self._levels: dict[str, dict[str, int | None]] = {}

    # -- counting ------------------------------------------------------------------------
    def counts(self, column: str) -> pd.Series:
        """Released rows per value of ``column``, values as text (missing values left out)."""
        if column not in self._counts:
            if column not in self.cells or not len(self.cells):
                self._counts[column] = pd.Series(dtype=np.int64)
            else:
                table = value_counts_by(self.cells, [column], name=ROWS, weights=self.weights)
                self._counts[column] = table.set_index(column)[ROWS].astype(np.int64)
        return self._counts[column]

    def taxonomy(self, column: str) -> Taxonomy | None:
        if column in self.config.dimensions or column in self.config.set_valued:
            return self.config.taxonomies[column]
        if column in self.config.informative:
            return self.config.informative_taxonomy
        return None

    def label_level(self, column: str, label: str) -> int | None:
        """The finest taxonomy level whose one group holds every leaf ``label`` stands for (a
        leaf: 0; ``*``: the top); None for a label the taxonomy does not know."""
        taxonomy = self.taxonomy(column)
        if taxonomy is None:
            return None
        if column not in self._levels:  # every label of every level, once: the finest wins
            self._levels[column] = {str(label): level for level in
                                    range(taxonomy.height, -1, -1)
                                    for label in taxonomy.level_labels[level]}
        known = self._levels[column]
        if label not in known:  # DiffGen's split intervals, Mondrian's ranges
            known[label] = _spanned_level(taxonomy, label)
        return known[label]

    # -- declared domains ------------------------------------------------------------------
    def declared_domains(self) -> dict[str, list[str]]:
        """Released columns with a declared domain (informative domain file, class values)."""
        declared: dict[str, list[str]] = {}
        if self.config.informative_domain is not None:
            declared[self.config.informative[0]] = list(self.config.informative_domain)
        if self.config.class_domain is not None:
            declared[self.config.class_columns[0]] = list(self.config.class_domain)
        return {c: v for c, v in declared.items() if c in self.released and v}

    def seen(self, column: str) -> set[str]:
        """The column's released values as its domain spells them (numbers canonical)."""
        numeric = self.config.columns[column].type in NUMERIC_TYPES
        return {str(canonical_number(v)) if numeric else str(v)
                for v, n in self.counts(column).items() if n > 0}

    def domains(self) -> tuple[list[dict[str, Any]], list[str]]:
        """Declared values absent from the released rows, per column with a declared domain:
        (facts, "use with care" reasons). Keyed pseudonyms release no declared value: no rule."""
        facts, reasons = [], []
        if not self.raw_values:
            return facts, reasons
        for column, values in self.declared_domains().items():
            seen = self.seen(column)
            present = sum(1 for v in values if v in seen)
            absent = len(values) - present
            facts.append({"column": column, "declared": len(values), "released": present})
            if absent / len(values) > DOMAIN_ABSENT_CARE:
                reasons.append(f"{column}: {absent:,} of {len(values):,} declared values not "
                               "released")
        return facts, reasons

    def absent_share(self, column: str, level: int) -> float:
        """The share of the column's declared values — grouped at the analysis's taxonomy
        ``level`` (a group counts as released when any of its values is) — absent from the
        released rows; 0 for a column without a declared domain."""
        values = self.declared_domains().get(column)
        if not values or not self.raw_values:
            return 0.0
        seen = self.seen(column)
        taxonomy = self.taxonomy(column)
        if not level or taxonomy is None or level > taxonomy.height:
            return sum(1 for v in values if v not in seen) / len(values)
        leaf = {str(label): i for i, label in enumerate(taxonomy.level_labels[0])}
        groups: dict[Any, bool] = {}
        for value in values:  # a declared value outside the taxonomy is its own group
            code = leaf.get(value)
            key = ("value", value) if code is None else int(taxonomy.level_codes[level][code])
            groups[key] = groups.get(key, False) or value in seen
        return sum(1 for hit in groups.values() if not hit) / len(groups)

    # -- declared analyses -----------------------------------------------------------------
    def analysis(self, spec: AnalysisSpec, bars: Mapping[str, Any]) -> AnalysisVerdict:
        """One declared analysis through the rules that apply to this mechanism."""
        served = tuple(self.serve(spec, column) for column in spec.columns)
        findings: list[Finding] = []
        if not self.total:
            findings.append(Finding(NOT_FIT, "no rows released", "no rows"))
        for service in served:
            findings += _service_findings(service)
        for column in spec.columns:
            share = self.absent_share(column, spec.level_of(column))
            if share > DOMAIN_ABSENT_NOT_FIT:
                where = (f" at level {spec.level_of(column)}" if spec.level_of(column) else "")
                findings.append(Finding(NOT_FIT, f"{column}: {share:.0%} of its declared "
                                                 f"values{where} not released",
                                        f"{column} values not released"))
        if self.kind != "synthetic" and self.raw_values:
            findings += self.coarser_rows(served)
        figures: dict[str, float] = {}
        if self.kind == "synthetic" and "analyses" in bars:
            more, figures = _interval_findings(spec, bars.get("analyses") or [])
            findings += more
        status = _worst([f.status for f in findings])
        worst = [f for f in findings if f.status == status]
        why = "; ".join(f.text for f in worst) if findings else _kept_words(served)
        short = "; ".join(dict.fromkeys(f.short for f in worst)) if findings else ""
        return AnalysisVerdict(spec.name, tuple(spec.columns),
                               tuple(spec.level_of(c) for c in spec.columns), status, why,
                               short, served, figures)

    def serve(self, spec: AnalysisSpec, column: str) -> ColumnService:
        """How the release serves ``column`` at the analysis's declared level."""
        declared = spec.level_of(column)
        if column not in self.released:
            return ColumnService(column, declared, None, "not released")
        if self.kind == "synthetic":
            return ColumnService(column, declared, 0, "synthetic")
        if not self.raw_values:
            return ColumnService(column, declared, None, "pseudonyms")
        level = self.released_level(column)
        taxonomy = self.taxonomy(column)
        if level is None:  # labels that are no level of its taxonomy
            return ColumnService(column, declared, None, "other labels")
        if taxonomy is not None and level >= taxonomy.height and taxonomy.height > 0:
            return ColumnService(column, declared, level, "generalized away")
        return ColumnService(column, declared, level, "kept" if level <= declared else "coarser")

    def released_level(self, column: str) -> int | None:
        """The level a row mechanism released ``column`` at: the informative and class columns
        raw (ipa pools rows, not values), a dimension at the chosen node (DiffGen: its cut's
        coarsest label), else — Mondrian's groups — the level of most released rows."""
        if column in self.config.informative or column in self.config.class_columns:
            return 0
        if column in self.node:
            return int(self.node[column])
        cut = (self.details.get("cut") or {}).get(column)
        if cut:
            levels = [self.label_level(column, str(label)) for label in cut]
            known = [lv for lv in levels if lv is not None]
            return max(known) if known else None
        counts = self.counts(column)
        if counts.empty:
            return None
        levels = np.array([self.label_level(column, str(v)) for v in counts.index], dtype=object)
        known = np.array([lv is not None for lv in levels])
        if not known.any():
            return None
        order = sorted(zip(levels[known], counts.to_numpy()[known], strict=True))
        half, running = counts.to_numpy()[known].sum() / 2, 0
        for level, n in order:  # the row-weighted median level
            running += n
            if running >= half:
                return int(level)
        return int(order[-1][0])

    def coarser_rows(self, served: Sequence[ColumnService]) -> list[Finding]:
        """Columns kept at the node whose label is still coarser than declared in more than
        ``COARSER_ROWS_CARE`` of the released rows (ladder rungs, pooled or suppressed rows)."""
        out = []
        for service in served:
            if service.how != "kept" or self.taxonomy(service.column) is None or not self.total:
                continue
            counts = self.counts(service.column)
            coarser = sum(int(n) for v, n in counts.items()
                          if (lv := self.label_level(service.column, str(v))) is not None
                          and lv > service.declared_level)
            share = coarser / self.total
            if share > COARSER_ROWS_CARE:
                out.append(Finding(CARE, f"{service.column} coarser than level "
                                         f"{service.declared_level} in {share:.0%} of the "
                                         "released rows (pooled, suppressed or at a coarser "
                                         "ladder rung)", f"{service.column} often coarser"))
        return out

    # -- whole release -------------------------------------------------------------------
    def everything_generalized_away(self) -> list[str]:
        """No declared analysis: a release whose every dimension is '*' says nothing by any."""
        dims = [c for c in self.config.dimensions if c in self.released]
        if self.kind == "synthetic" or not dims or not self.total or not self.raw_values:
            return []
        if all(set(self.counts(c).index.astype(str)) <= {SUPPRESSED} for c in dims):
            return ["every dimension generalized to '*': the rows say nothing by any of them"]
        return []

    def synthetic_reasons(self, bars: Mapping[str, Any]) -> list[str]:
        """aim: 1-way distributions that moved from their measurement; a clipped noisy total."""
        if self.kind != "synthetic":
            return []
        out = []
        for entry in bars.get("one_way") or []:
            moved = _number(entry.get("moved_tvd"))
            noise = _number(entry.get("noise_tvd"))
            # beyond what the measurement's own noise explains: a released distribution no
            # further from a noisy measurement than that noise is as close to the truth
            if moved is not None and moved > MOVED_TVD_CARE and (noise is None
                                                                  or moved > noise):
                out.append(f"{entry.get('column')}: its 1-way distribution moved by TVD "
                           f"{moved:.3f} from its measurement"
                           + (f" (noise alone: {noise:.3f})" if noise is not None else ""))
        if self.details.get("noisy_total_clipped"):
            out.append("the noisy total reached the synthetic-row ceiling: fewer rows were "
                       "sampled than measured")
        return out

    def impossible(self) -> tuple[int | None, str | None]:
        """Released rows holding a declared impossible combination (the mechanisms never
        produce one: this is the backstop), or (None, why not checked)."""
        if not self.config.impossible:
            return None, None
        named: dict[str, set[str]] = {}
        for spec in self.config.impossible:
            for column, values in spec.when.items():
                named.setdefault(column, set()).update(values)
        leaves = {column: self.leaf_labels(column, values) for column, values in named.items()}
        try:
            combos = ImpossibleCombos.resolve(self.config, leaves)
        except MedreleaseError as exc:
            return None, f"declared impossible combinations not checked ({exc})"
        hit = combos.label_rows(self.config, self.cells) if len(self.cells) else \
            np.zeros(0, dtype=bool)
        return int(self.weights[hit].sum()), None

    def leaf_labels(self, column: str, named: set[str]) -> list[str]:
        """A column's leaves as public facts give them: its taxonomy's, its declared domain,
        else the values the combinations name with the released ones."""
        taxonomy = self.taxonomy(column)
        if column in self.config.dimensions and taxonomy is not None:
            return [str(v) for v in taxonomy.level_labels[0]]
        if column in self.config.informative and self.config.informative_domain is not None:
            return list(self.config.informative_domain)
        if taxonomy is not None:
            return [str(v) for v in taxonomy.level_labels[0]]
        return sorted(named | {str(v) for v in self.counts(column).index})


def _kind(mechanism: str) -> tuple[str, bool]:
    """(kind, raw values) of a registered mechanism; an unknown one is judged as rows."""
    from medrelease.mechanisms import capabilities

    try:
        caps = capabilities(mechanism)
    except MedreleaseError:
        return "rows", True
    return caps.kind, caps.raw_values


def _spanned_level(taxonomy: Taxonomy, label: str) -> int | None:
    """The finest level one of whose groups holds every leaf of a label that is no level's
    own (an interval); None when the label stands for no leaf."""
    mask = taxonomy.leaf_mask(label)
    if not mask.any():
        return None
    for level, codes in enumerate(taxonomy.level_codes):
        if np.unique(codes[mask]).size == 1:
            return level
    return taxonomy.height


@dataclass(frozen=True)
class Finding:
    """One rule's finding about an analysis: its status, in words, and in a few words."""

    status: str
    text: str
    short: str


def _service_findings(service: ColumnService) -> list[Finding]:
    column = service.column
    if service.how == "not released":
        return [Finding(NOT_FIT, f"{column} not released by this mechanism",
                        f"{column} not released")]
    if service.how == "generalized away":
        return [Finding(NOT_FIT, f"{column} generalized away", f"{column} generalized away")]
    if service.how == "coarser":
        return [Finding(CARE, f"{column} generalized to level {service.released_level}, "
                              f"declared {service.declared_level}", f"{column} coarser")]
    if service.how == "other labels":
        return [Finding(CARE, f"{column}: its released labels are not levels of its taxonomy",
                        f"{column} labels")]
    if service.how == "pseudonyms":
        return [Finding(CARE, f"{column} released as keyed pseudonyms (counts exact, labels "
                              "codes)", f"{column} pseudonyms")]
    return []


def _kept_words(served: Sequence[ColumnService]) -> str:
    if any(s.how == "synthetic" for s in served):
        return "measured at its declared levels; synthetic rows within its intervals"
    return "kept at its declared levels"


def _worst(statuses: Sequence[str]) -> str:
    return max(statuses, key=LEVELS.index) if statuses else FIT


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if np.isfinite(number) else None


def _interval_findings(spec: AnalysisSpec, entries: Sequence[Mapping[str, Any]]
                       ) -> tuple[list[Finding], dict[str, float]]:
    """aim: the analysis's published 95 % intervals — too wide to read, or the sampled rows
    outside them."""
    entry = analysis_entry(spec.name, spec.columns,
                           [spec.level_of(c) for c in spec.columns], entries)
    if entry is None:
        return [Finding(CARE, "no interval published for it", "no interval")], {}
    cells = entry.get("cells") or []
    released = np.array([max(0.0, _number(c.get("released")) or 0.0) for c in cells])
    lower = np.array([_number(c.get("lower")) or 0.0 for c in cells])
    upper = np.array([_number(c.get("upper")) or 0.0 for c in cells])
    if not len(cells):
        return [Finding(CARE, "its published table has no cell", "no cell")], {}
    relative = (upper - lower) / 2 / np.maximum(released, 1.0)
    width = _weighted_median(relative, released)
    total = float(released.sum())
    outside = (released < lower) | (released > upper)
    drift = float(released[outside].sum()) / total if total else 0.0
    sigma = _number(entry.get("sigma")) or 0.0
    noise_tvd = (math.sqrt(2 / math.pi) * sigma * len(cells) / (2 * total)) if total else 1.0
    figures = {"median_relative_half_width": round(float(width), 6),
               "mass_outside_interval": round(drift, 6),
               "noise_tvd": round(float(noise_tvd), 6)}
    findings: list[Finding] = []
    if width > INTERVAL_NOT_FIT:
        findings.append(Finding(NOT_FIT, f"intervals too wide to read (typical cell "
                                         f"+-{width:.0%})", "intervals too wide"))
    elif width > INTERVAL_CARE:
        findings.append(Finding(CARE, f"wide intervals (typical cell +-{width:.0%})",
                                "wide intervals"))
    if noise_tvd > NOISE_TVD_NOT_FIT:
        findings.append(Finding(NOT_FIT, f"its {len(cells):,} cells are mostly noise (the "
                                         f"measurement alone: TVD about {noise_tvd:.2f})",
                                "mostly noise"))
    elif noise_tvd > NOISE_TVD_CARE:
        findings.append(Finding(CARE, f"its small cells are mostly noise (the measurement "
                                      f"alone: TVD about {noise_tvd:.2f} over {len(cells):,} "
                                      "cells)", "small cells noisy"))
    if drift > DRIFT_CARE:
        findings.append(Finding(CARE, f"{drift:.0%} of its released rows lie in cells outside "
                                      "the 95 % interval of the true count (the rows drift "
                                      "from the measurement)", "rows drift"))
    return findings, figures


def analysis_entry(name: str, columns: Sequence[str], levels: Sequence[int],
                   entries: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The error bars' entry of a declared analysis: by its name, else by its columns and
    levels (aim names an entry by its columns alone), else by its columns."""
    entries = [e for e in entries if isinstance(e, Mapping)]
    for same in (lambda e: e.get("name") == name,
                 lambda e: list(e.get("columns") or []) == list(columns)
                 and [int(v) for v in e.get("levels") or [0] * len(columns)] == list(levels),
                 lambda e: list(e.get("columns") or []) == list(columns)):
        found = next((e for e in entries if same(e)), None)
        if found is not None:
            return found
    return None


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    """The mass-weighted median (equal weights when no cell has mass)."""
    if not len(values):
        return 0.0
    weights = weights if weights.sum() > 0 else np.ones_like(values)
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cumulative, cumulative[-1] / 2)])
