"""``medrelease check``: every problem of a dataset at once, and the release it would run.

A release refuses at the first problem it meets, and each refusal costs a Prefect start; a
steward fixing a new table wants the whole list in one go. This module runs the engine's own
checks, stage by stage, and keeps going after a failure wherever the next stage does not need
what failed: the config (pydantic lists all its errors), each taxonomy on its own, the domain,
the extract's files (input-folder rule, links), the input schema (pandera, lazily: one entry per
column and problem), the missing-value limit, and the plan (mechanism, parameters, policy,
lattice size, work limits) that the flow's plan step makes (``plan_for_config``). There is no
second validator: every message is the engine's, so ``check`` and ``release`` cannot disagree.

Nothing is spent or written to the ledger, no noise is drawn, Prefect is never imported.
Findings carry columns, counts and file lines, never values; the values of an input failure go
to the steward-only log, as in a release.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from medrelease.data.config import ColumnSpec, DatasetConfig, find_config, read_yaml
from medrelease.data.taxonomy import load_taxonomy
from medrelease.errors import (
    ConfigError,
    InputValidationError,
    MedreleaseError,
    write_steward_log,
)
from medrelease.settings import steward_log_dir

if TYPE_CHECKING:
    from medrelease.planning import ErrorPlan


@dataclass(frozen=True)
class Finding:
    """One problem: where (stage and column), what, how many rows, and the first lines."""

    stage: str
    problem: str
    column: str | None = None
    rows: int | None = None
    first_lines: str = ""


@dataclass
class CheckReport:
    """What ``check`` found, and the release that would run once nothing is found."""

    dataset: str
    config_file: str = ""
    findings: list[Finding] = field(default_factory=list)
    release: list[tuple[str, str]] = field(default_factory=list)
    steward_log: Path | None = None
    rows: int | None = None
    seconds: float = 0.0
    # the declared analyses' expected errors at the release's epsilon (``medrelease.planning``:
    # public parameters and the declared expected_rows, never ``rows``); a sentence if not
    errors: ErrorPlan | str | None = None

    @property
    def ok(self) -> bool:
        return not self.findings


def check_dataset(dataset: str, input_path: str | None = None, mechanism: str | None = None,
                  epsilon: float | None = None, target_error: float | None = None
                  ) -> CheckReport:
    """Every check a release runs before it spends, each stage's problems collected; then the
    declared analyses' expected errors at the epsilon (and, with ``target_error``, the smallest
    epsilon that meets it), so that epsilon is chosen before it is spent."""
    started = time.perf_counter()
    report = CheckReport(dataset)
    try:
        config = find_config(dataset)
    except ConfigError as exc:
        report.findings += _config_findings(str(exc))
        report.findings += _taxonomies_of_unloadable_config(dataset)
        report.seconds = time.perf_counter() - started
        return report
    report.dataset, report.config_file = config.name, config.config_file
    config, usable = _taxonomies_checked(config, report)
    config = _domain_checked(config, report)
    _input_checked(config, input_path, report)
    if usable:
        _plan(config, mechanism, epsilon, report)
        report.errors = _expected_errors(config, mechanism, epsilon, target_error)
    report.seconds = time.perf_counter() - started
    return report


def _expected_errors(config: DatasetConfig, mechanism: str | None, epsilon: float | None,
                     target_error: float | None) -> ErrorPlan | str:
    """``planning.expected_errors``, or why it could not run (the plan's finding says more)."""
    from medrelease.planning import expected_errors

    try:
        return expected_errors(config, mechanism, epsilon, target_error)
    except (MedreleaseError, ValueError) as exc:
        return f"expected errors not computed: {exc}"


def _config_findings(message: str) -> list[Finding]:
    """A config error lists one line per invalid field: one finding each."""
    head, *lines = message.splitlines()
    if not lines:
        return [Finding("config", head)]
    return [Finding("config", line.strip()) for line in lines if line.strip()]


def _taxonomies_of_unloadable_config(dataset: str) -> list[Finding]:
    """An invalid config's taxonomy files are still worth checking: the steward fixes both
    at once. Best effort on the raw YAML; nothing here raises."""
    path = Path(dataset)
    if not path.suffix:
        from medrelease.settings import dataset_roots

        path = next((r / dataset / "dataset.yaml" for r in dataset_roots()
                     if (r / dataset / "dataset.yaml").is_file()), path)
    try:
        raw = read_yaml(path)
        columns = raw.get("columns") or {}
    except (MedreleaseError, AttributeError, OSError):
        return []
    findings = []
    for name, spec in columns.items() if isinstance(columns, dict) else ():
        relative = spec.get("taxonomy") if isinstance(spec, dict) else None
        if isinstance(relative, str):
            try:
                load_taxonomy(path.parent / relative, str(name))
            except MedreleaseError as exc:
                findings.append(Finding("taxonomy", str(exc), str(name)))
    return findings


def _without(config: DatasetConfig, columns: dict[str, ColumnSpec]) -> DatasetConfig:
    """The config with some columns' specs replaced, for the checks that do not need them."""
    return config.model_copy(update={"columns": {**config.columns, **columns}})


def _taxonomies_checked(config: DatasetConfig, report: CheckReport
                        ) -> tuple[DatasetConfig, bool]:
    """Each taxonomy on its own; a broken one is left out of the input checks (its column is
    checked for presence only) and the plan is skipped (the lattice needs every one)."""
    try:
        config.taxonomies  # noqa: B018 - loads and checks them all, as a release does
        return config, True
    except MedreleaseError:
        pass
    broken: dict[str, ColumnSpec] = {}
    for column in config.dimensions + config.set_valued:
        spec = config.columns[column]
        try:
            taxonomy = load_taxonomy(config.resolve(spec.taxonomy or ""), column,
                                     config.policy.max_taxonomy_leaves)
            if spec.missing is not None and spec.missing not in taxonomy.level_labels[0]:
                raise ConfigError(
                    f"column {column!r}: its missing: category is not a leaf of its taxonomy "
                    f"{Path(taxonomy.source).name}; add it so missing values have a place")
        except MedreleaseError as exc:
            report.findings.append(Finding("taxonomy", str(exc), column))
            broken[column] = ColumnSpec(role="drop")
    return _without(config, broken), False


def _domain_checked(config: DatasetConfig, report: CheckReport) -> DatasetConfig:
    try:
        config.informative_domain  # noqa: B018
        return config
    except MedreleaseError as exc:
        column = config.informative[0]
        report.findings.append(Finding("domain", str(exc), column))
        spec = config.columns[column]
        return _without(config, {column: ColumnSpec(role="informative",
                                                    description=spec.description)})


def _input_checked(config: DatasetConfig, input_path: str | None, report: CheckReport) -> None:
    """The extract's files, then the input schema on each, as a release reads them."""
    from medrelease.data.extract import resolve_extract

    try:
        extract = resolve_extract(config, input_path)
    except MedreleaseError as exc:
        report.findings.append(Finding("input file", str(exc)))
        return
    try:  # the snapshots resolution took are raw data: removed when the check ends
        report.rows = _rows_checked(config, extract, report)
    finally:
        extract.discard()


def _rows_checked(config: DatasetConfig, extract, report: CheckReport) -> int:
    """Each file of ``extract`` read and validated; the findings go to ``report``."""
    from medrelease.data.aggregate import check_drop_limit
    from medrelease.storage.io import counting_positions, read_input
    from schemas.input import fill_missing_categories, missing_rows, validate_input

    several = len(extract.files) > 1
    total = 0
    for path in extract.paths:
        where = f"input {path.name}" if several else "input"
        try:
            with counting_positions(config, path):
                frame = read_input(config, path)
                total += len(frame)
                try:
                    validate_input(frame, config)
                except InputValidationError as exc:
                    word = "row" if path.suffix.lower() == ".parquet" or \
                        config.input.format == "parquet" else "file line"
                    report.findings += _input_findings(exc, where, word)
                    report.steward_log = write_steward_log(steward_log_dir(), config.name, exc)
                filled = fill_missing_categories(frame, config)
                needed = [c for c in config.dimensions + config.informative
                          + config.class_columns if c in filled.columns]
                if config.missing == "drop_rows" and needed:
                    check_drop_limit(len(missing_rows(filled, needed)), len(filled), config)
        except MedreleaseError as exc:
            report.findings.append(Finding(where, str(exc)))
    return total


def _input_findings(exc: InputValidationError, where: str, word: str) -> list[Finding]:
    """One finding per (column, problem) of the schema's lazy validation; no values."""
    if not exc.problems:
        return [Finding(where, str(exc))]
    findings = []
    for problem in exc.problems:
        positions = problem.get("first_positions") or []  # already file lines (or rows)
        rows = problem.get("rows")
        lines = f"{word}{'s' if len(positions) > 1 else ''} " \
            f"{', '.join(map(str, positions))}" if positions else ""
        if rows and positions and len(positions) < rows:
            lines += f" and {rows - len(positions)} more"
        text = problem.get("problem") or "problem"
        if problem.get("distinct_values"):
            text = f"{problem['distinct_values']} distinct value(s) {text}"
        findings.append(Finding(where, text, problem.get("column"), rows, lines))
    return findings


def _plan(config: DatasetConfig, mechanism: str | None, epsilon: float | None,
          report: CheckReport) -> None:
    """The plan the flow makes (``plan_for_config``: mechanism, parameters, guarantee, policy,
    lattice and work limits); then the work it means, from public facts and the input's
    size."""
    from medrelease.mechanisms import capabilities
    from medrelease.release import lattice_size, plan_for_config, resolve_mechanism

    try:
        resolved = resolve_mechanism(config, mechanism, epsilon)
        nodes = lattice_size(config)
        plan = plan_for_config(config, resolved.name, resolved.params, None)
    except MedreleaseError as exc:
        report.findings.append(Finding("plan", str(exc)))
        return
    guarantee = plan.guarantee
    why = ("as asked" if mechanism else "named in the config" if config.mechanism.name
           else "the registry's rule: aim with a declared domain, else ipa")
    report.release = [
        ("mechanism", f"{plan.mechanism} ({why}): {capabilities(plan.mechanism).summary}"),
        ("epsilon", f"{guarantee.epsilon:g}, delta {guarantee.delta:g}"
         if guarantee.epsilon is not None else "none (no DP claim)"),
        ("unit", guarantee.neighbouring),
        ("guarantee", guarantee.statement()),
        ("work", _expected_work(config, plan, nodes, report.rows)),
    ]


def _expected_work(config: DatasetConfig, plan: Any, nodes: int, rows: int | None) -> str:
    """What the run will do, from public facts (and the rows read, for the steward)."""
    from medrelease.mechanisms import capabilities

    kind = capabilities(plan.mechanism).kind
    size = f"{rows:,} rows read; " if rows is not None else ""
    columns = len(config.dimensions) + len(config.informative)
    if kind == "synthetic":
        degree = getattr(plan.params, "workload_degree", 3)
        marginals = len(config.workload or []) or sum(
            math.comb(columns, k) for k in range(2, max(2, degree) + 1))
        rounds = getattr(plan.params, "rounds_per_column", 4) * columns
        return (f"{size}{marginals} workload marginals over {columns} columns; about "
                f"{rounds} rounds at most (aim anneals; large tables take minutes)")
    if kind == "lattice":
        return f"{size}{nodes:,} lattice nodes scored, one chosen privately"
    return f"{size}one pass over the rows"
