"""Confidence intervals for released noisy counts, from the released figure and public parameters.

A researcher who reads a released count R wants to know how far the true count n can be from it.
Everything here is a function of R and of parameters the manifest publishes anyway (the noise
epsilon, the release threshold tau, the level), never of the data, so the intervals can be
published next to the counts at no privacy cost (post-processing).

The noise law is the one the samplers draw (``randomness.discrete_laplace``): Z with
P(Z = k) = (1 - a) / (1 + a) a^|k|, a = exp(-eps'), where eps' = floor(eps 2^32) / 2^32 is the
epsilon the exact sampler really uses (``noise_epsilon``). Every function below takes ``eps`` as
the epsilon *handed to the sampler* (a step's epsilon divided by the unit's rows: see
``noise_law_epsilon``) and rounds it to eps' itself; the rounding is idempotent, so passing eps'
again is harmless. Tails in closed form, used throughout (t_j for j >= -1):

    t_j = P(Z >= j + 1) = P(Z <= -(j + 1)) = a^(j + 1) / (1 + a),    P(|Z| <= k) = 1 - 2 t_k.

Three release laws (see the mechanisms):

* plain: R = n + Z (sums of cells, ``sum_interval``);
* clipped: R = max(0, n + Z) (``histogram``, DiffGen's leaf counts) — ``clipped_interval``;
* thresholded: a cell is published only when R = n + Z >= tau (IPA's cells and pooled '*'
  cells) — ``thresholded_interval``, a *selective* interval: its coverage holds conditionally on
  the cell having been published, which is the only situation in which anyone sees R.

The two count intervals are built by test inversion (Neyman's construction): for every n an
acceptance region A(n) = [L(n), U(n)] of released values with P(R in A(n) | n) >= level,
L and U nondecreasing in n; the confidence set of R is {n : R in A(n)}, an interval because of
the monotonicity, with coverage P(n in C(R) | n) = P(R in A(n) | n) >= level for *every* n,
exactly (no normal approximation). The acceptance rule, for both laws:

1. L(n) is equal-tailed: the largest l with P(R < l | n) <= alpha / 2 (alpha = 1 - level);
2. U(n) is the smallest u with P(L(n) <= R <= u | n) >= level: the part of alpha the lower tail
   could not use (all of it at a boundary, where R cannot fall below the support) goes to the
   upper tail, which is what shortens the intervals near 0 or near tau;
3. far from the boundary, where L(n) = n - k (k = ``half_width``), U(n) = n + k: A(n) is the
   symmetric n +- k, so far from the boundary the interval is R +- k.

The thresholded law is stochastically increasing in n (a truncated shift family of a log-concave
law), so step 1 gives a nondecreasing L; U is made nondecreasing by a running maximum (widening
an acceptance region only raises its coverage). This is Fithian, Sun & Taylor's "optimal
inference after model selection" (2014) idea — condition on the selection event and invert the
conditional law — here exact and discrete, with the selection event {R >= tau}.
"""

from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass, field
from functools import lru_cache
from statistics import NormalDist
from typing import Any

import numpy as np

from medrelease.privacy.randomness import noise_epsilon

LEVEL = 0.95
TAIL_MASS = 1e-15  # per-cell noise mass dropped by sum_interval's exact convolution
EXACT_SUPPORT = 20_000  # sum_interval: largest support convolved exactly
MAX_TABLE = 2_000_000  # thresholded_interval: largest table of acceptance regions (tiny eps only)
NEAR_ROWS = 25  # CountIntervals: rows listed near the threshold / near 0


# -- the law actually drawn ----------------------------------------------------------------

def noise_law_epsilon(step_epsilon: float, unit_rows: int = 1) -> float:
    """eps' of the noise a step draws: the sampler gets ``step_epsilon / unit_rows`` (L1
    sensitivity m for a unit of m rows, as every mechanism does) and rounds it down to its
    2^-32 grid (``randomness.noise_fraction``). The intervals must use this eps', not the step's
    nominal epsilon: the noise is wider than eps suggests by at most 2^-32 relative, but the
    intervals claim exact coverage."""
    if unit_rows < 1:
        raise ValueError(f"unit_rows must be >= 1, got {unit_rows!r}")
    return noise_epsilon(step_epsilon / unit_rows)


def _check_level(level: float) -> float:
    if not (isinstance(level, (int, float)) and 0.5 <= level < 1):
        raise ValueError(f"level must be in [0.5, 1), got {level!r}")
    return float(level)


def _count(value: Any, name: str, minimum: int) -> int:
    try:
        number = operator.index(value)
    except TypeError:
        if isinstance(value, float) and value.is_integer():
            number = int(value)
        else:
            raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {number}")
    return number


def _log_tail(eps: float, j: int | np.ndarray) -> float | np.ndarray:
    """ln t_j = -(j + 1) eps' - ln(1 + a): never underflows to a misleading 0."""
    return -(np.asarray(j, dtype=np.float64) + 1) * eps - math.log1p(math.exp(-eps))


def _smallest_tail_index(eps: float, log_bound: float) -> int:
    """The smallest j >= 0 with ln t_j <= log_bound (closed form, then checked both ways)."""
    j = max(0, math.ceil((-log_bound - math.log1p(math.exp(-eps))) / eps) - 1)
    while j > 0 and _log_tail(eps, j - 1) <= log_bound:
        j -= 1
    while _log_tail(eps, j) > log_bound:
        j += 1
    return j


# -- 1. the symmetric half width -----------------------------------------------------------

def half_width(eps: float, level: float = LEVEL) -> int:
    """The smallest k with P(|Z| <= k) >= level, Z ~ discrete Laplace(eps').

    P(|Z| <= k) = 1 - 2 t_k = 1 - 2 a^(k + 1) / (1 + a), so
    k = ceil((ln 2 - ln(1 + a) - ln(1 - level)) / eps') - 1 (at least 0), checked against the
    exact tail. R +- k is the interval of an unclipped, unthresholded count, and the interval of
    a clipped or thresholded one far from 0 or tau.
    """
    eps, level = noise_epsilon(eps), _check_level(level)
    return _smallest_tail_index(eps, math.log((1 - level) / 2))


def one_sided_width(eps: float, level: float = LEVEL) -> int:
    """The smallest k with P(Z <= k) >= level (t_k <= 1 - level): the upper tail given all of
    alpha, as at a boundary where the lower tail is empty."""
    eps, level = noise_epsilon(eps), _check_level(level)
    return _smallest_tail_index(eps, math.log(1 - level))


# -- 2. clipped counts ---------------------------------------------------------------------

def clipped_interval(released: int, eps: float, level: float = LEVEL) -> tuple[int, int]:
    """A level confidence interval for n >= 0 from R = max(0, n + Z) (histogram, DiffGen leaves).

    Test inversion of the exact law of R given n: P(R = 0) = P(Z <= -n) = t_(n-1) (an atom),
    P(R = r) = pmf(r - n) for r >= 1. With k = ``half_width`` and k1 = ``one_sided_width``:

    * n >= k + 1: L(n) = n - k (P(R < n - k) = t_k <= alpha/2 < t_(k-1)), U(n) = n + k;
      coverage 1 - 2 t_k >= level.
    * n <= k: excluding R = 0 would cost t_(n-1) > alpha/2, so L(n) = 0 and the whole alpha
      goes to the upper tail: U(n) = n + k1; coverage 1 - t_k1 >= level.

    L and U are nondecreasing (k1 <= k), so inverting gives the interval
    [lo(R), R + k] with lo(R) = max(0, R - k1) for R <= k + k1, else max(k + 1, R - k);
    R = 0 gives [0, k]. Coverage >= level for every n >= 0 (checked exactly in the tests).
    """
    r = _count(released, "released", 0)
    k, k1 = half_width(eps, level), one_sided_width(eps, level)
    low = max(0, r - k1) if r <= k + k1 else max(k + 1, r - k)
    return low, r + k


# -- 3. thresholded counts: the selective interval -----------------------------------------

@dataclass(frozen=True)
class _ThresholdTable:
    """Intervals for R in [tau, last]; R > last gets R +- k."""

    tau: int
    k: int
    last: int
    low: tuple[int, ...]
    high: tuple[int, ...]


def _cdf(eps: float, log1pa: float, d: np.ndarray) -> np.ndarray:
    """P(Z <= d), elementwise: t_(-d-1) below 0, 1 - t_d from 0 up."""
    d = np.asarray(d, dtype=np.float64)
    below = np.exp(np.minimum(d, -1.0) * eps - log1pa)
    above = 1.0 - np.exp(-(np.maximum(d, 0.0) + 1) * eps - log1pa)
    return np.where(d <= -1, below, above)


def _acceptance(eps: float, tau: int, level: float, m: np.ndarray,
                k: int) -> tuple[np.ndarray, np.ndarray]:
    """(L(n), U(n)) for n = tau + m, m >= 0, under the law of R = n + Z given R >= tau.

    Given n = tau + m the offset D = R - n has support D >= -m and P(D <= d) = (F(d) - t_m)
    / (1 - t_m) with F the cdf of Z. Steps 1-3 of the module docstring, by vectorised integer
    bisection (both masses are monotone in the offset). For m = 0 (and every n < tau, whose
    conditional law is the same: tau + a geometric, by memorylessness) L = tau is forced; it is
    the equal-tailed value unless eps' is tiny, and forcing it keeps the interval of R = tau
    nonempty.
    """
    alpha = 1.0 - level
    log1pa = math.log1p(math.exp(-eps))
    floor_mass = _cdf(eps, log1pa, -m - 1)  # t_m = P(Z <= -m - 1)
    norm = 1.0 - floor_mass

    def lower(y: np.ndarray) -> np.ndarray:  # P(R < n + y | n, selected), y >= -m
        return np.maximum(0.0, _cdf(eps, log1pa, y - 1) - floor_mass) / norm

    def upper(u: np.ndarray) -> np.ndarray:  # P(R > n + u | n, selected), u >= -m - 1
        return _cdf(eps, log1pa, -u - 1) / norm  # P(Z >= u + 1) = P(Z <= -u - 1)

    # 1. largest y in [-m, k] with lower(y) <= alpha / 2 (lower(-m) = 0, lower(k + 1) >= level)
    good, bad = -m.astype(np.int64), np.full(m.shape, k + 1, dtype=np.int64)
    while np.any(bad - good > 1):
        mid = (good + bad) // 2
        ok = lower(mid) <= alpha / 2
        good, bad = np.where(ok, mid, good), np.where(ok, bad, mid)
    y = np.where(m == 0, 0, good)
    # 2. smallest u with lower(y) + upper(u) <= alpha; the budget is >= alpha / 2 and
    #    upper(u) <= 2 t_u, so u = half_width(level 1 - alpha / 2) always suffices.
    budget = alpha - lower(y)
    bad, good = y - 1, np.full(m.shape, half_width(eps, 1 - alpha / 2), dtype=np.int64)
    while np.any(good - bad > 1):
        mid = (good + bad) // 2
        ok = upper(mid) <= budget
        good, bad = np.where(ok, mid, good), np.where(ok, bad, mid)
    # 3. far from tau the region is the symmetric n +- k: coverage (1 - 2 t_k) / (1 - t_m)
    u = np.where(y == -k, k, good)
    n = tau + m
    return n + y, np.maximum.accumulate(n + u)


@lru_cache(maxsize=256)
def _threshold_table(eps: float, tau: int, level: float) -> _ThresholdTable:
    """Intervals of R in [tau, tau + K] where they differ from R +- k, cached per (eps', tau,
    level).

    L(n) = n - k for every n >= tau + m_far, where m_far is the first m >= k with
    P(R < n - k + 1 | n, selected) = (t_(k-1) - t_m) / (1 - t_m) > alpha / 2, i.e.
    t_m < c = (t_(k-1) - alpha/2) / (1 - alpha/2) (the left side grows with m, so it stays true);
    there U(n) = n + k. So C(R) = [R - k, R + k] once R - k - 1 >= tau + m_far and the running
    maximum of U has caught up; the table is computed a margin beyond that, checked, and trimmed
    to the last R whose interval differs.
    """
    k = half_width(eps, level)
    alpha = 1 - level
    t_k_minus_1 = math.exp(float(_log_tail(eps, k - 1))) if k > 0 else 1.0
    c = (t_k_minus_1 - alpha / 2) / (1 - alpha / 2)
    m_far = k if c <= 0 else max(k, math.floor(-(math.log(c) - float(_log_tail(eps, -1))) / eps))
    size = m_far + 2 * k + 8
    while True:
        if size > MAX_TABLE:
            raise ValueError(f"thresholded_interval: eps'={eps:g} needs a table of {size:,} "
                             f"acceptance regions (over {MAX_TABLE:,}); eps is too small")
        m = np.arange(size, dtype=np.int64)
        low_n, high_n = _acceptance(eps, tau, level, m, k)
        symmetric = (low_n == tau + m - k) & (high_n == tau + m + k)
        far_start = int(np.flatnonzero(~symmetric)[-1]) + 1 if not symmetric.all() else 0
        if far_start <= size - 2 * k - 4:
            break
        size *= 2  # float round-off at the boundary of m_far: take more room
    # From m = far_start on, every region is n +- k, in the table and beyond it (m >= m_far),
    # so C(R) = [R - k, R + k] for R >= tau + far_start + k + 1.
    # No released value may fall in no region: L(n + 1) <= U(n) + 1 (lowering L only adds
    # coverage, and keeps L nondecreasing).
    low_n = np.minimum(low_n, np.concatenate([[tau], high_n[:-1] + 1]))
    r = np.arange(tau, tau + size - k - 1, dtype=np.int64)  # hi(r) needs L up to r + k + 1
    first = np.searchsorted(high_n, r, side="left")  # the smallest n with U(n) >= r
    lows = np.where(first == 0, 0, tau + first)  # n = tau accepted: so is every n < tau
    highs = tau + np.searchsorted(low_n, r, side="right") - 1  # the largest n with L(n) <= r
    differs = np.flatnonzero((lows != r - k) | (highs != r + k))
    last = int(r[differs[-1]]) if differs.size else tau - 1
    if last > tau + far_start + k:
        raise AssertionError("thresholded_interval: inconsistent table (please report)")
    count = last - tau + 1
    return _ThresholdTable(tau, k, last, tuple(int(v) for v in lows[:count]),
                           tuple(int(v) for v in highs[:count]))


def thresholded_interval(released: int, eps: float, tau: int,
                         level: float = LEVEL) -> tuple[int, int]:
    """The selective level interval for n >= 0 of a cell published because R = n + Z >= tau.

    Cells with R < tau are not published, so a published R is a draw of R given R >= tau:
    P(R = r | n, selected) = pmf(r - n) / P(Z >= tau - n), r >= tau. Inverting this conditional
    law (module docstring, steps 1-3) gives conditional coverage >= level for every n >= 0: among
    the cells with true count n that get published, at least ``level`` of them have n in their
    interval — the guarantee an unconditional interval loses, since publication favours upward
    noise. For every n <= tau the conditional law is the same (tau + a geometric: the discrete
    Laplace is memoryless above its centre), so the data cannot tell those counts apart: an
    interval that reaches down to tau reaches down to 0. For R far above tau the interval is
    R +- ``half_width``. A cached table (``_threshold_table``) serves R in [tau, tau + K], plain
    arithmetic beyond.
    """
    r = _count(released, "released", 0)
    tau = _count(tau, "tau", 1)
    if r < tau:
        raise ValueError(f"released count {r} is below the threshold {tau}: such a cell is "
                         f"never published")
    table = _threshold_table(noise_epsilon(eps), tau, _check_level(level))
    if r > table.last:
        return r - table.k, r + table.k
    return table.low[r - tau], table.high[r - tau]


def threshold_rule_end(eps: float, tau: int, level: float = LEVEL) -> int:
    """The smallest R from which ``thresholded_interval`` is R +- half_width for every R."""
    table = _threshold_table(noise_epsilon(eps), _count(tau, "tau", 1), _check_level(level))
    return table.last + 1


# -- 4. sums of noisy counts ---------------------------------------------------------------

def _noise_sum_quantile(eps_counts: list[tuple[float, int]], level: float) -> tuple[float, bool]:
    """(q, exact): the equal-tailed upper quantile of W = sum of the noises (W is symmetric, so
    the lower one is -q); ``exact`` says whether it came from the convolution."""
    alpha = 1 - level
    laws = [(noise_epsilon(e), _count(c, "count", 0)) for e, c in eps_counts]
    laws = [(e, c) for e, c in laws if c > 0]
    if not laws:
        return 0.0, True
    # per cell, truncate to [-B, B] with P(|Z| > B) = 2 t_B <= TAIL_MASS
    bounds = [(e, c, _smallest_tail_index(e, math.log(TAIL_MASS / 2))) for e, c in laws]
    support = 1 + sum(2 * b * c for _, c, b in bounds)
    if support <= EXACT_SUPPORT:
        size = 1 << (support - 1).bit_length()  # circular convolution without wrap-around
        spectrum = np.ones(size // 2 + 1, dtype=np.complex128)
        for e, c, b in bounds:
            a = math.exp(-e)
            pmf = (1 - a) / (1 + a) * np.exp(-e * np.abs(np.arange(-b, b + 1)))
            spectrum *= np.fft.rfft(pmf, size) ** c  # offsets -b each, undone below
        mass = np.clip(np.fft.irfft(spectrum, size)[:support], 0.0, None)
        cdf = np.cumsum(mass) / mass.sum()
        offset = (support - 1) // 2  # index i is W = i - offset
        upper = int(np.searchsorted(cdf, 1 - alpha / 2, side="left")) - offset
        return float(upper), True
    variance = sum(c * 2 * math.exp(-e) / (-math.expm1(-e)) ** 2 for e, c in laws)
    return NormalDist().inv_cdf(1 - alpha / 2) * math.sqrt(variance), False


def sum_interval(released_total: float, eps_counts: list[tuple[float, int]],
                 level: float = LEVEL) -> tuple[float, float]:
    """An equal-tailed level interval for a sum of true counts from the sum of their noisy
    releases, each cell with independent, unclipped, unthresholded discrete Laplace noise.

    ``eps_counts`` lists (eps, number of cells with that eps). W = sum of the noises is
    symmetric, and the interval is (total - q_hi, total - q_lo) with q_lo = -q_hi. While the
    support of W is small (<= 20,000 points after dropping 1e-15 of each cell's tail mass) its
    law is the exact convolution of the pmfs (by FFT) and q_hi the smallest w with
    P(W <= w) >= 1 - alpha/2, so P(q_lo <= W <= q_hi) >= level; beyond, a normal approximation
    with the exact variance, 2a / (1 - a)^2 per cell. Not for clipped or thresholded cells,
    whose noise is neither symmetric nor independent of n.
    """
    level = _check_level(level)
    q, _ = _noise_sum_quantile(list(eps_counts), level)
    return float(released_total) - q, float(released_total) + q


# -- 5. Gaussian noise ---------------------------------------------------------------------

def gaussian_l1_bound(sigma: float, cells: int, failure: float) -> float:
    """A bound on sum_i |X_i| for ``cells`` i.i.d. N(0, sigma^2) that holds with probability
    >= 1 - failure: sigma (cells sqrt(2/pi) + sqrt(2 cells ln(1/failure))).

    E|X_i| = sigma sqrt(2/pi), and x -> sum |x_i| is sqrt(cells)-Lipschitz in the Euclidean
    norm, so by Gaussian concentration (Tsirelson-Ibragimov-Sudakov) it exceeds its mean by t
    with probability <= exp(-t^2 / (2 cells sigma^2)). Used for the discrete Gaussian noise
    (``zcdp.discrete_gaussian``, aim) as an approximation — the discrete Gaussian is not the
    continuous one, and the project's coverage benchmark checks the bound on its draws.
    """
    cells = _count(cells, "cells", 0)
    if not (sigma >= 0 and math.isfinite(sigma)):
        raise ValueError(f"sigma must be finite and >= 0, got {sigma!r}")
    if not 0 < failure < 1:
        raise ValueError(f"failure must be in (0, 1), got {failure!r}")
    return sigma * (cells * math.sqrt(2 / math.pi) + math.sqrt(2 * cells * math.log(1 / failure)))


# -- 6. what a manifest publishes ----------------------------------------------------------

@dataclass(frozen=True)
class CountIntervals:
    """How to read the released counts of one noisy step, ready for a manifest (``as_dict``).

    ``rows`` are (released, low, high) for the released values near the boundary (0 for clipped
    counts, tau for thresholded ones) whose interval differs from R +- ``half_width``; every
    R >= ``far_from`` gets R +- ``half_width``. ``rows_complete`` is False when more differing
    values exist than were listed (``thresholded_interval`` / ``clipped_interval`` compute them).
    """

    level: float
    epsilon: float
    release: str  # "plain", "clipped at 0" or "published when R >= tau"
    half_width: int
    threshold: int | None = None
    far_from: int = 0
    rows: tuple[tuple[int, int, int], ...] = field(default=())
    rows_complete: bool = True

    @property
    def noise(self) -> str:
        return (f"discrete Laplace, P(Z = k) proportional to exp(-{self.epsilon!r} |k|) "
                f"(the sampler's epsilon, on its 2^-32 grid)")

    @property
    def interval_kind(self) -> str:
        if self.threshold is not None:
            return ("selective (conditional on publication, n >= 0), exact test inversion of the "
                    "truncated law")
        if self.release == "clipped at 0":
            return "exact test inversion of the law of max(0, n + Z), n >= 0"
        return "n + Z, symmetric"

    @classmethod
    def plain(cls, eps: float, level: float = LEVEL) -> CountIntervals:
        return cls(_check_level(level), noise_epsilon(eps), "plain", half_width(eps, level))

    @classmethod
    def clipped(cls, eps: float, level: float = LEVEL, max_rows: int = NEAR_ROWS) -> CountIntervals:
        k = half_width(eps, level)
        far = 2 * k + 1  # clipped_interval's closed form: R - k from R = 2k + 1 on
        rows = [(r, *clipped_interval(r, eps, level)) for r in range(far)]
        rows = [row for row in rows if row[1:] != (row[0] - k, row[0] + k)]
        return cls(_check_level(level), noise_epsilon(eps), "clipped at 0", k, None, far,
                   tuple(rows[:max_rows]), len(rows) <= max_rows)

    @classmethod
    def thresholded(cls, eps: float, tau: int, level: float = LEVEL,
                    max_rows: int = NEAR_ROWS) -> CountIntervals:
        end = threshold_rule_end(eps, tau, level)
        rows = tuple((r, *thresholded_interval(r, eps, tau, level))
                     for r in range(tau, min(end, tau + max_rows)))
        return cls(_check_level(level), noise_epsilon(eps), f"published when R >= {tau}",
                   half_width(eps, level), tau, end, rows, end - tau <= max_rows)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: plain numbers, strings and lists."""
        return {
            "level": self.level,
            "noise": self.noise,
            "noise_epsilon": self.epsilon,
            "release": self.release,
            "interval": self.interval_kind,
            "threshold": self.threshold,
            "half_width": self.half_width,
            "far_rule": f"R >= {self.far_from}: [R - {self.half_width}, R + {self.half_width}]",
            "near_rows": [{"released": r, "low": lo, "high": hi} for r, lo, hi in self.rows],
            "near_rows_complete": self.rows_complete,
        }


# -- 6. Totals over several cells ------------------------------------------------------------

def _positive_part_quantile(eps: float, cells: int, level: float) -> float:
    """Upper ``level`` quantile of S = sum of ``cells`` i.i.d. max(0, Z), Z discrete Laplace:
    exact convolution while small, else normal with the exact mean a/(1 - a^2) and second
    moment a/(1 - a)^2 per cell (plus one, for the lattice)."""
    eps = noise_epsilon(eps)
    a = math.exp(-eps)
    if cells == 0:
        return 0.0
    top = math.ceil(math.log(1e-15) / math.log(a)) if a > 0 else 1
    if cells * top <= 20_000:
        k = np.arange(top + 1)
        pmf = np.where(k == 0, 1 / (1 + a), (1 - a) / (1 + a) * a ** k)
        total = np.array([1.0])
        for _ in range(cells):
            total = np.convolve(total, pmf)
        return float(np.searchsorted(np.cumsum(total), level))
    mean = a / (1 - a * a)
    variance = a / (1 - a) ** 2 - mean ** 2
    from statistics import NormalDist

    return cells * mean + NormalDist().inv_cdf(level) * math.sqrt(cells * variance) + 1.0


def clipped_total_interval(released_total: float, eps: float, cells: int,
                           level: float = LEVEL) -> tuple[float, float]:
    """The true total N of ``cells`` cells released as max(0, n + Z), every cell drawn
    (histogram, DiffGen: empty cells included), from their released total T.

    Each cell has n <= R - Z (equality unless clipped) and n >= R - max(0, Z) (n >= 0), so
    T - sum max(0, Z) <= N <= T - sum Z: the interval takes the upper (1 + level)/2 quantile
    of the first sum and the lower (1 - level)/2 quantile of the second — valid whatever the
    cells' true counts, and computed from T, ``cells`` (public: the node's domain) and eps."""
    positive, q = _clipped_total_widths(noise_epsilon(eps), int(cells), _check_level(level))
    return max(0.0, float(released_total) - positive), float(released_total) + q


@functools.lru_cache(maxsize=256)
def _clipped_total_widths(eps: float, cells: int, level: float) -> tuple[float, float]:
    """(q+, q) of ``clipped_total_interval``: the same for every total over ``cells`` cells."""
    positive = _positive_part_quantile(eps, cells, (1 + level) / 2)
    q, _ = _noise_sum_quantile([(eps, cells)], level)
    return positive, q


def cells_entry(applies_to: str, intervals: CountIntervals, step_epsilon: float,
                unit_rows: int = 1) -> dict[str, Any]:
    """One kind of released count as a mechanism's manifest states it: which counts, their
    noise in words, R +- half_width far from the boundary, and the exact intervals near it."""
    unit = f" per unit of up to {unit_rows} rows (scale {unit_rows}/epsilon)" if unit_rows > 1 else ""
    return {"applies_to": applies_to,
            "noise": f"discrete Laplace, epsilon {step_epsilon:.4g}{unit}; {intervals.release}",
            "noise_epsilon": intervals.epsilon, "threshold": intervals.threshold,
            "half_width": intervals.half_width, "far_from": intervals.far_from,
            "interval": intervals.interval_kind,
            "near_threshold": [[r, lo, hi] for r, lo, hi in intervals.rows],
            "near_threshold_complete": intervals.rows_complete}


# -- 7. totals of thresholded cells, valid under selection ---------------------------------
#
# A value's total N over an ipa release: its rows sit in cells of the chosen node, of the
# ladder rungs and of the pooled (*, ..., *, v) cell; a cell c (true count n_c, step epsilon
# eps_c, threshold tau_c) is published iff R_c = n_c + Z_c >= tau_c. T = the sum of the
# published R_c. Given every selection outcome S (which cells were published, which nodes the
# rungs chose), the published R_c are independent, each with the truncated law of n_c + Z
# given n_c + Z >= tau_c (each step draws fresh noise; its cells are fixed by the outputs
# before it). ``selected_total_interval`` states [lo, hi] with P(lo <= N <= hi) >= level for
# every input (docs/PRIVACY.md, "Error bars": the proof).
#
# Upper end. N - T = -sum_P D_c + U, D_c = R_c - n_c and U the rows left after the last step:
# U = n_pool (published: D_pool in the sum) or, unpublished, U + Z_pool < tau_pool, so
# U <= tau_pool - 1 - Z_pool. Given S, D_c | published = Z | Z >= tau_c - n_c is stochastically
# larger than Z (conditioning on an upper set), and Z_pool is independent of S's earlier part.
# So N <= T + (tau_pool - 1)[pool unpublished] + q, q the upper alpha/2 quantile of a sum of
# |P| + [pool unpublished] independent discrete Laplace noises (``_noise_sum_quantile``).
#
# Lower end. N >= sum_P n_c = theta' - shortfall, theta' = sum_P max(n_c, tau_c), shortfall =
# sum_P (tau_c - n_c)^+. With m_c = (n_c - tau_c)^+, V_c = R_c - max(n_c, tau_c) has the law
# L(m_c) = Z | Z >= -m_c (memorylessness makes every n_c <= tau_c give m_c = 0), which is
# stochastically decreasing in m_c. Berger & Boos (1994): lower confidence bounds m^_c that
# hold simultaneously with probability >= 1 - gamma (one-sided, gamma / |P| each) give
# theta' >= T - q_V(m^) with probability >= 1 - alpha_V - gamma, q_V the upper alpha_V quantile
# of sum_c L(m^_c) (exact convolution): on {m^ <= m}, q_V(m^) >= q_V(m). The shortfall is
# bounded twice, taking the smaller: (a) a cell with n_c < tau_c is published only with
# R_c - tau_c ~ G = Z | Z >= 0, P(G >= F) = a^F, so with probability >= 1 - beta' no cell with
# R_c >= tau_c + F_c (a_c^F_c <= beta' / |P|) falls short and the shortfall is at most
# sum over the other published cells of (tau_c - 1); (b) unconditionally, a cell of n rows
# falls short by b = tau - n with probability P(Z >= b): a Chernoff bound over every cell of
# every step (each step's cells partition at most N of the value's rows) gives
# shortfall <= x(N) with probability >= 1 - beta. Then lo = the smallest N with
# N + min(x(N), (a)) >= T - q_V. Failure budget of the lower end: alpha/2 = alpha_V + gamma +
# beta + beta' (0.8, 0.1, 0.05, 0.05 of it).

LOWER_SPLIT = (0.8, 0.1, 0.05, 0.05)  # alpha_V, gamma (Berger-Boos), beta (Chernoff), beta'
LAW_SUPPORT_MASS = 1e-15  # upper tail mass of each law dropped by the convolution
EXACT_SELECTIVE_SUPPORT = 1 << 18  # beyond: normal approximation of the sum


def _tail_ge(eps: float, k: np.ndarray) -> np.ndarray:
    """P(Z >= k) elementwise: a^k / (1 + a) for k >= 1, 1 - a^(1 - k) / (1 + a) for k <= 0."""
    k = np.asarray(k, dtype=np.float64)
    log1pa = math.log1p(math.exp(-eps))
    high = np.exp(-np.maximum(k, 1.0) * eps - log1pa)
    low = 1.0 - np.exp(-(1.0 - np.minimum(k, 0.0)) * eps - log1pa)
    return np.where(k >= 1, high, low)


def selection_floor(released: np.ndarray, eps: float, tau: int, failure: float) -> np.ndarray:
    """m^: for each published R >= tau, the smallest m >= 0 with P(R' >= R | n = tau + m,
    published) > ``failure`` — a one-sided lower confidence bound on m = (n - tau)^+ that fails
    with probability <= ``failure`` for every n (P_m(R' >= r) grows with m, and for n <= tau the
    law is that of m = 0)."""
    eps = noise_epsilon(eps)
    j = np.asarray(released, dtype=np.int64) - int(tau)
    if np.any(j < 0):
        raise ValueError("a published count is below its threshold")

    def survival(m: np.ndarray) -> np.ndarray:  # P(Z >= j - m) / P(Z >= -m)
        return _tail_ge(eps, j - m) / _tail_ge(eps, -m)

    low = np.full(j.shape, -1, dtype=np.int64)   # survival(low) <= failure (virtual at -1)
    high = j.copy()                               # survival(j) >= 1/2 > failure
    while np.any(high - low > 1):
        mid = (low + high) // 2
        ok = survival(np.maximum(mid, 0)) > failure
        high, low = np.where(ok, mid, high), np.where(ok, low, mid)
    return np.maximum(high, 0)


@lru_cache(maxsize=4096)
def _law(eps: float, m: int) -> tuple[int, np.ndarray]:
    """(offset, pmf) of V = Z | Z >= -m on [-m, B], B dropping <= LAW_SUPPORT_MASS above."""
    a = math.exp(-eps)
    top = _smallest_tail_index(eps, math.log(LAW_SUPPORT_MASS))
    support = np.arange(-m, top + 1)
    pmf = (1 - a) / (1 + a) * np.exp(-eps * np.abs(support))
    return -m, pmf / float(_tail_ge(eps, np.array([-m]))[0])


def law_cap(eps: float) -> int:
    """m from which L(m) is taken as L(cap) (conservative: L decreases in m), where
    P(Z < -cap) <= 1e-9: the laws differ by less than that."""
    return _smallest_tail_index(noise_epsilon(eps), math.log(1e-9))


@lru_cache(maxsize=8192)
def _selective_sum_quantile(laws: tuple[tuple[float, int, int], ...], prob: float) -> int:
    """The smallest w with P(sum V <= w) >= prob, V_i ~ L(eps_i, m_i) independent; ``laws``
    lists (eps, m, how many). Exact (FFT) while the support is small, else normal with the
    exact mean and variance."""
    parts = [(_law(e, m), c) for e, m, c in laws if c > 0]
    if not parts:
        return 0
    support = 1 + sum(c * (len(pmf) - 1) for (_, pmf), c in parts)
    if support <= EXACT_SELECTIVE_SUPPORT:
        size = 1 << (support - 1).bit_length()
        spectrum = np.ones(size // 2 + 1, dtype=np.complex128)
        offset = 0
        for (start, pmf), count in parts:
            spectrum *= np.fft.rfft(pmf, size) ** count
            offset += start * count
        mass = np.clip(np.fft.irfft(spectrum, size)[:support], 0.0, None)
        cdf = np.cumsum(mass) / mass.sum()
        return int(np.searchsorted(cdf, prob - 1e-12, side="left")) + offset
    mean = variance = 0.0
    for (start, pmf), count in parts:
        values = np.arange(start, start + len(pmf))
        mu = float((values * pmf).sum())
        mean += count * mu
        variance += count * float(((values - mu) ** 2 * pmf).sum())
    return math.ceil(mean + NormalDist().inv_cdf(prob) * math.sqrt(variance)) + 1


@lru_cache(maxsize=1024)
def _shortfall_rate(eps: float, tau: int, lam: float) -> float:
    """max over b = 1 .. tau - 1 of P(Z >= b) (e^(lam b) - 1) / (tau - b): the Chernoff
    exponent per row of one step's shortfall (a cell of n = tau - b rows is published short
    by b with probability P(Z >= b); log(1 + p x) <= p x)."""
    if tau < 2:
        return 0.0
    b = np.arange(1, tau, dtype=np.float64)
    with np.errstate(over="ignore"):
        rate = _tail_ge(eps, b) * np.expm1(lam * b) / (tau - b)
    return float(np.max(rate))


@lru_cache(maxsize=8192)
def shortfall_bound(rows: float, eps: float, tau: int, single: bool, failure: float) -> float:
    """x: one thresholded step's shortfall over a value's ``rows`` rows exceeds this with
    probability <= ``failure``, for every input. Many cells (a node's, a rung's: they
    partition at most ``rows`` rows): Chernoff, log E e^(lam S) <= rows r(lam), minimised over
    lam < eps'. One cell (the pooled (*, v) cell): S >= x needs Z >= x, so the smallest x with
    P(Z >= x) <= failure. Never above tau - 1 per cell (a cell has a row)."""
    eps = noise_epsilon(eps)
    if tau < 2 or rows <= 0:
        return 0.0
    if single:
        return float(min(tau - 1, _smallest_tail_index(eps, math.log(failure)) + 1))
    best = float(rows * (tau - 1))  # always: a short cell has a row, short by <= tau - 1
    for lam in np.linspace(eps / 40, eps * 0.95, 40):
        rate = _shortfall_rate(eps, int(tau), float(lam))
        if math.isfinite(rate):
            best = min(best, (rows * rate + math.log(1 / failure)) / float(lam))
    return best


def selected_total_interval(released: np.ndarray, step_of: np.ndarray,
                            steps: tuple[tuple[float, int, bool], ...], pool_step: int,
                            lost_pools: int, level: float = LEVEL,
                            covering: np.ndarray | None = None,
                            covering_step_of: np.ndarray | None = None) -> tuple[int, int]:
    """A level interval for a true total N (a value's, or a marginal cell's) from the
    published thresholded cells that lie inside it, valid under selection for every input (the
    section's comment; docs/PRIVACY.md, "Error bars").

    ``released``: those cells' counts, ``step_of`` the index in ``steps`` of the step that
    published each; ``steps``: every thresholded step that may hold the total's rows, as (the
    sampler's eps', tau, whether it is one cell per value: the pool); ``pool_step``: the
    pool's index. The upper end also allows for rows the release placed where they cannot be
    told apart: ``covering`` (with ``covering_step_of``), published cells coarser than the
    total's own labels that contain it (every row of one may belong here: its n <= R - Z), and
    ``lost_pools`` pooled (*, v) cells that were not published (each may have held up to
    tau_pool - 1 - Z of the total's rows). A value's total: no covering cell, one lost pool
    unless its pooled cell was published. With no published cell: [0, upper]."""
    level = _check_level(level)
    alpha = 1 - level
    released = np.asarray(released, dtype=np.int64)
    step_of = np.asarray(step_of, dtype=np.int64)
    covering = np.zeros(0, dtype=np.int64) if covering is None else np.asarray(covering,
                                                                               dtype=np.int64)
    covering_step_of = (np.zeros(0, dtype=np.int64) if covering_step_of is None
                        else np.asarray(covering_step_of, dtype=np.int64))
    total = int(released.sum())
    laws_z: dict[float, int] = {}
    for s in (*step_of, *covering_step_of):
        e = noise_epsilon(steps[s][0])
        laws_z[e] = laws_z.get(e, 0) + 1
    pool_eps, pool_tau, _ = steps[pool_step]
    if lost_pools:
        e = noise_epsilon(pool_eps)
        laws_z[e] = laws_z.get(e, 0) + int(lost_pools)
    q_up, _ = _noise_sum_quantile_cached(tuple(sorted(laws_z.items())), level)
    upper = (total + int(covering.sum()) + int(lost_pools) * (int(pool_tau) - 1)
             + math.ceil(q_up))
    if released.size == 0:
        return 0, max(0, upper)
    a_v, gamma, beta, beta_far = (alpha / 2 * s for s in LOWER_SPLIT)
    count = released.size
    floors = np.empty(count, dtype=np.int64)
    near = np.zeros(len(steps))
    for s in np.unique(step_of):
        eps, tau, _ = steps[s]
        eps = noise_epsilon(eps)
        here = step_of == s
        floors[here] = np.minimum(selection_floor(released[here], eps, tau, gamma / count),
                                  law_cap(eps))
        # F with P(G >= F) = a^F <= beta' / |P|: a cell published F or more above tau cannot
        # be short (but with that probability, over all cells)
        reach = math.ceil(math.log(count / beta_far) / eps)
        near[s] = float(((released[here] < tau + reach) * (tau - 1)).sum())
    groups: dict[tuple[float, int], int] = {}
    for s, m in zip(step_of, floors, strict=True):
        key = (noise_epsilon(steps[s][0]), int(m))
        groups[key] = groups.get(key, 0) + 1
    q_v = _selective_sum_quantile(tuple(sorted((e, m, c) for (e, m), c in groups.items())),
                                  round(1 - a_v, 12))
    target = total - q_v

    def shortfall(rows: int) -> float:
        return sum(min(near[s], shortfall_bound(rows, eps, tau, single, beta / len(steps)))
                   for s, (eps, tau, single) in enumerate(steps) if near[s] > 0)

    if target <= 0 or shortfall(0) >= target:
        return 0, max(0, upper)
    low, high = 0, target  # N = target always reaches it: the shortfall bound is >= 0
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if mid + shortfall(mid) >= target else (mid, high)
    return high, max(high, upper)


@lru_cache(maxsize=8192)
def _noise_sum_quantile_cached(eps_counts: tuple[tuple[float, int], ...],
                               level: float) -> tuple[float, bool]:
    """``_noise_sum_quantile`` for a hashable list (a release asks for the same few often)."""
    return _noise_sum_quantile(list(eps_counts), level)


def thresholded_bounds(released: np.ndarray, eps: float, tau: int,
                       level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """``thresholded_interval`` of many published counts of one step at once (the cached table
    near tau, R +- k beyond): a released count of 1M cells costs a few array operations."""
    r = np.asarray(released, dtype=np.int64)
    if np.any(r < tau):
        raise ValueError("a published count is below its threshold")
    table = _threshold_table(noise_epsilon(eps), _count(tau, "tau", 1), _check_level(level))
    lows, highs = r - table.k, r + table.k
    near = r <= table.last
    if table.last >= table.tau and np.any(near):
        index = r[near] - table.tau
        lows[near] = np.asarray(table.low, dtype=np.int64)[index]
        highs[near] = np.asarray(table.high, dtype=np.int64)[index]
    return lows, highs


def clipped_bounds(released: np.ndarray, eps: float, level: float = LEVEL
                   ) -> tuple[np.ndarray, np.ndarray]:
    """``clipped_interval`` of many counts at once (its closed form, vectorised)."""
    r = np.asarray(released, dtype=np.int64)
    k, k1 = half_width(eps, level), one_sided_width(eps, level)
    low = np.where(r <= k + k1, np.maximum(0, r - k1), np.maximum(k + 1, r - k))
    return low, r + k
