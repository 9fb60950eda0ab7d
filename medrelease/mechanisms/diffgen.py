"""``diffgen``: differentially private top-down specialization (Mohammed et al.; ALGORITHMS.md §4).

Every predictor starts fully generalized (taxonomy root, or the whole integer range); one
partition holds all records. In each of ``h`` rounds the exponential mechanism picks one cut
value to specialize, scored by ``Max`` (sum of majority-class counts of its children,
sensitivity 1) or ``InfoGain`` (sensitivity log2 |classes|). Integer predictors are split at a
point chosen by the exponential mechanism over every integer of the interval. At the end every
leaf partition — every combination of the final cut values, empty ones included — gets a noisy
count per class value.

Budget (original DiffGen): eps/2 over the |numeric predictors| + 2h exponential-mechanism calls
(eps' = eps / (2 (|A_num| + 2h)) each; the two split points of a specialized interval cover
disjoint records, so together they cost one eps'), and eps/2 for the counts (discrete Laplace,
scale 2/eps, each record in exactly one leaf partition). Candidates and split-point ranges come
from the taxonomies and earlier private choices only, never from the data, so the whole
procedure is eps-DP by sequential and parallel composition.

Set-valued predictors (diagnosis-code sets over an item taxonomy, ``setvalued.py``) are candidates
like any cut value; a round that splits one spends its second ``eps'`` (a categorical round's is
unused, a numeric round's pays the new split points) on the noisy emptiness test of the children,
so the total stays ``eps``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
import pandas as pd
from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

from medrelease.data.aggregate import prepare_table
from medrelease.data.config import DatasetConfig
from medrelease.data.taxonomy import Taxonomy
from medrelease.errors import ParameterError, PolicyError
from medrelease.mechanisms.base import (
    Capabilities,
    MechanismBase,
    MechanismParams,
    ReleaseShape,
    RowsOutput,
    declared_draws,
    expected_rows_above,
    noise_bound,
)
from medrelease.mechanisms.interval_rows import listed_clipped_bounds
from medrelease.mechanisms.setvalued import ChildGroups, SetCut, encode_item_sets
from medrelease.privacy.guarantee import ADD_REMOVE_ONE_ROW, BudgetStep, Guarantee, StepDraws
from medrelease.privacy.interval_table import (
    PER_ESTIMATE,
    SIMULTANEOUS,
    IntervalTable,
    bonferroni_level,
    joined_cells,
)
from medrelease.privacy.intervals import (
    LEVEL,
    CountIntervals,
    cells_entry,
    clipped_interval,
    clipped_total_interval,
    noise_law_epsilon,
)
from medrelease.privacy.randomness import discrete_laplace, exponential_mechanism, noise_epsilon
from medrelease.privacy.unit_cut import unit_cut_epsilon, unit_cut_step

LABEL = "DiffGen, epsilon-DP (exponential mechanism + discrete Laplace counts)"


class DiffGenParams(MechanismParams):
    epsilon: float = Field(default=1.0, gt=0, allow_inf_nan=False, description="privacy budget")
    specializations: int = Field(default=10, ge=0, le=200, description="h: number of rounds")
    score: Literal["max", "infogain"] = Field(default="max", description="utility score")
    spurious_per_split: float = Field(
        default=1.0, gt=0, le=100, allow_inf_nan=False,
        description="set-valued columns: expected spurious item combinations per split value "
                    "(sets the emptiness threshold; lower = higher threshold)")
    n_numeric: SkipJsonSchema[int] = 0  # set by the release driver from the dataset config
    unit_rows: SkipJsonSchema[int] = 1  # m: every sensitivity is m times the row's (a unit)
    unit_column: SkipJsonSchema[str | None] = None  # a declared unit: its cut is published

    @property
    def main_epsilon(self) -> float:
        """DiffGen's own budget: epsilon less the unit cut's share (``privacy/unit_cut.py``)
        when a unit is declared."""
        return self.epsilon - unit_cut_epsilon(self.epsilon, self.unit_column)

    @property
    def eps_call(self) -> float:
        return self.main_epsilon / (2 * (self.n_numeric + 2 * self.specializations) or 1)


@dataclass
class _Cut:
    """One predictor's current cut: per cut value, (level, code) or an integer interval."""

    taxonomy: Taxonomy
    numeric: bool
    values: list[tuple[int, int]] = field(default_factory=list)  # (level, code) or (lo, hi)
    splits: list[int | None] = field(default_factory=list)       # numeric: chosen split point

    def label(self, index: int) -> str:
        a, b = self.values[index]
        if self.numeric:
            low, high = self.taxonomy.leaves[a], self.taxonomy.leaves[b]
            return str(low) if a == b else f"[{low}-{high}]"
        return self.taxonomy.level_labels[a][b]


def _class_table(child: np.ndarray, classes: np.ndarray, counts: np.ndarray, n_children: int,
                 n_classes: int) -> np.ndarray:
    return np.bincount(child * n_classes + classes, weights=counts,
                       minlength=n_children * n_classes).reshape(n_children, n_classes)


def _score(table: np.ndarray, kind: str) -> float:
    """Max: sum of majority counts; InfoGain: entropy reduction (tables are children x classes)."""
    if kind == "max":
        return float(table.max(axis=1).sum())
    total = table.sum()
    if total <= 0:
        return 0.0

    def entropy(rows: np.ndarray) -> np.ndarray:
        sums = rows.sum(axis=-1, keepdims=True)
        p = np.divide(rows, sums, out=np.zeros_like(rows, dtype=float), where=sums > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            return -np.nansum(np.where(p > 0, p * np.log2(p), 0.0), axis=-1)

    parent = entropy(table.sum(axis=0))
    children = entropy(table)
    return float(parent - (table.sum(axis=1) / total * children).sum())


def _split_scores(leaf_class: np.ndarray, kind: str) -> np.ndarray:
    """Score of every split t (left = leaves[:t+1]) of an interval, from per-leaf class counts."""
    left = np.cumsum(leaf_class, axis=0)[:-1]
    right = leaf_class.sum(axis=0) - left
    if kind == "max":
        return left.max(axis=1) + right.max(axis=1)
    return np.array([_score(np.stack([lft, rgt]), "infogain") for lft, rgt in zip(left, right,
                                                                                      strict=True)])


class DiffGen(MechanismBase):
    name: ClassVar[str] = "diffgen"
    capabilities: ClassVar[Capabilities] = Capabilities(
        summary="eps-DP, proven (classification release)",
        gives="generalized rows with a noisy count per class, built to train classifiers",
        draws_declared_steps=True,
        kind="rows",
        set_valued_input=True,
        needs_class_domain=True,
        output_roles=("dimension", "set_valued", "class"),
        audit_designs=("common", "classification"),
        published_tables=("intervals.csv",),
    )
    selection: ClassVar[str] = "none"
    Params: ClassVar[type[MechanismParams]] = DiffGenParams

    def guarantee(self, params: DiffGenParams) -> Guarantee:
        return Guarantee(self.name, params.epsilon, 0.0, ADD_REMOVE_ONE_ROW, True, LABEL)

    def budget_steps(self, params: DiffGenParams) -> list[BudgetStep]:
        eps_call = params.eps_call
        steps = []
        if params.n_numeric:
            steps.append(BudgetStep("initial split points", eps_call * params.n_numeric, 0.0,
                                    self.name, "one exponential mechanism per numeric predictor"))
        if params.specializations:
            steps.append(BudgetStep("specializations", eps_call * params.specializations, 0.0,
                                    self.name, f"exponential mechanism ({params.score}) per round"))
            steps.append(BudgetStep("split points / emptiness tests",
                                    eps_call * params.specializations, 0.0, self.name,
                                    "per round: split points of a newly specialized interval, "
                                    "or the noisy emptiness test of a set-valued split"))
        spent = sum(s.epsilon for s in steps)
        steps.append(BudgetStep("leaf counts", params.main_epsilon - spent, 0.0, self.name,
                                "discrete Laplace per leaf partition x class, empty ones included"))
        return steps + unit_cut_step(params.epsilon, params.unit_column, self.name)

    def error_bars(self, params: DiffGenParams, context: Any = None,
                   node: Any = None) -> dict[str, Any]:
        """95 % intervals of the leaf partitions' class counts (public: the leaf-count step's
        epsilon): every leaf partition x class value is drawn, empty ones included, clipped."""
        leaves = next(s.epsilon for s in self.budget_steps(params) if s.step == "leaf counts")
        m = params.unit_rows
        cells = [cells_entry("every leaf partition x class value (no rows: released as 0)",
                             CountIntervals.clipped(noise_law_epsilon(leaves, m)), leaves, m)]
        return {"level": LEVEL,
                "statement": ("Every leaf partition of the final cut, with every class value, "
                              "was released as max(0, n + Z) rows, Z discrete Laplace. A "
                              "partition x class with rows (in data.csv and intervals.csv) has "
                              "the interval of its true count given that it came out at 1 or "
                              "more (95 % for every true count); one absent from data.csv was "
                              "released as 0 and its true count lies in [0, "
                              f"{clipped_interval(0, noise_law_epsilon(leaves, m))[1]}]."),
                "cells": cells,
                "totals": ("A total over c partitions x class values with released total T "
                           "lies in [T - q+, T + q] (the 97.5 % quantiles of the sum of c "
                           "noises' positive parts, and of c noises).")}

    def row_bounds(self, params: DiffGenParams, shape: ReleaseShape) -> tuple[int, int]:
        return 0, shape.rows + shape.noise_cells * noise_bound(
            params.main_epsilon / (2 * params.unit_rows))

    def release_rows(self, table: pd.DataFrame, config: DatasetConfig, params: DiffGenParams,
                     rng: np.random.Generator, draws: StepDraws | None,
                     key: bytes | None) -> RowsOutput:
        """The checked frame (class included) through ``release_frame``; the summary of the
        cut is the release's details."""
        frame = prepare_table(table, config, include_class=True)
        released, summary = self.release_frame(frame, config, params, rng, draws)
        return RowsOutput(released, ReleaseShape(rows=len(frame), noise_cells=summary["cells"]),
                          details=summary,
                          intervals=self.interval_table_of(released, config, params, summary))

    def interval_table_of(self, released: pd.DataFrame, config: DatasetConfig,
                          params: DiffGenParams, summary: dict[str, Any]) -> Any:
        """``intervals.csv``: every released (partition, class) count's interval under
        max(0, n + Z), and every class value's total over the leaf partitions (per estimate
        and simultaneous), from the released rows and the leaf-count step's epsilon only."""
        eps = noise_epsilon(self.leaf_noise_epsilon(params))
        columns = list(released.columns)
        class_column = config.class_columns[0]
        table = IntervalTable(LEVEL)
        counts = (released.astype(str).groupby(columns, sort=True).size()
                  if len(released) else pd.Series(dtype=np.int64))
        if len(counts):
            frame = counts.reset_index(name="__n")
            low, high = listed_clipped_bounds(frame["__n"].to_numpy(), eps, LEVEL)
            table.add("count", columns, joined_cells([frame[c].to_numpy() for c in columns]),
                      frame["__n"].to_numpy(), low, high)
        values = list(config.class_domain or [])
        by_class = released[class_column].astype(str).value_counts() if len(released) else {}
        totals = np.array([int(by_class.get(v, 0)) for v in values], dtype=np.int64)
        partitions = int(summary["leaf_partitions"])
        for holds, each in ((PER_ESTIMATE, LEVEL),
                            (SIMULTANEOUS, bonferroni_level(LEVEL, len(values)))):
            spans = np.array([clipped_total_interval(t, eps, partitions, each)
                              for t in totals]).reshape(-1, 2)
            table.add("total", [class_column], np.asarray(values, dtype=object), totals,
                      spans[:, 0], spans[:, 1], holds)
        return table

    def leaf_noise_epsilon(self, params: DiffGenParams) -> float:
        """The epsilon each leaf cell's discrete Laplace is drawn at (the leaf-count step's,
        over the unit's rows)."""
        leaves = next(s.epsilon for s in self.budget_steps(params) if s.step == "leaf counts")
        return leaves / params.unit_rows

    def cell_ceiling(self, config: DatasetConfig, params: DiffGenParams) -> int:
        """The most leaf cells (partitions x class values) a release may draw: the policy's
        ``max_leaf_cells``, and no more cells than keep the rows their noise is expected to
        add within ``max_noise_rows`` (public: the policy and the parameters)."""
        per_cell = expected_rows_above(self.leaf_noise_epsilon(params))
        by_noise = math.floor(config.policy.max_noise_rows / per_cell) if per_cell > 0 \
            else config.policy.max_leaf_cells
        return max(0, min(config.policy.max_leaf_cells, by_noise))

    def check_work(self, config: DatasetConfig, params: DiffGenParams) -> None:
        """Before anything is read or spent: the largest final cut the ``specializations``
        rounds could reach (``leaf_partitions_bound``, from the taxonomies only) times the
        class values must fit ``max_leaf_cells``, and the rows its noise is expected to add
        must fit ``max_noise_rows`` (every leaf cell is drawn, empty ones included; a run at
        200 specializations drew 1.03e9 cells, one at eps 5e-5 released 60.7M rows).
        Set-valued columns count with their two starting values here; while the rounds run,
        a split that would take the cells past ``cell_ceiling`` is not made (see
        ``release_frame``)."""
        relational = [config.taxonomies[p] for p in config.dimensions]
        classes = max(len(config.class_domain or []), 1)
        leaves = leaf_partitions_bound(relational, params.specializations) \
            * 2 ** len(config.set_valued)
        cells = leaves * classes
        policy = config.policy
        where = f"dataset {config.name!r}"
        if cells > policy.max_leaf_cells:
            raise PolicyError(
                f"diffgen on {where}: {params.specializations} specializations could cut its "
                f"predictors into {leaves:,} leaf partitions, {cells:,} cells with the "
                f"{classes} class values (every one drawn, empty ones included), over the limit "
                f"of {policy.max_leaf_cells:,} (policy: max_leaf_cells in its config); use fewer "
                "specializations (parameter 'specializations') or raise the limit. Nothing was "
                "read or spent.")
        noise_rows = cells * expected_rows_above(self.leaf_noise_epsilon(params))
        if noise_rows > policy.max_noise_rows:
            raise PolicyError(
                f"diffgen at epsilon {params.epsilon:g} on {where} is expected to add "
                f"{noise_rows:,.0f} noise rows (up to {cells:,} leaf cells, each released with "
                f"a noisy count), over the limit of {policy.max_noise_rows:,} (policy: "
                "max_noise_rows in its config); use a larger epsilon or fewer specializations "
                "(parameter 'specializations'), or raise the limit. Nothing was read or spent.")

    def release_frame(self, frame: pd.DataFrame, config: DatasetConfig, params: DiffGenParams,
                      rng: np.random.Generator, draws: StepDraws | None = None
                      ) -> tuple[pd.DataFrame, dict[str, Any]]:
        """Run DiffGen on a checked frame; returns the microdata and a summary of the cut.

        Every draw takes its epsilon from the plan's declared steps (``draws``): a step that
        covers several calls (one per round) is shared evenly between them."""
        draws = draws or declared_draws(self, self.budget_steps(params))
        per_call = _per_call_epsilons(draws, params)
        if len(config.class_columns) != 1:
            raise ParameterError("diffgen needs exactly one column with role 'class'")
        class_column = config.class_columns[0]
        predictors = config.dimensions
        taxonomies = [config.taxonomies[p] for p in predictors]
        leaf = np.stack([t.encode(frame[p]) for p, t in zip(predictors, taxonomies, strict=True)],
                        axis=1).astype(np.int64)
        set_cuts, itemsets, set_rows = [], [], []
        for name in config.set_valued:
            row_set, sets = encode_item_sets(frame[name], config.columns[name].separator or "",
                                             config.taxonomies[name])
            set_cuts.append(SetCut(config.taxonomies[name]))
            itemsets.append(sets)
            set_rows.append(row_set)
        class_values = config.class_domain
        if not class_values:
            raise ParameterError(
                f"diffgen needs the class column's public domain: declare 'values: [...]' for "
                f"{class_column!r} in the dataset config (taking the values from the data would "
                "reveal a class value only one person has)")
        n_cls = len(class_values)
        if n_cls < 2:
            raise ParameterError(f"diffgen: class column {class_column!r} needs at least 2 values")
        class_codes = pd.Categorical(frame[class_column].astype("string"),
                                     categories=class_values).codes.astype(np.int64)
        if (class_codes < 0).any():
            bad = int((class_codes < 0).sum())
            raise ParameterError(f"diffgen: class column {class_column!r} has {bad} value(s) "
                                 "outside its declared domain (values)")
        # Aggregate once: counts per (finest predictor vector, item-set cells, class).
        cells, counts = np.unique(np.column_stack([leaf, *set_rows, class_codes]), axis=0,
                                  return_counts=True)
        n_rel = len(predictors)
        leaf, set_cell, classes = cells[:, :n_rel], cells[:, n_rel:-1], cells[:, -1]
        set_assign = [cut.initial(sets) for cut, sets in zip(set_cuts, itemsets, strict=True)]
        sensitivity = 1.0 if params.score == "max" else math.log2(n_cls)

        cuts = [_Cut(t, t.kind == "numeric") for t in taxonomies]
        assign = np.zeros_like(leaf)
        for i, cut in enumerate(cuts):
            if cut.numeric:
                cut.values.append((0, cut.taxonomy.n_leaves - 1))
                cut.splits.append(self._split_point(leaf[:, i], classes, counts, 0,
                                                    cut.taxonomy.n_leaves - 1, n_cls, params,
                                                    sensitivity, per_call["initial"], rng))
            else:
                cut.values.append((cut.taxonomy.height, 0))
                cut.splits.append(None)

        set_steps: list[dict[str, Any]] = []
        ceiling = self.cell_ceiling(config, params)
        for _ in range(params.specializations):
            candidates: list[tuple] = []
            scores: list[float] = []
            sizes = [len(c.values) for c in cuts] + [len(c.values) for c in set_cuts]
            for i, cut in enumerate(cuts):
                for v in range(len(cut.values)):
                    child = self._children(cut, v, leaf[:, i])
                    if child is None:
                        continue
                    # Only set-valued splits can take a cut past what check_work bounded:
                    # then a relational split that would pass the ceiling is not a candidate
                    # (the sizes are earlier private outputs: post-processing).
                    if set_cuts and _cells_after(sizes, i, self._child_count(cut, v),
                                                 n_cls) > ceiling:
                        continue
                    mine = assign[:, i] == v
                    n_children = int(child.max()) + 1 if child.size else 1
                    table = _class_table(child[mine], classes[mine], counts[mine],
                                         max(n_children, 1), n_cls)
                    candidates.append(("relational", i, v))
                    scores.append(_score(table, params.score))
            for j, set_cut in enumerate(set_cuts):
                for node in set_cut.candidates():
                    groups = set_cut.groups(node, itemsets[j], set_assign[j])
                    group, mine = _cell_groups(groups, itemsets[j].n_sets, set_cell[:, j])
                    table = _class_table(group[mine], classes[mine], counts[mine],
                                         max(groups.parent.size, 1), n_cls)
                    candidates.append(("set", j, groups, group, mine))
                    scores.append(_score(table, params.score))
            if not candidates:
                break
            chosen = candidates[exponential_mechanism(rng, np.array(scores),
                                                      per_call["choice"], sensitivity)]
            if chosen[0] == "relational":
                _, i, v = chosen
                self._specialize(cuts[i], v, leaf[:, i], assign[:, i], classes, counts, n_cls,
                                 params, sensitivity, per_call["split"], rng)
                continue
            _, j, groups, group, mine = chosen
            group_counts = np.bincount(group[mine], weights=counts[mine],
                                       minlength=groups.parent.size).astype(np.int64)
            others = math.prod(sizes) // max(sizes[n_rel + j], 1) * n_cls
            step = set_cuts[j].specialize(groups, group_counts, per_call["split"],
                                          params.spurious_per_split, rng, set_assign[j],
                                          max_values=ceiling // max(others, 1))
            set_steps.append({"column": config.set_valued[j], **step})

        shape = [len(c.values) for c in cuts] + [len(c.values) for c in set_cuts]
        n_leaves = math.prod(shape)
        leaf_coords = [assign[:, i] for i in range(n_rel)] + [
            set_assign[j][set_cell[:, j]] for j in range(len(set_cuts))]
        partition = np.ravel_multi_index(tuple(leaf_coords), shape)
        true = np.bincount(partition * n_cls + classes, weights=counts,
                           minlength=n_leaves * n_cls).astype(np.int64)
        noisy = np.maximum(0, true + discrete_laplace(rng, per_call["leaves"], true.size))
        cell_index = np.repeat(np.arange(true.size), noisy)
        cell_index = cell_index[rng.permutation(cell_index.size)]
        part, cls = np.divmod(cell_index, n_cls)
        coords = np.unravel_index(part, shape)
        labels_of = [[cut.label(j) for j in range(len(cut.values))] for cut in cuts + set_cuts]
        table = {}
        for name, labels, coord in zip(predictors + config.set_valued, labels_of, coords,
                                       strict=True):
            table[name] = np.asarray(labels, dtype=object)[coord]
        table[class_column] = np.asarray(class_values, dtype=object)[cls]
        summary = {
            "leaf_partitions": n_leaves,
            "cut": dict(zip(predictors + config.set_valued, labels_of, strict=True)),
            "cells": int(true.size),
            "set_specializations": set_steps,
            "set_cuts": dict(zip(config.set_valued, set_cuts, strict=True)),
            "budget_steps_drawn": draws.close(),
        }
        return pd.DataFrame(table), summary

    def generalize(self, frame: pd.DataFrame, config: DatasetConfig,
                   details: dict[str, Any]) -> pd.DataFrame:
        """Map raw records to the released cut (to test a classifier trained on the release).

        ``details`` is the release's summary: relational values by their cut labels, item sets
        by replaying the recorded set-valued splits.
        """
        out = {}
        for name in config.dimensions:
            taxonomy = config.taxonomies[name]
            leaf = taxonomy.encode(frame[name])
            mapped = np.full(len(frame), "*", dtype=object)
            for label in details["cut"][name]:
                mapped[taxonomy.leaf_mask(label)[leaf]] = label
            out[name] = mapped
        for name, set_cut in details.get("set_cuts", {}).items():
            row_set, sets = encode_item_sets(frame[name], config.columns[name].separator or "",
                                             config.taxonomies[name])
            values = set_cut.replay(sets)
            labels = np.asarray([set_cut.label(v) for v in range(len(set_cut.values))],
                                dtype=object)
            out[name] = labels[values[row_set]]
        return pd.DataFrame(out)

    # -- helpers ---------------------------------------------------------------------------

    def _children(self, cut: _Cut, v: int, leaf: np.ndarray) -> np.ndarray | None:
        """Child index of every cell's leaf under cut value v (None if v cannot be split)."""
        if cut.numeric:
            lo, hi = cut.values[v]
            t = cut.splits[v]
            if lo == hi or t is None:
                return None
            return (leaf > t).astype(np.int64)
        level, code = cut.values[v]
        if level == 0:
            return None
        below = cut.taxonomy.level_codes[level - 1]
        under = np.flatnonzero(cut.taxonomy.level_codes[level] == code)
        kids = np.unique(below[under])
        lookup = np.full(cut.taxonomy.cardinality(level - 1), 0, dtype=np.int64)
        lookup[kids] = np.arange(kids.size)
        return lookup[below[leaf]]

    @staticmethod
    def _child_count(cut: _Cut, v: int) -> int:
        """How many values cut value ``v`` becomes when specialized (public: the taxonomy)."""
        if cut.numeric:
            return 2
        level, code = cut.values[v]
        under = cut.taxonomy.level_codes[level] == code
        return int(np.unique(cut.taxonomy.level_codes[level - 1][under]).size)

    def _specialize(self, cut: _Cut, v: int, leaf: np.ndarray, assign: np.ndarray,
                    classes: np.ndarray, counts: np.ndarray, n_cls: int, params: DiffGenParams,
                    sensitivity: float, eps_call: float, rng: np.random.Generator) -> None:
        mine = assign == v
        if cut.numeric:
            lo, hi = cut.values[v]
            t = int(cut.splits[v])
            parts = [(lo, t), (t + 1, hi)]
            new_ids = [v, len(cut.values)]
            cut.values[v] = parts[0]
            cut.values.append(parts[1])
            cut.splits.append(None)
            for (a, b), vid in zip(parts, new_ids, strict=True):
                cut.splits[vid] = self._split_point(leaf, classes, counts, a, b, n_cls, params,
                                                    sensitivity, eps_call, rng, assign=None)
            assign[mine & (leaf > t)] = new_ids[1]
            return
        level, code = cut.values[v]
        below = cut.taxonomy.level_codes[level - 1]
        under = np.flatnonzero(cut.taxonomy.level_codes[level] == code)
        kids = [int(k) for k in np.unique(below[under])]
        ids = [v] + [len(cut.values) + j for j in range(len(kids) - 1)]
        cut.values[v] = (level - 1, kids[0])
        for kid in kids[1:]:
            cut.values.append((level - 1, kid))
            cut.splits.append(None)
        lookup = np.full(cut.taxonomy.cardinality(level - 1), -1, dtype=np.int64)
        lookup[kids] = ids
        assign[mine] = lookup[below[leaf[mine]]]

    def _split_point(self, leaf: np.ndarray, classes: np.ndarray, counts: np.ndarray, lo: int,
                     hi: int, n_cls: int, params: DiffGenParams, sensitivity: float,
                     eps_call: float, rng: np.random.Generator, assign=None) -> int | None:
        """Exponential mechanism over the integer split points of [lo, hi] (None if one value)."""
        if hi <= lo:
            return None
        inside = (leaf >= lo) & (leaf <= hi)
        per_leaf = np.zeros((hi - lo + 1, n_cls))
        np.add.at(per_leaf, (leaf[inside] - lo, classes[inside]), counts[inside])
        scores = _split_scores(per_leaf, params.score)
        return lo + exponential_mechanism(rng, scores, eps_call, sensitivity)


def _per_call_epsilons(draws: StepDraws, params: DiffGenParams) -> dict[str, float]:
    """Each declared step taken once, shared evenly over the calls it covers."""
    out = {"initial": 0.0, "choice": 0.0, "split": 0.0}
    if params.n_numeric:
        out["initial"] = draws.take("initial split points").epsilon / params.n_numeric
    if params.specializations:
        out["choice"] = draws.take("specializations").epsilon / params.specializations
        out["split"] = (draws.take("split points / emptiness tests").epsilon
                        / params.specializations)
    out["leaves"] = draws.take("leaf counts").epsilon
    # A unit of m rows moves every score and count by at most m times one row's sensitivity
    # (one row at a time, triangle inequality): each call draws at eps / m.
    return {call: eps / params.unit_rows for call, eps in out.items()}


def _cell_groups(groups: ChildGroups, n_sets: int, set_cell: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Child group of every count cell under a set-valued candidate, and which cells it affects."""
    of_set = np.full(n_sets, -1, dtype=np.int64)
    of_set[groups.cells] = groups.group
    group = of_set[set_cell]
    return group, group >= 0


def _cells_after(sizes: list[int], column: int, children: int, n_classes: int) -> int:
    """Leaf cells once one value of ``column`` becomes ``children`` values."""
    grown = list(sizes)
    grown[column] += children - 1
    return math.prod(grown) * n_classes


def cut_growth(taxonomy: Taxonomy, rounds: int) -> list[int]:
    """An upper bound on one predictor's cut size after r = 0..rounds specializations of it.

    Numeric: each split adds one interval. Categorical: a specialization replaces a value by
    its children, adding (children - 1); the r largest such gains of the whole taxonomy bound
    any r specializations. Never more values than the taxonomy has leaves."""
    if taxonomy.kind == "numeric":
        gains = [1] * rounds
    else:
        gains = []
        for level in range(1, taxonomy.height + 1):
            pairs = np.unique(np.column_stack([taxonomy.level_codes[level],
                                               taxonomy.level_codes[level - 1]]), axis=0)
            gains += [int(k) - 1 for k in np.bincount(pairs[:, 0])]
        gains = sorted(gains, reverse=True)[:rounds]
        gains += [0] * (rounds - len(gains))
    out, size = [1], 1
    for gain in gains:
        size += gain
        out.append(min(size, taxonomy.n_leaves))
    return out


def leaf_partitions_bound(taxonomies: list[Taxonomy], specializations: int) -> int:
    """The most leaf partitions (the product of the predictors' cut sizes) that
    ``specializations`` rounds can reach, from the taxonomies only: the largest product over
    every way of sharing the rounds among the predictors (exact integers)."""
    best = [1] * (specializations + 1)  # best[r]: largest product with r rounds so far
    for taxonomy in taxonomies:
        growth = cut_growth(taxonomy, specializations)
        best = [max(growth[k] * best[r - k] for k in range(r + 1))
                for r in range(specializations + 1)]
    return max(best)
