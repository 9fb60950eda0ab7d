"""Zero-concentrated DP (zCDP): the conversion to (eps, delta) and an exact discrete Gaussian.

``aim`` is accounted in zCDP (Bun & Steinke 2016): a measurement with discrete Gaussian noise of
variance sigma^2 on a query of L2 sensitivity Delta is Delta^2 / (2 sigma^2)-zCDP (Canonne,
Kamath & Steinke, NeurIPS 2020, Thm 14 — the discrete Gaussian is as private as the continuous
one), an eps_t-DP exponential mechanism is eps_t^2 / 8-zCDP (Cesar & Rogers 2021, bounded
range), and rho's add up. The release's (eps, delta) is turned into rho once, by the exact
conversion (CKS Prop. 12 / Cor. 13): the largest rho whose zCDP guarantee implies (eps, delta).

The sampler is CKS Algorithm 3 on integers only: Y ~ discrete Laplace of scale t = floor(sigma)
+ 1, accepted with Bernoulli(exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2))). sigma^2 is put on a grid
of 1/16 (rounded up: more noise, less rho — the accounting reads the rounded value), so that
gamma is a rational with one common denominator and the Bernoulli draws are exact integer
comparisons, vectorised (docs/PRIVACY.md, "aim").
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache

import numpy as np

from medrelease.errors import MedreleaseError
from medrelease.privacy.randomness import (
    INT64_SAFE,
    LIST_ROUND_MAX,
    _bernoulli_exp_unit,
    _bernoulli_exp_unit_list,
    _scalar_bernoulli_exp_unit,
    _Uniforms,
    discrete_laplace_rational,
)

SIGMA_SQ_GRID = 16  # sigma^2 is a multiple of 1/16 (rounded up)
# |a| below this: the discrete Gaussian's acceptance exponent a^2 is computed in int64 (the same
# integers as Python's, 3x faster on a million cells); above it, in Python ints
EXACT_IN_INT64 = 2 ** 31


def cdp_delta(rho: float, epsilon: float) -> float:
    """The smallest delta such that rho-zCDP implies (epsilon, delta)-DP (CKS Cor. 13).

    delta = inf over alpha > 1 of exp((alpha - 1)(alpha rho - eps)) / (alpha - 1)
    * (1 - 1/alpha)^alpha; the infimum is found by bisection on the derivative's sign (the
    expression is convex in alpha there), and any alpha gives a valid upper bound.
    """
    if rho < 0 or epsilon < 0:
        raise ValueError("rho and epsilon must be non-negative")
    if rho == 0:
        return 0.0
    low, high = 1.01, (epsilon + 1) / (2 * rho) + 2
    for _ in range(1000):
        alpha = (low + high) / 2
        derivative = (2 * alpha - 1) * rho - epsilon + math.log1p(-1.0 / alpha)
        if derivative < 0:
            low = alpha
        else:
            high = alpha
    log_delta = ((alpha - 1) * (alpha * rho - epsilon) + alpha * math.log1p(-1 / alpha)
                 - math.log(alpha - 1.0))
    return min(math.exp(log_delta), 1.0)


@lru_cache(maxsize=1024)  # a pure function a release asks for a dozen times (~25 ms each)
def rho_for(epsilon: float, delta: float) -> float:
    """The largest rho (to 1e-12 relative) whose zCDP guarantee implies (epsilon, delta)-DP.

    Bisection on the monotone ``cdp_delta(rho, epsilon)``; the lower end is returned, so the
    rho used never gives a delta above the one charged.
    """
    if not (epsilon > 0 and 0 < delta < 1):
        raise ValueError("zCDP accounting needs epsilon > 0 and 0 < delta < 1")
    low, high = 0.0, epsilon + 1.0
    while cdp_delta(high, epsilon) <= delta:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        if cdp_delta(mid, epsilon) <= delta:
            low = mid
        else:
            high = mid
        if high - low <= 1e-12 * high:
            break
    return low


def gaussian_rho(sigma_sq: float, sensitivity: float = 1.0) -> float:
    """rho of discrete Gaussian noise of variance parameter sigma^2 at L2 sensitivity Delta."""
    return sensitivity ** 2 / (2.0 * sigma_sq)


def exponential_rho(epsilon: float) -> float:
    """rho of an epsilon-DP exponential mechanism (bounded range: eps^2 / 8)."""
    return epsilon ** 2 / 8.0


def grid_sigma_sq(sigma: float) -> Fraction:
    """sigma^2 on the sampler's grid, rounded up (never less noise than asked for)."""
    if not (math.isfinite(sigma) and sigma > 0):
        raise ValueError(f"sigma must be positive and finite, got {sigma!r}")
    return Fraction(math.ceil(Fraction(sigma) ** 2 * SIGMA_SQ_GRID), SIGMA_SQ_GRID)


def _accept(rng: np.random.Generator, whole: np.ndarray, rest: np.ndarray, den: int) -> np.ndarray:
    """Bernoulli(exp(-(whole + rest/den))) per entry: ``whole`` Bernoulli(exp(-1)) successes
    in a row, then Bernoulli(exp(-rest/den)) (CKS: exp(-a-b) = exp(-a) exp(-b))."""
    ok = np.ones(whole.size, dtype=bool)
    remaining = whole.copy()
    while True:
        running = np.flatnonzero(ok & (remaining > 0))
        if not running.size:
            break
        ok[running] &= _bernoulli_exp_unit(rng, np.ones(running.size, dtype=np.int64), 1)
        remaining[running] -= 1
    todo = np.flatnonzero(ok)
    if den < INT64_SAFE // 64:
        ok[todo] = _bernoulli_exp_unit(rng, rest[todo].astype(np.int64), den)
    else:  # an enormous sigma: exact, one entry at a time
        uniforms = _Uniforms(rng)
        ok[todo] = [_scalar_bernoulli_exp_unit(uniforms, int(r), den) for r in rest[todo]]
    return ok


def _accept_list(uniforms: _Uniforms, whole: list[int], rest: list[int], den: int) -> list[bool]:
    """``_accept`` in Python lists and ints for a few entries: the same draws, in the same
    order (each round of Bernoulli(exp(-1)) over the entries still running and still owing
    one, then the fractional coins of the survivors)."""
    ok, remaining = [True] * len(whole), list(whole)
    while running := [j for j, owed in enumerate(remaining) if owed > 0 and ok[j]]:
        for j, hit in zip(running, _bernoulli_exp_unit_list(uniforms, [1] * len(running), 1),
                          strict=True):
            ok[j] = hit
            remaining[j] -= 1
    todo = [j for j, alive in enumerate(ok) if alive]
    if den < INT64_SAFE // 64:
        hits = _bernoulli_exp_unit_list(uniforms, [rest[j] for j in todo], den)
    else:  # an enormous sigma: exact, one entry at a time
        hits = [_scalar_bernoulli_exp_unit(uniforms, rest[j], den) for j in todo]
    for j, hit in zip(todo, hits, strict=True):
        ok[j] = hit
    return ok


def discrete_gaussian(rng: np.random.Generator, sigma_sq: Fraction, size: int) -> np.ndarray:
    """``size`` draws of the discrete Gaussian N_Z(0, sigma^2): P(Y = y) ∝ exp(-y^2 / (2 sigma^2)).

    CKS Algorithm 3 with sigma^2 = p / q: t = floor(sigma) + 1; Y ~ DLap(t); gamma =
    (|Y| t q - p)^2 / (2 p q t^2), one common denominator; accept with Bernoulli(exp(-gamma)).
    """
    p, q = sigma_sq.numerator, sigma_sq.denominator
    t = math.isqrt(p // q) + 1  # floor(sigma) + 1
    den = 2 * p * q * t * t
    out = np.zeros(size, dtype=np.int64)
    todo = np.arange(size)
    while todo.size > LIST_ROUND_MAX:
        y = discrete_laplace_rational(rng, 1, t, todo.size)
        magnitude = np.abs(y)
        if (y.size and int(magnitude.max()) * t * q + p < EXACT_IN_INT64  # a^2 < 2^62
                and den < 2 ** 63):  # (and the divisor an int64 too)
            a = magnitude * (t * q) - p
        else:  # exact integers (Python ints) for the rare draw, or sigma, that would overflow
            a = magnitude.astype(object) * (t * q) - p
        square = a * a
        whole, rest = square // den, square % den
        accepted = _accept(rng, whole.astype(np.int64), rest, den)
        out[todo[accepted]] = y[accepted]
        todo = todo[~accepted]
    uniforms = _Uniforms(rng)
    while todo.size:  # a few entries (the later passes): the same draws in Python ints
        y = discrete_laplace_rational(rng, 1, t, todo.size).tolist()
        square = [(abs(v) * t * q - p) ** 2 for v in y]
        accepted = np.array(_accept_list(uniforms, [a // den for a in square],
                                         [a % den for a in square], den), dtype=bool)
        out[todo[accepted]] = np.array(y, dtype=np.int64)[accepted]
        todo = todo[~accepted]
    return out


class RhoOverspendError(MedreleaseError):
    """A zCDP charge beyond the budget was refused before any noise was drawn for it."""


class RhoFilter:
    """The zCDP budget of one mechanism run, as a privacy filter: charges add up (sequential
    composition of rho's), and a charge that would take the total past the budget is refused
    *before* it is made, so no draw can overspend by construction (the idea of OpenDP's
    odometer/filter). ``aim``'s rounds charge every measurement and selection through one, and
    the manifest's ``rho_used`` is its total.

    ``slack`` (relative) admits the last round's float rounding of "exactly what is left"; the
    guarantee is computed from ``budget``, and the tests hold ``used <= budget (1 + 1e-9)``.
    """

    def __init__(self, budget: float, slack: float = 1e-12) -> None:
        if not (math.isfinite(budget) and budget > 0):
            raise ValueError(f"a zCDP budget must be positive and finite, got {budget!r}")
        self.budget = float(budget)
        self.slack = slack
        self.used = 0.0
        self.charges: list[tuple[str, float]] = []

    @property
    def left(self) -> float:
        """What may still be charged (never negative)."""
        return max(0.0, self.budget - self.used)

    def charge(self, rho: float, what: str) -> float:
        """Charge ``rho`` for ``what`` (a measurement, a selection) or refuse it; returns rho."""
        if not (math.isfinite(rho) and rho >= 0):
            raise ValueError(f"{what}: a zCDP charge must be finite and >= 0, got {rho!r}")
        if self.used + rho > self.budget * (1.0 + self.slack):
            raise RhoOverspendError(
                f"{what} would charge rho {rho:.6g} with {self.left:.6g} of {self.budget:.6g} "
                "left: refused before drawing (the rounds' plan is wrong; nothing is published)")
        self.used += rho
        self.charges.append((what, rho))
        return rho
