"""Choosing epsilon before spending: the expected error of each declared analysis.

A steward must pick epsilon before the release runs, and once spent it is gone; what a
researcher will care about is the error of the tables the dataset declares (``analyses:``).
For ``aim`` that error is a closed formula of public facts only: each declared analysis is
measured once with discrete Gaussian noise whose sigma is a function of the parameters
(``analysis_sigma``), its cells are the product of its columns' taxonomy cardinalities at the
declared levels, and an *average cell* holds ``expected_rows / cells`` rows, where
``expected_rows`` is the size the steward declares in the dataset config. The input's own row
count never enters (it would make the advice, printed for everyone, a statistic of the data).

For ``histogram``, ``ipa`` and ``diffgen`` the noise of each released cell is known from the
parameters too (their published error bars), but which cells an analysis ends up summing
depends on the node or the cut, so only the per-cell figure is given, in one sentence.

Pure functions of the config and the parameters: nothing is read, drawn or spent, and no
Prefect. ``medrelease check --epsilon / --target-error`` and the release form read them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

from medrelease.data.config import AnalysisSpec, DatasetConfig
from medrelease.data.constraints import analysis_problems, column_taxonomy
from medrelease.mechanisms import get_mechanism
from medrelease.mechanisms.base import MechanismParams
from medrelease.plan import PublicFacts
from medrelease.release import resolve_mechanism
from medrelease.synthetic.release import RoundsParams, analysis_sigma

LEVEL = 0.95
Z_CELL = NormalDist().inv_cdf(1 - (1 - LEVEL) / 2)  # 1.96: one cell's two-sided 95 %
NO_ANALYSES = "no analyses declared (docs/NEW-DATASET.md, 'analyses')"
FORM_EPSILONS = (0.5, 1.0, 2.0)
BISECTION_STEPS = 200
RELATIVE_TOLERANCE = 1e-10  # of the epsilon --target-error returns


@dataclass(frozen=True)
class AnalysisError:
    """The expected 95 % error of one declared analysis at one epsilon.

    For ``aim``: ``cells`` (public), ``sigma`` (rows), ``per_cell`` = 1.96 sigma (one cell's
    95 % half-width), ``all_cells`` = Phi^-1(1 - 0.025 / cells) sigma (every cell at once,
    Bonferroni), and, with a declared ``expected_rows``, both as a share of an average cell and
    the measured table's expected total variation distance. For the other mechanisms only
    ``note`` (what the noise of a released cell is) and, where the law gives it, ``per_cell``.
    """

    analysis: str
    cells: int | None = None
    sigma: float | None = None
    per_cell: float | None = None
    all_cells: float | None = None
    share: float | None = None
    all_cells_share: float | None = None
    tvd: float | None = None
    note: str = ""


@dataclass(frozen=True)
class TargetEpsilon:
    """``--target-error``: the smallest epsilon whose per-cell 95 % half-width, as a share of
    an average cell, is at most ``target`` for every declared analysis (None: not even
    ``max_epsilon`` meets it, or it could not be computed — ``message`` says which)."""

    target: float
    epsilon: float | None
    max_epsilon: float
    share_at_max: float | None
    worst_analysis: str | None
    message: str


@dataclass(frozen=True)
class ErrorPlan:
    """What ``check`` says about the declared analyses at the release's epsilon."""

    mechanism: str
    epsilon: float | None
    expected_rows: int | None
    analyses: tuple[AnalysisError, ...] = ()
    notes: tuple[str, ...] = ()
    target: TargetEpsilon | None = None

    @property
    def title(self) -> str:
        at = f" at epsilon {self.epsilon:g}" if self.epsilon is not None else ""
        return f"expected 95 % error of the declared analyses{at} ({self.mechanism})"

    def table(self) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
        """Header and formatted rows for a console table (the CLI only prints them): aim's
        figures, as shares only with a declared ``expected_rows``; else the per-cell noise
        and the sentence on how the mechanism serves the analysis."""
        if self.mechanism != "aim":
            return (("analysis", "± rows per released cell (95 %)", "how it is served"),
                    [(e.analysis, f"±{e.per_cell:,.0f}" if e.per_cell is not None else "-",
                      e.note) for e in self.analyses])
        header = ("analysis", "cells", "sigma (rows)", "± rows per cell (95 %)",
                  "± rows, all cells at once")
        if self.expected_rows is not None:
            header += ("± share of an average cell (per cell / all at once)", "expected TVD")
        rows = []
        for e in self.analyses:
            row = (e.analysis, f"{e.cells:,}" if e.cells is not None else "?",
                   f"{e.sigma:,.1f}" if e.sigma is not None else "-",
                   f"±{e.per_cell:,.1f}" if e.per_cell is not None else "-",
                   f"±{e.all_cells:,.1f}" if e.all_cells is not None else e.note or "-")
            if self.expected_rows is not None:
                row += (f"±{e.share:.1%} / ±{e.all_cells_share:.1%}"
                        if e.share is not None and e.all_cells_share is not None else "-",
                        f"{e.tvd:.3f}" if e.tvd is not None else "-")
            rows.append(row)
        return header, rows


def planned_params(config: DatasetConfig, mechanism: str | None = None,
                   epsilon: float | None = None) -> tuple[str, MechanismParams]:
    """The mechanism and parsed parameters a release would run with (the request, else the
    config, else the registry's rule; the config's public facts set as the plan sets them),
    without the plan's policy checks: an epsilon the policy refuses still has an error to show
    (``check`` reports the refusal separately)."""
    resolved = resolve_mechanism(config, mechanism, epsilon)
    impl = get_mechanism(resolved.name)
    raw = dict(resolved.params)
    for name, value in asdict(PublicFacts.of(config)).items():
        if name in impl.Params.model_fields:
            raw[name] = value
    return resolved.name, impl.parse_params(raw)


def analysis_cells(config: DatasetConfig, analysis: AnalysisSpec) -> int | None:
    """Cells of an analysis's table: per column, its taxonomy's cardinality at the declared
    level (the informative column at level 0: its declared domain). None when a column has no
    public value list (an informative column without a domain: its cells are the data's)."""
    cells = 1
    for column in analysis.columns:
        level = analysis.level_of(column)
        domain = config.informative_domain if column in config.informative else None
        if column in config.informative and level == 0 and domain is not None:
            cells *= len(domain)
            continue
        taxonomy = column_taxonomy(config, column)
        if taxonomy is None or level > taxonomy.height:
            return None
        cells *= taxonomy.cardinality(level)
    return cells


def aim_analysis_error(analysis: AnalysisSpec, cells: int | None, sigma: float,
                       expected_rows: int | None) -> AnalysisError:
    """One analysis measured once with discrete Gaussian noise of ``sigma`` rows (the normal
    approximation of its tails): per cell 1.96 sigma, all cells at once Phi^-1(1 - 0.025 /
    cells) sigma; an average cell holds expected_rows / cells rows; the measured table's
    expected TVD is E|Z| cells / (2 expected_rows) = sqrt(2/pi) sigma cells / (2 expected_rows)."""
    per_cell = Z_CELL * sigma
    if cells is None:
        return AnalysisError(analysis.name, None, sigma, per_cell,
                             note="its cells are not public (no declared domain)")
    all_cells = NormalDist().inv_cdf(1 - (1 - LEVEL) / 2 / cells) * sigma
    if expected_rows is None:
        return AnalysisError(analysis.name, cells, sigma, per_cell, all_cells)
    average = expected_rows / cells
    return AnalysisError(analysis.name, cells, sigma, per_cell, all_cells,
                         share=per_cell / average, all_cells_share=all_cells / average,
                         tvd=math.sqrt(2 / math.pi) * sigma * cells / (2 * expected_rows))


def aim_errors(config: DatasetConfig, params: RoundsParams) -> list[AnalysisError]:
    """Every declared analysis's expected error under ``aim`` at ``params.epsilon``."""
    sigma = analysis_sigma(params, len(config.analyses))
    return [aim_analysis_error(a, analysis_cells(config, a), sigma, config.expected_rows)
            for a in config.analyses]


def worst_share(config: DatasetConfig, params: RoundsParams) -> tuple[float, str]:
    """The largest per-cell 95 % half-width as a share of an average cell over the declared
    analyses (the one with the most cells), and that analysis's name."""
    errors = [e for e in aim_errors(config, params) if e.share is not None]
    if not errors:
        raise ValueError("no analysis has public cells and a declared expected_rows")
    worst = max(errors, key=lambda e: e.share or 0.0)
    return worst.share or 0.0, worst.analysis


def epsilon_for_target(config: DatasetConfig, params: Any, target: float) -> TargetEpsilon:
    """The smallest epsilon in (0, policy.max_epsilon] at which every declared analysis's
    per-cell 95 % half-width is at most ``target`` of an average cell, by bisection: the error
    falls as epsilon grows (rho, hence the analyses' rho, grows with it). Only aim has such a
    closed error; the caller says so for the others."""
    top = config.policy.max_epsilon
    if not target > 0 or not math.isfinite(target):
        raise ValueError(f"target error must be a positive share, e.g. 0.1, got {target!r}")
    if config.expected_rows is None:
        return TargetEpsilon(target, None, top, None, None,
                             "needs expected_rows in the dataset config: a share of an average "
                             "cell is a share of expected_rows / cells rows")

    def share_at(epsilon: float) -> tuple[float, str]:
        return worst_share(config, params.model_copy(update={"epsilon": epsilon}))

    at_top, worst = share_at(top)
    if at_top > target:
        return TargetEpsilon(target, None, top, at_top, worst,
                             f"not met: even at the policy's max_epsilon {top:g} the largest "
                             f"error is ±{at_top:.1%} of an average cell ({worst})")
    low, high = 0.0, top
    for _ in range(BISECTION_STEPS):
        mid = (low + high) / 2
        if share_at(mid)[0] <= target:
            high = mid
        else:
            low = mid
        if high - low <= RELATIVE_TOLERANCE * high:
            break
    reached, worst = share_at(high)
    return TargetEpsilon(target, high, top, at_top, worst,
                         f"smallest epsilon with every analysis within ±{target:.1%} of an "
                         f"average cell (95 %, per cell): {high:.4g} (largest error there: "
                         f"±{reached:.1%}, {worst})")


CELL_STEPS = {"histogram": "cell counts", "ipa": "cells", "diffgen": "leaf counts"}


def _cell_noise(mechanism: str, params: Any) -> tuple[float, int, int | None]:
    """(step epsilon, 95 % half-width, threshold) of the mechanism's main released cells: the
    step from its budget, the rest from its published error bars (``error_bars``: what every
    release of it states), so the advice and the release cannot disagree."""
    impl = get_mechanism(mechanism)
    step = next(s.epsilon for s in impl.budget_steps(params) if s.step == CELL_STEPS[mechanism])
    entry = impl.error_bars(params)["cells"][0]
    return step, int(entry["half_width"]), entry.get("threshold")


def other_mechanism_note(mechanism: str, params: Any, analysis: AnalysisSpec) -> AnalysisError:
    """One sentence on how ``mechanism`` serves an analysis, with the law's per-cell figure."""
    m = getattr(params, "unit_rows", 1)
    unit = f" (scale {m}/epsilon: a unit of up to {m} rows)" if m > 1 else ""
    name = analysis.name
    if mechanism == "histogram":
        eps, k, _ = _cell_noise(mechanism, params)
        return AnalysisError(name, per_cell=k, note=(
            f"every cell of the histogram's node gets discrete Laplace noise at epsilon "
            f"{eps:.4g}{unit}, ±{k} rows per released cell (95 %, clipped at 0); its columns are "
            "released at the node's levels (the finest node within auto_cells, fixed from the "
            "taxonomies at no budget), so they may be generalized and a cell of the analysis is "
            "a sum of node cells"))
    if mechanism == "ipa":
        eps, k, tau = _cell_noise(mechanism, params)
        ladder = "the ladder's coarser nodes, then to " if params.ladder_rungs else ""
        return AnalysisError(name, per_cell=k, note=(
            f"each released (class, value) cell gets discrete Laplace noise at epsilon "
            f"{eps:.4g}{unit}, ±{k} rows (95 %), and is published only when its noisy count "
            f"reaches tau = {tau}; rows of cells below tau go to {ladder}pooled (*, ..., *, "
            "value) cells, or are dropped; the node is chosen privately, so its dimension "
            "columns may be generalized"))
    if mechanism == "diffgen":
        eps, k, _ = _cell_noise(mechanism, params)
        return AnalysisError(name, per_cell=k, note=(
            f"every leaf partition x class value gets discrete Laplace noise at epsilon "
            f"{eps:.4g}{unit}, ±{k} rows (95 %, clipped at 0); the cut is chosen privately, so "
            "its columns may be generalized and a cell of the analysis is a sum of leaf counts"))
    return AnalysisError(name, note=f"{mechanism} draws no calibrated count noise: no expected "
                                    "error from epsilon")


def expected_errors(config: DatasetConfig, mechanism: str | None = None,
                    epsilon: float | None = None,
                    target_error: float | None = None) -> ErrorPlan:
    """The declared analyses' expected 95 % errors at the epsilon the release would run with
    (the request's, else the config's), and with ``target_error`` the smallest epsilon that
    meets it (aim only). From the config and the parameters alone, never the input."""
    name, params = planned_params(config, mechanism, epsilon)
    eps = getattr(params, "epsilon", None)
    if not config.analyses:
        return ErrorPlan(name, eps, config.expected_rows, notes=(NO_ANALYSES,))
    problems = analysis_problems(config)
    if problems:
        return ErrorPlan(name, eps, config.expected_rows,
                         notes=("expected errors not computed until the analyses' levels are "
                                "fixed: " + "; ".join(problems),))
    if name != "aim":
        notes = [f"{name}: the numbers are per released cell; the error of an analysis's cells "
                 "depends on the node or cut the release chooses"]
        if target_error is not None:
            notes.append(f"--target-error is computed for aim only ({name} has no closed "
                         "error for an analysis)")
        return ErrorPlan(name, eps, config.expected_rows,
                         tuple(other_mechanism_note(name, params, a) for a in config.analyses),
                         tuple(notes))
    notes = [f"aim measures each of the {len(config.analyses)} declared analyses once, with "
             f"discrete Gaussian noise (a {params.analyses_share:g} share of the rounds' rho, "
             "split evenly); per cell 1.96 sigma, all cells at once (Bonferroni) "
             "Phi^-1(1 - 0.025/cells) sigma"]
    if config.expected_rows is None:
        notes.append("expected_rows is not declared in the dataset config: errors in rows only "
                     "(declare it to see them as shares of an average cell)")
    else:
        notes.append(f"an average cell holds expected_rows / cells rows; expected_rows "
                     f"{config.expected_rows:,} is the steward's declared size, not the input's")
    if params.unit_rows > 1:
        notes.append(f"rows are those of the table after each {config.privacy.unit_words}'s rows "
                     f"are cut to at most {params.unit_rows} (max_rows_per_unit); sigma already "
                     f"accounts for the {params.unit_rows} rows of one unit")
    target = epsilon_for_target(config, params, target_error) if target_error is not None \
        else None
    return ErrorPlan(name, eps, config.expected_rows, tuple(aim_errors(config, params)),
                     tuple(notes), target)


def form_epsilon_summary(config: DatasetConfig,
                         epsilons: tuple[float, ...] = FORM_EPSILONS) -> str | None:
    """One line for the release form: the largest expected 95 % error among the dataset's
    declared analyses at a few epsilons (within its policy), under its default mechanism when
    that is aim; None when it declares none or another mechanism is its default."""
    if not config.analyses or analysis_problems(config):
        return None
    shown = [e for e in epsilons if e <= config.policy.max_epsilon]
    parts, worst = [], ""
    for eps in shown:
        name, params = planned_params(config, None, eps)
        if name != "aim":
            return None
        if config.expected_rows is not None:
            share, worst = worst_share(config, params)  # type: ignore[arg-type]
            parts.append(f"±{share:.0%} of an average cell at {eps:g}")
        else:  # one sigma for every analysis: the same rows per cell
            sigma = analysis_sigma(params, len(config.analyses))  # type: ignore[arg-type]
            parts.append(f"±{Z_CELL * sigma:,.0f} rows per cell at {eps:g}")
    if not parts:
        return None
    which = f"largest of {len(config.analyses)}, {worst}" if worst else \
        f"{len(config.analyses)}, no expected_rows declared"
    return f"{config.name} (analyses: {which}): " + ", ".join(parts)
