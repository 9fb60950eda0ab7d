"""How much the privacy unit's bound cut, published as a small DP count of its own.

With a unit declared (``privacy: {unit: patient_id, max_rows_per_unit: m}``) every mechanism
sees the table after each unit's rows were cut to at most ``m`` (``medrelease/data/units.py``),
so every released count and every interval is about that table, not the input: a patient with
five admissions counts as ``m``. A researcher needs the scale of that cut to judge the bias, and
the number of rows removed is a function of the input: publishing it costs budget.

The step ``unit bound: rows removed`` (declared by each DP mechanism when a unit is declared,
``UNIT_CUT_SHARE`` of the release's epsilon, taken off the mechanism's own budget so the steps
still add up to the guarantee) releases

    C = sum over units of min(UNIT_CUT_CAP, max(0, rows_u - m))  +  Z,

Z discrete Laplace with P(Z = k) proportional to exp(-(eps_step / UNIT_CUT_CAP) |k|).

*Privacy.* Adding or removing one unit changes its own term only, by at most ``UNIT_CUT_CAP``
(the cap is public): L1 sensitivity ``UNIT_CUT_CAP``, so the noisy count is ``eps_step``-DP for
one unit (no delta). It is drawn from its own stream (a child of the unit bound's), once, with
the step's epsilon handed out by the plan (``StepDraws``), and composes with the mechanism's
steps sequentially.

*Reading it.* C counts at most ``UNIT_CUT_CAP`` rows per unit, so it is a floor on the rows the
bound removed (exact when no unit had more than ``m + UNIT_CUT_CAP`` rows); its 95 % interval
is the plain two-sided one of an unclipped discrete Laplace count (``half_width``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from medrelease.data.units import UNIT_CUT_CAP, BoundReport, UnitBound
from medrelease.privacy.guarantee import BudgetStep, StepDraws
from medrelease.privacy.intervals import LEVEL, half_width, noise_law_epsilon
from medrelease.privacy.randomness import (
    CryptoSeed,
    StreamSeed,
    discrete_laplace,
    generator_for,
    noise_epsilon,
)

UNIT_CUT_STEP = "unit bound: rows removed"
UNIT_CUT_SHARE = 0.02  # of the release's epsilon (public, stated in the step)


def unit_cut_epsilon(epsilon: float, unit_column: str | None) -> float:
    """The step's epsilon: ``UNIT_CUT_SHARE`` of the release's when a unit is declared, else 0
    (no bound, no step)."""
    return UNIT_CUT_SHARE * epsilon if unit_column else 0.0


def unit_cut_step(epsilon: float, unit_column: str | None, mechanism: str) -> list[BudgetStep]:
    """The declared step (a list: empty without a unit), for a mechanism's ``budget_steps``."""
    eps = unit_cut_epsilon(epsilon, unit_column)
    if not eps:
        return []
    return [BudgetStep(
        UNIT_CUT_STEP, eps, 0.0, mechanism,
        f"discrete Laplace count of the rows the privacy unit's bound removed, at most "
        f"{UNIT_CUT_CAP} counted per unit (sensitivity {UNIT_CUT_CAP}); {UNIT_CUT_SHARE:.0%} "
        "of epsilon, so a researcher sees the scale of the cut")]


def cut_stream(seed: StreamSeed) -> StreamSeed:
    """The count's own stream: a child of the bound's (a fresh OS key for publication), so its
    noise is independent of which rows the bound kept and of every other draw."""
    if isinstance(seed, CryptoSeed):
        return CryptoSeed.fresh()
    return np.random.SeedSequence(seed.entropy, spawn_key=(*seed.spawn_key, 1))


def _capped(report: BoundReport | dict[str, Any] | None) -> int | None:
    """The capped count the bound's report carries (None: no report reached the release)."""
    if isinstance(report, BoundReport):
        return report.rows_cut_capped
    if isinstance(report, dict):
        key = f"rows cut, at most {UNIT_CUT_CAP} per unit"
        if key in report:
            return int(report[key])
    return None


NO_REPORT = ("the unit bound's report did not reach this release (the rows were not bounded "
             "here): nothing is published on a guess")


def draw_unit_cut(steps: list[BudgetStep] | StepDraws, unit: UnitBound | None,
                  report: BoundReport | dict[str, Any] | None) -> dict[str, Any] | None:
    """Draw the declared ``unit bound: rows removed`` step once (None when the plan declares
    none) and describe it for the manifest (``mechanism_details.unit_cut``): the noisy count,
    its 95 % interval, the step's epsilon and the cap, and what it means. Post-processing of
    the noisy count only; the true count never leaves this function.

    Without the bound's report (an engine caller that never bounded the rows: the flow always
    has it) the step is passed over, still charged, and nothing is published: a count of 0
    drawn on a guess would be a wrong number with a right-looking interval."""
    capped = _capped(report)
    if isinstance(steps, StepDraws):
        if UNIT_CUT_STEP not in steps.declared:
            return None
        if capped is None:
            steps.pass_over(UNIT_CUT_STEP, NO_REPORT)
            return None
        step = steps.take(UNIT_CUT_STEP)
    else:
        step = next((s for s in steps if s.step == UNIT_CUT_STEP), None)
        if step is None or capped is None:
            return None
    if unit is None:
        raise ValueError(f"{UNIT_CUT_STEP!r} is declared but the plan has no unit bound")
    rng = generator_for(cut_stream(unit.seed))
    noisy = int(capped + discrete_laplace(rng, step.epsilon / UNIT_CUT_CAP, 1)[0])
    k = half_width(noise_law_epsilon(step.epsilon, UNIT_CUT_CAP), LEVEL)
    return unit_cut_summary(noisy, k, step.epsilon, unit)


def unit_cut_summary(noisy: int, k: int, epsilon: float, unit: UnitBound) -> dict[str, Any]:
    """The published description (a fixed shape: the audit compares shapes between
    neighbours)."""
    low, high = max(0, noisy - k), max(0, noisy + k)
    rows = f"{unit.row_noun}s"
    return {
        "released": noisy, "lower": low, "upper": high, "level": LEVEL,
        "epsilon": float(epsilon), "noise_epsilon": noise_epsilon(epsilon / UNIT_CUT_CAP),
        "cap_per_unit": UNIT_CUT_CAP, "max_rows_per_unit": unit.max_rows,
        "statement": (
            f"The privacy unit's bound cut each {unit.unit_noun} to at most {unit.max_rows} "
            f"{rows if unit.max_rows != 1 else unit.row_noun} before anything was counted. "
            f"It removed about {noisy:,} {rows} (95 % interval [{low:,}, {high:,}]; a "
            f"{unit.unit_noun} counts at most {UNIT_CUT_CAP} removed {rows} here, so this is a "
            f"floor), a DP count with epsilon {epsilon:.3g}. Every count and interval of this "
            f"release is about {unit.scope()}: a count of {rows} is biased down by the rows "
            f"the bound removed from it."),
    }
