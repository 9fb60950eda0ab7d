"""Error bars for an ``aim`` release, from its DP outputs only (AIM, McKenna et al., VLDB 2022,
§5 "uncertainty quantification", adapted to taxonomy levels and merged rare values).

What is read: the noisy measurements (``AIMState.one_way_noisy``, ``AIMState.noisy``), their
sigmas, each round's public selection facts (``RoundRecord``: eligible candidates, sensitivity,
epsilon, the selected weight, the fit gap of the noisy vector to the previous model), the model
before the last measurement (``AIMState.previous_model``), the merges (decided from round 0's
noisy counts), the taxonomies' code maps, and the released rows. Never the true marginals
(``run.answers``), the count table (``run.space.codes`` / ``weights``) or a score, so every bound
below is post-processing of DP outputs and may be published.

Notation: ``c = sqrt(2/pi)`` (E|N(0, 1)|) and, for independent N(0, s_i^2) noises,

    G(s, f) = c * sum_i s_i + ||s||_2 * sqrt(2 ln(1/f)),

which bounds their L1 norm with probability >= 1 - f: the L1 norm is ||s||_2-Lipschitz in the
standard normal vector, so Gaussian concentration (Tsirelson-Ibragimov-Sudakov) applies; with
one sigma it is ``sigma (n c + sqrt(2 n ln(1/f)))``. The noise actually added is the discrete
Gaussian N_Z(0, sigma^2) (variance <= sigma^2, sub-Gaussian with parameter sigma; CKS 2020):
treating it as N(0, sigma^2) here is an approximation that the coverage benchmark checks.
Each bound holds with probability >= ``level`` on its own (failure lambda = 1 - level, split
by a union bound between the events it uses); they do not hold simultaneously.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import pandas as pd

from medrelease.privacy.randomness import noise_epsilon
from medrelease.synthetic import pgm
from medrelease.synthetic.aim_rounds import EXPECTED_ABS, AIMRounds
from medrelease.synthetic.axis_sums import marginal_of_subset, sum_axis
from medrelease.synthetic.space import Columns

LEAF = -1  # a measurement's level for round 0's leaf-level vectors (before merging)
SEP = " × "


# -- the measurements, published ---------------------------------------------------------------

def measurements_frame(run: AIMRounds) -> pd.DataFrame:
    """Every cell of every measurement, long format: ``round`` (0 for the 1-way marginals of
    round 0), ``marginal`` (columns joined by " × "), ``levels`` ("0,1"), ``sigma``, one column
    per released attribute with the cell's label at the measured level (null where the attribute
    is not in the marginal), and ``noisy_count`` (int64: discrete Gaussian on integer counts).

    Round 0 is published as measured: at the leaves, with leaf labels (its re-expression on
    merged values is derived, and not published). Later rounds count rows on the merged values:
    a merged group is labelled "<parent> (rare)"."""
    state = run.state
    names = run.space.names
    blocks: list[tuple[int, Columns, tuple[int, ...], float, np.ndarray, list]] = []
    categories = [_categories(run, c) for c in range(len(names))]
    sigma0 = float(state.measurements[0].stddev) if state.measurements else 0.0
    for c, noisy in enumerate(state.one_way_noisy):
        labels = run.leaves[c].leaf_labels
        blocks.append((0, (c,), (0,), sigma0, noisy, [labels]))
    for record, noisy in zip(state.records, state.noisy, strict=True):
        columns = tuple(names.index(n) for n in record.columns)
        labels = [run.space.attributes[c].level_labels[lv]
                  for c, lv in zip(columns, record.levels, strict=True)]
        blocks.append((record.round, columns, tuple(record.levels), record.sigma, noisy, labels))
    size = sum(int(b[4].size) for b in blocks)
    codes = {c: np.full(size, -1, dtype=np.int64) for c in range(len(names))}
    rounds = np.empty(size, dtype=np.int64)
    sigmas = np.empty(size, dtype=np.float64)
    counts = np.empty(size, dtype=np.int64)
    marginal_codes = np.empty(size, dtype=np.int64)
    levels_codes = np.empty(size, dtype=np.int64)
    marginals: dict[str, int] = {}
    level_strings: dict[str, int] = {}
    start = 0
    for number, columns, levels, sigma, noisy, labels in blocks:
        n = int(noisy.size)
        part = slice(start, start + n)
        shape = tuple(len(lab) for lab in labels)
        cells = np.unravel_index(np.arange(n), shape)
        for c, lab, index in zip(columns, labels, cells, strict=True):
            lookup = np.array([categories[c][1][x] for x in lab], dtype=np.int64)
            codes[c][part] = lookup[index]
        rounds[part], sigmas[part] = number, sigma
        counts[part] = np.asarray(noisy, dtype=np.int64).reshape(-1)
        marginal = SEP.join(names[c] for c in columns)
        marginal_codes[part] = marginals.setdefault(marginal, len(marginals))
        level = ",".join(str(lv) for lv in levels)
        levels_codes[part] = level_strings.setdefault(level, len(level_strings))
        start += n
    frame = {"round": rounds,
             "marginal": pd.Categorical.from_codes(marginal_codes, categories=list(marginals)),
             "levels": pd.Categorical.from_codes(levels_codes, categories=list(level_strings)),
             "sigma": sigmas}
    for c, name in enumerate(names):
        frame[name] = pd.Categorical.from_codes(codes[c], categories=categories[c][0])
    frame["noisy_count"] = counts
    return pd.DataFrame(frame)


def _categories(run: AIMRounds, column: int) -> tuple[list[str], dict[str, int]]:
    """An attribute's labels at every level, leaves and merged values (distinct, in order)."""
    index: dict[str, int] = {}
    for label in run.leaves[column].leaf_labels:
        index.setdefault(label, len(index))
    for labels in run.space.attributes[column].level_labels:
        for label in labels:
            index.setdefault(label, len(index))
    return list(index), index


# -- the bounds --------------------------------------------------------------------------------

@dataclass(frozen=True)
class MarginalBound:
    """A high-probability bound on how far a marginal of the released rows is from the
    source's: ``l1_bound`` on the L1 distance of the count vectors (at the marginal's levels, on
    the released attributes' values), ``tvd_bound = min(1, l1_bound / R)`` on the total variation
    distance of the two distributions. ``target``: "workload" (a workload marginal) or
    "measurement" (a marginal a round measured, at its levels)."""

    columns: tuple[str, ...]
    levels: tuple[int, ...]
    basis: str  # "measured" / "selection" / "none"
    l1_bound: float | None
    tvd_bound: float
    reason: str
    level: float = 0.95
    target: str = "workload"

    def statement(self) -> str:
        what = f"the {SEP.join(self.columns)} marginal"
        if any(self.levels):
            what += f" (levels {','.join(str(lv) for lv in self.levels)})"
        if self.basis == "none":
            return f"{what} of these rows: no bound ({self.reason})"
        return (f"{what} of these rows is within {self.tvd_bound:.3g} of the source's (total "
                f"variation distance), with {self.level:.0%} confidence")

    def as_dict(self) -> dict:
        return {"columns": list(self.columns), "levels": list(self.levels), "basis": self.basis,
                "l1_bound": None if self.l1_bound is None else float(self.l1_bound),
                "tvd_bound": float(self.tvd_bound), "reason": self.reason,
                "level": float(self.level), "target": self.target,
                "statement": self.statement()}


def bounds_summary(bounds: Sequence[MarginalBound]) -> dict:
    """The bounds as JSON: the confidence level, what a bound says, and every bound."""
    level = bounds[0].level if bounds else 0.95
    return {
        "level": level,
        "statement": (f"each bound holds with probability at least {level:.0%} on its own (not "
                      "for all marginals at once): the total variation distance between the "
                      "marginal distribution of the released rows and the source's, at the "
                      "marginal's taxonomy levels, is at most tvd_bound. Computed from the DP "
                      "measurements, the selections and the released rows only."),
        "informative": sum(1 for b in bounds if b.tvd_bound < 1),
        "bounds": [b.as_dict() for b in bounds],
    }


def marginal_bounds(run: AIMRounds, released_codes: dict[str, np.ndarray],
                    workload: Iterable, level: float = 0.95) -> list[MarginalBound]:
    """A bound for every workload marginal (leaf level), then for every marginal a round measured
    at its own levels (where the fine one drowns in noise, these are what one can rely on).

    ``released_codes``: leaf codes per attribute of the released rows (``run.synthesize``'s);
    ``workload``: attribute index tuples (or ``run.workload``'s (columns, weight) pairs).

    **From L1 to TVD.** For count vectors a (source, sum N) and b (released, sum R),
    2 TVD = ||a/N - b/R||_1 <= ||a - b||_1 / R + ||a||_1 |1/N - 1/R| = (||a - b||_1 + |N - R|) / R
    <= 2 ||a - b||_1 / R, since |N - R| = |sum(a - b)| <= ||a - b||_1. So TVD <= B / R.

    **Measured** (r inside the clique of a measurement whose levels are at or below r's on r's
    columns; round 0's leaf vectors measure every 1-way marginal): each such measurement, summed
    to r (a cell of the result adds k measured cells: variance k sigma^2), combined cell by cell
    by inverse-variance weighting into y_bar with per-cell sigma_bar. Then ||M_r(D) - y_bar||_1
    <= G(sigma_bar, lambda) and B = ||M_r(released) - y_bar||_1 + G(sigma_bar, lambda).

    **Selection** (r at the leaves, not measured, and (r, levels 0) was among the last round T's
    eligible candidates C_T): the exponential mechanism draws with probability
    ∝ exp(eps' q / (2 Delta)) (eps' the sampler's rational eps_T, Delta the largest weight in
    C_T), with q_r = w_r (||M_r(D) - M_r(p_{T-1})||_1 - c sigma'_T n_r) (sigma'_T the planned,
    pre-grid sigma, as the quality uses it). P(q_sel <= q_r - alpha) <= |C_T| exp(-eps' alpha /
    (2 Delta)) = lambda/2 for alpha = (2 Delta / eps') ln(2 |C_T| / lambda). The measurement y_T
    of the selected marginal gives q_sel <= w_sel (g_T + G(sigma_T, n_sel, lambda/2)
    - c sigma'_T n_sel), g_T = ||y_T - M_sel(p_{T-1})||_1, with probability >= 1 - lambda/2.
    Hence, with probability >= 1 - lambda, ||M_r(D) - M_r(p_{T-1})||_1 <= (w_sel (g_T + G
    - c sigma'_T n_sel) + alpha) / w_r + c sigma'_T n_r, and B = that + ||M_r(p_{T-1}) -
    M_r(released)||_1 (triangle inequality).

    **Merged values back to leaves.** Both bases above bound the L1 distance on the merged
    values (the rounds' domain) when a column of r is at level 0 and has merged groups; coarser
    levels map a group as its leaves, so there nothing changes. For one merged cell G (a set of
    leaf cells, a and b the source and released counts in it, A and B their sums):
    ||a_G - b_G||_1 <= A + B = |A - B| + 2 min(A, B) <= |A - B| + 2 B. Summed over the cells, the
    leaf-level L1 <= the merged-level L1 + 2 x (released rows whose value in some level-0 column
    of r lies in a merged group of two or more leaves).

    **None**: neither applies (the fine marginal was never a candidate, larger than the
    model-size limit or ``max_cells``, or not eligible in the last round): tvd_bound 1."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    bars = _ErrorBars(run, released_codes, level)
    out = []
    seen = set()
    for columns in _workload_sets(workload):
        key = (columns, (0,) * len(columns))
        if key not in seen:
            seen.add(key)
            out.append(bars.workload_bound(columns))
    names = run.space.names
    for record in run.state.records:
        columns = tuple(names.index(n) for n in record.columns)
        key = (columns, tuple(record.levels))
        if key not in seen:
            seen.add(key)
            out.append(bars.measured_bound(columns, tuple(record.levels), "measurement"))
    return out


def _workload_sets(workload: Iterable) -> list[Columns]:
    out = []
    for entry in workload:
        columns = entry[0] if (len(entry) == 2 and isinstance(entry[0], tuple)) else entry
        out.append(tuple(sorted(int(c) for c in columns)))
    return out


def noise_l1(sigmas: np.ndarray, failure: float) -> float:
    """G: an L1 bound on independent N(0, sigmas_i^2) noises, holding w.p. >= 1 - failure."""
    s = np.asarray(sigmas, dtype=np.float64).reshape(-1)
    return float(EXPECTED_ABS * s.sum() + math.sqrt((s * s).sum()) * math.sqrt(
        2 * math.log(1 / failure)))


@dataclass
class _Measured:
    round: int
    columns: Columns            # attribute indices, ascending
    levels: tuple[int, ...]     # LEAF for round 0 (before merging), else merged-domain levels
    noisy: np.ndarray           # shaped
    sigma: float


class _ErrorBars:
    """One release's bounds: the measurements, code maps and released codes, prepared once."""

    def __init__(self, run: AIMRounds, released_codes: dict[str, np.ndarray], level: float):
        self.run, self.level, self.failure = run, level, 1.0 - level
        space, state = run.space, run.state
        self.attributes = space.attributes  # merged domains (public: from round 0's output)
        self.names = space.names
        d = len(self.names)
        self.leaf_to_merged = [np.arange(run.leaves[c].size, dtype=np.int64) for c in range(d)]
        self.group_size = [np.ones(a.size, dtype=np.int64) for a in self.attributes]
        for merge in run.merges:
            mapping = np.empty(sum(m.size for m in merge.members), dtype=np.int64)
            for code, members in enumerate(merge.members):
                mapping[members] = code
            self.leaf_to_merged[merge.column] = mapping
            self.group_size[merge.column] = np.array([m.size for m in merge.members])
        merged = {merge.column for merge in run.merges}
        self.released = {c: (self.leaf_to_merged[c][np.asarray(released_codes[n], dtype=np.int64)]
                             if c in merged else np.asarray(released_codes[n], dtype=np.int64))
                         for c, n in enumerate(self.names)}
        self._released_fine: dict[Columns, np.ndarray] = {}
        self.rows = len(next(iter(released_codes.values()))) if released_codes else 0
        # candidates by (columns, levels) and the last round's eligible, looked up once per
        # workload set (a scan per set was 3,300 x 9,000 on a 40-column table: 10 s)
        self._candidate_index = {(cand.columns, cand.levels): i
                                 for i, cand in reversed(list(enumerate(run.candidates)))}
        self._last_eligible = set(state.last_eligible)
        sigma0 = float(state.measurements[0].stddev) if state.measurements else 0.0
        self.measured = [_Measured(0, (c,), (LEAF,), np.asarray(y), sigma0)
                         for c, y in enumerate(state.one_way_noisy)]
        for record, noisy in zip(state.records, state.noisy, strict=True):
            columns = tuple(self.names.index(n) for n in record.columns)
            shape = tuple(self.attributes[c].cardinality(lv)
                          for c, lv in zip(columns, record.levels, strict=True))
            self.measured.append(_Measured(record.round, columns, tuple(record.levels),
                                           np.asarray(noisy).reshape(shape), record.sigma))

    # -- code maps ----------------------------------------------------------------------------
    def code_map(self, column: int, source: int, target: int) -> np.ndarray:
        """Codes at level ``source`` (LEAF: before merging) -> codes at ``target`` (merged)."""
        attribute = self.attributes[column]
        if source == LEAF:
            return attribute.level_maps[target][self.leaf_to_merged[column]]
        out = np.zeros(attribute.cardinality(source), dtype=np.int64)
        out[attribute.level_maps[source]] = attribute.level_maps[target]
        return out

    def released_marginal(self, columns: Columns, levels: tuple[int, ...]) -> np.ndarray:
        """The released rows' counts at ``levels``: summed from their merged-leaf marginal."""
        out = self._released_leaves(columns)
        for axis, (c, lv) in enumerate(zip(columns, levels, strict=True)):
            attribute = self.attributes[c]
            groups = attribute.level_maps[lv]
            if lv or not np.array_equal(groups, np.arange(groups.size)):  # (a domain's level 0
                # may number the leaves in its taxonomy's order: code_map reads it so too)
                out = sum_axis(out, axis, groups, attribute.cardinality(lv))
        return out

    def _released_leaves(self, columns: Columns) -> np.ndarray:
        """The released rows' counts on the merged leaves of ``columns``: summed from a
        superset's table already made when it has fewer cells than there are rows (cheaper
        than a pass over the rows), else counted; kept when it is such a table. Whole
        numbers: the same either way."""
        if columns in self._released_fine:
            return self._released_fine[columns]
        shape = tuple(self.attributes[c].size for c in columns)
        # the kept tables one column larger (the workload's sets and their subsets: a larger
        # one holds one of them with no more cells; a scan of every table kept was quadratic)
        supersets = [s for s in (tuple(sorted((*columns, a))) for a in range(len(self.names))
                                 if a not in columns)
                     if s in self._released_fine and self._released_fine[s].size < self.rows]
        if supersets:
            source = min(supersets, key=lambda s: self._released_fine[s].size)
            table = marginal_of_subset(self._released_fine[source], source, columns)
        else:
            flat = np.zeros(self.rows, dtype=np.int64)
            for c, size in zip(columns, shape, strict=True):
                flat = flat * size + self.released[c]
            table = np.bincount(flat, minlength=math.prod(shape)).astype(np.float64).reshape(shape)
        if table.size < self.rows:  # kept only where it can serve a subset (memory)
            self._released_fine[columns] = table
        return table

    def merged_rows(self, columns: Columns, levels: tuple[int, ...]) -> int:
        """Released rows whose value in a level-0 column lies in a group of >= 2 leaves."""
        inside = np.zeros(self.rows, dtype=bool)
        for c, lv in zip(columns, levels, strict=True):
            if lv == 0 and (self.group_size[c] > 1).any():
                inside |= self.group_size[c][self.released[c]] > 1
        return int(inside.sum())

    def project(self, m: _Measured, columns: Columns, levels: tuple[int, ...]
                ) -> tuple[np.ndarray, np.ndarray]:
        """A measurement summed to (columns, levels): the noisy marginal and, per cell, how many
        measured cells it adds (its noise variance is that times sigma^2)."""
        values = m.noisy.astype(np.float64)
        ones = np.ones_like(values)
        axis = 0
        for c, lv in zip(m.columns, m.levels, strict=True):
            if c not in columns:
                values, ones = values.sum(axis=axis), ones.sum(axis=axis)
                continue
            target = levels[columns.index(c)]
            groups = self.code_map(c, lv, target) if lv != target else None
            size = self.attributes[c].cardinality(target)
            if groups is not None and not (groups.size == size
                                           and np.array_equal(groups, np.arange(size))):
                values = sum_axis(values, axis, groups, size)
                ones = sum_axis(ones, axis, groups, size)
            axis += 1
        return values, ones

    def supports(self, columns: Columns, levels: tuple[int, ...]) -> list[_Measured]:
        out = []
        for m in self.measured:
            if not set(columns) <= set(m.columns):
                continue
            if all(m.levels[m.columns.index(c)] <= lv for c, lv in zip(columns, levels,
                                                                          strict=True)):
                out.append(m)
        return out

    # -- bounds -------------------------------------------------------------------------------
    def bound(self, columns: Columns, levels: tuple[int, ...], basis: str, merged_l1: float,
              reason: str, target: str) -> MarginalBound:
        extra = self.merged_rows(columns, levels)
        l1 = merged_l1 + 2 * extra
        if extra:
            reason += f"; + 2 x {extra} released rows in merged groups (leaf level)"
        tvd = min(1.0, l1 / self.rows) if self.rows else 1.0
        return MarginalBound(tuple(self.names[c] for c in columns), levels, basis, l1, tvd,
                             reason, self.level, target)

    def measured_bound(self, columns: Columns, levels: tuple[int, ...], target: str
                       ) -> MarginalBound | None:
        found = self.supports(columns, levels)
        if not found:
            return None
        precision = 0.0
        weighted = 0.0
        for m in found:
            values, cells = self.project(m, columns, levels)
            inverse = 1.0 / (cells * m.sigma ** 2)
            precision = precision + inverse
            weighted = weighted + values * inverse
        y_bar = weighted / precision
        sigma_bar = 1.0 / np.sqrt(precision)
        residual = float(np.abs(self.released_marginal(columns, levels) - y_bar).sum())
        noise = noise_l1(sigma_bar, self.failure)
        rounds = sorted({m.round for m in found})
        reason = (f"measured in round(s) {', '.join(map(str, rounds))}: |released - noisy| "
                  f"{residual:.1f} + noise bound {noise:.1f} (sigma_bar "
                  f"{float(sigma_bar.mean()):.2f} per cell on average)")
        return self.bound(columns, levels, "measured", residual + noise, reason, target)

    def workload_bound(self, columns: Columns) -> MarginalBound:
        levels = (0,) * len(columns)
        measured = self.measured_bound(columns, levels, "workload")
        if measured is not None:
            return measured
        selected = self.selection_bound(columns)
        if isinstance(selected, MarginalBound):
            return selected
        return MarginalBound(tuple(self.names[c] for c in columns), levels, "none", None, 1.0,
                             selected, self.level, "workload")

    def selection_bound(self, columns: Columns) -> MarginalBound | str:
        """The last round's selection bound, or why there is none."""
        run, state = self.run, self.run.state
        if not state.records or state.previous_model is None:
            return "no round after round 0 selected a marginal"
        levels = (0,) * len(columns)
        index = self._candidate_index.get((columns, levels))
        if index is None:
            return ("never a candidate: its clique exceeds the model-size limit or its cells "
                    "max_cells")
        if index not in self._last_eligible:
            return "not among the last round's eligible candidates (model-size limit)"
        record = state.records[-1]
        lam = self.failure
        weight = run.candidates[index].weight
        eps = noise_epsilon(record.selection_epsilon)
        alpha = 2 * record.sensitivity / eps * math.log(2 * record.candidates / lam)
        noise = noise_l1(np.full(record.cells, record.sigma), lam / 2)
        expected = EXPECTED_ABS * record.planned_sigma
        cells = self.run.space.cells(columns)
        quality = record.weight * (record.fit_gap + noise - expected * record.cells)
        model_l1 = (quality + alpha) / weight + expected * cells
        clique = tuple(self.names[c] for c in columns)
        prior = pgm.model_marginal(state.previous_model, clique)
        gap = float(np.abs(prior - self.released_marginal(columns, levels)).sum())
        reason = (f"not measured; selection in round {record.round} among {record.candidates} "
                  f"candidates: |source - model| <= {model_l1:.1f} (alpha {alpha:.1f}), "
                  f"|model - released| {gap:.1f}")
        return self.bound(columns, levels, "selection", model_l1 + gap, reason, "workload")


# -- declared analyses and 1-way marginals: an interval per cell ------------------------------

def analysis_tables(run: AIMRounds, released_codes: dict[str, np.ndarray],
                    level: float = 0.95) -> list[dict]:
    """Every declared analysis as a researcher reads it: per cell, the released rows' count,
    the measurement (the true count + discrete Gaussian noise of the analysis's sigma) and the
    95 % interval of the true count, [measured - z sigma, measured + z sigma] rounded inwards to
    whole numbers (a count is whole) and cut at 0. The interval is about the table the rounds
    measured: the input after the per-unit bound. ``simultaneous_half_width``: z for all of the
    analysis's cells at once (Bonferroni). DP outputs and public labels only."""
    names = run.space.names
    out = []
    records = [(r, y) for r, y in zip(run.state.records, run.state.noisy, strict=True)
               if r.analysis]
    normal = NormalDist()
    z = normal.inv_cdf(0.5 + level / 2)
    for record, noisy in records:
        columns = tuple(names.index(n) for n in record.columns)
        leaves = [run.leaves[c] for c in columns]
        shape = tuple(a.cardinality(lv) for a, lv in zip(leaves, record.levels, strict=True))
        flat = np.zeros(len(released_codes[names[columns[0]]]), dtype=np.int64)
        for a, c, lv, size in zip(leaves, columns, record.levels, shape, strict=True):
            flat = flat * size + a.level_maps[lv][np.asarray(released_codes[names[c]],
                                                             dtype=np.int64)]
        released = np.bincount(flat, minlength=math.prod(shape))
        measured = np.asarray(noisy, dtype=np.int64).reshape(-1)
        half = z * record.sigma
        lower = np.maximum(0, np.ceil(measured - half)).astype(np.int64)
        upper = np.maximum(0, np.floor(measured + half)).astype(np.int64)
        labels = [a.level_labels[lv] for a, lv in zip(leaves, record.levels, strict=True)]
        names_in, levels_in = list(record.columns), list(record.levels)
        order = _declared_order(run, record.columns)  # axes as the steward wrote them
        arrays = [a.reshape(shape).transpose(order).reshape(-1)
                  for a in (released, measured, lower, upper)]
        released, measured, lower, upper = arrays
        labels = [labels[k] for k in order]
        shape = tuple(shape[k] for k in order)
        names_in, levels_in = [names_in[k] for k in order], [levels_in[k] for k in order]
        cells = np.unravel_index(np.arange(measured.size), shape)
        rows = [{"cell": [labels[k][int(cells[k][i])] for k in range(len(columns))],
                 "released": int(released[i]), "measured": int(measured[i]),
                 "lower": int(lower[i]), "upper": int(upper[i])}
                for i in range(measured.size)]
        bonferroni = normal.inv_cdf(1 - (1 - level) / (2 * max(1, measured.size)))
        out.append({"name": SEP.join(names_in), "columns": names_in,
                    "levels": levels_in, "sigma": float(record.sigma),
                    "level": level, "holds": "per estimate",
                    "simultaneous_half_width": float(bonferroni * record.sigma),
                    "about": "the true count of the input the rounds measured (after each "
                             "privacy unit's rows were cut to the declared maximum, when a "
                             "unit is declared)",
                    "cells": rows})
    return out


def _declared_order(run: AIMRounds, columns: tuple[str, ...]) -> list[int]:
    """The axes of a measured analysis (columns in the space's order) in the order the
    steward declared them (``run.analysis_orders``); the space's order if none matches."""
    for declared in getattr(run, "analysis_orders", ()):
        if sorted(declared) == sorted(columns):
            return [columns.index(c) for c in declared]
    return list(range(len(columns)))


def one_way_moves(run: AIMRounds, released_codes: dict[str, np.ndarray]) -> list[dict]:
    """Per released column: how far the released rows' 1-way distribution (at the leaves) is
    from its round-0 measurement made a distribution (the noisy counts projected on counts
    >= 0 with the same sum), as a total variation distance ``moved_tvd``; and ``noise_tvd``,
    about how far the measurement itself is expected to be from the source's distribution
    (E|N(0, sigma^2)| per cell over the total, halved). DP outputs only."""
    from medrelease.synthetic.space import projected_weights

    out = []
    sigma = float(run.state.measurements[0].stddev) if run.state.measurements else 0.0
    for c, noisy in enumerate(run.state.one_way_noisy):
        name = run.space.names[c]
        released = np.bincount(np.asarray(released_codes[name], dtype=np.int64),
                               minlength=run.leaves[c].size).astype(np.float64)
        measured = projected_weights(np.asarray(noisy, dtype=np.float64))
        if released.sum() <= 0 or measured.sum() <= 0:
            continue
        moved = 0.5 * float(np.abs(released / released.sum() - measured / measured.sum()).sum())
        noise = min(1.0, 0.5 * EXPECTED_ABS * sigma * noisy.size / max(float(noisy.sum()), 1.0))
        out.append({"column": name, "sigma": sigma, "moved_tvd": round(moved, 6),
                    "noise_tvd": round(noise, 6)})
    return out


# -- intervals.csv: every 1-way marginal and every declared analysis, cell by cell ---------

def one_way_intervals(run: AIMRounds, released_codes: dict[str, np.ndarray],
                      level: float = 0.95) -> list[dict]:
    """Per released column and taxonomy level below '*', per cell: the released rows' count
    and the interval of the true count from every measurement that covers the cell.

    Round 0 measured every column at its leaves (discrete Gaussian, sigma_0): a cell at level
    l sums the k leaves under it (variance k sigma_0^2). A later round that measured the column
    at a level l' <= l (on the merged values at l' = 0), summed over its other columns and then
    over the l'-codes under the cell, adds an independent estimate of variance (cells summed)
    x sigma_t^2. The estimates are combined by inverse-variance weighting (variance 1 / sum of
    1 / v_i) and the interval is estimate +- z sigma, rounded outwards, cut at 0: every
    measurement's noise is independent and mean 0, the discrete Gaussian's variance is at most
    sigma^2, and treating the sum as normal is the approximation the coverage benchmark checks.
    A leaf merged into a "<parent> (rare)" group: later rounds measured only the group, so its
    interval comes from its own round-0 measurement alone. Never a true count is read."""
    z = NormalDist().inv_cdf(0.5 + level / 2)
    bars = _ErrorBars(run, released_codes, level)
    out = []
    for c, name in enumerate(run.space.names):
        leaf = run.leaves[c]
        merged = bars.attributes[c]
        y0 = np.asarray(run.state.one_way_noisy[c], dtype=np.float64)
        sigma0 = bars.measured[c].sigma
        codes = np.asarray(released_codes[name], dtype=np.int64)
        for lv in range(leaf.levels):
            size = leaf.cardinality(lv)
            to_level = np.asarray(leaf.level_maps[lv], dtype=np.int64)
            weight = np.zeros(size)
            weighted = np.zeros(size)
            k = np.bincount(to_level, minlength=size).astype(np.float64)
            estimate = np.bincount(to_level, weights=y0, minlength=size)
            var = np.where(k > 0, k * sigma0 ** 2, np.inf)
            weight += 1 / var
            weighted += estimate / var
            if lv == 0:  # a later round's merged value is a leaf only where nothing merged
                alone = bars.group_size[c][bars.leaf_to_merged[c]] == 1
                target = np.where(alone, bars.leaf_to_merged[c], -1)
            elif merged.level_labels[lv] == leaf.level_labels[lv]:
                target = None
            else:  # (never: merging keeps every coarser level) — use round 0 only
                target = np.full(0, -1)
            for m in bars.measured[len(run.space.names):]:
                if c not in m.columns or (target is not None and target.size == 0):
                    continue
                axis = m.columns.index(c)
                lm = m.levels[axis]
                if lm > lv:
                    continue
                others = [a for a in range(m.noisy.ndim) if a != axis]
                summed = m.noisy.sum(axis=tuple(others)) if others else m.noisy
                cells_each = m.noisy.size // max(m.noisy.shape[axis], 1)
                if lv == 0:
                    if lm != 0:
                        continue
                    use = target >= 0
                    est = np.zeros(size)
                    est[use] = summed[target[use]]
                    v = np.where(use, cells_each * m.sigma ** 2, np.inf)
                else:
                    up = np.zeros(merged.cardinality(lm), dtype=np.int64)
                    up[merged.level_maps[lm]] = merged.level_maps[lv]
                    est = np.bincount(up, weights=summed, minlength=size)
                    per = np.bincount(up, minlength=size).astype(np.float64)
                    v = np.where(per > 0, per * cells_each * m.sigma ** 2, np.inf)
                weight += 1 / v
                weighted += np.where(np.isfinite(v), est, 0.0) / v
            centre = weighted / weight
            half = z / np.sqrt(weight)
            released = np.bincount(to_level[codes], minlength=size)
            out.append({"column": name, "level": lv, "labels": list(leaf.level_labels[lv]),
                        "released": released, "centre": centre, "sd": 1 / np.sqrt(weight),
                        "lower": np.maximum(0, np.ceil(centre - half - 1e-9)),
                        "upper": np.maximum(0, np.floor(centre + half + 1e-9))})
    return out


def aim_interval_table(run: AIMRounds, released_codes: dict[str, np.ndarray],
                       analyses: list[dict], informative: str | None, level: float = 0.95):
    """``intervals.csv`` of an ``aim`` release: every 1-way marginal at every level and every
    declared analysis's cells (``marginal``, per estimate); the declared analyses' cells at
    once (``simultaneous``, Bonferroni over each analysis's cells), or, with none declared,
    the informative column's values at once. From the measurements and the released rows."""
    from medrelease.privacy.interval_table import (
        SIMULTANEOUS,
        IntervalTable,
        bonferroni_level,
        joined_cells,
    )

    table = IntervalTable(level)
    normal = NormalDist()
    for block in one_way_intervals(run, released_codes, level):
        column = block["column"] + (f" (level {block['level']})" if block["level"] else "")
        table.add("marginal", [column], np.asarray(block["labels"], dtype=object),
                  block["released"], block["lower"], block["upper"])
        if not analyses and block["column"] == informative and block["level"] == 0:
            z = normal.inv_cdf(1 - (1 - bonferroni_level(level, len(block["labels"]))) / 2)
            centre, sd = block["centre"], block["sd"]
            table.add("marginal", [column], np.asarray(block["labels"], dtype=object),
                      block["released"], np.ceil(centre - z * sd - 1e-9),
                      np.floor(centre + z * sd + 1e-9), SIMULTANEOUS)
    for entry in analyses:
        cells = entry["cells"]
        columns = [f"{c} (level {lv})" if lv else c
                   for c, lv in zip(entry["columns"], entry["levels"], strict=True)]
        labels = joined_cells([[c["cell"][i] for c in cells]
                               for i in range(len(entry["columns"]))])
        released = [c["released"] for c in cells]
        table.add("marginal", columns, labels, released,
                  [c["lower"] for c in cells], [c["upper"] for c in cells])
        measured = np.array([c["measured"] for c in cells], dtype=np.float64)
        half = float(entry["simultaneous_half_width"])
        table.add("marginal", columns, labels, released,
                  np.ceil(measured - half - 1e-9), np.floor(measured + half + 1e-9),
                  SIMULTANEOUS)
    return table
