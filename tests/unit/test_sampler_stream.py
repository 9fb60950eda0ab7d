"""The exact samplers draw the very numbers a plain scalar transcription of CKS draws.

Every seeded release, the step audits' calibrated run counts and the published seeded examples
depend on the samplers' stream: which uniform integers are drawn, in which order, and where the
generator is left. The references below are the algorithms as written in the paper, one
``rng.integers(0, high)`` call per uniform integer, in the order the samplers have always used:
breadth first (every entry's round-K draw before any entry's round K + 1 draw; all U draws, then
the acceptance coins, then the Bernoulli(exp(-1)) counts, then the signs; rejected entries
retried after the kept ones, in the order they were rejected). A change of any draw's order,
range or count shows as a different output or a different generator state after the call.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from medrelease.privacy import zcdp
from medrelease.privacy.randomness import (
    INT64_SAFE,
    CryptoSeed,
    _bernoulli_exp_unit,
    _count_exp1_successes,
    bernoulli_exp,
    discrete_laplace,
    discrete_laplace_rational,
    exponential_mechanism,
    generator_for,
    noise_fraction,
)


def _draw(rng: np.random.Generator, high: int) -> int:
    """One uniform integer in [0, high): numpy's scalar draw, or raw bits above 2^62."""
    if high <= INT64_SAFE:
        return int(rng.integers(0, high))
    bits = high.bit_length()
    while True:
        value = int.from_bytes(rng.bytes((bits + 7) // 8), "little") & ((1 << bits) - 1)
        if value < high:
            return value


def reference_bernoulli_exp_unit(rng: np.random.Generator, nums: list[int], den: int) -> list[bool]:
    """CKS Algorithm 1 for each num/den: K = 1; while uniform{0..den K - 1} < num: K += 1;
    return K odd. Breadth first; a round whose range reaches 2^62 finishes each remaining entry
    on its own, in order."""
    result = [False] * len(nums)
    active, k = list(range(len(nums))), 1
    while active:
        if den * k >= INT64_SAFE:
            for i in active:
                kk = k
                while _draw(rng, den * kk) < nums[i]:
                    kk += 1
                result[i] = kk % 2 == 1
            break
        survivors = []
        for i in active:
            if _draw(rng, den * k) < nums[i]:
                survivors.append(i)
            else:
                result[i] = k % 2 == 1
        active, k = survivors, k + 1
    return result


def reference_count_exp1(rng: np.random.Generator, n: int) -> list[int]:
    """Per entry, Bernoulli(exp(-1)) successes before the first failure, a round at a time."""
    count, active = [0] * n, list(range(n))
    while active:
        hits = reference_bernoulli_exp_unit(rng, [1] * len(active), 1)
        active = [i for i, hit in zip(active, hits, strict=True) if hit]
        for i in active:
            count[i] += 1
    return count


def reference_discrete_laplace(rng: np.random.Generator, s: int, t: int, n: int) -> list[int]:
    """CKS Algorithm 2 with eps = s / t: U; accept with Bernoulli(exp(-U/t)); V; Y = (U + tV) // s;
    sign B; reject (B = 1, Y = 0)."""
    out, todo = [0] * n, list(range(n))
    while todo:
        u = [_draw(rng, t) for _ in todo]
        accepted = reference_bernoulli_exp_unit(rng, u, t)
        kept = [(i, ui) for i, ui, ok in zip(todo, u, accepted, strict=True) if ok]
        v = reference_count_exp1(rng, len(kept))
        signs = [_draw(rng, 2) for _ in kept]
        again = []
        for (i, ui), vi, negative in zip(kept, v, signs, strict=True):
            y = (ui + t * vi) // s
            if negative and y == 0:
                again.append(i)
            else:
                out[i] = -y if negative else y
        todo = [i for i, ok in zip(todo, accepted, strict=True) if not ok] + again
    return out


def reference_bernoulli_exp(rng: np.random.Generator, gamma: Fraction) -> bool:
    """Bernoulli(exp(-gamma)): floor(gamma) Bernoulli(exp(-1)) in a row, then the fraction."""
    for _ in range(math.floor(gamma)):
        if not reference_bernoulli_exp_unit(rng, [1], 1)[0]:
            return False
    rest = gamma - math.floor(gamma)
    return reference_bernoulli_exp_unit(rng, [rest.numerator], rest.denominator)[0]


def reference_exponential_mechanism(rng: np.random.Generator, scores: list[float],
                                    epsilon: float, sensitivity: float, monotone: bool) -> int:
    scale = noise_fraction(epsilon) / (Fraction(sensitivity) * (1 if monotone else 2))
    top = Fraction(max(scores))
    while True:
        i = _draw(rng, len(scores))
        if reference_bernoulli_exp(rng, scale * (top - Fraction(scores[i]))):
            return i


def reference_discrete_gaussian(rng: np.random.Generator, sigma_sq: Fraction, n: int) -> list[int]:
    """CKS Algorithm 3 as ``zcdp.discrete_gaussian`` batches it: Laplace draws for every entry
    still to do, then each entry's Bernoulli(exp(-1)) run (a round at a time), then the
    fractional coins of the entries that survived (breadth first, but for a sigma so large
    that the coins' common denominator passes 2^56: then one entry after the other)."""
    p, q = sigma_sq.numerator, sigma_sq.denominator
    t = math.isqrt(p // q) + 1
    den = 2 * p * q * t * t
    out, todo = [0] * n, list(range(n))
    while todo:
        y = reference_discrete_laplace(rng, 1, t, len(todo))
        square = [(abs(yi) * t * q - p) ** 2 for yi in y]
        ok, remaining = [True] * len(todo), [sq // den for sq in square]
        while running := [j for j in range(len(todo)) if ok[j] and remaining[j] > 0]:
            for j, hit in zip(running, reference_bernoulli_exp_unit(rng, [1] * len(running), 1),
                              strict=True):
                ok[j] = hit
                remaining[j] -= 1
        alive = [j for j in range(len(todo)) if ok[j]]
        rests = [square[j] % den for j in alive]
        if den < INT64_SAFE // 64:
            hits = reference_bernoulli_exp_unit(rng, rests, den)
        else:  # an enormous sigma: each entry's coin to its end, one entry after the other
            hits = [reference_bernoulli_exp_unit(rng, [rest], den)[0] for rest in rests]
        for j, hit in zip(alive, hits, strict=True):
            ok[j] = hit
        for j in range(len(todo)):
            if ok[j]:
                out[todo[j]] = y[j]
        todo = [i for i, keep in zip(todo, ok, strict=True) if not keep]
    return out


def _pair(kind: str, seed: int) -> tuple[np.random.Generator, np.random.Generator]:
    """Two generators in the same state: a seeded PCG64 (test releases) or a ChaCha20 stream
    (publication) with a fixed key."""
    if kind == "chacha":
        key = CryptoSeed(int(np.random.SeedSequence(seed).generate_state(1, np.uint64)[0]))
        return generator_for(key), generator_for(key)
    return np.random.default_rng(seed), np.random.default_rng(seed)


def _same_place(ours: np.random.Generator, reference: np.random.Generator) -> None:
    """The generator is left where the reference leaves it: the next 32-bit draw (which uses a
    buffered half word if one is pending), the next 64-bit draw and the whole state agree."""
    assert int(ours.integers(0, 2 ** 31)) == int(reference.integers(0, 2 ** 31))
    assert int(ours.integers(0, 2 ** 62)) == int(reference.integers(0, 2 ** 62))
    assert str(ours.bit_generator.state) == str(reference.bit_generator.state)


# eps' = s / t: 1/1 (t = 1: U draws nothing), 1/2, 2/1, 50/1 (Y = 0 nearly always: many
# rejected negative zeros), 2^-20 (Y near 2^20 V), and t = 2^32 (0.1, 1/3, 0.7: the 32-bit
# range's edge, 2^32 - 1, then 64-bit ranges from K = 2).
EPSILONS = (1.0, 0.5, 2.0, 50.0, 2.0 ** -20, 0.1, 1 / 3, 0.7)
SIZES = (0, 1, 2, 5, 100)


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_discrete_laplace_draws_the_references_numbers(epsilon: float) -> None:
    eps = noise_fraction(epsilon)
    for seed in range(4):
        for size in SIZES:
            kind = "chacha" if seed == 3 else "pcg"
            ours, reference = _pair(kind, 1000 * seed + size)
            got = discrete_laplace(ours, epsilon, size)
            assert got.dtype == np.int64 and got.shape == (size,)
            expected = reference_discrete_laplace(reference, eps.numerator, eps.denominator, size)
            assert got.tolist() == expected, (epsilon, seed, size, kind)
            _same_place(ours, reference)


@pytest.mark.parametrize(("epsilon", "kind"), [(0.1, "pcg"), (1.0, "chacha"), (50.0, "pcg")])
def test_discrete_laplace_draws_the_references_numbers_for_ten_thousand(epsilon, kind) -> None:
    """The large sizes go through the vectorised rounds, then the small tail of each round."""
    eps = noise_fraction(epsilon)
    ours, reference = _pair(kind, 7)
    got = discrete_laplace(ours, epsilon, (100, 100))
    assert got.shape == (100, 100)
    expected = reference_discrete_laplace(reference, eps.numerator, eps.denominator, 10_000)
    assert got.ravel().tolist() == expected
    _same_place(ours, reference)


def test_the_rational_laplace_and_its_parts_draw_the_references_numbers() -> None:
    """The parts the discrete Gaussian calls directly: any s / t, acceptance coins for any
    num / den up to the 2^62 edge (where the rounds finish entry by entry), and the counts."""
    choices = np.random.default_rng(5)
    for seed in range(40):
        ours, reference = _pair("chacha" if seed % 4 == 0 else "pcg", seed)
        n = int(choices.choice([0, 1, 2, 3, 5, 17, 100, 300]))
        s, t = int(choices.integers(1, 40)), int(choices.integers(1, 1 << int(choices.integers(1, 40))))
        assert discrete_laplace_rational(ours, s, t, n).tolist() == reference_discrete_laplace(
            reference, s, t, n)
        den = int(choices.choice([1, 2, 3, 1 << 32, (1 << 61) + 7, (INT64_SAFE // 64) - 1]))
        nums = [int(x) for x in choices.integers(0, den + 1, n)]
        if seed % 3 == 0 and n:  # the edges: num 0 (always fails at K = 1) and num = den
            nums[0], nums[-1] = 0, den
        got = _bernoulli_exp_unit(ours, np.array(nums, dtype=np.int64), den)
        assert got.dtype == bool and got.tolist() == reference_bernoulli_exp_unit(reference, nums,
                                                                                  den)
        assert _count_exp1_successes(ours, n).tolist() == reference_count_exp1(reference, n)
        _same_place(ours, reference)


def test_bernoulli_exp_and_the_exponential_mechanism_draw_the_references_numbers() -> None:
    choices = np.random.default_rng(6)
    for seed in range(30):
        ours, reference = _pair("chacha" if seed % 5 == 0 else "pcg", seed)
        for _ in range(20):
            gamma = Fraction(int(choices.integers(0, 400)), int(choices.integers(1, 100)))
            assert bernoulli_exp(ours, gamma) == reference_bernoulli_exp(reference, gamma)
        m = int(choices.choice([1, 2, 5, 100, 2000]))
        scores = (choices.integers(-50, 50, m) * choices.random()).tolist()
        epsilon, sensitivity = float(choices.choice([0.1, 1.0, 2.5])), float(choices.choice([1, 3]))
        monotone = bool(seed % 2)
        for _ in range(5):
            assert exponential_mechanism(ours, np.array(scores), epsilon, sensitivity,
                                         monotone) == reference_exponential_mechanism(
                reference, scores, epsilon, sensitivity, monotone)
        _same_place(ours, reference)


@pytest.mark.parametrize("sigma_sq", [Fraction(9, 16), Fraction(625), Fraction(160001, 16),
                                      Fraction(2147395601, 16)])
def test_the_discrete_gaussian_draws_the_references_numbers(sigma_sq: Fraction) -> None:
    for seed, size in [(0, 0), (1, 1), (2, 5), (3, 100), (4, 2000)]:
        ours, reference = _pair("chacha" if seed == 2 else "pcg", seed)
        got = zcdp.discrete_gaussian(ours, sigma_sq, size)
        assert got.tolist() == reference_discrete_gaussian(reference, sigma_sq, size)
        _same_place(ours, reference)


def test_the_few_draws_computed_here_are_numpys_draws() -> None:
    """The few draws the samplers compute from the bit generator's outputs (numpy's bounded
    algorithm, ``randomness._Uniforms``) are the values ``rng.integers`` gives and leave the
    generator where it leaves it, at the edges of numpy's branches: ranges of one, 2, the
    32-bit Lemire ranges (2^31 + 1 rejects half its words), exactly 2^32 (a raw 32-bit word),
    the 64-bit Lemire ranges up to 2^62; 32- and 64-bit draws interleaved so a buffered half
    word is pending across calls."""
    from medrelease.privacy.randomness import _Uniforms

    highs = [1, 2, 3, 7, 1000, (1 << 31) - 1, 1 << 31, (1 << 31) + 1, 3 << 30, (1 << 32) - 1,
             1 << 32, (1 << 32) + 1, 1 << 33, 10 ** 12 + 39, (1 << 61) + 1, 3 << 60,
             (1 << 62) - 1, 1 << 62]
    for kind in ("pcg", "chacha"):
        ours, numpy_own = _pair(kind, 21)
        uniforms = _Uniforms(ours)
        choices = np.random.default_rng(3)
        for _ in range(400):
            high = int(choices.choice(highs))
            count = int(choices.integers(0, 20))
            assert uniforms.draws(high, count) == numpy_own.integers(0, high, count).tolist()
            assert uniforms.one(high) == int(numpy_own.integers(0, high)), (kind, high)
        _same_place(ours, numpy_own)
