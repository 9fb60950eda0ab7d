"""Empirical privacy audit: a statistical lower bound on a mechanism's epsilon (EVALUATION.md).

Two neighbouring tables are built to be worst-case: ``D`` and ``D' = D + one row`` whose
informative value occurs nowhere else. The mechanism runs many times on each. Candidate
distinguishing events are scored on the first half of the runs; the best one is then estimated
on the second half with Clopper-Pearson intervals, giving at the stated confidence

    eps_lower_bound = ln( p_low(E | one table) / p_high(E | the other) ).

A sound eps-DP mechanism keeps this at or below eps (up to delta); ``ipa-paper`` publishes every
real row's informative value, so its bound exceeds its claim.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import beta

from medrelease.aggregate import aggregate_frame
from medrelease.release import release_from_counts
from medrelease.taxonomy import SUPPRESSED, from_leaf_paths, numeric_levels

UNIQUE_VALUE = "UNIQUE-DX"
Event = Callable[[pd.DataFrame], bool]


@dataclass(frozen=True)
class AuditResult:
    mechanism: str
    claimed_epsilon: float
    runs_per_table: int
    event: str
    hits_with: int
    hits_without: int
    epsilon_lower_bound: float
    confidence: float

    @property
    def exceeds_claim(self) -> bool:
        return self.epsilon_lower_bound > self.claimed_epsilon


def neighbouring_tables(n_rows: int = 60, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``D`` and ``D'``: D' adds one person whose diagnosis nobody else has."""
    rng = np.random.default_rng(seed)
    base = pd.DataFrame({
        "cat": rng.choice([f"c{i}" for i in range(4)], n_rows),
        "num": rng.integers(0, 20, n_rows),
        "inf": rng.choice([f"d{i}" for i in range(5)], n_rows),
    })
    target = pd.DataFrame({"cat": ["c0"], "num": [0], "inf": [UNIQUE_VALUE]})
    return base, pd.concat([base, target], ignore_index=True)


def _taxonomies():
    leaves = [f"c{i}" for i in range(4)]
    cat = from_leaf_paths("cat", "categorical", leaves,
                          [[f"g{i // 2}", SUPPRESSED] for i in range(4)])
    num = numeric_levels("num", 0, 19, [{"width": 5}])
    return cat, num


def clopper_pearson(hits: int, n: int, confidence: float) -> tuple[float, float]:
    """Exact one-sided bounds, each at ``confidence`` (so use (1 + c) / 2 for a joint c)."""
    alpha = 1.0 - confidence
    low = 0.0 if hits == 0 else float(beta.ppf(alpha, hits, n - hits + 1))
    high = 1.0 if hits == n else float(beta.ppf(1 - alpha, hits + 1, n - hits))
    return low, high


def _events() -> dict[str, Event]:
    return {
        "unique value released": lambda t: bool((t["inf"] == UNIQUE_VALUE).any()),
        "unique value absent": lambda t: not bool((t["inf"] == UNIQUE_VALUE).any()),
    }


def _bound(hits_a: int, hits_b: int, n: int, confidence: float) -> float:
    low, _ = clopper_pearson(hits_a, n, confidence)
    _, high = clopper_pearson(hits_b, n, confidence)
    if low <= 0.0:
        return 0.0
    return max(0.0, math.log(low / high))


def run_audit(
    mechanism: str, epsilon: float, runs: int = 200, seed: int | None = None,
    confidence: float = 0.95, progress: Callable[[int, int], None] | None = None,
) -> AuditResult:
    """Run ``mechanism`` ``runs`` times on each neighbour and bound epsilon from below."""
    without, with_target = neighbouring_tables()
    taxonomies = _taxonomies()
    tables = {}
    for name, frame in (("without", without), ("with", with_target)):
        tables[name] = aggregate_frame(frame, ["cat", "num"], ["inf"], taxonomies)
    seeds = np.random.SeedSequence(seed).generate_state(2 * runs) if seed is not None else None
    outcomes: dict[str, list[dict[str, bool]]] = {"without": [], "with": []}
    events = _events()
    done = 0
    for name, counts in tables.items():
        for _ in range(runs):
            run_seed = None if seeds is None else int(seeds[done])
            table = release_from_counts(counts, mechanism, {"epsilon": epsilon},
                                        seed=run_seed).table
            outcomes[name].append({e: f(table) for e, f in events.items()})
            done += 1
            if progress:
                progress(done, 2 * runs)
    half = runs // 2
    joint = (1.0 + confidence) / 2.0  # two one-sided bounds -> joint confidence

    def hits(name: str, event: str, part: slice) -> int:
        return sum(o[event] for o in outcomes[name][part])

    # Choose the event and direction on the first half (plain frequencies, +1 smoothing)...
    best, best_score = None, -math.inf
    for event in events:
        for a, b in (("with", "without"), ("without", "with")):
            score = math.log((hits(a, event, slice(0, half)) + 1) /
                             (hits(b, event, slice(0, half)) + 1))
            if score > best_score:
                best, best_score = (event, a, b), score
    event, a, b = best
    # ...and bound it on the second half only.
    n = runs - half
    hits_a, hits_b = hits(a, event, slice(half, runs)), hits(b, event, slice(half, runs))
    return AuditResult(
        mechanism=mechanism,
        claimed_epsilon=epsilon,
        runs_per_table=runs,
        event=f"{event} ({a} the target vs {b})",
        hits_with=hits("with", event, slice(half, runs)),
        hits_without=hits("without", event, slice(half, runs)),
        epsilon_lower_bound=_bound(hits_a, hits_b, n, joint),
        confidence=confidence,
    )
