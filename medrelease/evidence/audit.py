"""Empirical privacy audit: a statistical lower bound on a mechanism's epsilon (EVALUATION.md).

Two neighbouring tables are built to be worst-case (a *design*): ``unique`` — ``D' = D`` plus
one person whose diagnosis occurs nowhere else; ``tipping`` — a diagnosis sits one row below the
mechanism's release threshold in ``D`` and reaches it in ``D'``; ``classification`` — DiffGen's
table plus one record. The mechanism runs many times on each (in batches, which the audit flow
fans out as Prefect tasks). Each run is reduced to a statistic (rows carrying the target's
value); the events ``statistic >= j`` are scored on the first half of the runs, and the best
one is estimated on the second half with Clopper-Pearson intervals, giving at the stated
confidence

    eps_lower_bound = ln( p_low(E | one table) / p_high(E | the other) ).

A sound eps-DP mechanism keeps this at or below eps (up to delta); ``ipa-paper`` publishes every
real row's informative value, so its bound exceeds its claim.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import beta

from medrelease.data.aggregate import aggregate_frame
from medrelease.data.config import DatasetConfig, config_from_dict
from medrelease.data.taxonomy import SUPPRESSED, from_leaf_paths, numeric_levels
from medrelease.mechanisms import capabilities, get_mechanism
from medrelease.release import release, release_from_counts

UNIQUE_VALUE = "UNIQUE-DX"
TIPPING_VALUE = "TIPPING-DX"
DESIGNS = ("unique", "tipping", "classification")
Statistic = Callable[[pd.DataFrame], float]


@dataclass(frozen=True)
class AuditResult:
    mechanism: str
    claimed_epsilon: float
    runs_per_table: int
    design: str
    event: str
    hits_with: int
    hits_without: int
    epsilon_lower_bound: float
    confidence: float

    @property
    def exceeds_claim(self) -> bool:
        return self.epsilon_lower_bound > self.claimed_epsilon

    @property
    def ceiling(self) -> float:
        """The largest bound these runs could ever show (all hits on one side, none on the other)."""
        return detection_ceiling(self.runs_per_table, self.confidence)

    @property
    def verdict(self) -> str:
        """'exceeds its claim', 'within its claim', or 'inconclusive' when the claim is at or
        above what this number of runs can detect (more runs raise the ceiling)."""
        if self.exceeds_claim:
            return "exceeds its claim"
        if self.claimed_epsilon >= self.ceiling:
            return "inconclusive"
        return "within its claim"


def detection_ceiling(runs_per_table: int, confidence: float = 0.95) -> float:
    """ln(p_low / p_high) for n/n hits against 0/n on the estimation half: no larger bound exists.

    With 200 runs per table (100 estimated) at 95 % this is 3.28: a claim of eps >= 3.28 can
    never be shown to fail, so such an audit is inconclusive, not a pass.
    """
    n = runs_per_table - runs_per_table // 2
    return _bound(n, 0, n, (1.0 + confidence) / 2.0) if n > 0 else 0.0


def default_design(mechanism: str) -> str:
    return "classification" if capabilities(mechanism).needs_class_domain else "unique"


def _base(n_rows: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "cat": rng.choice([f"c{i}" for i in range(4)], n_rows),
        "num": rng.integers(0, 20, n_rows),
        "inf": rng.choice([f"d{i}" for i in range(5)], n_rows),
    })


def neighbouring_tables(n_rows: int = 60, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``D`` and ``D'``: D' adds one person whose diagnosis nobody else has."""
    base = _base(n_rows, seed)
    target = pd.DataFrame({"cat": ["c0"], "num": [0], "inf": [UNIQUE_VALUE]})
    return base, pd.concat([base, target], ignore_index=True)


def tipping_copies(mechanism: str, epsilon: float) -> int:
    """Rows of the tipping value in ``D``: one below the count the mechanism needs to show it."""
    impl = get_mechanism(mechanism)
    params = impl.parse_params({"epsilon": epsilon})
    if hasattr(impl, "thresholds"):
        return max(1, impl.thresholds(params)[0] - 1)
    return max(1, getattr(params, "suppression_threshold", 2) - 1)


def common_tables(n_rows: int = 60, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``D'`` adds a copy of one of ``D``'s rows (a common value in a populated class)."""
    base = _base(n_rows, seed)
    return base, pd.concat([base, base.iloc[:1]], ignore_index=True)


def tipping_tables(mechanism: str, epsilon: float, n_rows: int = 60, seed: int = 0
                   ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``D`` holds the tipping diagnosis one row short of the threshold, in one class."""
    base = _base(n_rows, seed)
    copies = tipping_copies(mechanism, epsilon)
    tip = pd.DataFrame({"cat": ["c0"] * copies, "num": [0] * copies,
                        "inf": [TIPPING_VALUE] * copies})
    without = pd.concat([base, tip], ignore_index=True)
    return without, pd.concat([without, tip.iloc[:1]], ignore_index=True)


def _taxonomies():
    leaves = [f"c{i}" for i in range(4)]
    cat = from_leaf_paths("cat", "categorical", leaves,
                          [[f"g{i // 2}", SUPPRESSED] for i in range(4)])
    num = numeric_levels("num", 0, 19, [{"width": 5}])
    return cat, num


@lru_cache(maxsize=1)
def _classification_config() -> DatasetConfig:
    """The DiffGen audit's config; its taxonomies are loaded before the temp folder goes."""
    with tempfile.TemporaryDirectory(prefix="medrelease-audit-") as name:
        folder = Path(name)
        (folder / "cat.csv").write_text("".join(f"c{i};g{i // 2};*\n" for i in range(4)))
        (folder / "num.yaml").write_text("domain: {min: 0, max: 19}\nlevels:\n  - {width: 5}\n")
        config = config_from_dict({
            "name": "audit", "input": {"path": "unused.csv"},
            "columns": {"cat": {"role": "dimension", "taxonomy": "cat.csv"},
                        "num": {"role": "dimension", "type": "integer", "taxonomy": "num.yaml"},
                        "outcome": {"role": "class", "values": ["no", "yes"]}},
            "privacy": {"lifetime_epsilon": 1e9},
        }, folder)
        config.taxonomies  # noqa: B018 - loaded while the files exist
    return config


def classification_tables(n_rows: int = 60, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """DiffGen's neighbours: D' adds one 'yes' record in the corner cell (c0, 0)."""
    base = _base(n_rows, seed).drop(columns="inf")
    base["outcome"] = np.where(np.random.default_rng(seed + 1).random(n_rows) < 0.2, "yes", "no")
    target = pd.DataFrame({"cat": ["c0"], "num": [0], "outcome": ["yes"]})
    return base, pd.concat([base, target], ignore_index=True)


def design_tables(design: str, mechanism: str, epsilon: float
                  ) -> tuple[pd.DataFrame, pd.DataFrame, Statistic]:
    """The two neighbours of a design and the statistic each run is reduced to."""
    if design == "unique":
        without, with_target = neighbouring_tables()
        return without, with_target, lambda t: float((t["inf"] == UNIQUE_VALUE).sum())
    if design == "tipping":
        without, with_target = tipping_tables(mechanism, epsilon)
        return without, with_target, lambda t: float((t["inf"] == TIPPING_VALUE).sum())
    if design == "classification":
        without, with_target = classification_tables()
        return without, with_target, lambda t: float((t["outcome"] == "yes").sum())
    raise ValueError(f"unknown audit design {design!r}; choose one of {', '.join(DESIGNS)}")


def clopper_pearson(hits: int, n: int, confidence: float) -> tuple[float, float]:
    """Exact one-sided bounds, each at ``confidence`` (so use (1 + c) / 2 for a joint c)."""
    alpha = 1.0 - confidence
    low = 0.0 if hits == 0 else float(beta.ppf(alpha, hits, n - hits + 1))
    high = 1.0 if hits == n else float(beta.ppf(1 - alpha, hits + 1, n - hits))
    return low, high


def _bound(hits_a: int, hits_b: int, n: int, confidence: float) -> float:
    low, _ = clopper_pearson(hits_a, n, confidence)
    _, high = clopper_pearson(hits_b, n, confidence)
    if low <= 0.0:
        return 0.0
    return max(0.0, math.log(low / high))


def run_batch(mechanism: str, epsilon: float, design: str, table: str,
              seeds: Sequence[int | None]) -> list[float]:
    """Run the mechanism once per seed on one neighbour; the statistic of every run."""
    without, with_target, statistic = design_tables(design, mechanism, epsilon)
    frame = with_target if table == "with" else without
    out = []
    if design == "classification":
        config = _classification_config()
        for seed in seeds:
            out.append(statistic(release(frame, config, mechanism=mechanism,
                                         params={"epsilon": epsilon}, seed=seed).table))
        return out
    # histogram is eps-DP only with a public domain, so it gets one (the same for both tables);
    # the IPA mechanisms run as they do on a config without one
    public = capabilities(mechanism).audit_public_domain
    values = sorted(set(with_target["inf"])) if public else None
    counts = aggregate_frame(frame, ["cat", "num"], ["inf"], _taxonomies(), values)
    for seed in seeds:
        out.append(statistic(release_from_counts(counts, mechanism, {"epsilon": epsilon},
                                                 seed=seed).table))
    return out


def seeds_for(runs: int, seed: int | None) -> tuple[list[int | None], list[int | None]]:
    """Per-run seeds for the two tables (None: fresh OS entropy per run)."""
    if seed is None:
        return [None] * runs, [None] * runs
    state = np.random.SeedSequence(seed).generate_state(2 * runs)
    return [int(s) for s in state[:runs]], [int(s) for s in state[runs:]]


def bound_from_statistics(mechanism: str, epsilon: float, design: str,
                          without: Sequence[float], with_target: Sequence[float],
                          confidence: float = 0.95) -> AuditResult:
    """Pick the event ``statistic >= j`` and its direction on the first half, bound on the rest."""
    runs = min(len(without), len(with_target))
    half = runs // 2
    stats = {"without": np.asarray(without[:runs]), "with": np.asarray(with_target[:runs])}
    thresholds = sorted(set(np.concatenate([stats["without"][:half], stats["with"][:half]])))
    best, best_score = (thresholds[0] if thresholds else 0.0, "with", "without"), -math.inf
    for j in thresholds:
        for a, b in (("with", "without"), ("without", "with")):
            hits_a = int((stats[a][:half] >= j).sum())
            hits_b = int((stats[b][:half] >= j).sum())
            # the first half's own lower bound favours events frequent enough to bound well
            score = _bound(hits_a, hits_b, half, (1.0 + confidence) / 2.0) + 1e-6 * math.log(
                (hits_a + 1) / (hits_b + 1))
            if score > best_score:
                best, best_score = (j, a, b), score
    j, a, b = best
    n = runs - half
    second = {k: v[half:] for k, v in stats.items()}
    hits = {k: int((v >= j).sum()) for k, v in second.items()}
    joint = (1.0 + confidence) / 2.0  # two one-sided bounds -> joint confidence
    return AuditResult(
        mechanism=mechanism, claimed_epsilon=epsilon, runs_per_table=runs, design=design,
        event=f"target statistic >= {j:g} (more likely {a} the target than {b})",
        hits_with=hits["with"], hits_without=hits["without"],
        epsilon_lower_bound=_bound(hits[a], hits[b], n, joint), confidence=confidence,
    )


def run_audit(
    mechanism: str, epsilon: float, runs: int = 200, seed: int | None = None,
    confidence: float = 0.95, progress: Callable[[int, int], None] | None = None,
    design: str | None = None, batch_size: int = 20,
) -> AuditResult:
    """Run ``mechanism`` ``runs`` times on each neighbour and bound epsilon from below."""
    design = design or default_design(mechanism)
    seeds = dict(zip(("without", "with"), seeds_for(runs, seed), strict=True))
    results: dict[str, list[float]] = {"without": [], "with": []}
    done = 0
    for table in ("without", "with"):
        for start in range(0, runs, batch_size):
            chunk = seeds[table][start:start + batch_size]
            results[table] += run_batch(mechanism, epsilon, design, table, chunk)
            done += len(chunk)
            if progress:
                progress(done, 2 * runs)
    return bound_from_statistics(mechanism, epsilon, design, results["without"],
                                 results["with"], confidence)
