"""``relational``: synthetic patients with their admissions (and their admissions' diagnoses
...), one file per table with fresh keys, under (eps, delta)-DP for adding or removing one
patient with all their rows in every table (docs/RELATIONAL.md, docs/PRIVACY.md "Relational
releases").

The engine is ``medrelease.relational`` (the patient-normalised tables, one ``aim`` model per
child table, the generator); this file declares what every mechanism declares: parameters, the
guarantee, the budget, and the kind's one hook ``release_tables``. A relational dataset's
config names its tables (``relational:``); no other mechanism reads a relational dataset and
this one reads nothing else (the plan's refusals say so).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import pandas as pd
from pydantic.json_schema import SkipJsonSchema

from medrelease.data.config import DatasetConfig
from medrelease.errors import ParameterError
from medrelease.mechanisms.base import Capabilities, MechanismBase, ReleaseShape
from medrelease.plan import MaterializedRelease, ReleasePlan
from medrelease.privacy.guarantee import BudgetStep, Guarantee
from medrelease.privacy.randomness import MIN_NOISE_EPSILON
from medrelease.privacy.zcdp import rho_for
from medrelease.relational.intervals import relational_intervals
from medrelease.relational.mechanism import (
    SYNTHETIC_NOTICE,
    RelationalParams,
    chain_shares,
    release_relational,
)
from medrelease.storage.released_rows import ReleasedRows

# The neighbouring relation when the config's words are not at hand (set by the plan from the
# dataset's tables: PublicFacts.unit_relation).
GENERIC_RELATION = "add/remove one patient with all their rows in every table"


class RelationalMechanismParams(RelationalParams):
    """The relational release's parameters; the relation is set from the dataset's tables."""

    unit_relation: SkipJsonSchema[str | None] = None


class Relational(MechanismBase):
    name: ClassVar[str] = "relational"
    selection: ClassVar[str] = "rounds"
    Params: ClassVar[type[RelationalParams]] = RelationalMechanismParams
    capabilities: ClassVar[Capabilities] = Capabilities(
        summary="(eps, delta)-DP synthetic patients with their admissions (zCDP, one file "
                "per table, fresh keys)",
        gives=("synthetic tables that join: patients, their admissions, their diagnoses ..., "
               "with the cross-table statistics kept; no row is a real patient, no key an "
               "input key"),
        kind="relational",
        audit_designs=(),
        published_tables=("intervals.csv",),
    )

    def guarantee(self, params: RelationalMechanismParams) -> Guarantee:
        rho = rho_for(params.epsilon, params.delta)
        notes = (f"rho = {rho:.6g}-zCDP (the largest rho that implies ({params.epsilon:g}, "
                 f"{params.delta:g})-DP), split over one model per child table; every patient "
                 "weighs the same in every model's table, so each measurement moves by at "
                 "most one patient; synthetic rows with fresh keys — no released row "
                 "describes a real patient")
        return Guarantee(self.name, params.epsilon, params.delta,
                         params.unit_relation or GENERIC_RELATION, True,
                         "synthetic related tables, (eps, delta)-DP via rho-zCDP "
                         "(one aim model per child table)", notes)

    def budget_steps(self, params: RelationalMechanismParams) -> list[BudgetStep]:
        rho = rho_for(params.epsilon, params.delta)
        return [BudgetStep(
            "models (zCDP)", params.epsilon, params.delta, self.name,
            f"rho = {rho:.6g} split over one model per child table (equal shares unless "
            "chain_shares says otherwise): per model, leaf 1-way marginals of its own "
            "tables' columns, its declared analyses, then aim's rounds (exponential-mechanism "
            "selection eps_t^2/8, discrete Gaussian 1/(2 sigma_t^2)), each at sensitivity "
            "one patient; the models' rho's add up")]

    def check_work(self, config: DatasetConfig, params: RelationalMechanismParams) -> None:
        """Before anything is read or spent: a relational dataset, and every model's round
        epsilon above the samplers' floor (public sizes only)."""
        if config.relational is None:
            raise ParameterError(
                f"relational releases a dataset whose config declares its tables "
                f"('relational:'); dataset {config.name!r} is one table: use aim, ipa or "
                "another mechanism of its policy")
        schema = config.relational_schema
        try:  # a declared share per model, checked before the charge
            shares = chain_shares(schema, params)
        except ValueError as exc:
            raise ParameterError(f"relational on dataset {config.name!r}: {exc}. Nothing was "
                                 "read or spent.") from None
        # a model's rounds draw at its share of rho; the exponential mechanism is drawn with
        # the epsilon for one patient (ScaledAIMRounds._select: the rows' epsilon times L), so
        # the floor applies on the patient's scale, as aim's (AIM.smallest_round_epsilon):
        # every round's epsilon is at least min(sqrt(0.8 rho_t / T), sqrt(0.8 rho_t (1 -
        # 0.9 / rounds_per_column))), T the rounds of a model of at most every column
        columns = sum(len(t.columns) + 1 for t in schema.tables)  # (+1: the table's count)
        rho = rho_for(params.epsilon, params.delta) * min(shares)  # the smallest model's
        if schema.analyses:  # the rounds plan with what the analyses leave
            rho *= 1 - params.analyses_share
        rounds = params.rounds_per_column * max(columns, 1)
        smallest = min((0.8 * rho / rounds) ** 0.5,
                       (0.8 * rho * (1 - 0.9 / params.rounds_per_column)) ** 0.5)
        if smallest < MIN_NOISE_EPSILON:
            raise ParameterError(
                f"relational at epsilon {params.epsilon:g} on dataset {config.name!r}: a "
                f"round's selection could get epsilon {smallest:.3g}, below the samplers' "
                f"floor {MIN_NOISE_EPSILON:g}; raise epsilon, give the smallest model a "
                "larger chain_shares, or lower rounds_per_column. Nothing was read or spent.")

    def row_bounds(self, params: RelationalMechanismParams, shape: ReleaseShape
                   ) -> tuple[int, int]:
        """Synthetic patients: between one and the public ceiling (their number is a noisy
        total, a DP output)."""
        return 1, params.max_patients

    def release_tables(self, frames: Mapping[str, pd.DataFrame], config: DatasetConfig,
                       plan: ReleasePlan, log: Callable[[str], None] | None = None
                       ) -> MaterializedRelease:
        """The release of the validated tables (one frame per table, text): the models, the
        synthetic tables with fresh keys, the measurements and their intervals."""
        schema = config.relational_schema
        params = plan.params
        released = release_relational(schema, frames, params, log=log, source=plan.random)
        root = schema.root
        tables = released.tables
        patients = tables[root.name][list(root.column_names)]
        details: dict[str, Any] = {
            "synthetic": SYNTHETIC_NOTICE, "rho": released.rho,
            "rho_used": released.rho_used,
            "tables": relational_tables_summary(config, tables),
            "measurements": released.measurements(),
        }
        intervals, bars = relational_intervals(schema, released)
        return MaterializedRelease(
            index=-1, node=(), rows=ReleasedRows.from_frame(patients), il=None,
            row_bounds=(1, params.max_patients), details=details, nodes=(),
            error_bars=bars, tables={"intervals.csv": intervals},
            data_tables=dict(tables))


def relational_tables_summary(config: DatasetConfig, tables: Mapping[str, pd.DataFrame]
                              ) -> list[dict[str, Any]]:
    """How the released tables join (public: the config's declarations and the released
    rows' counts): per table its file, key, the table and column it references, its bound."""
    schema = config.relational_schema
    out = []
    for table in schema.tables:
        entry: dict[str, Any] = {"table": table.name, "rows": len(tables[table.name]),
                                 "columns": list(table.column_names)}
        if table.key:
            entry["key"] = table.key
        if table.parent is not None:
            entry.update(parent=table.parent, references=table.parent_key,
                         max_children=table.max_children)
        out.append(entry)
    return out
