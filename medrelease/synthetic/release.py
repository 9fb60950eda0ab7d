"""``aim`` as a release: the rounds set up from the plan and the config, and the synthetic rows
as a ``MaterializedRelease`` (what the output checks and the publisher read).

The flow drives ``AIMRounds`` itself (scoring fanned out as Prefect tasks); ``release_synthetic``
runs every round in this process (the CLI's engine path, tests, benchmarks).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from medrelease.data.aggregate import CountTable
from medrelease.data.config import DatasetConfig
from medrelease.mechanisms import get_mechanism
from medrelease.mechanisms.aim import AIMParams, check_workload, default_workload
from medrelease.privacy.randomness import generator_for
from medrelease.release import MaterializedRelease, ReleasePlan
from medrelease.storage.released_rows import ReleasedRows
from medrelease.synthetic.aim_rounds import AIMRounds, Settings
from medrelease.synthetic.error_bars import bounds_summary, marginal_bounds, measurements_frame
from medrelease.synthetic.space import MarginalSpace

SYNTHETIC_NOTICE = "synthetic rows — no row describes a real patient"


def workload_of(config: DatasetConfig | None, space: MarginalSpace,
                params: AIMParams) -> list[tuple[tuple[int, ...], float]]:
    """The steward's declared workload, else every 2- to ``workload_degree``-way marginal;
    as attribute indices of the space."""
    names = list(space.names)
    declared = (config.workload if config is not None else None) or []
    sets = ([(tuple(w.columns), w.weight) for w in declared] if declared
            else default_workload(names, params.workload_degree))
    check_workload(sets, names)
    return [(tuple(names.index(c) for c in cols), weight) for cols, weight in sets]


def aim_rounds(counts: CountTable, config: DatasetConfig | None, plan: ReleasePlan,
               log: Callable[[str], None] | None = None) -> AIMRounds:
    """The rounds of one release: candidates from the workload and the taxonomies (public),
    the true marginals from the count table, randomness from the plan's release stream."""
    params: AIMParams = plan.params
    taxonomy = config.informative_taxonomy if config is not None else None
    space = MarginalSpace(counts, taxonomy)
    settings = Settings(rho=get_mechanism("aim").rounds_rho(params),
                        rounds=params.rounds_per_column * len(space.attributes),
                        max_model_size=params.max_model_size, max_cells=params.max_cells,
                        iters=params.iters, final_iters=params.final_iters,
                        tolerance=params.tolerance or None,
                        max_rows=params.max_synthetic_rows)
    rng = generator_for(plan.release_seed)
    return AIMRounds(space, workload_of(config, space, params), settings, rng, log)


def synthetic_release(run: AIMRounds, counts: CountTable, plan: ReleasePlan) -> MaterializedRelease:
    """Sample the rows and describe them (public details: every measurement's columns, levels,
    sigma and selection epsilon — outputs of the rounds — never a score or a true count)."""
    seed = int(run.rng.integers(0, 2**63 - 1))
    codes, rows = run.synthesize(seed)
    leaves = run.leaves
    key = np.zeros(rows, dtype=np.int64)
    for attribute in leaves:
        key = key * attribute.size + codes[attribute.name]
    _, first, counts_per_row = np.unique(key, return_index=True, return_counts=True)
    cells = {}
    for attribute in leaves:
        leaf = codes[attribute.name][first]
        labels = list(attribute.leaf_labels)
        if attribute.name in counts.dimensions:
            cells[attribute.name] = pd.Categorical.from_codes(leaf, categories=labels)
        else:
            cells[attribute.name] = np.asarray(labels, dtype=object)[leaf]
    released = ReleasedRows(pd.DataFrame(cells), counts_per_row.astype(np.int64), plan.shuffle_seed)
    state = run.state
    details = {
        "synthetic": SYNTHETIC_NOTICE,
        # the guarantee's rho (for one privacy unit), and what the rounds ran at: one row's
        # sensitivity at rho / m^2 for a unit of m rows; rho_used counts on the rounds' scale
        "rho": impl_rho(plan),
        "rounds_rho": run.settings.rho,
        "rho_used": state.rho_used,
        "measurements": [r.as_dict() for r in state.records],
        "one_way_sigma": float(state.measurements[0].stddev),
        "merged_rare_values": {run.space.names[m.column]: m.merged for m in run.merges},
        # the public ceiling on the rows sampled, and whether the noisy total reached it
        "synthetic_rows_ceiling": run.settings.max_rows,
        "noisy_total_clipped": state.total_clipped,
    }
    total_sigma = state.total_sigma
    impl = get_mechanism("aim")
    return MaterializedRelease(
        index=-1, node=tuple(0 for _ in counts.dimensions), rows=released, il=None,
        row_bounds=impl.row_bounds(plan.params, state.total, total_sigma), details=details,
        nodes=(tuple(0 for _ in counts.dimensions),),
        error_bars=researcher_error_bars(run, codes),
        tables={"measurements.parquet": measurements_frame(run)})


def impl_rho(plan: ReleasePlan) -> float:
    """The rho of the release's guarantee, for one privacy unit (the rounds run at rho/m^2)."""
    return get_mechanism("aim").rho(plan.params)


def researcher_error_bars(run: AIMRounds, released_codes: dict[str, np.ndarray]) -> dict:
    """The published error bars: a 95 % bound per workload marginal and per measured marginal
    (AIM's paper §5), from the measurements, the selections and the sampled rows only."""
    summary = bounds_summary(marginal_bounds(run, released_codes, run.workload))
    summary["marginals"] = summary.pop("bounds")
    return summary


def release_synthetic(counts: CountTable, config: DatasetConfig | None, plan: ReleasePlan,
                      log: Callable[[str], None] | None = None) -> MaterializedRelease:
    run = aim_rounds(counts, config, plan, log)
    run.run()
    return synthetic_release(run, counts, plan)
