"""Evidence for one published release, computed against its input (EVALUATION.md).

Accuracy first (workload error of every 1-, 2- and 3-way marginal, the informative column value
by value, what researchers need — collapsed distributions, inflated values, erased associations,
impossible combinations: ``research.py`` — a verdict and warnings: ``accuracy.py``), then
utility (IL parts, the IPA paper's queries, classification, information gain), risk that fits
the release (class sizes and prosecutor risk for real rows; matches of unique input records for
synthetic rows; the frequency-matching attack for pseudonyms) and the IL of every lattice node
by height. A section that does not apply is left out with one sentence saying why
(``left_out``). Everything here looks at the raw input, so the result is for the steward and is
written outside the release folder, never published with it; and it is no basis for deciding
whether to publish or to rerun (``accuracy.STEWARD_BASIS``): the publication verdict in the
manifest is.
"""

from __future__ import annotations

import functools
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from medrelease.data.aggregate import CountTable, mixed_radix_digits
from medrelease.data.config import DatasetConfig
from medrelease.evidence.accuracy import (
    Accuracy,
    informative_accuracy,
    not_comparable,
    workload_accuracy,
)
from medrelease.evidence.classification import information_gain, model_scores, split
from medrelease.evidence.research import research_accuracy
from medrelease.evidence.risk import (
    frequency_attack,
    risk_of_sizes,
    risk_report,
    synthetic_match_risk,
)
from medrelease.evidence.text_codes import CodedColumns
from medrelease.evidence.utility import AnalysisQuery, compare_queries
from medrelease.mechanisms import capabilities, get_mechanism
from medrelease.storage.store import find_data_file


@dataclass(frozen=True)
class InputRows:
    """The input as the evaluation reads it: its rows, or its distinct cells with the rows each
    stands for (``weights``). A release made from counts is evaluated from those counts: reading
    and hashing the file again and grouping a million rows cost 0.5 s of every release."""

    table: pd.DataFrame
    weights: np.ndarray | None = None
    # Rows per combination of ``sized_dimensions``, when known from the counts (their classes)
    class_sizes: np.ndarray | None = None
    sized_dimensions: frozenset[str] = frozenset()

    @property
    def n_rows(self) -> int:
        return len(self.table) if self.weights is None else int(self.weights.sum())

    @functools.cached_property
    def rows(self) -> pd.DataFrame:
        """One row per input row (cells repeated by their counts), for the models: expanded
        once however many measures read it."""
        if self.weights is None:
            return self.table
        return self.table.loc[self.table.index.repeat(self.weights)].reset_index(drop=True)

    def risk(self, dimensions: list[str]) -> dict[str, float | int]:
        """Re-identification risk on ``dimensions``: from the class sizes when they are of
        exactly these dimensions, else from the table."""
        if self.class_sizes is not None and set(dimensions) == self.sized_dimensions:
            return risk_of_sizes(self.class_sizes, self.n_rows)
        return risk_report(self.table, dimensions, self.weights)

    @classmethod
    def from_counts(cls, counts: CountTable, config: DatasetConfig) -> InputRows | None:
        """The count table as cells, when it describes the input's rows exactly: no rows
        dropped or bounded per unit, no missing value turned into a category (rows counts
        those as missing), every releasable column in it. Else None: read the file."""
        columns = [*counts.dimensions, *counts.informative.columns]
        if (counts.unit_bound is not None or counts.dropped_rows
                or any(config.columns[c].missing is not None for c in counts.dimensions)
                or set(config.declared) - set(columns)):
            return None
        if counts.wide:  # codes per column: no class keys (risk then reads the table)
            return cls._from_wide(counts, columns)
        radix = max(counts.n_inf, 1)
        class_keys = counts.cell_keys // radix  # sorted: cells of a class are contiguous
        informative_codes = counts.cell_keys - class_keys * radix
        data: dict[str, Any] = {}
        for column, taxonomy, codes in zip(
                counts.dimensions, counts.taxonomies,
                mixed_radix_digits(class_keys, [t.n_leaves for t in counts.taxonomies]),
                strict=True):
            data[column] = pd.Categorical.from_codes(
                codes, categories=[str(leaf) for leaf in taxonomy.leaves])
        for column in counts.informative.columns:
            per_code, uniques = pd.factorize(counts.informative[column])
            data[column] = pd.Categorical.from_codes(
                per_code[informative_codes], categories=[str(v) for v in uniques])
        weights = np.asarray(counts.counts, np.int64)
        starts = np.flatnonzero(np.diff(class_keys, prepend=-1)) if class_keys.size else []
        return cls(pd.DataFrame(data, columns=columns), weights,
                   class_sizes=np.add.reduceat(weights, starts) if len(starts) else None,
                   sized_dimensions=frozenset(counts.dimensions))

    @classmethod
    def _from_wide(cls, counts: CountTable, columns: list[str]) -> InputRows:
        """A wide count table (a code per column per cell) as cells."""
        data: dict[str, Any] = {}
        for column, taxonomy, codes in zip(counts.dimensions, counts.taxonomies,
                                           counts.dimension_columns(), strict=True):
            data[column] = pd.Categorical.from_codes(
                codes, categories=[str(leaf) for leaf in taxonomy.leaves])
        for column in counts.informative.columns:
            per_code, uniques = pd.factorize(counts.informative[column])
            data[column] = pd.Categorical.from_codes(
                per_code[counts.inf_codes()], categories=[str(v) for v in uniques])
        return cls(pd.DataFrame(data, columns=columns), np.asarray(counts.counts, np.int64))


@dataclass
class Evaluation:
    dataset: str
    release_id: str
    mechanism: str
    guarantee: str
    for_publication: bool
    budget_steps: list[dict[str, Any]]
    information_loss: dict[str, float]
    input_rows: int
    released_rows: int
    query_summary: dict[str, Any] = field(default_factory=dict)
    queries: pd.DataFrame | None = None
    classification: dict[str, dict[str, float]] = field(default_factory=dict)
    classification_note: str = ""
    information_gain: pd.DataFrame | None = None
    risk_release: dict[str, float | int] = field(default_factory=dict)
    risk_input: dict[str, float | int] = field(default_factory=dict)
    frequency_attack: dict[str, float] = field(default_factory=dict)
    il_by_height: pd.DataFrame | None = None
    unit_warning: str | None = None  # identifiers declared, no privacy unit: one row protected
    accuracy: dict[str, Any] = field(default_factory=dict)
    risk_synthetic: dict[str, float | int] = field(default_factory=dict)
    input_note: str = ""  # how the input's rows relate to the file's (dropped, bounded)
    left_out: dict[str, str] = field(default_factory=dict)  # section -> why it does not apply

    @property
    def verdict(self) -> str:
        return str(self.accuracy.get("verdict", ""))

    @property
    def warnings(self) -> list[str]:
        return list(self.accuracy.get("warnings", []))

    @property
    def basis(self) -> str:
        """What the verdict is no basis for (``accuracy.STEWARD_BASIS``)."""
        return str(self.accuracy.get("basis", ""))

    def as_json(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items()
               if not isinstance(v, pd.DataFrame) and v is not None}
        for name in ("queries", "information_gain", "il_by_height"):
            frame = getattr(self, name)
            if frame is not None:
                out[name] = json.loads(frame.to_json(orient="records"))
        return out


def _classification(given: InputRows, released: pd.DataFrame, config: DatasetConfig,
                    mechanism: str, details: dict[str, Any]) -> tuple[dict, str]:
    label = config.class_columns[0] if config.class_columns else None
    if label is None or label not in released.columns:
        return {}, "the release carries no class column: classification does not apply"
    original = given.rows
    predictors = [c for c in config.dimensions if c in released.columns]
    raw_train, raw_test = split(original, 0.3, seed=0)
    scores: dict[str, dict[str, float]] = {}
    majority = raw_train[label].astype(str).mode().iloc[0]
    scores["LA"] = {"accuracy": float((raw_test[label].astype(str) == majority).mean())}
    for kind in ("tree", "forest"):
        scores[f"BA {kind}"] = model_scores(raw_train[predictors], raw_train[label],
                                            raw_test[predictors], raw_test[label], kind)
    if capabilities(mechanism).kind == "rows" and details.get("cut"):  # (diffgen's cut)
        # relational columns by their cut labels; set-valued ones need the split history,
        # which the manifest does not carry
        generalized = get_mechanism(mechanism).generalize(raw_test, config,
                                                         {"cut": details["cut"]})
        note = ("CA: trained on the release, tested on 30 % of the input generalized to the "
                "release's cut (those records were part of the release's input; the held-out "
                "version is benchmarks/diffgen_adult.py). Set-valued columns are left out here.")
        for kind in ("tree", "forest"):
            scores[f"CA {kind}"] = model_scores(released[predictors], released[label],
                                                generalized, raw_test[label], kind)
    else:
        rel_train, rel_test = split(released, 0.3, seed=0)
        note = ("CA: trained and tested on a 70/30 split of the release itself (seed 004's "
                "protocol for pseudonymized and k-anonymous tables)")
        for kind in ("tree", "forest"):
            scores[f"CA {kind}"] = model_scores(rel_train[predictors], rel_train[label],
                                                rel_test[predictors], rel_test[label], kind)
    return scores, note


def input_note(record: dict[str, Any], rows: int) -> str:
    """The input's size said once, with how it relates to the file and to what was released:
    every section of the evaluation compares with these ``rows``."""
    parts = [f"{rows:,} input rows (the extract after its missing-value policy)"]
    if record.get("dropped_rows"):
        parts.append(f"{int(record['dropped_rows']):,} row(s) with missing values dropped "
                     "(missing: drop_rows)")
    bound = record.get("unit_bound") or {}
    if bound.get("rows after the bound") is not None:
        parts.append(f"the release was made from {int(bound['rows after the bound']):,} of them "
                     f"(each of {int(bound.get('units', 0)):,} units bounded to its declared "
                     "maximum of rows)")
    return "; ".join(parts)


def _il_by_height(candidates: pd.DataFrame) -> pd.DataFrame | None:
    levels = [c for c in candidates.columns if c.startswith("level_")]
    if candidates.empty or not levels or "il" not in candidates.columns:
        return None
    frame = candidates.assign(height=candidates[levels].sum(axis=1))
    parts = [c for c in ("il", "ncp", "emd", "rate") if c in frame.columns]
    return frame.groupby("height")[parts].mean().reset_index()


def _released_rows(folder: Path) -> pd.DataFrame:
    """The published rows, text columns as categoricals: read as Parquet stores them
    (dictionary encoded), so counting a million released rows hashes no strings (0.1 s)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = find_data_file(folder, ".parquet")
    text = [field.name for field in pq.read_schema(path)
            if pa.types.is_string(field.type) or pa.types.is_large_string(field.type)]
    return pq.read_table(path, read_dictionary=text).to_pandas()


def evaluate_release(release_dir: str | Path, original: pd.DataFrame | InputRows,
                     config: DatasetConfig,
                     query: AnalysisQuery | None = None,
                     details: dict[str, Any] | None = None,
                     record: dict[str, Any] | None = None,
                     candidates: pd.DataFrame | None = None) -> Evaluation:
    """Evaluate the release in ``release_dir`` (public manifest + data) against its input.

    ``record`` is the release's steward record (input rows, information loss) and
    ``candidates`` its per-node summaries; both stay internal, as does the result.
    """
    given = original if isinstance(original, InputRows) else InputRows(original)
    folder = Path(release_dir)
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    released = _released_rows(folder)
    record = record or {}
    candidates = candidates if candidates is not None else pd.DataFrame()
    mechanism = manifest["mechanism"]
    details = details or manifest.get("mechanism_details", {})
    caps = capabilities(mechanism)
    evaluation = Evaluation(
        dataset=manifest["dataset"], release_id=manifest["release_id"], mechanism=mechanism,
        guarantee=manifest["guarantee"]["statement"],
        unit_warning=config.unit_warning,
        for_publication=not manifest.get("test_release", False),
        budget_steps=manifest["budget_steps"],
        information_loss=record.get("information_loss", {}),
        input_rows=given.n_rows, input_note=input_note(record, given.n_rows),
        released_rows=manifest["released_rows"],
    )
    # The workload marginals (41 of them: the evaluation's largest part) on a second thread
    # while this one runs the other sections and then the informative column's accuracy: all
    # spend their time in numpy, pandas and Arrow kernels that release the interpreter lock
    # (1,361,000 released rows: the whole accuracy on the second thread left it running ~1.2 s
    # after this one; split so, 2.8-3.0 s -> 2.3-2.4 s on one machine; docs/results/aim.md).
    # Each reads the inputs only; the results are the same.
    # A release of keyed pseudonyms has nothing to compare (``not_comparable``).
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="workload") as workload_thread:
        workload = (workload_thread.submit(workload_accuracy, given.table, given.weights,
                                           released, config) if caps.raw_values else None)
        _other_sections(evaluation, given, released, config, mechanism, details, caps, query,
                        candidates)  # (an error here waits for the thread, then is raised)
        if workload is None:
            accuracy = not_comparable()
        else:  # this thread's share first: ``workload.result()`` waits for the other's
            # (the informative column and the research checks read the same columns as
            # codes: each coded once)
            coded = (CodedColumns(given.table), CodedColumns(released))
            informative = informative_accuracy(given.table, given.weights, released, config,
                                               caps.loss_reason, coded=coded)
            research = research_accuracy(given.table, given.weights, released, config,
                                         coded=coded)
            accuracy = Accuracy.of(workload.result(), informative, research)
    evaluation.accuracy = accuracy.as_json()
    return evaluation


def _other_sections(evaluation: Evaluation, given: InputRows, released: pd.DataFrame,
                    config: DatasetConfig, mechanism: str, details: dict[str, Any], caps,
                    query: AnalysisQuery | None, candidates: pd.DataFrame) -> None:
    """Everything but the accuracy: the queries, classification, risk, information loss."""
    left_out = evaluation.left_out
    if not evaluation.information_loss:
        left_out["information loss"] = (
            "synthetic rows: information loss (NCP + EMD + Rate) measures generalized real "
            "rows; read the accuracy section" if caps.kind == "synthetic" else
            f"{mechanism} does not compute information loss; read the accuracy section")
    query = query or AnalysisQuery()
    if query.applies_to(config) and all(c in released.columns for c in query.columns()):
        evaluation.queries, evaluation.query_summary = compare_queries(
            given.table, released, config, query, original_weights=given.weights)
    else:
        left_out["analysis queries"] = (
            "the IPA paper's queries need its schema (age, sex, length of stay, surgery and a "
            f"diagnosis column) released; {config.name} does not have it")
    evaluation.classification, evaluation.classification_note = _classification(
        given, released, config, mechanism, details)
    if not evaluation.classification:
        left_out["classification"] = evaluation.classification_note
    label = config.class_columns[0] if config.class_columns else None
    if evaluation.classification and label:
        attrs = [c for c in config.dimensions if c in released.columns]
        before = information_gain(given.rows, label, attrs)
        after = information_gain(released, label, attrs)
        evaluation.information_gain = pd.DataFrame({
            "attribute": attrs, "before": [before[a] for a in attrs],
            "after": [after[a] for a in attrs]})
    dims = [c for c in config.dimensions + config.set_valued if c in released.columns]
    if caps.kind == "synthetic":  # no released row is a patient: class sizes say nothing
        columns = [c for c in config.declared if c in released.columns]
        evaluation.risk_synthetic = synthetic_match_risk(given.table, given.weights, released,
                                                         columns)
        left_out["class-size risk"] = (
            "synthetic rows: class sizes and prosecutor risk would treat each synthetic row as "
            "a patient; the matches of unique input records are shown instead")
    else:
        evaluation.risk_release = risk_report(released, dims)
        evaluation.risk_input = given.risk(dims)
    if caps.needs_secret:  # a keyed mapping keeps frequencies
        evaluation.frequency_attack = frequency_attack(given.rows, dims)
    evaluation.il_by_height = _il_by_height(candidates)
    if evaluation.il_by_height is None:
        left_out["information loss per lattice height"] = (
            "no lattice nodes were scored for this release")
