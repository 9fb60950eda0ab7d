"""Intervals for released noisy counts: exact coverage, Monte-Carlo coverage, closed forms."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from medrelease.privacy import intervals
from medrelease.privacy.intervals import (
    CountIntervals,
    clipped_interval,
    gaussian_l1_bound,
    half_width,
    noise_law_epsilon,
    one_sided_width,
    sum_interval,
    threshold_rule_end,
    thresholded_interval,
)
from medrelease.privacy.randomness import discrete_laplace, noise_epsilon

LEVEL = 0.95
EPSILONS = [0.05, 0.3, 1.0, 2.0]
TAUS = [2, 10, 30]


# -- the law, written out independently of the module ---------------------------------------

def _log_pmf(eps: float, d: np.ndarray) -> np.ndarray:
    a = math.exp(-eps)
    return math.log((1 - a) / (1 + a)) - eps * np.abs(d)


def _log_survival(eps: float, x: int) -> float:
    """ln P(Z >= x)."""
    log1pa = math.log1p(math.exp(-eps))
    if x >= 1:
        return -eps * x - log1pa
    return math.log1p(-math.exp(-eps * (1 - x) - log1pa))


def _reach(eps: float) -> int:
    """Offsets beyond which the pmf's tail mass is below 1e-16."""
    return math.ceil(37 / eps) + 2


def _threshold_coverage(eps: float, tau: int, n_max: int, level: float = LEVEL) -> np.ndarray:
    """P(n in C(R) | n, R >= tau) for n = 0..n_max, mass beyond the summed range counted as a miss."""
    eps = noise_epsilon(eps)
    reach = _reach(eps)
    r = np.arange(tau, n_max + reach + 1)
    bounds = np.array([thresholded_interval(int(x), eps, tau, level) for x in r])
    coverage = np.empty(n_max + 1)
    for n in range(n_max + 1):
        p = np.exp(_log_pmf(eps, r - n) - _log_survival(eps, tau - n))
        inside = (bounds[:, 0] <= n) & (n <= bounds[:, 1])
        coverage[n] = math.fsum(p[inside])
    return coverage


def _clipped_coverage(eps: float, n_max: int, level: float = LEVEL) -> np.ndarray:
    eps = noise_epsilon(eps)
    reach = _reach(eps)
    r = np.arange(0, n_max + reach + 1)
    bounds = np.array([clipped_interval(int(x), eps, level) for x in r])
    coverage = np.empty(n_max + 1)
    for n in range(n_max + 1):
        p = np.exp(_log_pmf(eps, r - n))
        p[0] = math.exp(_log_survival(eps, n))  # P(R = 0) = P(Z <= -n) = P(Z >= n)
        inside = (bounds[:, 0] <= n) & (n <= bounds[:, 1])
        coverage[n] = math.fsum(p[inside])
    return coverage


# -- half width ------------------------------------------------------------------------------

@pytest.mark.parametrize("eps", [*EPSILONS, 0.62, 0.01, 5.0])
@pytest.mark.parametrize("level", [0.9, 0.95, 0.99])
def test_half_width_matches_the_closed_form_and_the_pmf(eps: float, level: float) -> None:
    e = noise_epsilon(eps)
    a = math.exp(-e)
    closed = max(0, math.ceil((math.log(2) - math.log1p(a) - math.log(1 - level)) / e) - 1)
    k = half_width(eps, level)
    assert k == closed
    central = lambda j: math.fsum(np.exp(_log_pmf(e, np.arange(-j, j + 1))))  # noqa: E731
    assert central(k) >= level
    assert k == 0 or central(k - 1) < level
    assert 1 - 2 * a ** (k + 1) / (1 + a) >= level
    k1 = one_sided_width(eps, level)
    assert 1 - a ** (k1 + 1) / (1 + a) >= level and k1 <= k
    assert k1 == 0 or 1 - a ** k1 / (1 + a) < level


def test_the_helper_gives_the_epsilon_the_sampler_draws() -> None:
    assert noise_law_epsilon(1.3, 3) == noise_epsilon(1.3 / 3)
    assert noise_law_epsilon(0.1) <= 0.1
    assert noise_epsilon(noise_law_epsilon(0.1)) == noise_law_epsilon(0.1)  # idempotent
    eps = noise_law_epsilon(0.7, 2)
    assert thresholded_interval(20, 0.35, 18) == thresholded_interval(20, eps, 18)
    with pytest.raises(ValueError):
        noise_law_epsilon(1.0, 0)


# -- exact coverage ------------------------------------------------------------------------

@pytest.mark.parametrize("eps", EPSILONS)
def test_clipped_interval_covers_every_n_exactly(eps: float) -> None:
    k = half_width(eps)
    coverage = _clipped_coverage(eps, 4 * k + 20)
    assert coverage.min() >= LEVEL - 1e-12, (int(coverage.argmin()), coverage.min())
    assert clipped_interval(0, eps) == (0, k)
    for r in range(2 * k + 1, 2 * k + 30):
        assert clipped_interval(r, eps) == (r - k, r + k)


@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("tau", TAUS)
def test_thresholded_interval_covers_every_n_conditionally(eps: float, tau: int) -> None:
    k = half_width(eps)
    end = threshold_rule_end(eps, tau)
    coverage = _threshold_coverage(eps, tau, end + 2 * k + 10)
    assert coverage.min() >= LEVEL - 1e-12, (int(coverage.argmin()), coverage.min())
    # every n <= tau has the same conditional law, hence the same coverage
    assert np.ptp(coverage[: tau + 1]) < 1e-9
    for r in range(end, end + 3 * k + 5):
        assert thresholded_interval(r, eps, tau) == (r - k, r + k)
    assert thresholded_interval(end - 1, eps, tau) != (end - 1 - k, end - 1 + k) or end == tau
    lows = [thresholded_interval(r, eps, tau)[0] for r in range(tau, end + k)]
    highs = [thresholded_interval(r, eps, tau)[1] for r in range(tau, end + k)]
    assert lows == sorted(lows) and highs == sorted(highs)
    assert lows[0] == 0 and all(lo <= r <= hi for r, lo, hi in zip(range(tau, end + k), lows, highs,
                                                                      strict=True))


@pytest.mark.parametrize(("eps", "tau", "level"), [(0.02, 2, 0.95), (0.62, 24, 0.95), (0.3, 10, 0.9),
                                                   (1.0, 5, 0.99)])
def test_thresholded_coverage_at_other_settings(eps: float, tau: int, level: float) -> None:
    """eps 0.02 is below the point (~0.025) where even n <= tau's equal-tailed lower limit would
    pass tau: L = tau is forced there, and R = tau still gets a nonempty interval."""
    k = half_width(eps, level)
    end = threshold_rule_end(eps, tau, level)
    coverage = _threshold_coverage(eps, tau, end + 2 * k + 10, level)
    assert coverage.min() >= level - 1e-12
    lo, hi = thresholded_interval(tau, eps, tau, level)
    assert lo == 0 and hi >= tau


def test_thresholded_interval_refuses_unpublished_counts() -> None:
    with pytest.raises(ValueError, match="below the threshold"):
        thresholded_interval(9, 1.0, 10)
    with pytest.raises(ValueError):
        thresholded_interval(12, 1.0, 10, level=1.0)


# -- Monte Carlo with the project's own sampler ------------------------------------------------

def _mc_coverage(rng: np.random.Generator, eps: float, n: int, draws: int, tau: int | None) -> tuple:
    released = n + discrete_laplace(rng, eps, draws)
    if tau is None:
        released = np.maximum(0, released)
        table = {int(r): clipped_interval(int(r), eps) for r in np.unique(released)}
    else:
        released = released[released >= tau]
        table = {int(r): thresholded_interval(int(r), eps, tau) for r in np.unique(released)}
    lo = np.array([table[int(r)][0] for r in released])
    hi = np.array([table[int(r)][1] for r in released])
    hit = (lo <= n) & (n <= hi)
    return float(hit.mean()), released.size


@pytest.mark.parametrize(("eps", "tau", "n", "draws"), [
    (0.3, 10, 0, 300_000), (0.3, 10, 12, 60_000), (0.3, 10, 25, 60_000),
    (1.0, 2, 1, 200_000), (1.0, 2, 6, 60_000),
    (1.0, None, 0, 60_000), (1.0, None, 2, 60_000), (0.3, None, 5, 60_000), (0.3, None, 40, 60_000),
])
def test_monte_carlo_coverage_with_the_sampler(eps: float, tau: int | None, n: int, draws: int) -> None:
    rng = np.random.default_rng(20_240 + n)
    empirical, kept = _mc_coverage(rng, eps, n, draws, tau)
    exact = (_clipped_coverage(eps, n)[n] if tau is None else _threshold_coverage(eps, tau, n)[n])
    se = math.sqrt(exact * (1 - exact) / kept)
    print(f"eps={eps} tau={tau} n={n}: empirical coverage {empirical:.4f} over {kept} published, "
          f"exact {exact:.4f}")
    assert LEVEL - 0.01 <= empirical <= 1
    assert abs(empirical - exact) <= 4 * se + 1e-9
    assert empirical <= 0.995  # not absurdly conservative


def test_exact_coverage_is_not_absurdly_conservative() -> None:
    """Mean coverage over n near the boundary stays close to the level (the discreteness of the
    law alone forces some excess at large eps)."""
    for eps in (0.05, 0.3, 1.0):
        k = half_width(eps)
        floor = 1 - 2 * math.exp(-noise_epsilon(eps) * (k + 1)) / (1 + math.exp(-noise_epsilon(eps)))
        c = _threshold_coverage(eps, 10, threshold_rule_end(eps, 10) + k)
        print(f"eps={eps}: thresholded coverage min {c.min():.4f} mean {c.mean():.4f} "
              f"max {c.max():.4f} (symmetric n +- k: {floor:.4f})")
        assert c.mean() <= max(floor, LEVEL) + 0.02
        c = _clipped_coverage(eps, 3 * k)
        print(f"eps={eps}: clipped coverage min {c.min():.4f} mean {c.mean():.4f} max {c.max():.4f}")
        assert c.mean() <= max(floor, LEVEL) + 0.02


# -- sums ------------------------------------------------------------------------------------

def test_sum_interval_exact_and_normal_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    for laws in ([(1.0, 100)], [(0.5, 20), (2.0, 50)], [(0.3, 12)]):
        q_exact, exact = intervals._noise_sum_quantile(laws, LEVEL)
        assert exact
        with monkeypatch.context() as patch:
            patch.setattr(intervals, "EXACT_SUPPORT", 0)
            q_normal, exact = intervals._noise_sum_quantile(laws, LEVEL)
        assert not exact
        assert abs(q_exact - q_normal) <= 1, (laws, q_exact, q_normal)
    low, high = sum_interval(500, [(1.0, 100)])
    assert (low, high) == (500 - q_exact_of([(1.0, 100)]), 500 + q_exact_of([(1.0, 100)]))


def q_exact_of(laws: list[tuple[float, int]]) -> float:
    return intervals._noise_sum_quantile(laws, LEVEL)[0]


def test_sum_interval_matches_a_direct_convolution() -> None:
    eps_a, eps_b = noise_epsilon(0.4), noise_epsilon(1.5)
    grid = np.arange(-200, 201)
    pa, pb = np.exp(_log_pmf(eps_a, grid)), np.exp(_log_pmf(eps_b, grid))
    pmf = np.convolve(np.convolve(pa, pa), pb)  # two cells at 0.4, one at 1.5
    support = np.arange(pmf.size) - 600
    cdf = np.cumsum(pmf)
    q = int(support[np.searchsorted(cdf, 1 - (1 - LEVEL) / 2)])
    assert sum_interval(10, [(0.4, 2), (1.5, 1)]) == (10.0 - q, 10.0 + q)
    assert sum_interval(7, [(1.0, 1)]) == (7 - half_width(1.0), 7 + half_width(1.0))
    assert sum_interval(7, []) == (7.0, 7.0)


# -- Gaussian --------------------------------------------------------------------------------

@pytest.mark.parametrize(("sigma", "cells", "failure"), [(2.5, 40, 0.05), (10.0, 5, 0.01), (1.0, 200, 0.1)])
def test_gaussian_l1_bound_covers_simulated_noise(sigma: float, cells: int, failure: float) -> None:
    rng = np.random.default_rng(7)
    l1 = np.abs(rng.normal(0.0, sigma, size=(20_000, cells))).sum(axis=1)
    bound = gaussian_l1_bound(sigma, cells, failure)
    exceed = float((l1 > bound).mean())
    print(f"sigma={sigma} cells={cells} failure={failure}: bound {bound:.1f}, exceeded {exceed:.4f}")
    assert exceed <= failure
    assert gaussian_l1_bound(sigma, 0, failure) == 0.0


# -- the manifest record ---------------------------------------------------------------------

def test_count_intervals_record_is_json() -> None:
    record = CountIntervals.thresholded(0.62, 24)
    data = json.loads(json.dumps(record.as_dict()))
    assert data["threshold"] == 24 and data["half_width"] == half_width(0.62)
    assert data["near_rows"][0] == {"released": 24, "low": 0,
                                    "high": thresholded_interval(24, 0.62, 24)[1]}
    assert data["near_rows_complete"]
    assert data["far_rule"].startswith(f"R >= {threshold_rule_end(0.62, 24)}:")
    clipped = CountIntervals.clipped(1.0).as_dict()
    assert clipped["near_rows"][0] == {"released": 0, "low": 0, "high": half_width(1.0)}
    for row in clipped["near_rows"]:
        assert (row["low"], row["high"]) == clipped_interval(row["released"], 1.0)
    plain = CountIntervals.plain(0.5).as_dict()
    assert plain["near_rows"] == [] and plain["threshold"] is None
