"""``aim``: DP synthetic rows on the dataset's taxonomies (ALGORITHMS.md §6).

AIM (McKenna, Mullins, Sheldon, Miklau, VLDB 2022) on Private-PGM (``mbi``), with candidates
that are attribute sets *and taxonomy levels*: a coarse marginal is measured where the fine one
would drown in noise, and the estimator takes it as a linear measurement of the fine clique.
The rounds are in ``medrelease.synthetic.aim_rounds`` (run by ``medrelease.synthetic.release``);
this file declares the parameters, the guarantee and the budget, as every mechanism does.

Released: synthetic rows at the taxonomies' leaves (and the informative column's declared
domain), as many as a noisy total; no row describes a real patient. Guarantee: rho-zCDP with rho
the largest that implies the release's (eps, delta), for add/remove one row.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

from medrelease.data.aggregate import CountTable
from medrelease.errors import ParameterError
from medrelease.mechanisms.base import Capabilities, MechanismBase, MechanismParams, ReleaseShape
from medrelease.plan import MaterializedRelease, ReleasePlan
from medrelease.privacy.guarantee import ADD_REMOVE_ONE_ROW, BudgetStep, Guarantee
from medrelease.privacy.randomness import MIN_NOISE_EPSILON
from medrelease.privacy.unit_cut import unit_cut_step
from medrelease.synthetic.aim_rounds import AIMRounds
from medrelease.synthetic.release import (
    aim_rounds,
    analysis_sigma,
    release_rho,
    rounds_rho,
    sampled_row_bounds,
    synthetic_release,
)

DEFAULT_DELTA = 1e-6


class AIMParams(MechanismParams):
    epsilon: float = Field(default=1.0, gt=0, allow_inf_nan=False, description="privacy budget")
    delta: float = Field(default=DEFAULT_DELTA, gt=0, le=1e-3, allow_inf_nan=False,
                         description="delta of the (eps, delta) guarantee (rho from both)")
    rounds_per_column: int = Field(
        default=4, ge=1, le=64,
        description="nominal rounds per released column (AIM's T / d; fewer = more budget a "
                    "round); annealing and the last round decide how many run")
    max_model_size: float = Field(
        default=2.5, gt=0, le=2000,
        description="largest model (MB of its junction tree). 2.5 gave the same error as 10 on "
                    "tables of 20,000-30,000 rows at eps 0.5-2 in a third to three quarters of "
                    "the time; on a million rows at eps 1, 10 cuts the 2-way error by about "
                    "12 % in 3x the time (AIM's paper uses 80)")
    max_cells: int = Field(default=1_000_000, ge=1, le=50_000_000,
                           description="largest marginal a round may measure (cells)")
    iters: int = Field(default=100, ge=10, le=10_000,
                       description="at most this many mirror-descent steps per round "
                                   "(warm-started, with the step size the last fit reached)")
    tolerance: float = Field(default=1e-4, ge=0, le=0.1, allow_inf_nan=False,
                             description="a round's fit stops once its loss improves by less "
                                         "than this (relative) over 100 steps; 0 = never")
    final_iters: int = Field(default=300, ge=10, le=20_000,
                             description="mirror-descent steps of the final estimate")
    workload_degree: int = Field(default=3, ge=1, le=4,
                                 description="without a declared workload: every marginal of "
                                             "2 up to this many columns (2: lower error on "
                                             "Adult-like tables, but no published error bar "
                                             "for any 3-way marginal; docs/results/peers.md)")
    analyses_share: float = Field(
        default=0.3, ge=0.05, le=0.8, allow_inf_nan=False,
        description="share of the rounds' rho spent first on the dataset's declared analyses "
                    "(each measured once at its levels, split evenly; public, stated in the "
                    "manifest); unused when the dataset declares none")
    max_synthetic_rows: int = Field(
        default=5_000_000, ge=1, le=50_000_000,
        description="at most this many synthetic rows are sampled: the noisy total is clipped "
                    "to it (a public ceiling; at a tiny epsilon the noisy total alone can ask "
                    "for tens of millions of rows)")
    # Set by the release driver from the dataset config, never by users (hidden from forms).
    public_domain: SkipJsonSchema[bool] = True
    unit_rows: SkipJsonSchema[int] = 1  # m: marginals move by m in L2, scores by m * w_r
    unit_column: SkipJsonSchema[str | None] = None  # a declared unit: its cut is published
    declared_analyses: SkipJsonSchema[int] = 0  # the config's analyses, measured first


class AIM(MechanismBase):
    name: ClassVar[str] = "aim"
    capabilities: ClassVar[Capabilities] = Capabilities(
        summary="(eps, delta)-DP synthetic rows (zCDP; no row is a real patient)",
        gives=("synthetic rows whose 2- and 3-way statistics are the most accurate DP option "
               "here; no row is a real patient"),
        kind="synthetic",
        audit_designs=("unique", "common"),
        audit_public_domain=True,
        published_tables=("intervals.csv", "measurements.parquet"),
    )
    selection: ClassVar[str] = "rounds"
    Params: ClassVar[type[MechanismParams]] = AIMParams

    def rho(self, params: AIMParams) -> float:
        return release_rho(params)

    def rounds_rho(self, params: AIMParams) -> float:
        """The rho the rounds calibrate for at row sensitivity: rho / m^2. A unit of m rows
        moves each marginal by at most m in L2 and each score by m w_r, so Gaussian noise and
        selections calibrated for one row at rho / m^2 are rho-zCDP for one unit."""
        return rounds_rho(params)

    def guarantee(self, params: AIMParams) -> Guarantee:
        rho = self.rho(params)
        per_row = (f"; rounds calibrated at rho / {params.unit_rows}^2 for a unit of "
                   f"{params.unit_rows} rows" if params.unit_rows > 1 else "")
        cut = sum(s.epsilon for s in unit_cut_step(params.epsilon, params.unit_column,
                                                   self.name))
        rounds_eps = f"{params.epsilon - cut:.6g}" if cut else f"{params.epsilon:g}"
        plus = f", plus the unit cut's count at epsilon {cut:.3g}" if cut else ""
        notes = (f"rho = {rho:.6g}-zCDP (the largest rho that implies ({rounds_eps}, "
                 f"{params.delta:g})-DP){plus}{per_row}; synthetic rows sampled from a "
                 "Private-PGM model fitted to noisy marginals — no released row describes a "
                 "real patient")
        if not params.public_domain:
            return Guarantee(self.name, params.epsilon, params.delta, ADD_REMOVE_ONE_ROW, False,
                             "synthetic rows — informative domain taken from the data, not DP",
                             notes)
        return Guarantee(self.name, params.epsilon, params.delta, ADD_REMOVE_ONE_ROW, True,
                         "synthetic rows, (eps, delta)-DP via rho-zCDP (AIM on the taxonomies)",
                         notes)

    def budget_steps(self, params: AIMParams) -> list[BudgetStep]:
        rho = self.rho(params)
        analyses = ""
        if params.declared_analyses:
            sigma = analysis_sigma(params, params.declared_analyses)
            analyses = (f"; first {params.analyses_share:.0%} of it on the "
                        f"{params.declared_analyses} declared analyses, each measured once "
                        f"with a discrete Gaussian of sigma {sigma:.3g}")
        cut = unit_cut_step(params.epsilon, params.unit_column, self.name)
        return [BudgetStep(
            "rounds (zCDP)", params.epsilon - sum(s.epsilon for s in cut), params.delta,
            self.name,
            f"rho = {rho:.6g} over AIM's rounds: leaf 1-way marginals, then per round an "
            "exponential-mechanism selection (eps_t^2/8) and a discrete Gaussian measurement "
            f"(1/(2 sigma_t^2)); rho's add up, the last round spends what is left{analyses}"),
                *cut]

    def row_bounds(self, params: AIMParams, shape: ReleaseShape) -> tuple[int, int]:
        """Plausible released rows (steward check): within 12 of the noisy total's sigmas of
        the (clipped) noisy total the rows were sampled to — a DP output, never the input's
        row count, so whether a release passes the check does not depend on the data."""
        return sampled_row_bounds(shape.noisy_total, shape.total_sigma,
                                  params.max_synthetic_rows)

    def start_rounds(self, counts: CountTable, config: Any, plan: ReleasePlan,
                     log: Callable[[str], None] | None = None) -> AIMRounds:
        """Round 0 (leaf 1-way marginals, rare values merged), then the candidates and their
        true marginals from the count table."""
        run = aim_rounds(counts, config, plan, log)
        run.start()
        return run

    def sample(self, run: AIMRounds, counts: CountTable, plan: ReleasePlan
               ) -> MaterializedRelease:
        """The final estimate and the synthetic rows (as many as the noisy total)."""
        return synthetic_release(run, counts, plan)

    def smallest_round_epsilon(self, params: AIMParams, n_columns: int) -> float:
        """A lower bound on every round's selection epsilon, from public parameters only.

        With rho_r = the rounds' rho, T = rounds_per_column x n_columns and the rounds' shares
        (``aim_rounds``: 0.9 measurement, 0.1 selection): a round that is not the last uses
        eps_0 = sqrt(0.8 rho_r / T) or more (annealing only doubles it); the last spends what
        is left, eps = sqrt(0.8 left). Left after round 0 is at least rho_r (1 - 0.9 /
        rounds_per_column); left at a later last round is at least the cost of the round before
        (it was not last, so twice its cost was left), and that cost is at least rho_r / T.
        So every round's epsilon is at least min(eps_0, sqrt(0.8 rho_r (1 - 0.9 / rpc)))."""
        rho = self.rounds_rho(params)
        if params.declared_analyses:  # the rounds plan with what the analyses leave
            rho *= 1 - params.analyses_share
        rounds = params.rounds_per_column * max(n_columns, 1)
        first = math.sqrt(0.8 * rho / rounds)
        after_round_zero = math.sqrt(0.8 * rho * (1 - 0.9 / params.rounds_per_column))
        return min(first, after_round_zero)

    def check_work(self, config: Any, params: AIMParams) -> None:
        """Before anything is read or spent: every round's selection epsilon must reach the
        samplers' floor 2^-20 (a run at eps 1e-6 was charged, then stopped at a round's
        epsilon of 3.3e-7). The rows sampled are bounded by ``max_synthetic_rows``. Every
        declared analysis must have the levels it names and fit the model (its leaf table
        within ``max_model_size``, its own cells within ``max_cells``): public sizes."""
        check_analyses_fit(config, params)
        columns = len(config.dimensions) + len(config.informative)
        smallest = self.smallest_round_epsilon(params, columns)
        if smallest < MIN_NOISE_EPSILON:
            raise ParameterError(
                f"aim at epsilon {params.epsilon:g} on dataset {config.name!r}: a round's "
                f"selection could get epsilon {smallest:.3g}, below the samplers' floor "
                f"{MIN_NOISE_EPSILON:g} (2^-20) ({columns} columns x rounds_per_column "
                f"{params.rounds_per_column} rounds); use a larger epsilon or fewer rounds "
                "(parameter 'rounds_per_column'). Nothing was read or spent.")



def check_analyses_fit(config: Any, params: AIMParams) -> None:
    """Refuse, before anything is read or spent, a declared analysis aim cannot measure: a
    level its taxonomy lacks, a leaf table larger than the model-size limit, or more cells
    than ``max_cells`` (the message names the analysis and the parameter to change)."""
    from medrelease.data.constraints import (
        analysis_problems,
        column_taxonomy,
        impossible_problems,
    )

    problems = analysis_problems(config) + impossible_problems(config)
    if problems:
        raise ParameterError("; ".join(problems) + ". Nothing was read or spent.")
    for analysis in config.analyses:
        leaves, cells = 1, 1
        for column in analysis.columns:
            taxonomy = column_taxonomy(config, column)
            domain = (config.informative_domain if column in config.informative else None)
            size = len(domain) if domain is not None else (
                taxonomy.n_leaves if taxonomy is not None else 0)
            if not size:
                continue  # an informative column without a declared domain: its values
                # come from the data, sized when read
            leaves *= size
            level = analysis.level_of(column)
            cells *= taxonomy.cardinality(level) if (taxonomy is not None and level) else size
        if leaves * 8 / 2**20 > params.max_model_size:
            raise ParameterError(
                f"aim: declared analysis {analysis.name} has {leaves:,} cells at its columns' "
                f"values, more than the model-size limit max_model_size {params.max_model_size:g} "
                "MB holds; declare it at coarser levels or raise 'max_model_size'. Nothing was "
                "read or spent.")
        if cells > params.max_cells:
            raise ParameterError(
                f"aim: declared analysis {analysis.name} has {cells:,} cells, more than "
                f"max_cells {params.max_cells:,}; declare it at coarser levels. Nothing was "
                "read or spent.")
