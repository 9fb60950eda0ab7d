"""All randomness of a release comes from one entropy source, drawn by exact samplers.

``RandomSource`` is the root. For a release that may be published it draws every stream's key
from the operating system's CSPRNG (``secrets``, i.e. ``getrandom``) and each stream is a
ChaCha20 generator (``randomgen.ChaCha``, 20 rounds, 256-bit key, counter from 0): a
cryptographically secure keystream, as fast here as numpy's PCG64 (measured, docs/PRIVACY.md).
An explicit ``seed`` makes a TEST release (separate store, never published: anyone who knows the
seed can subtract the noise) on numpy's seeded PCG64. Independent child streams (one per lattice
node, one for the selection, one for the final draw, one for the shuffle; the unit bound's from
its own child, ``unit_stream``) are spawned from the root, so work can be split across threads
or processes without sharing a generator; a stream turned into a generator twice gives the same
draws twice (a scored candidate replays).

Samplers (docs/PRIVACY.md, "Samplers"): every privacy claim assumes the noise has exactly the
stated law, so none of them rounds a floating-point draw.

* ``discrete_laplace``: P(Z = k) ∝ exp(-eps' |k|) with unbounded support, by Canonne, Kamath
  and Steinke's algorithm (NeurIPS 2020, Algorithms 1-2) on integers only, vectorised. The
  noise epsilon is ``eps' = floor(eps * 2^32) / 2^32 <= eps`` (a rational the integer sampler
  can use); noise at ``eps' <= eps`` is ``eps``-DP a fortiori, and thresholds are computed for
  ``eps'``. Uniform integers come from numpy's bounded-integer generator, which is exact.
* ``exponential_mechanism``: P(i) ∝ exp(eps' u_i / (c Δ)) exactly (c = 2, or 1 for a monotone
  score), by uniform proposals accepted with an exact Bernoulli(exp(-γ)) on rational γ.
* ``tail_binomial``: how many of N zero counts pass ``Z >= threshold`` — the exact binomial,
  by geometric skips computed with lazily refined, correctly rounded decimal arithmetic, for N
  far beyond what can be enumerated (set-valued DiffGen).
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from decimal import Context, Decimal
from fractions import Fraction
from functools import lru_cache

import numpy as np

NOISE_GRID_BITS = 32
NOISE_GRID = 1 << NOISE_GRID_BITS
MIN_NOISE_EPSILON = 2.0 ** -20
INT64_SAFE = 1 << 62
# The unit bound's child index: above any count of children ``spawn`` gives a plan (lattice
# nodes + 3; ``max_lattice_nodes`` is at most 10^7).
UNIT_STREAM = 1 << 32


CHACHA_ROUNDS = 20
PUBLICATION_RANDOMNESS = ("OS entropy (secrets/getrandom) keying ChaCha20 streams "
                          "(randomgen.ChaCha, 20 rounds, 256-bit keys): cryptographically secure")
TEST_RANDOMNESS = "fixed seed, numpy PCG64 streams (TEST release: NOT FOR PUBLICATION)"


@dataclass(frozen=True)
class CryptoSeed:
    """One stream of a publishable release: a 256-bit ChaCha20 key from the OS's CSPRNG.

    The key never appears in a repr, a log or a record; it lives as long as the run."""

    key: int = field(repr=False)

    @classmethod
    def fresh(cls) -> CryptoSeed:
        return cls(secrets.randbits(256))

    def spawn(self, n: int) -> list[CryptoSeed]:
        """Independent child streams: fresh keys from the OS (not derived from this key)."""
        return [CryptoSeed.fresh() for _ in range(n)]


StreamSeed = np.random.SeedSequence | CryptoSeed


def generator_for(seed: StreamSeed | int | None) -> np.random.Generator:
    """The generator of one stream: ChaCha20 for a ``CryptoSeed``, PCG64 for a test seed.

    Called twice on the same stream it gives the same draws (the counter starts at 0)."""
    if isinstance(seed, CryptoSeed):
        from randomgen import ChaCha

        return np.random.Generator(ChaCha(key=seed.key, counter=0, rounds=CHACHA_ROUNDS))
    return np.random.default_rng(seed)


@dataclass
class RandomSource:
    """The one entropy root of a release."""

    seed: int | None = None
    _root: np.random.SeedSequence = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
        self._root = np.random.SeedSequence(self.seed)

    @property
    def for_publication(self) -> bool:
        return self.seed is None

    @property
    def test_release(self) -> bool:
        """A fixed seed makes a TEST release: reproducible, and for that reason never published."""
        return self.seed is not None

    @property
    def seed_policy(self) -> str:
        if self.seed is None:
            return "OS entropy (for publication)"
        return "fixed seed (TEST release: NOT FOR PUBLICATION)"

    @property
    def randomness(self) -> str:
        """The random source in words (the manifest's ``randomness`` field)."""
        return PUBLICATION_RANDOMNESS if self.seed is None else TEST_RANDOMNESS

    def spawn(self, n: int) -> list[StreamSeed]:
        """``n`` independent child streams (each becomes its own generator via
        ``generator_for``): OS-keyed ChaCha20 for publication, seeded PCG64 for a test."""
        if self.seed is None:
            return [CryptoSeed.fresh() for _ in range(n)]
        return self._root.spawn(n)

    def generator(self) -> np.random.Generator:
        return generator_for(self.spawn(1)[0])

    def unit_stream(self) -> StreamSeed:
        """The privacy unit's bound's own stream: a fresh OS key for publication; for a test
        seed, child ``UNIT_STREAM`` of the root — never one of the children ``spawn`` hands
        out (nodes, selection, final draw, shuffle), however many nodes there are, so the rows
        a unit keeps are independent of every noise draw (it was child 3, which was also
        node 3's noise stream in the engine's plan)."""
        if self.seed is None:
            return CryptoSeed.fresh()
        return np.random.SeedSequence(self.seed, spawn_key=(UNIT_STREAM,))


# -- the noise epsilon ---------------------------------------------------------------------

def noise_fraction(epsilon: float) -> Fraction:
    """eps' = floor(eps * 2^32) / 2^32: the rational epsilon the exact samplers draw with."""
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon)
            and epsilon >= MIN_NOISE_EPSILON):
        raise ValueError(f"noise epsilon must be a finite number >= 2^-20, got {epsilon!r}")
    return _grid_fraction(epsilon)


@lru_cache(maxsize=1024)
def _grid_fraction(epsilon: float) -> Fraction:
    """Cached: a release asks for the same few epsilons thousands of times (per cell table,
    per threshold), and the Fraction arithmetic costs 30 us a call. Equal keys (1 and 1.0)
    give equal fractions."""
    return Fraction(math.floor(Fraction(epsilon) * NOISE_GRID), NOISE_GRID)


def noise_epsilon(epsilon: float) -> float:
    """eps' as a float (for tail formulas and reports)."""
    return float(noise_fraction(epsilon))


def discrete_laplace_tail(epsilon: float, k: int) -> float:
    """P(Z >= k), k >= 1, for the discrete Laplace that ``discrete_laplace(eps)`` draws.

    P(Z >= k) = x^k / (1 + x) with x = exp(-eps'); computed in logs so it never underflows to a
    misleading 0 before the caller compares it with delta.
    """
    eps = noise_epsilon(epsilon)
    return math.exp(-k * eps - math.log1p(math.exp(-eps)))


# -- uniform integers: numpy's draws, without numpy's per-call cost --------------------------
#
# The samplers' stream (which uniform integers are drawn, in which order) is fixed: seeded
# releases, the step audits' calibrated run counts and the published seeded examples depend on
# it (tests/unit/test_sampler_stream.py holds a scalar transcription of CKS to compare with). Every
# sampler runs in rounds, breadth first: each entry still running draws once per round, in
# entry order, so a round is one bounded-integer draw of numpy's. What costs is not arithmetic
# but numpy's per-call overhead on the few entries of the later rounds (3 us a scalar
# ``rng.integers`` call, 9 us a sized one, 1-2 us any other array operation), so a round with
# at most ``LIST_ROUND_MAX`` entries keeps its bookkeeping in Python lists and ints, and up to
# ``FEW_DRAWS_MAX`` draws are computed here from the bit generator's own 32- and 64-bit
# outputs, by numpy's algorithm (0.6 us a draw).

LIST_ROUND_MAX = 64
FEW_DRAWS_MAX = 12
_MASK32, _MASK64 = (1 << 32) - 1, (1 << 64) - 1


def _numpy_bounded(rng: np.random.Generator):
    """A function ``high -> int(rng.integers(0, high))`` for 1 <= high <= 2^62: the same value,
    the generator left in the same place, at a fifth of the cost.

    It is numpy's bounded-integer algorithm (``random_bounded_uint64_fill``, numpy >= 1.17's
    ``Generator``): nothing drawn for a range of one; a range of 2^32 is one 32-bit output;
    otherwise Lemire's multiply-and-reject on 32-bit outputs below 2^32 and on 64-bit outputs
    above. The outputs come from the bit generator's own ``next_uint32`` / ``next_uint64``
    (numpy's ctypes interface), so its buffered half words are used as numpy uses them. A
    generator without a numpy bit generator (a test's scripted one) gets its own
    ``integers``. Not locked: a generator belongs to one stream, used by one thread."""
    interface = getattr(getattr(rng, "bit_generator", None), "ctypes", None)
    if interface is None:
        return lambda high: int(rng.integers(0, high))
    next32, next64, state = interface.next_uint32, interface.next_uint64, interface.state

    def below(high: int) -> int:
        if high == 1:
            return 0
        if high <= _MASK32:
            m = next32(state) * high
            if (m & _MASK32) < high:
                threshold = (_MASK32 + 1 - high) % high
                while (m & _MASK32) < threshold:
                    m = next32(state) * high
            return m >> 32
        if high == _MASK32 + 1:
            return next32(state)
        m = next64(state) * high
        if (m & _MASK64) < high:
            threshold = (_MASK64 + 1 - high) % high
            while (m & _MASK64) < threshold:
                m = next64(state) * high
        return m >> 64

    below.keepalive = rng  # the state pointer lives as long as the generator
    return below


class _Uniforms:
    """Bounded uniform integers from one generator: ``draws(high, count)`` is
    ``rng.integers(0, high, count).tolist()``, the same values in the same order."""

    __slots__ = ("below", "rng")

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.below = _numpy_bounded(rng)

    def draws(self, high: int, count: int) -> list[int]:
        high = int(high)  # Python ints: a numpy integer would overflow in ``below``
        if high == 1 or count == 0:  # numpy draws nothing for these
            return [0] * count
        if count <= FEW_DRAWS_MAX and high <= INT64_SAFE:
            below = self.below
            return [below(high) for _ in range(count)]
        return self.rng.integers(0, high, count).tolist()

    def one(self, high: int) -> int:
        """One draw in [0, high) for any positive integer (raw bits above 2^62)."""
        high = int(high)
        if high <= INT64_SAFE:
            return self.below(high)
        return _uniform_below(self.rng, high)


def _uniform_draws(rng: np.random.Generator, high: int, size: int) -> np.ndarray:
    """``rng.integers(0, high, size)``, the same draws (see ``_Uniforms``)."""
    if high == 1:  # numpy draws nothing for a range of one
        return np.zeros(size, dtype=np.int64)
    if size <= FEW_DRAWS_MAX:
        return np.array(_Uniforms(rng).draws(high, size), dtype=np.int64)
    return rng.integers(0, high, size)


def _uniform_below(rng: np.random.Generator, n: int) -> int:
    """Exact uniform integer in [0, n) for any positive Python int (rejection on raw bits)."""
    if n <= INT64_SAFE:
        return int(rng.integers(0, n))
    bits = n.bit_length()
    while True:
        value = int.from_bytes(rng.bytes((bits + 7) // 8), "little") & ((1 << bits) - 1)
        if value < n:
            return value


# -- exact Bernoulli(exp(-gamma)) ------------------------------------------------------------

def _bernoulli_exp_unit_list(uniforms: _Uniforms, nums: list[int], den: int,
                             k: int = 1) -> list[bool]:
    """Bernoulli(exp(-num/den)) per entry of ``nums``, 0 <= num <= den, from round ``k`` on
    (CKS Algorithm 1: K = 1; while Bernoulli(gamma / K): K += 1; return K odd).

    Bernoulli(num / (den K)) is ``uniform{0..den K - 1} < num``, exact in integers; every entry
    still running in round K draws once, in entry order. A range that reaches 2^62 (never in
    practice: P(K > 2^29) is below 1 / (2^29)!) finishes each remaining entry on its own."""
    result = [False] * len(nums)
    active = list(range(len(nums)))
    while active:
        high = den * k
        if high >= INT64_SAFE:
            for i in active:
                result[i] = _scalar_bernoulli_exp_unit(uniforms, nums[i], den, k)
            break
        odd = k % 2 == 1
        survivors = []
        for i, draw in zip(active, uniforms.draws(high, len(active)), strict=True):
            if draw < nums[i]:
                survivors.append(i)
            else:
                result[i] = odd
        active = survivors
        k += 1
    return result


def _bernoulli_exp_unit(rng: np.random.Generator, num: np.ndarray, den: int) -> np.ndarray:
    """Bernoulli(exp(-num/den)) per entry, 0 <= num <= den (CKS Algorithm 1, vectorised).

    The rounds of many entries are numpy operations; once at most ``LIST_ROUND_MAX`` entries
    run, the remaining rounds go on in ``_bernoulli_exp_unit_list`` (the same draws)."""
    num = np.asarray(num, dtype=np.int64)
    if num.size <= LIST_ROUND_MAX:
        return np.array(_bernoulli_exp_unit_list(_Uniforms(rng), num.tolist(), den),
                        dtype=bool)
    result = np.zeros(num.size, dtype=bool)
    active = np.arange(num.size)
    k = 1
    while active.size > LIST_ROUND_MAX and den * k < INT64_SAFE:
        success = _uniform_draws(rng, den * k, active.size) < num[active]
        result[active[~success]] = k % 2 == 1
        active = active[success]
        k += 1
    if active.size:
        result[active] = _bernoulli_exp_unit_list(_Uniforms(rng), num[active].tolist(), den, k)
    return result


def _scalar_bernoulli_exp_unit(uniforms: _Uniforms, num: int, den: int, k: int = 1) -> bool:
    """Bernoulli(exp(-num/den)) for one rational in [0, 1], continuing from counter ``k``."""
    while uniforms.one(den * k) < num:
        k += 1
    return k % 2 == 1


def _bernoulli_exp(uniforms: _Uniforms, gamma: Fraction) -> bool:
    whole = math.floor(gamma)
    for _ in range(whole):
        if not _scalar_bernoulli_exp_unit(uniforms, 1, 1):
            return False
    rest = gamma - whole
    return _scalar_bernoulli_exp_unit(uniforms, rest.numerator, rest.denominator)


def bernoulli_exp(rng: np.random.Generator, gamma: Fraction) -> bool:
    """Exact Bernoulli(exp(-gamma)) for a rational gamma >= 0 (CKS: whole part, then fraction)."""
    if gamma < 0:
        raise ValueError("gamma must be >= 0")
    return _bernoulli_exp(_Uniforms(rng), gamma)


# -- discrete Laplace --------------------------------------------------------------------------

def _count_exp1_list(uniforms: _Uniforms, n: int) -> list[int]:
    """Per entry, the number of Bernoulli(exp(-1)) successes before the first failure: in each
    geometric round every entry still running flips one coin, all coins' rounds together.

    A coin is CKS Algorithm 1 with gamma = 1: round K = 1 always goes on (uniform{0} < 1, which
    draws nothing), round K >= 2 goes on on a draw of 0 from uniform{0..K-1}; the coin is a
    success if it stops at an odd K (``_bernoulli_exp_unit_list`` with num = den = 1)."""
    draws = uniforms.draws
    count = [0] * n
    active = list(range(n))
    while active:
        success = [False] * len(active)
        running, k = list(range(len(active))), 2
        while running:
            going = []
            for j, draw in zip(running, draws(k, len(running)), strict=True):
                if draw == 0:
                    going.append(j)
                elif k % 2 == 1:
                    success[j] = True
            running = going
            k += 1
        active = [i for i, hit in zip(active, success, strict=True) if hit]
        for i in active:
            count[i] += 1
    return count


def _count_exp1_successes(rng: np.random.Generator, n: int) -> np.ndarray:
    """``_count_exp1_list`` as an array; numpy rounds while more than ``LIST_ROUND_MAX`` run."""
    count = np.zeros(n, dtype=np.int64)
    active = np.arange(n)
    while active.size > LIST_ROUND_MAX:
        active = active[_bernoulli_exp_unit(rng, np.ones(active.size, dtype=np.int64), 1)]
        count[active] += 1
    if active.size:
        count[active] += np.array(_count_exp1_list(_Uniforms(rng), active.size),
                                  dtype=np.int64)
    return count


def discrete_laplace(
    rng: np.random.Generator, epsilon: float, size: int | tuple[int, ...]
) -> np.ndarray:
    """Integer noise with P(Z = k) ∝ exp(-eps' |k|), exactly (CKS Algorithm 2, vectorised).

    With eps' = s / t: U ~ uniform{0..t-1}, accept with Bernoulli(exp(-U/t)); V = successes of
    Bernoulli(exp(-1)); Y = floor((U + t V) / s); a fair sign B; reject (B = 1, Y = 0);
    return (1 - 2B) Y. Unbounded support, symmetric, no floating point.
    """
    eps = noise_fraction(epsilon)
    shape = (int(size),) if isinstance(size, (int, np.integer)) else tuple(size)
    return discrete_laplace_rational(rng, eps.numerator, eps.denominator,
                                     math.prod(shape)).reshape(shape)


def _discrete_laplace_list(uniforms: _Uniforms, s: int, t: int, n: int) -> list[int]:
    """n draws of ``discrete_laplace_rational`` in Python ints (exact at any size), the same
    draws in the same order: all U, their acceptance coins, the accepted entries' counts, their
    signs; then the retries, rejected U first, then the rejected negative zeros."""
    out = [0] * n
    todo = list(range(n))
    while todo:
        u = uniforms.draws(t, len(todo))
        accepted = _bernoulli_exp_unit_list(uniforms, u, t)
        kept = [(i, ui) for i, ui, ok in zip(todo, u, accepted, strict=True) if ok]
        counts = _count_exp1_list(uniforms, len(kept))
        signs = uniforms.draws(2, len(kept))
        negative_zeros = []
        for (i, ui), v, negative in zip(kept, counts, signs, strict=True):
            y = (ui + t * v) // s
            if negative and y == 0:
                negative_zeros.append(i)
            else:
                out[i] = -y if negative else y
        todo = [i for i, ok in zip(todo, accepted, strict=True) if not ok] + negative_zeros
    return out


def discrete_laplace_rational(rng: np.random.Generator, s: int, t: int, n: int) -> np.ndarray:
    """n draws with P(Z = k) ∝ exp(-(s/t) |k|), s and t positive integers (CKS Algorithm 2).

    numpy rounds while more than ``LIST_ROUND_MAX`` entries are to do, then
    ``_discrete_laplace_list`` for the rest, in the order they are retried."""
    out = np.zeros(n, dtype=np.int64)
    todo = np.arange(n)
    while todo.size > LIST_ROUND_MAX:
        u = rng.integers(0, t, todo.size)
        accepted = _bernoulli_exp_unit(rng, u, t)
        idx, u = todo[accepted], u[accepted]
        v = _count_exp1_successes(rng, idx.size)
        if v.size and int(v.max()) >= (INT64_SAFE // t) - 1:  # astronomically rare: big ints
            y = np.array([(int(a) + t * int(b)) // s for a, b in zip(u, v, strict=True)],
                         dtype=object)
        else:
            y = (u + t * v) // s
        negative = _uniform_draws(rng, 2, idx.size).astype(bool)
        keep = ~(negative & (y == 0))
        out[idx[keep]] = np.where(negative[keep], -y[keep], y[keep]).astype(np.int64)
        todo = np.concatenate([todo[~accepted], idx[~keep]])
    if todo.size:
        out[todo] = _discrete_laplace_list(_Uniforms(rng), s, t, todo.size)
    return out


def discrete_laplace_by_geometrics(
    rng: np.random.Generator, epsilon: float, size: int | tuple[int, ...]
) -> np.ndarray:
    """The textbook construction (difference of two geometric draws), a test reference only."""
    p = -math.expm1(-noise_epsilon(epsilon))
    return rng.geometric(p, size=size).astype(np.int64) - rng.geometric(p, size=size)


# -- exponential mechanism -------------------------------------------------------------------

def exponential_mechanism(
    rng: np.random.Generator, scores: np.ndarray, epsilon: float, sensitivity: float,
    monotone: bool = False,
) -> int:
    """Index i drawn with probability ∝ exp(eps' * score_i / (c * sensitivity)), exactly.

    c = 2 in general, c = 1 when the score is monotone (adding a row never lowers any score).
    Proposals are uniform; candidate i is accepted with Bernoulli(exp(-gamma_i)),
    gamma_i = eps' (top - score_i) / (c sensitivity) >= 0, computed on the exact rational
    values of the float scores, so the accepted index has exactly the stated law.
    """
    values = np.asarray(scores, dtype=np.float64)
    if values.size == 0:
        raise ValueError("exponential mechanism needs at least one candidate")
    if not np.isfinite(values).all():
        raise ValueError("exponential mechanism scores must be finite")
    scale = noise_fraction(epsilon) / (Fraction(sensitivity) * (1 if monotone else 2))
    top = Fraction(float(values.max()))
    uniforms, gammas = _Uniforms(rng), {}  # gamma_i computed when i is first proposed
    while True:
        i = uniforms.below(values.size)
        if i not in gammas:
            gammas[i] = scale * (top - Fraction(float(values[i])))
        if _bernoulli_exp(uniforms, gammas[i]):
            return i


def selection_probabilities(
    scores: np.ndarray, epsilon: float, sensitivity: float, monotone: bool = False
) -> np.ndarray:
    """The exponential mechanism's probabilities, computed with log-sum-exp (for reports)."""
    c = 1.0 if monotone else 2.0
    logits = noise_epsilon(epsilon) * np.asarray(scores, dtype=np.float64) / (c * sensitivity)
    logits -= logits.max()
    weights = np.exp(logits)
    return weights / weights.sum()


# -- exact binomial of threshold passes among zero counts -------------------------------------

def _widened(value: Decimal, prec: int) -> tuple[Decimal, Decimal]:
    """[value (1 - 10^-prec) - 10^-prec, value (1 + 10^-prec) + 10^-prec], in either sign."""
    half = abs(value).scaleb(-prec) + Decimal(1).scaleb(-prec)
    return value - half, value + half


def _log_miss(epsilon: Fraction, threshold: int, work: Context) -> Decimal:
    """ln(1 - p), p = P(Z >= threshold) = x^thr / (1 + x), x = exp(-eps'), at ``work`` precision.

    Every operation is correctly rounded at ``work.prec`` digits and touches numbers of size at
    most 2, so the absolute error stays below 100 * 10^-work.prec.
    """
    eps = work.divide(Decimal(epsilon.numerator), Decimal(epsilon.denominator))
    x = work.exp(work.minus(eps))
    p = work.divide(work.exp(work.minus(work.multiply(eps, threshold))), work.add(1, x))
    return work.ln(work.subtract(1, p))


def _geometric_failures(rng: np.random.Generator, epsilon: Fraction, threshold: int,
                        digits: int) -> int:
    """Failures before the first pass: floor(ln U / ln(1 - p)) for a lazily refined uniform U.

    U lies in [a / 2^m, (a + 1) / 2^m). Working at W = prec + 2 digits + 20 digits keeps every
    absolute rounding error below 10^-(prec + digits + 15) while |ln(1 - p)| >= p >= 10^-digits
    (``digits`` bounds -log10 p), so widening each quantity by a relative 10^-prec encloses the
    true value. The floor is returned once the quotient's interval holds a single integer;
    otherwise more bits of U and more digits are drawn. Terminates with probability 1; never
    rounds the result.
    """
    bits, prec = 64 + 4 * digits, 40 + 2 * digits
    a = _uniform_below(rng, 1 << bits)
    while True:
        work = Context(prec=prec + 2 * digits + 20)
        miss_low, miss_high = _widened(_log_miss(epsilon, threshold, work), prec)  # both < 0
        if a > 0:
            scale = Decimal(1 << bits)
            ln_low = _widened(work.ln(work.divide(Decimal(a), scale)), prec)[0]
            ln_high = min(Decimal(0), _widened(work.ln(work.divide(Decimal(a + 1), scale)),
                                               prec)[1])
            # both logarithms <= 0: the quotient is smallest for the largest ln U and |ln(1-p)|
            q_low = _widened(work.divide(ln_high, miss_low), prec)[0]
            q_high = _widened(work.divide(ln_low, miss_high), prec)[1]
            if math.floor(max(q_low, Decimal(0))) == math.floor(q_high):
                return math.floor(q_high)
        a = (a << 32) | _uniform_below(rng, 1 << 32)
        bits += 32
        prec += 10


def tail_binomial(rng: np.random.Generator, trials: int, epsilon: float, threshold: int) -> int:
    """Exact Binomial(trials, P(Z >= threshold)) for Z ~ ``discrete_laplace(epsilon)``.

    Counts how many of ``trials`` zero counts would pass the threshold test, by geometric skips
    between passes (trials may be 2^216). Expected cost: one skip per pass plus one.
    """
    if trials <= 0:
        return 0
    if threshold <= 0:
        raise ValueError("tail_binomial needs a threshold >= 1")
    eps = noise_fraction(epsilon)
    digits = len(str(trials)) + int(threshold * float(eps) / math.log(10)) + 1
    position, passes = 0, 0
    while True:
        position += _geometric_failures(rng, eps, threshold, digits) + 1
        if position > trials:
            return passes
        passes += 1
