"""Noise and selection follow their formulas (fixed seeds, explicit tolerances)."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from medrelease.data.aggregate import aggregate
from medrelease.data.config import load_config
from medrelease.mechanisms import get_mechanism
from medrelease.mechanisms.base import ReleaseContext
from medrelease.privacy.randomness import (
    RandomSource,
    bernoulli_exp,
    discrete_laplace,
    discrete_laplace_by_geometrics,
    discrete_laplace_tail,
    exponential_mechanism,
    noise_epsilon,
    selection_probabilities,
    tail_binomial,
)
from medrelease.release import release


def _pmf(k: np.ndarray, epsilon: float) -> np.ndarray:
    a = math.exp(-noise_epsilon(epsilon))
    return (1 - a) / (1 + a) * a ** np.abs(k)


@pytest.mark.parametrize("epsilon", [2.0, 0.5, 0.1])
def test_discrete_laplace_matches_its_pmf_and_variance(epsilon: float) -> None:
    rng = np.random.default_rng(1)
    n = 400_000
    draws = discrete_laplace(rng, epsilon, n)
    assert draws.dtype == np.int64
    a = math.exp(-noise_epsilon(epsilon))
    assert draws.var() == pytest.approx(2 * a / (1 - a) ** 2, rel=0.03)
    assert abs(draws.mean()) < 5 * math.sqrt(2 * a / (1 - a) ** 2 / n)
    ks = np.arange(-4, 5)
    freq = np.array([(draws == k).mean() for k in ks])
    expected = _pmf(ks, epsilon)
    sigma = np.sqrt(expected * (1 - expected) / n)
    assert np.all(np.abs(freq - expected) < 5 * sigma)


@pytest.mark.slow
@pytest.mark.parametrize(("epsilon", "delta"), [(0.6, 1e-3), (0.2, 1e-4)])
def test_tail_holds_up_to_the_release_threshold(epsilon: float, delta: float) -> None:
    """P(Z >= k) matches exp(-eps' k) / (1 + exp(-eps')) for every k up to tau - 1: the event a
    new cell needs to be released is exactly as rare as the threshold assumes."""
    from medrelease.mechanisms.ipa import release_threshold

    tau = release_threshold(epsilon, delta, 2)
    n = 2_000_000
    draws = discrete_laplace(np.random.default_rng(11), epsilon, n)
    for k in range(1, tau):
        expected = discrete_laplace_tail(epsilon, k)
        observed = (draws >= k).mean()
        assert abs(observed - expected) < 5 * math.sqrt(expected * (1 - expected) / n) + 1e-7
    assert discrete_laplace_tail(epsilon, tau - 1) <= delta < discrete_laplace_tail(epsilon,
                                                                                    tau - 2)
    assert (draws >= tau - 1).mean() <= delta + 5 * math.sqrt(delta / n)
    assert ((draws >= tau - 1).sum() > 0) == (delta * n > 20)  # the tail is reached, not cut


class _RiggedGenerator:
    """Scripted uniform integers that walk the sampler into a far tail: U = 0 is accepted, then
    Bernoulli(exp(-1)) succeeds ``successes`` times (K = 3 each), then fails (K = 2)."""

    def __init__(self, successes: int) -> None:
        self.successes = successes

    def integers(self, low, high=None, size=None):
        high = int(np.max(high))
        if high >= 1 << 32:
            value = 0 if high == 1 << 32 else high - 1  # U = 0; Bernoulli(exp(0)) accepts
        elif high == 1:
            value = 0
        elif high == 2:
            value = 0 if self.successes > 0 else 1
        else:  # high == 3: stop with K = 3, an odd K: one more success
            value, self.successes = 2, self.successes - 1
        return np.full(size, value, dtype=np.int64) if size is not None else value


def test_discrete_laplace_support_is_unbounded() -> None:
    """A floating-point inverse CDF tops out near 37 / eps (61 at eps 0.6); the exact sampler
    goes as far as its coin flips say: 150 successes give |Z| = floor(150 / eps')."""
    draws = discrete_laplace(_RiggedGenerator(150), 0.6, 1)
    assert abs(int(draws[0])) == math.floor(150 / noise_epsilon(0.6)) == 250


@pytest.mark.slow
def test_tail_binomial_is_the_exact_binomial() -> None:
    rng = np.random.default_rng(12)
    eps, threshold, trials = 1.0, 3, 1023
    p = discrete_laplace_tail(eps, threshold)
    draws = np.array([tail_binomial(rng, trials, eps, threshold) for _ in range(600)])
    assert draws.mean() == pytest.approx(trials * p, rel=0.05)
    assert draws.var() == pytest.approx(trials * p * (1 - p), rel=0.2)
    huge = [tail_binomial(rng, (1 << 216) - 1, 0.05, 3000) for _ in range(5)]
    assert all(isinstance(v, int) and 0 <= v < 20 for v in huge)


def _two_sample_chi2(x: np.ndarray, y: np.ndarray) -> float:
    low, high = -8, 8
    bins = np.arange(low, high + 2)
    hx = np.histogram(np.clip(x, low, high), bins)[0]
    hy = np.histogram(np.clip(y, low, high), bins)[0]
    keep = (hx + hy) > 0
    return stats.chi2_contingency(np.vstack([hx[keep], hy[keep]]))[1]


@pytest.mark.slow
def test_discrete_laplace_agrees_with_geometric_difference_and_opendp() -> None:
    import opendp.prelude as dp

    dp.enable_features("contrib")
    epsilon = 0.5
    ours = discrete_laplace(np.random.default_rng(2), epsilon, 20_000)
    reference = discrete_laplace_by_geometrics(np.random.default_rng(3), epsilon, 20_000)
    measurement = dp.m.make_laplace(dp.atom_domain(T=int), dp.absolute_distance(T=int),
                                    1 / epsilon)
    opendp_draws = np.array([measurement(0) for _ in range(20_000)])
    assert _two_sample_chi2(ours, reference) > 1e-3
    assert _two_sample_chi2(ours, opendp_draws) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("monotone", [False, True])
def test_exponential_mechanism_frequencies_match_formula(monotone: bool) -> None:
    scores = np.array([0.0, 1.0, 2.0, 2.0])
    eps, sensitivity = 2.0, 1.0
    expected = np.exp(eps * scores / ((1 if monotone else 2) * sensitivity))
    expected /= expected.sum()
    np.testing.assert_allclose(selection_probabilities(scores, eps, sensitivity, monotone),
                               expected)
    rng = np.random.default_rng(4)
    n = 60_000
    picks = np.bincount([exponential_mechanism(rng, scores, eps, sensitivity, monotone)
                         for _ in range(n)], minlength=4) / n
    assert np.all(np.abs(picks - expected) < 5 * np.sqrt(expected * (1 - expected) / n))


def test_exponential_mechanism_is_numerically_safe() -> None:
    scores = np.array([1e6, 1e6 + 50, -1e9])
    rng = np.random.default_rng(5)
    assert exponential_mechanism(rng, scores, epsilon=1000.0, sensitivity=1.0) == 1
    probs = selection_probabilities(scores, 1000.0, 1.0)
    assert np.all(np.isfinite(probs)) and probs[1] == pytest.approx(1.0)


def test_bernoulli_exp_is_exact_for_rationals() -> None:
    rng = np.random.default_rng(6)
    n = 40_000
    for gamma in (Fraction(1, 3), Fraction(5, 2)):
        hits = sum(bernoulli_exp(rng, gamma) for _ in range(n)) / n
        expected = math.exp(-float(gamma))
        assert abs(hits - expected) < 5 * math.sqrt(expected * (1 - expected) / n)


@pytest.mark.slow
def test_seed_policy_and_reproducibility(nps_config, nps_sample) -> None:
    assert RandomSource().for_publication
    fixed = RandomSource(3)
    assert not fixed.for_publication and fixed.test_release
    assert "NOT FOR PUBLICATION" in fixed.seed_policy
    small = nps_sample.head(2000)
    one = release(small, nps_config, mechanism="ipa-paper", seed=9)
    two = release(small, nps_config, mechanism="ipa-paper", seed=9)
    pd.testing.assert_frame_equal(one.table.astype(str), two.table.astype(str))
    fresh = [release(small, nps_config, mechanism="ipa-paper") for _ in range(2)]
    assert fresh[0].for_publication
    assert not fresh[0].table.astype(str).equals(fresh[1].table.astype(str))
    with pytest.raises(ValueError, match="non-negative integer"):
        RandomSource(-1)


def _classes_of_size(tmp_path: Path, n_classes: int, size: int):
    values = [f"v{i}" for i in range(n_classes)]
    (tmp_path / "id.csv").write_text("".join(f"{v};*\n" for v in values))
    (tmp_path / "dataset.yaml").write_text(
        "name: sizes\ninput: {path: x.csv}\ncolumns:\n"
        "  id: {role: dimension, taxonomy: id.csv}\n  value: {role: informative}\n"
        "privacy: {lifetime_epsilon: 10}\n"
    )
    table = pd.DataFrame({"id": np.repeat(values, size), "value": "a"})
    config = load_config(tmp_path / "dataset.yaml")
    return ReleaseContext.from_counts(aggregate(table, config))


@pytest.mark.parametrize(("variant", "size", "expected"), [
    ("paper", 2, 0.5),                       # P(2 <= 2 + Lap((t-1)/eps))
    ("paper", 3, 0.5 * math.exp(-0.5)),      # P(Lap(1/0.5) >= 1)
    ("authors_code", 2, 1.0),                # max(t, ...) always suppresses |E| = t
    ("authors_code", 3, 0.5 * math.exp(-0.5)),
])
def test_ipa_paper_threshold_noise_scale(tmp_path, variant, size, expected) -> None:
    context = _classes_of_size(tmp_path, 4000, size)
    mechanism = get_mechanism("ipa-paper")
    params = mechanism.parse_params(
        {"epsilon": 2.0, "eps_suppression": 0.5, "eps_insertion": 0.5, "eps_value": 0.5,
         "eps_candidates": 0.5, "threshold_noise": variant})
    table = context.lattice.bottom()
    cells = mechanism.perturb_node(context, table, np.random.SeedSequence(6), params)
    suppressed_rows = cells.true_counts[cells.suppressed_class[cells.class_of_cell]].sum()
    share = suppressed_rows / (4000 * size)
    assert share == pytest.approx(expected, abs=5 * math.sqrt(expected * (1 - expected) / 4000)
                                  + 1e-9)


def test_ipa_paper_counterfeit_counts_follow_clipped_discrete_laplace(tmp_path) -> None:
    context = _classes_of_size(tmp_path, 4000, 10)
    mechanism = get_mechanism("ipa-paper")
    eps_ins = 0.4
    params = mechanism.parse_params(
        {"epsilon": 100.4, "eps_suppression": 50, "eps_insertion": eps_ins, "eps_value": 25,
         "eps_candidates": 25})
    cells = mechanism.perturb_node(context, context.lattice.bottom(),
                                   np.random.SeedSequence(7), params)
    a = math.exp(-noise_epsilon(eps_ins))
    mean_positive_part = a / ((1 + a) * (1 - a))  # E[max(0, Z)] for discrete Laplace(1/eps)
    counterfeit = cells.class_noise[~cells.suppressed_class]
    assert counterfeit.mean() == pytest.approx(mean_positive_part, rel=0.08)
    assert (counterfeit == 0).mean() == pytest.approx(1 / (1 + a), abs=0.03)


def test_publishable_streams_are_chacha20_keyed_by_the_os_and_replay() -> None:
    """A release for publication draws from OS-keyed ChaCha20; a stream replays itself (a
    scored candidate is re-drawn identically), two streams differ, and the noise keeps its law
    (compared with OpenDP's discrete Laplace)."""
    import opendp.prelude as dp
    from randomgen import ChaCha

    from medrelease.privacy.randomness import CryptoSeed, RandomSource, generator_for

    source = RandomSource()
    first, second = source.spawn(2)
    assert isinstance(first, CryptoSeed) and "key" not in repr(first)
    assert isinstance(generator_for(first).bit_generator, ChaCha)
    assert (generator_for(first).integers(0, 1 << 62, 8)
            == generator_for(first).integers(0, 1 << 62, 8)).all()
    assert (generator_for(first).integers(0, 1 << 62, 8)
            != generator_for(second).integers(0, 1 << 62, 8)).any()
    assert "ChaCha20" in source.randomness and "PCG64" in RandomSource(seed=1).randomness
    dp.enable_features("contrib")
    ours = discrete_laplace(generator_for(CryptoSeed.fresh()), 0.5, 20_000)
    measurement = dp.m.make_laplace(dp.vector_domain(dp.atom_domain(T="i64")),
                                    dp.l1_distance(T="i64"), 2.0)
    assert _two_sample_chi2(ours, np.asarray(measurement([0] * 20_000))) > 1e-3


def test_the_discrete_gaussian_draws_the_same_in_int64_as_in_python_ints(monkeypatch):
    """Its acceptance exponent is computed in int64 where it cannot overflow: the very same
    integers, so the very same draws as the Python-int path for the same generator."""
    from fractions import Fraction

    from medrelease.privacy import zcdp

    for sigma_sq in (Fraction(9, 16), Fraction(625), Fraction(160001, 16)):
        fast = zcdp.discrete_gaussian(np.random.default_rng(4), sigma_sq, 20_000)
        monkeypatch.setattr(zcdp, "EXACT_IN_INT64", 0)  # every draw on the Python-int path
        slow = zcdp.discrete_gaussian(np.random.default_rng(4), sigma_sq, 20_000)
        monkeypatch.undo()
        assert np.array_equal(fast, slow)


def test_the_discrete_gaussian_takes_python_ints_where_its_divisor_leaves_int64(monkeypatch):
    """sigma^2 near 2^27 gives 2 p q t^2 >= 2^63: a pass whose Laplace draws are all 0 keeps
    |a| small, yet the exponent's divisor is no int64 — the exact path takes it (it raised
    OverflowError on the int64 path)."""
    from fractions import Fraction

    from medrelease.privacy import zcdp

    real, calls = zcdp.discrete_laplace_rational, []

    def zeros_first(rng, s, t, n):
        calls.append(n)
        return np.zeros(n, dtype=np.int64) if len(calls) == 1 else real(rng, s, t, n)

    monkeypatch.setattr(zcdp, "discrete_laplace_rational", zeros_first)
    for n in (3, 100):  # a pass kept in Python ints (a few entries), and one in numpy
        calls.clear()
        out = zcdp.discrete_gaussian(np.random.default_rng(1), Fraction(2147395601, 16), n)
        assert out.shape == (n,) and calls[0] == n


def test_the_samplers_fast_draws_are_numpys_draws() -> None:
    """``_uniform_draws`` (scalar draws for a few entries, none for a range of one) gives the
    values ``rng.integers(0, high, size)`` gives and leaves the generator where it leaves it:
    the exact samplers' stream, and so every seeded release, is unchanged by it."""
    from medrelease.privacy.randomness import _uniform_draws

    choices = np.random.default_rng(99)
    for seed in range(3):
        fast, numpy_own = np.random.default_rng(seed), np.random.default_rng(seed)
        for i in range(600):
            high = int(10 ** choices.integers(0, 13)) if i % 3 == 0 else int(choices.integers(1, 7))
            size = int(choices.integers(0, 7))
            got, expected = _uniform_draws(fast, high, size), numpy_own.integers(0, high, size)
            assert got.dtype == expected.dtype and got.tolist() == expected.tolist(), (high, size)
            if i % 5 == 0:  # other draws in between (the 32-bit halves numpy buffers)
                assert fast.integers(0, 2**31) == numpy_own.integers(0, 2**31)
        assert fast.bit_generator.state == numpy_own.bit_generator.state
