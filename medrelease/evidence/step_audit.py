"""Statistical audits that can fail: one design per step of ``ipa`` and DiffGen's leaf counts.

The end-to-end audit (``audit.py``) bounds a whole release's epsilon from below; at the default
parameters ``ipa`` releases the audited cell or nothing, so its selection, ladder and pool are
never exercised, and a claim of eps 1 could only fail if delta were broken by ~0.17. Here each
design isolates one step with *test-only* parameters (a large delta, a budget split that puts
the epsilon where the step is) that put the step's event probability in a measurable range,
runs the real mechanism code (``IPA.materialize``, the driver's ``select_node``, ``release``)
on two neighbouring count tables, and tests the step's own claim:

* ``delta`` designs (a cell that exists in one table only): the target released with
  probability at most ``e^eps P(other table) + delta``; the lower bound
  ``p_low(A) - e^eps p_high(B)`` (Clopper-Pearson, joint 95 %) must stay at or below delta;
* ``epsilon`` designs (a cell one row below / at the threshold, a selection): the lower bound
  ``ln((p_low(A) - delta) / p_high(B))`` must stay at or below the step's epsilon.

Each design names a deliberately broken variant (threshold - 2, delta x 10, sensitivity halved,
the unit bound removed) that it must flag; ``power`` says the smallest violation the design
detects at its run count. docs/PRIVACY.md has the table (``benchmarks/step_audit.py``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from unittest import mock

import numpy as np
import pandas as pd

from medrelease.data import units as units_module
from medrelease.data.aggregate import CountTable, aggregate_frame
from medrelease.evidence.audit import (
    TIPPING_VALUE,
    UNIQUE_VALUE,
    _base,
    _classification_config,
    _taxonomies,
    clopper_pearson,
)
from medrelease.mechanisms import diffgen as diffgen_module
from medrelease.mechanisms import ipa as ipa_module
from medrelease.mechanisms.base import ReleaseContext
from medrelease.plan import PublicFacts
from medrelease.privacy.zcdp import RhoFilter, cdp_delta, gaussian_rho, grid_sigma_sq
from medrelease.release import plan_release, release, score_nodes, select_node
from medrelease.synthetic import aim_rounds as aim_rounds_module
from medrelease.synthetic.space import MarginalSpace

CONFIDENCE = 0.95
VALUES = sorted([f"d{i}" for i in range(5)] + [UNIQUE_VALUE, TIPPING_VALUE])

# Test-only parameters: a delta per thresholded step that the sound release probability nearly
# reaches (0.0478 of 0.05; 0.032 of 0.05 at the rung; 0.0546 of 0.06 in the pool), and the
# budget where the step is.
CELLS = {"epsilon": 1.0, "ladder_rungs": 0, "delta": 0.1}   # cells 0.90, pool 0.05
RUNG = {"epsilon": 1.0, "ladder_rungs": 1, "delta": 0.15, "eps_candidates": 0.05,
        "eps_cells": 0.05, "eps_ladder": 0.85, "eps_suppression": 0.05}
POOL = {"epsilon": 1.0, "ladder_rungs": 1, "delta": 0.18, "eps_candidates": 0.05,
        "eps_cells": 0.05, "eps_ladder": 0.05, "eps_suppression": 0.85}
# aim's round measurement at a test-only sigma of 1 (rho 0.5), claimed as (2.5, cdp_delta)
AIM_SIGMA = 1.0
AIM_CLAIM_EPSILON = 2.5
SELECTION = {"epsilon": 2.15, "ladder_rungs": 1, "delta": 0.06, "eps_candidates": 2.0,
             "eps_cells": 0.05, "eps_ladder": 0.05, "eps_suppression": 0.05}


@dataclass(frozen=True)
class StepDesign:
    name: str
    step: str                 # the step of the mechanism it exercises
    kind: str                 # "delta" or "epsilon"
    claim_epsilon: float      # the step's own claim
    claim_delta: float
    runs: int                 # per table
    broken: str               # the variant it must flag
    run: Callable[[int, int], tuple[np.ndarray, np.ndarray]]  # (runs, seed) -> events A, B


@dataclass(frozen=True)
class StepResult:
    design: str
    variant: str
    runs: int
    hits_a: int
    hits_b: int
    bound: float              # delta lower bound (delta designs) or epsilon lower bound
    claim: float
    power: str

    @property
    def violated(self) -> bool:
        return self.bound > self.claim + 1e-12

    def as_row(self) -> dict:
        return {"design": self.design, "variant": self.variant, "runs per table": self.runs,
                "event, table A": self.hits_a, "event, table B": self.hits_b,
                "lower bound": round(self.bound, 4), "claim": self.claim,
                "verdict": "VIOLATION" if self.violated else "within its claim",
                "power at these runs": self.power}


# -- neighbouring count tables ----------------------------------------------------------------

def _counts(frame: pd.DataFrame) -> CountTable:
    return aggregate_frame(frame, ["cat", "num"], ["inf"], _taxonomies(), VALUES)


def _rows(value: str, cells: list[tuple[str, int]]) -> pd.DataFrame:
    return pd.DataFrame({"cat": [c for c, _ in cells], "num": [n for _, n in cells],
                         "inf": [value] * len(cells)})


def _with(base: pd.DataFrame, extra: pd.DataFrame) -> pd.DataFrame:
    return pd.concat([base, extra], ignore_index=True)


def _plan(params: dict, unit_rows: int = 1, seed: int = 1):
    facts = PublicFacts(public_domain=True, unit_rows=unit_rows,
                        unit_column="patient" if unit_rows > 1 else None,
                        unit_relation="add/remove one patient" if unit_rows > 1 else None)
    return plan_release("ipa", params, 0, seed, facts, product_bounds=False)  # test-only delta


class _ContextsByRows:
    """The count context of each distinct bounded table: the bound runs afresh every run, but
    a patient's five rows have only ten 2-subsets, so each context is built once."""

    def __init__(self) -> None:
        self._built: dict[tuple, tuple] = {}

    def __call__(self, frame: pd.DataFrame) -> tuple:
        key = tuple(map(tuple, frame.to_numpy(dtype=object).tolist()))  # 7x itertuples' speed
        if key not in self._built:
            context = ReleaseContext.from_counts(_counts(frame))
            self._built[key] = (context, context.lattice.bottom())
        return self._built[key]


def _released_where(params: dict, frames: tuple[pd.DataFrame, pd.DataFrame], value: str,
                    part: str, unit_rows: int = 1) -> Callable[[int, int], tuple]:
    """Runs of ``IPA.materialize`` at the bottom node on each table: was ``value`` released in
    ``part`` ('cells' at the node, 'rung' 1, or the '*' 'pool')?

    Frames with a ``patient`` column first go through the real unit bound
    (``units.bound_frame``, at most ``unit_rows`` rows per patient, a fresh draw each run), as a
    release does before anything else."""
    def run(runs: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        plan = _plan(params, unit_rows)
        impl = ipa_module.IPA()
        code = VALUES.index(value)
        out = []
        for side, frame in enumerate(frames):
            context = ReleaseContext.from_counts(_counts(frame))
            table = context.lattice.bottom()
            seeds = np.random.SeedSequence([seed, side]).spawn(runs)
            events = np.zeros(runs, dtype=bool)
            bounded_contexts = _ContextsByRows()
            for i, child in enumerate(seeds):
                if "patient" in frame.columns:
                    bounded, _ = units_module.bound_frame(
                        frame, units_module.UnitBound("patient", unit_rows, child.spawn(1)[0]))
                    context, table = bounded_contexts(bounded)
                cells = impl.materialize(context, table, child, plan.params)
                node = cells.class_node[cells.class_of_cell]
                where = {"cells": node == 0, "rung": node == 1, "pool": node == -1}[part]
                events[i] = bool(((cells.inf_codes == code) & where
                                  & (cells.released_counts > 0)).any())
            out.append(events)
        return out[0], out[1]
    return run


def _selection_of_top(params: dict) -> Callable[[int, int], tuple]:
    """Runs of the driver's ``select_node`` on each table's real scores: the all-'*' node?"""
    def run(runs: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        plan = _plan(params)
        tau = ipa_module.IPA().thresholds(plan.params)[0]
        frames = (_rows("d0", [("c0", 0)] * (tau - 1)), _rows("d0", [("c0", 0)] * tau))
        out = []
        for side, frame in enumerate(frames):
            context = ReleaseContext.from_counts(_counts(frame))
            summaries = score_nodes(context, plan, context.lattice.nodes)
            top = len(context.lattice.nodes) - 1
            seeds = np.random.SeedSequence([seed, side]).spawn(runs)
            out.append(np.array([select_node(replace(plan, selection_seed=s), summaries)[0]
                                 == top for s in seeds]))
        return out[0], out[1]  # A: without the row (top more likely), B: with it
    return run


def _aim_measured_cell() -> Callable[[int, int], tuple]:
    """aim's round measurement (``AIMRounds._measure``: grid sigma, the discrete Gaussian, the
    rho it charges) of the cat x diagnosis marginal on each table; event 'the added row's cell came
    out at least 2 above the smaller table's count'."""
    def run(runs: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        base = _base(60, 0)
        frames = (_with(base, _rows(UNIQUE_VALUE, [("c0", 0)])), base)  # A: with the row
        candidate = aim_rounds_module.Candidate((0, 2), (0, 0), 1.0)
        settings = aim_rounds_module.Settings(rho=1.0, rounds=1, max_model_size=1e9,
                                              max_cells=10**7, iters=1, final_iters=1)
        spaces = [MarginalSpace(_counts(f)) for f in frames]
        answers = [aim_rounds_module.true_answers(sp, [candidate])[0].reshape(-1)
                   for sp in spaces]
        cell = int(np.flatnonzero(answers[0] != answers[1])[0])
        target = answers[1][cell] + 2
        out = []
        for side, (space, answer) in enumerate(zip(spaces, answers, strict=True)):
            rng = np.random.default_rng(np.random.SeedSequence([seed, side]))
            rounds = aim_rounds_module.AIMRounds(space, [], settings, rng)
            events = np.zeros(runs, dtype=bool)
            for i in range(runs):
                # each run is a release of its own; the audit tests the draw against its claim (the
                # broken variant charges more than a round may): accounting has its own tests
                rounds.state.budget = RhoFilter(1e6)
                rounds._measure(candidate.columns, candidate.levels, answer, AIM_SIGMA)
                events[i] = rounds.state.noisy.pop()[cell] >= target
                rounds.state.measurements.clear()
            out.append(events)
        return out[0], out[1]
    return run


def _diffgen_yes_count() -> Callable[[int, int], tuple]:
    """DiffGen without specializations: the leaf counts are all of it; event 'released yes
    count >= the larger table's true count'."""
    def run(runs: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        config = _classification_config()
        base = _base(40, 3).drop(columns="inf").assign(outcome="no")
        base.loc[:9, "outcome"] = "yes"
        frames = (base, _with(base, pd.DataFrame({"cat": ["c0"], "num": [0],
                                                   "outcome": ["yes"]})))
        out = []
        for side, frame in enumerate(reversed(frames)):  # A: with the record
            seeds = np.random.SeedSequence([seed, side]).generate_state(runs)
            out.append(np.array([
                (release(frame, config, "diffgen", {"epsilon": 1.0, "specializations": 0},
                         seed=int(s)).table["outcome"] == "yes").sum() >= 11 for s in seeds]))
        return out[0], out[1]
    return run


def designs(runs: int = 1000) -> list[StepDesign]:
    """Every step design, with the tables it runs on and the variant it must flag."""
    base = _base(60, 0)
    tau = ipa_module.IPA().thresholds(_plan(CELLS).params)[0]
    unique = _rows(UNIQUE_VALUE, [("c0", 0)])
    tip = _rows(TIPPING_VALUE, [("c0", 0)] * (tau - 1))
    # one patient's five rows; the real bound keeps a random 2 (one cell of 2 or a split)
    patient = _rows(UNIQUE_VALUE, [("c0", 0)] + [("c1", 5)] * 4).assign(patient="p")
    base_units = base.assign(patient=[f"u{i}" for i in range(len(base))])
    aim_rho = gaussian_rho(float(grid_sigma_sq(AIM_SIGMA)))
    return [
        StepDesign("ipa cells: new cell", "cells (threshold)", "delta", 0.9, 0.05, runs,
                   "threshold - 2",
                   _released_where(CELLS, (_with(base, unique), base), UNIQUE_VALUE, "cells")),
        StepDesign("ipa cells: tipping cell", "cells (noise)", "epsilon", 0.9, 0.05, runs,
                   "sensitivity halved",
                   _released_where(CELLS, (_with(_with(base, tip), tip.iloc[:1]),
                                           _with(base, tip)), TIPPING_VALUE, "cells")),
        StepDesign("ipa ladder rung: new cell", "ladder rung 1 (threshold)", "delta", 0.765,
                   0.05, runs, "threshold - 2",
                   _released_where(RUNG, (_with(base, unique), base), UNIQUE_VALUE, "rung")),
        StepDesign("ipa pool: new value", "suppressed cells (threshold)", "delta", 0.85, 0.06,
                   runs, "threshold - 2",
                   _released_where(POOL, (_with(base, unique), base), UNIQUE_VALUE, "pool")),
        StepDesign("ipa selection: top node", "node selection", "epsilon", 2.0, 0.0,
                   8 * runs, "sensitivity halved", _selection_of_top(SELECTION)),
        StepDesign("ipa cells: one patient, m = 2", "cells (unit threshold)", "delta", 0.9,
                   0.05, runs, "bound removed (the patient's 5 rows reach the mechanism)",
                   _released_where(CELLS, (_with(base_units, patient), base_units),
                                   UNIQUE_VALUE, "cells", unit_rows=2)),
        StepDesign("aim round: measurement", "round measurement (discrete Gaussian)",
                   "epsilon", AIM_CLAIM_EPSILON, cdp_delta(aim_rho, AIM_CLAIM_EPSILON), runs,
                   "noise halved", _aim_measured_cell()),
        StepDesign("diffgen leaf counts", "leaf counts", "epsilon", 0.5, 0.0, runs,
                   "sensitivity halved", _diffgen_yes_count()),
    ]


# -- the broken variants ----------------------------------------------------------------------

@contextlib.contextmanager
def broken(design: StepDesign) -> Iterator[StepDesign]:
    """The design's deliberately broken variant, for as long as the block runs."""
    if design.broken == "threshold - 2":
        sound = ipa_module.release_threshold
        with mock.patch.object(ipa_module, "release_threshold",
                               lambda *a, **k: sound(*a, **k) - 2):
            yield design
    elif design.broken == "sensitivity halved" and design.step.startswith("cells"):
        noisy = ipa_module._noisy_cells
        with mock.patch.object(ipa_module, "_noisy_cells",
                               lambda rng, table, eps, tau: noisy(rng, table, 2 * eps, tau)):
            yield design
    elif design.broken == "sensitivity halved" and design.step == "node selection":
        own = ipa_module.IPA.selection_utility
        with mock.patch.object(ipa_module.IPA, "selection_utility",
                               lambda self, s, p: (lambda u: (u[0], u[1] / 2, u[2]))(
                                   own(self, s, p))):
            yield design
    elif design.broken == "sensitivity halved":
        calls = diffgen_module._per_call_epsilons
        with mock.patch.object(diffgen_module, "_per_call_epsilons",
                               lambda d, p: {k: 2 * v for k, v in calls(d, p).items()}):
            yield design
    elif design.broken.startswith("bound removed"):
        real_bound = units_module.bounded_weights
        with mock.patch.object(units_module, "bounded_weights",
                               lambda codes, weights, m, rng: real_bound(codes, weights, 10**9,
                                                                         rng)):
            yield design
    elif design.broken == "noise halved":
        grid = aim_rounds_module.grid_sigma_sq
        with mock.patch.object(aim_rounds_module, "grid_sigma_sq",
                               lambda sigma: grid(sigma / 2)):
            yield design
    else:
        raise ValueError(f"no broken variant {design.broken!r}")


# -- the bound and its power ------------------------------------------------------------------

def lower_bound(kind: str, hits_a: int, hits_b: int, runs: int, epsilon: float,
                delta: float) -> float:
    """The step's delta (``delta``) or epsilon (``epsilon``) bounded from below, jointly 95 %."""
    joint = (1.0 + CONFIDENCE) / 2.0
    low_a, _ = clopper_pearson(hits_a, runs, joint)
    _, high_b = clopper_pearson(hits_b, runs, joint)
    if kind == "delta":
        return max(0.0, low_a - math.exp(epsilon) * high_b)
    if low_a - delta <= 0 or high_b <= 0:
        return 0.0
    return max(0.0, math.log((low_a - delta) / high_b))


def power(design: StepDesign, p_b: float) -> str:
    """The smallest violation the design flags at its run count (at expected hit counts)."""
    n = design.runs
    b_hits = round(p_b * n)
    if design.kind == "delta":
        for p in np.linspace(design.claim_delta, 1.0, 2000):
            if lower_bound("delta", round(p * n), b_hits, n, design.claim_epsilon,
                           design.claim_delta) > design.claim_delta:
                return f"delta >= {p:.3g} ({p / design.claim_delta:.1f}x the claim)"
        return "none"
    for eps in np.linspace(design.claim_epsilon, design.claim_epsilon + 6, 3000):
        p = min(1.0, math.exp(eps) * p_b + design.claim_delta)
        if lower_bound("epsilon", round(p * n), b_hits, n, design.claim_epsilon,
                       design.claim_delta) > design.claim_epsilon:
            return f"epsilon >= {eps:.2f} (claim {design.claim_epsilon:g})"
    return "none"


def misreported(design: StepDesign, sound: StepResult, factor: float = 10.0) -> StepResult:
    """The sound run's events held to a delta claimed ``factor`` times too small: a delta off by
    10x must be detected from the same runs."""
    claim = design.claim_delta / factor
    bound = lower_bound("delta", sound.hits_a, sound.hits_b, sound.runs, design.claim_epsilon,
                        claim)
    return replace(sound, variant=f"delta claimed {factor:g}x too small", bound=bound,
                   claim=claim, power="")


def run_design(design: StepDesign, variant: str = "sound", seed: int = 0) -> StepResult:
    """Run one design (``variant``: 'sound' or 'broken') and bound its step's claim."""
    with (broken(design) if variant == "broken" else contextlib.nullcontext(design)) as used:
        events_a, events_b = used.run(design.runs, seed)
    hits_a, hits_b = int(events_a.sum()), int(events_b.sum())
    claim = used.claim_delta if used.kind == "delta" else used.claim_epsilon
    bound = lower_bound(used.kind, hits_a, hits_b, used.runs, used.claim_epsilon,
                        used.claim_delta)
    return StepResult(design.name, variant if variant == "sound" else design.broken,
                      design.runs, hits_a, hits_b, bound, claim,
                      power(design, hits_b / design.runs) if variant == "sound" else "")
