"""Output checks (Great Expectations suite from ``schemas/output.py``)."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from medrelease.data.config import DatasetConfig
from medrelease.errors import MedreleaseError
from medrelease.mechanisms import capabilities, output_columns
from medrelease.mechanisms.base import ReleaseContext
from medrelease.plan import CheckReport, MaterializedRelease
from schemas.output import OutputExpectations, check_release


class OutputCheckError(MedreleaseError):
    """The release failed its output checks; it is not published."""


def expectations_for(config: DatasetConfig, context: ReleaseContext | None,
                     chosen: MaterializedRelease, mechanism: str = "") -> OutputExpectations:
    if context is None:  # no lattice: columns and row count; values are intervals or pseudonyms
        return OutputExpectations(
            columns=output_columns(config, mechanism),
            dimension_labels={}, informative_domain={},
            min_rows=chosen.row_bounds[0], max_rows=chosen.row_bounds[1])
    nodes = chosen.nodes or (chosen.node,)  # ipa's ladder: the labels of every rung
    taxonomies = context.counts.taxonomies  # (aim's context never builds a lattice)
    labels = {
        column: sorted({label for node in nodes for label in taxonomies[i].level_labels[node[i]]})
        for i, column in enumerate(context.counts.dimensions)
    }
    informative = {
        column: context.counts.informative[column].tolist()
        for column in context.counts.informative.columns
    }
    synthetic = bool(mechanism) and capabilities(mechanism).kind == "synthetic"
    return OutputExpectations(
        columns=list(context.counts.dimensions) + list(context.counts.informative.columns),
        star_allowed=not synthetic,  # synthetic rows are drawn at the leaves: never '*'

        dimension_labels=labels,
        informative_domain=informative,
        min_rows=chosen.row_bounds[0],
        max_rows=chosen.row_bounds[1],
        public_domain=context.counts.public_domain,
        fully_suppressed_levels={
            column: all(node[i] == taxonomies[i].height for node in nodes)
            for i, column in enumerate(context.counts.dimensions)
        },
        star_patterns=[[c for i, c in enumerate(context.counts.dimensions)
                        if node[i] == taxonomies[i].height] for node in nodes],
    )


@task(name="check-output", cache_policy=NO_CACHE)
def check_output(config: DatasetConfig, context: ReleaseContext | None,
                 chosen: MaterializedRelease, mechanism: str = "") -> CheckReport:
    report = check_release(chosen.rows, expectations_for(config, context, chosen, mechanism))
    if not report.success:
        failed = "; ".join(
            f"{r['check']}{'(' + r['column'] + ')' if r['column'] else ''}: {r['unexpected']}"
            for r in report.failures()
        )
        raise OutputCheckError(f"release failed its output checks, nothing published: {failed}")
    return report
