"""What the steward declares about the released table beyond its columns: the analyses
researchers need and the combinations of values no real row holds (``analyses:`` and
``impossible:`` in the dataset config, docs/NEW-DATASET.md).

Both are public (written by the steward, never read from the data). This module turns them
into what the engine works with: an analysis's levels checked against the taxonomies, and an
impossible combination as one boolean mask over each column's leaves, so that a synthetic
row (leaf codes) or a released row (labels of any taxonomy level) is tested with one gather
per column.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from medrelease.data.config import AnalysisSpec, DatasetConfig, ImpossibleSpec
from medrelease.data.taxonomy import Taxonomy
from medrelease.errors import ConfigError


def column_taxonomy(config: DatasetConfig, column: str) -> Taxonomy | None:
    """The taxonomy a released column's labels come from (a dimension's, or the informative
    column's optional one)."""
    if column in config.dimensions:
        return config.taxonomies[column]
    if column in config.informative:
        return config.informative_taxonomy
    return None


def analysis_problems(config: DatasetConfig) -> list[str]:
    """Every declared analysis whose levels the taxonomies cannot give, one sentence each
    (``check`` lists them; a release refuses them before anything is spent)."""
    problems = []
    for analysis in config.analyses:
        for column in analysis.columns:
            level = analysis.level_of(column)
            if not level:
                continue
            taxonomy = column_taxonomy(config, column)
            if taxonomy is None:
                problems.append(f"analysis {analysis.name}: column {column!r} has no taxonomy, "
                                f"so it has no level {level} (use level 0, its values)")
            elif level >= taxonomy.height:
                problems.append(f"analysis {analysis.name}: column {column!r} has levels 0 to "
                                f"{taxonomy.height - 1} below '*' (its taxonomy "
                                f"{taxonomy.source or column}); level {level} releases nothing")
    return problems


def analysis_levels(analysis: AnalysisSpec) -> tuple[int, ...]:
    return tuple(analysis.level_of(c) for c in analysis.columns)


def label_leaves(config: DatasetConfig, column: str, leaf_labels: Sequence[str],
                 label: str) -> np.ndarray:
    """Which of the column's leaves (``leaf_labels``, the engine's order) a label stands for:
    a leaf itself, or a label of any level of the column's taxonomy (all False if neither)."""
    labels = [str(v) for v in leaf_labels]
    direct = np.array([v == label for v in labels], dtype=bool)
    if direct.any():
        return direct
    taxonomy = column_taxonomy(config, column)
    if taxonomy is None:
        return direct
    under = taxonomy.leaf_mask(label)
    if not under.any():
        return direct
    covered = {str(leaf) for leaf, inside in zip(taxonomy.level_labels[0], under, strict=True)
               if inside}
    return np.array([v in covered for v in labels], dtype=bool)


@dataclass(frozen=True)
class ImpossibleCombos:
    """The declared impossible combinations, each as a leaf mask per column it names."""

    combos: tuple[dict[str, np.ndarray], ...]
    reasons: tuple[str, ...]
    leaf_labels: Mapping[str, tuple[str, ...]]

    @classmethod
    def resolve(cls, config: DatasetConfig, leaf_labels: Mapping[str, Sequence[str]],
                strict: bool = True) -> ImpossibleCombos:
        """``leaf_labels``: each released column's leaves as the engine orders them. A value
        that is neither a leaf nor a taxonomy label of its column is a config error (the value
        comes from the config, so naming it reveals nothing of the data) — checked before
        anything is spent on the public leaves (``public_leaf_labels``); with ``strict``
        False (an informative column whose values come from the data) such a value matches
        nothing."""
        combos, reasons = [], []
        labels = {c: tuple(str(v) for v in values) for c, values in leaf_labels.items()}
        for spec in config.impossible:
            masks = {}
            for column, values in spec.when.items():
                if column not in labels:
                    raise ConfigError(f"impossible combination {sorted(spec.when)}: column "
                                      f"{column!r} is not released by this mechanism")
                mask = np.zeros(len(labels[column]), dtype=bool)
                for value in values:
                    hit = label_leaves(config, column, labels[column], value)
                    if not hit.any() and strict:
                        raise ConfigError(
                            f"impossible combination {sorted(spec.when)}: {value!r} is not a "
                            f"value or taxonomy label of column {column!r}")
                    mask |= hit
                masks[column] = mask
            combos.append(masks)
            reasons.append(spec.reason or describe(spec))
        return cls(tuple(combos), tuple(reasons), labels)

    def __bool__(self) -> bool:
        return bool(self.combos)

    def leaf_rows(self, codes: Mapping[str, np.ndarray]) -> np.ndarray:
        """Rows given as leaf codes per column (a synthetic sample) that hold an impossible
        combination."""
        size = len(next(iter(codes.values()))) if codes else 0
        out = np.zeros(size, dtype=bool)
        for masks in self.combos:
            hit = np.ones(size, dtype=bool)
            for column, mask in masks.items():
                hit &= mask[np.asarray(codes[column], dtype=np.int64)]
            out |= hit
        return out

    def label_rows(self, config: DatasetConfig, frame: pd.DataFrame) -> np.ndarray:
        """Released rows (labels of any level) whose every named value lies wholly inside an
        impossible combination: a generalized label that also covers possible values is not
        impossible. Counted per distinct label, never per row."""
        out = np.zeros(len(frame), dtype=bool)
        for masks in self.combos:
            if any(column not in frame.columns for column in masks):
                continue
            hit = np.ones(len(frame), dtype=bool)
            for column, mask in masks.items():
                codes, uniques = pd.factorize(frame[column].astype(str))
                inside = np.array([_within(config, column, self.leaf_labels[column], mask,
                                           str(u)) for u in uniques], dtype=bool)
                hit &= inside[codes] if len(uniques) else np.zeros(len(frame), dtype=bool)
            out |= hit
        return out


def _within(config: DatasetConfig, column: str, leaves: Sequence[str], mask: np.ndarray,
            label: str) -> bool:
    covered = label_leaves(config, column, leaves, label)
    return bool(covered.any()) and bool(mask[covered].all())


def describe(spec: ImpossibleSpec) -> str:
    """The combination in words, e.g. ``status in {0} with cause in {cancer, heart}``."""
    return " with ".join(f"{c} in {{{', '.join(v)}}}" for c, v in spec.when.items())


def impossible_for(config: DatasetConfig, leaf_labels: Mapping[str, Sequence[str]]
                   ) -> ImpossibleCombos | None:
    """The config's impossible combinations over these columns, or None when it declares none
    (values already checked against the public leaves before the charge)."""
    if not config.impossible:
        return None
    return ImpossibleCombos.resolve(config, leaf_labels, strict=False)


def public_leaf_labels(config: DatasetConfig) -> dict[str, tuple[str, ...]]:
    """The released columns' leaves known before the data is read: every dimension's taxonomy
    leaves, and the informative column's declared domain (when it has one)."""
    out = {c: tuple(str(v) for v in config.taxonomies[c].level_labels[0])
           for c in config.dimensions}
    domain = config.informative_domain
    if domain is not None:
        out[config.informative[0]] = tuple(domain)
    return out


def impossible_problems(config: DatasetConfig) -> list[str]:
    """Declared impossible combinations whose values are not labels of their columns (the
    public ones), one sentence each: ``check`` lists them, a release refuses them first."""
    labels = public_leaf_labels(config)
    problems = []
    for spec in config.impossible:
        for column, values in spec.when.items():
            if column not in labels:
                continue
            for value in values:
                if not label_leaves(config, column, labels[column], value).any():
                    problems.append(f"impossible combination {sorted(spec.when)}: {value!r} "
                                    f"is not a value or taxonomy label of column {column!r}")
    return problems
