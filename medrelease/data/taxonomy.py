"""Taxonomies: map every raw value of a dimension attribute to a label at each level.

Level 0 is the raw value, the last level is ``*``. A taxonomy is stored as integer code maps
(leaf code -> code at level l) so that a whole table can be generalized with one numpy gather
per attribute; labels are only looked up for the few codes that end up in a release.

Two file formats (ALGORITHMS.md §1):
* ARX-style CSV: one line per raw value, ``raw;level1;...;*``;
* YAML rules for integer attributes: a domain and, per level, an interval ``width`` (with an
  optional ``anchor``) or explicit ``cuts`` (interval starts).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import yaml

from medrelease.data.binning import (  # (SUPPRESSED, check_leaf_count: one definition each)
    SUPPRESSED,
    WHOLE,
    Binning,
    binned_leaves,
    check_leaf_count,
)
from medrelease.errors import InputValidationError, TaxonomyError, format_rows, position_numbers

# The policy's default limit on a taxonomy's leaves (max_taxonomy_leaves): a million decimal bins
# took 24 s to build here and five million minutes, all before the charge; a 5-digit zip code
# has 100,000 leaves, ICD-9 17,553.
DEFAULT_MAX_LEAVES = 200_000
NOT_WHOLE = "are not whole numbers written as digits (e.g. 34; no exponent, no fraction)"
INTERVAL = re.compile(r"^\[?(-?\d+)(?:-(-?\d+))?\]?$")  # "34" or "[20-29]"
TaxonomyKind = Literal["categorical", "numeric", "binned"]


@dataclass(frozen=True)
class Taxonomy:
    """One attribute's generalization hierarchy as code maps.

    ``level_codes[l][leaf_code]`` is the code of that leaf's ancestor at level ``l``;
    ``level_labels[l][code]`` its label; ``level_leaf_counts[l][code]`` how many leaves it covers.
    For numeric taxonomies ``level_bounds[l]`` holds the (low, high) integer bounds per code.
    """

    attribute: str
    kind: TaxonomyKind
    leaves: tuple
    level_codes: tuple[np.ndarray, ...]
    level_labels: tuple[tuple[str, ...], ...]
    level_leaf_counts: tuple[np.ndarray, ...]
    level_bounds: tuple[tuple[np.ndarray, np.ndarray], ...] | None = None
    source: str = ""
    binning: Binning | None = None   # kind "binned": decimals, top/bottom coding, missing leaf
    _leaf_index: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def height(self) -> int:
        """Index of the top level (``*``); the attribute contributes ``height + 1`` lattice levels."""
        return len(self.level_codes) - 1

    @property
    def n_leaves(self) -> int:
        return len(self.leaves)

    def cardinality(self, level: int) -> int:
        """Number of distinct generalized values at ``level``."""
        return len(self.level_labels[level])

    def ncp(self, level: int) -> np.ndarray:
        """Normalized certainty penalty per code at ``level``: leaves covered / all leaves, 0 for one leaf.

        For integer intervals this equals interval width / domain range (intervals are closed
        integer ranges, so ``[20-29]`` has width 10 in a domain of ``max - min + 1`` values).
        """
        counts = self.level_leaf_counts[level].astype(np.float64)
        return np.where(counts <= 1, 0.0, counts / self.n_leaves)

    def leaf_mask(self, label: str) -> np.ndarray:
        """Which leaves a released label stands for (all False for an unknown label).

        A label of any level matches its leaves; for numeric taxonomies an integer or an
        interval ``[lo-hi]`` that is not a level label (DiffGen's private split points) matches
        the leaves inside it. The one place released labels are read back.
        """
        for level in range(self.height + 1):
            labels = self.level_labels[level]
            if label in labels:
                return self.level_codes[level] == labels.index(label)
        interval = INTERVAL.match(label) if self.kind == "numeric" else None
        if interval is None:
            return np.zeros(self.n_leaves, dtype=bool)
        low = int(interval.group(1))
        high = int(interval.group(2) or low)
        values = np.asarray(self.leaves, dtype=np.int64)
        return (values >= low) & (values <= high)

    def labels(self, level: int) -> np.ndarray:
        """Labels of all codes at ``level`` as an object array (index with codes)."""
        return np.asarray(self.level_labels[level], dtype=object)

    def encode(self, values: pd.Series) -> np.ndarray:
        """Leaf codes for raw values; raises naming each kind of problem, its count and lines.

        Values are matched by their text for categorical taxonomies (so an integer column can use
        an ARX file such as Adult's age hierarchy), as integers for numeric ones, and by exact
        decimal binning for binned ones.
        """
        if self.kind == "numeric":
            return self._encode_numeric(values)
        if self.binning is not None:
            codes = self.binning.encode(values)
            if (codes < 0).any():
                self._raise_uncovered(values, codes < 0)
            return codes.astype(np.int32)
        text = values.astype("string")
        codes = pd.Categorical(text, categories=pd.Index(self.leaves, dtype="string")).codes
        bad = codes < 0
        if bad.any():
            self._raise_uncovered(values, bad)
        return codes.astype(np.int32)

    def _encode_numeric(self, values: pd.Series) -> np.ndarray:
        text = values.astype("string")
        whole = text.str.match(WHOLE.pattern).fillna(False).to_numpy(dtype=bool)
        not_whole = values.notna().to_numpy() & ~whole
        if not_whole.any():
            raise _value_error(self.attribute, values, not_whole, NOT_WHOLE, self.source)
        as_float = pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64)
        low, high = int(self.leaves[0]), int(self.leaves[-1])
        outside = (as_float < low) | (as_float > high) | ~np.isfinite(as_float)
        if outside.any():
            self._raise_uncovered(values, outside, f" (domain {low}..{high})")
        return (as_float - low).astype(np.int32)

    def _raise_uncovered(self, values: pd.Series, bad: np.ndarray, extra: str = "") -> None:
        raise _value_error(
            self.attribute, values, bad, f"are not covered by its taxonomy{extra}", self.source
        )


def _value_error(
    attribute: str, values: pd.Series, bad: np.ndarray, what: str, source: str
) -> InputValidationError:
    """Counts and file lines, never the values (those go to the problems, for the steward log)."""
    bad_rows = np.flatnonzero(bad)
    positions = values.index.to_numpy()[bad_rows]  # rows of the whole file, also in chunks
    offending = values.iloc[bad_rows].astype("string")
    n_values = int(offending.nunique(dropna=False))
    where = f" ({Path(source).name})" if source else ""
    problem = {"column": attribute, "problem": what, "rows": len(bad_rows),
               "distinct_values": n_values, "first_positions": position_numbers(positions),
               "values": offending.drop_duplicates().head(10).tolist()}
    message = (f"column {attribute!r}: {n_values} distinct value(s) {what}{where}, in "
               f"{len(bad_rows)} row(s), first at {format_rows(positions)}")
    return InputValidationError(message, [problem])


def from_leaf_paths(
    attribute: str,
    kind: TaxonomyKind,
    leaves: list,
    paths: list[list[str]],
    source: str = "",
    bounds: list[list[tuple[int, int]]] | None = None,
    binning: Binning | None = None,
) -> Taxonomy:
    """Build a taxonomy from each leaf's labels at levels 1..h, checking it is a proper tree.

    Checks: distinct leaves, the same number of levels for every leaf, a single ``*`` at the top,
    and one parent per label at every level (a label with two parents, or a cycle between labels,
    would make generalization ambiguous).
    """
    where = f" in {source}" if source else ""
    if not leaves:
        raise TaxonomyError(f"taxonomy for {attribute!r}{where} has no values")
    seen: dict = {}
    for i, leaf in enumerate(leaves):
        if leaf in seen:
            raise TaxonomyError(
                f"taxonomy for {attribute!r}{where}: value {leaf!r} appears twice "
                f"(lines {seen[leaf] + 1} and {i + 1}); each raw value needs exactly one line"
            )
        seen[leaf] = i
    depths = {len(p) for p in paths}
    if len(depths) != 1:
        counts = pd.Series([len(p) for p in paths]).value_counts()
        odd = next(i for i, p in enumerate(paths) if len(p) != counts.idxmax())
        raise TaxonomyError(
            f"taxonomy for {attribute!r}{where}: lines have different numbers of levels "
            f"(line {odd + 1} has {len(paths[odd]) + 1} fields, most have {counts.idxmax() + 1})"
        )
    depth = depths.pop()
    if depth == 0 or any(p[-1] != SUPPRESSED for p in paths):
        bad = next((i for i, p in enumerate(paths) if not p or p[-1] != SUPPRESSED), 0)
        raise TaxonomyError(
            f"taxonomy for {attribute!r}{where}: the last level must be '*' on every line "
            f"(line {bad + 1} ends with {paths[bad][-1] if paths[bad] else leaves[bad]!r})"
        )
    _check_tree(attribute, where, leaves, paths)

    n = len(leaves)
    level_codes = [np.arange(n, dtype=np.int32)]
    level_labels: list[tuple[str, ...]] = [tuple(_leaf_label(v) for v in leaves)]
    level_counts = [np.ones(n, dtype=np.int64)]
    level_bounds = None
    if bounds is not None:
        leaf_arr = np.asarray(leaves, dtype=np.int64)
        level_bounds = [(leaf_arr, leaf_arr)]
    for level in range(depth):
        labels = [p[level] for p in paths]
        codes, uniques = pd.factorize(pd.Series(labels, dtype=object), sort=False)
        level_codes.append(codes.astype(np.int32))
        level_labels.append(tuple(str(u) for u in uniques))
        level_counts.append(np.bincount(codes, minlength=len(uniques)).astype(np.int64))
        if bounds is not None and level_bounds is not None:
            lows = np.zeros(len(uniques), dtype=np.int64)
            highs = np.zeros(len(uniques), dtype=np.int64)
            for leaf_i, code in enumerate(codes):
                lows[code], highs[code] = bounds[leaf_i][level]
            level_bounds.append((lows, highs))
    return Taxonomy(
        attribute=attribute,
        kind=kind,
        leaves=tuple(leaves),
        level_codes=tuple(level_codes),
        level_labels=tuple(level_labels),
        level_leaf_counts=tuple(level_counts),
        level_bounds=tuple(level_bounds) if level_bounds is not None else None,
        source=source,
        binning=binning,
    )


def _leaf_label(value: object) -> str:
    return str(value)


def _check_tree(attribute: str, where: str, leaves: list, paths: list[list[str]]) -> None:
    """One parent per (level, label), and no cycle among labels across levels."""
    parents: dict[tuple[int, str], str] = {}
    edges: dict[str, set[str]] = {}
    for leaf, path in zip(leaves, paths, strict=True):
        chain = [_leaf_label(leaf), *path]
        for level in range(len(chain) - 1):
            child, parent = chain[level], chain[level + 1]
            key = (level, child)
            if level > 0 and key in parents and parents[key] != parent:
                raise TaxonomyError(
                    f"taxonomy for {attribute!r}{where}: {child!r} at level {level} has two "
                    f"parents, {parents[key]!r} and {parent!r}; a taxonomy must be a tree"
                )
            parents[key] = parent
            if child != parent:
                edges.setdefault(child, set()).add(parent)
    # A cycle (a label that is, through other labels, its own ancestor) makes levels meaningless.
    state: dict[str, int] = {}
    for start in list(edges):
        if state.get(start):
            continue
        stack = [(start, iter(edges.get(start, ())))]
        state[start] = 1
        while stack:
            node, children = stack[-1]
            nxt = next(children, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                raise TaxonomyError(
                    f"taxonomy for {attribute!r}{where}: cycle through {nxt!r} "
                    f"(a value is listed as its own ancestor)"
                )
            elif not state.get(nxt):
                state[nxt] = 1
                stack.append((nxt, iter(edges.get(nxt, ()))))


def load_arx_csv(path: Path, attribute: str, delimiter: str = ";",
                 max_leaves: int = DEFAULT_MAX_LEAVES) -> Taxonomy:
    """Read an ARX hierarchy file (``raw;level1;...;*``).

    Lines starting with ``#`` at the top are comments (``medrelease init`` marks a list of
    values it read from the data there, as in a domain file); further down, a line starting
    with ``#`` is a value, as ever."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TaxonomyError(f"cannot read taxonomy {path}: {exc}") from exc
    check_leaf_count(attribute, text.count("\n") + 1, max_leaves, str(path))
    lines = text.splitlines()
    header = 0
    while header < len(lines) and lines[header].lstrip().startswith("#"):
        header += 1
    rows = [line.rstrip("\r").split(delimiter) for line in lines[header:] if line.strip()]
    if not rows:
        raise TaxonomyError(f"taxonomy file {path} is empty")
    leaves = [r[0].strip() for r in rows]
    paths = [[c.strip() for c in r[1:]] for r in rows]
    return from_leaf_paths(attribute, "categorical", leaves, paths, source=str(path))


def numeric_levels(
    attribute: str, low: int, high: int, level_rules: list[dict], source: str = "",
    max_leaves: int = DEFAULT_MAX_LEAVES,
) -> Taxonomy:
    """Integer taxonomy from interval rules; every level must nest inside the next."""
    where = f" in {source}" if source else ""
    if high < low:
        raise TaxonomyError(f"taxonomy for {attribute!r}{where}: domain max {high} < min {low}")
    check_leaf_count(attribute, high - low + 1, max_leaves, source)
    values = np.arange(low, high + 1, dtype=np.int64)
    starts_per_level: list[np.ndarray] = []
    for i, rule in enumerate(level_rules, start=1):
        if rule == SUPPRESSED or rule == {"*": None}:
            raise TaxonomyError(
                f"taxonomy for {attribute!r}{where}: level {i}: '*' is added as the top level "
                f"automatically; list only the interval levels"
            )
        if not isinstance(rule, dict):
            raise TaxonomyError(
                f"taxonomy for {attribute!r}{where}: level {i} must be a mapping with 'width' "
                f"or 'cuts', got {rule!r}"
            )
        if "width" in rule:
            width = rule["width"]
            anchor = rule.get("anchor", low)
            if not isinstance(width, int) or width < 1:
                raise TaxonomyError(
                    f"taxonomy for {attribute!r}{where}: level {i} width must be a positive "
                    f"integer, got {width!r}"
                )
            starts = anchor + ((values - anchor) // width) * width
        elif "cuts" in rule:
            cuts = np.asarray(sorted(rule["cuts"]), dtype=np.int64)
            if len(cuts) == 0 or cuts[0] > low:
                raise TaxonomyError(
                    f"taxonomy for {attribute!r}{where}: level {i} cuts must start at or below "
                    f"the domain minimum {low}"
                )
            starts = cuts[np.searchsorted(cuts, values, side="right") - 1]
        else:
            raise TaxonomyError(
                f"taxonomy for {attribute!r}{where}: level {i} needs 'width' or 'cuts'"
            )
        starts_per_level.append(np.maximum(starts, low))
    nested = _nested_intervals(attribute, values, starts_per_level, low, high, source)
    if nested is not None:
        return nested
    # not nested: the generic tree check names the label with two parents
    paths: list[list[str]] = [[] for _ in values]
    bounds: list[list[tuple[int, int]]] = [[] for _ in values]
    for starts in starts_per_level:
        uniq = np.unique(starts)
        ends = np.append(uniq[1:] - 1, high)
        idx = np.searchsorted(uniq, starts)
        labels = [f"[{a}-{b}]" for a, b in zip(uniq.tolist(), ends.tolist(), strict=True)]
        for j, k in enumerate(idx.tolist()):
            paths[j].append(labels[k])
            bounds[j].append((int(uniq[k]), int(ends[k])))
    for j in range(len(values)):
        paths[j].append(SUPPRESSED)
        bounds[j].append((low, high))
    return from_leaf_paths(
        attribute, "numeric", values.tolist(), paths, source=source, bounds=bounds
    )


def _nested_intervals(attribute: str, values: np.ndarray, starts_per_level: list[np.ndarray],
                      low: int, high: int, source: str) -> Taxonomy | None:
    """The integer taxonomy ``from_leaf_paths`` builds from these interval starts, built from
    the arrays directly; None when a level does not nest inside the next (the caller then
    builds it the generic way, whose check names the label with two parents).

    The generic way loops over every leaf in Python: 0.8 s for a zipcode domain of 90,000
    values, paid by every run that loads such a config. Here a level's codes are its
    intervals in increasing order, which is the order ``from_leaf_paths`` numbers them in
    (the starts never decrease along the domain, so first appearance is sorted order); a
    nested level cannot form a cycle (each parent interval contains its child)."""
    n = len(values)
    level_codes = [np.arange(n, dtype=np.int32)]
    level_labels: list[tuple[str, ...]] = [tuple(str(v) for v in values.tolist())]
    level_counts = [np.ones(n, dtype=np.int64)]
    level_bounds = [(values, values)]
    for starts in starts_per_level:
        if np.any(np.diff(starts) < 0):
            return None
        uniq = np.unique(starts)
        ends = np.append(uniq[1:] - 1, high)
        codes = np.searchsorted(uniq, starts)
        level_codes.append(codes.astype(np.int32))
        level_labels.append(tuple(f"[{a}-{b}]" for a, b in
                                  zip(uniq.tolist(), ends.tolist(), strict=True)))
        level_counts.append(np.bincount(codes, minlength=len(uniq)).astype(np.int64))
        level_bounds.append((uniq.astype(np.int64), ends.astype(np.int64)))
    for child, parent in itertools.pairwise(level_codes[1:]):
        pairs = np.unique(child.astype(np.int64) * (int(parent.max()) + 1) + parent)
        if len(pairs) != int(child.max()) + 1:  # a child interval with two parents
            return None
    level_codes.append(np.zeros(n, dtype=np.int32))
    level_labels.append((SUPPRESSED,))
    level_counts.append(np.array([n], dtype=np.int64))
    level_bounds.append((np.array([low], dtype=np.int64), np.array([high], dtype=np.int64)))
    return Taxonomy(attribute=attribute, kind="numeric", leaves=tuple(values.tolist()),
                    level_codes=tuple(level_codes), level_labels=tuple(level_labels),
                    level_leaf_counts=tuple(level_counts), level_bounds=tuple(level_bounds),
                    source=source)


BINNED_KEYS = ("resolution", "top_code", "bottom_code", "missing")


def load_yaml_rules(path: Path, attribute: str, max_leaves: int = DEFAULT_MAX_LEAVES
                    ) -> Taxonomy:
    """Read a YAML numeric taxonomy: ``domain: {min, max}`` and ``levels: [{width|cuts}, ...]``,
    optionally with ``resolution``, ``top_code``, ``bottom_code`` or ``missing`` (binning.py)."""
    try:
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise TaxonomyError(f"cannot read taxonomy {path}: {type(exc).__name__}") from None
    if not isinstance(spec, dict) or "domain" not in spec or "levels" not in spec:
        raise TaxonomyError(
            f"taxonomy {path}: expected a mapping with 'domain: {{min, max}}' and 'levels'"
        )
    if not isinstance(spec["domain"], dict):
        raise TaxonomyError(f"taxonomy {path}: 'domain' must be a mapping {{min, max}}")
    if any(key in spec for key in BINNED_KEYS):
        binned = binned_leaves(attribute, spec, source=str(path), max_leaves=max_leaves)
        return from_leaf_paths(attribute, "binned", binned.labels, binned.paths,
                               source=str(path), binning=binned.binning)
    domain = spec["domain"]
    try:
        low, high = int(domain["min"]), int(domain["max"])
    except (KeyError, TypeError, ValueError) as exc:
        raise TaxonomyError(f"taxonomy {path}: domain needs integer 'min' and 'max'") from exc
    levels = spec["levels"] or []
    if not isinstance(levels, list):
        raise TaxonomyError(f"taxonomy {path}: 'levels' must be a list")
    return numeric_levels(attribute, low, high, levels, source=str(path), max_leaves=max_leaves)


def load_taxonomy(path: Path, attribute: str, max_leaves: int = DEFAULT_MAX_LEAVES) -> Taxonomy:
    """Load by file extension: ``.csv`` (ARX) or ``.yaml``/``.yml`` (numeric rules); refuse
    one with more than ``max_leaves`` leaves before building it."""
    if not path.exists():
        raise TaxonomyError(f"taxonomy file for {attribute!r} not found: {path}")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return load_arx_csv(path, attribute, max_leaves=max_leaves)
    if suffix in (".yaml", ".yml"):
        return load_yaml_rules(path, attribute, max_leaves)
    raise TaxonomyError(f"taxonomy {path}: unknown format {suffix!r} (use .csv or .yaml)")
