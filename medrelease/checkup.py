"""``medrelease check``: every problem of a dataset at once, and the release it would run.

A release refuses at the first problem it meets, and each refusal costs a Prefect start; a
steward fixing a new table wants the whole list in one go. This module runs the engine's own
checks, stage by stage, and keeps going after a failure wherever the next stage does not need
what failed: the config (pydantic lists all its errors), each taxonomy on its own, the domain,
the extract's files (input-folder rule, links, how many), the input schema (pandera, lazily: one
entry per column and problem), the missing-value limit, the plan (mechanism, parameters, policy,
lattice size, the dimensions' joint domain, work limits) that the flow's plan step makes
(``plan_for_config``) and the rules of every stage before the charge, declared once in
``medrelease/refusals.py`` (the ledger's, the count's, the stores'), each stage's all at once.
A relational dataset's extract (one file per table) is read as its release reads it
(``relational.reading.read_tables``) and every problem of its tables and references is a finding
of its own (``relational.schema.problems``); it has no count table.
There is no second validator: every message is the engine's, so
``check`` and ``release`` cannot disagree (issue 55: a test walks every pre-charge refusal,
``tests/flow/test_check_equals_release.py``).

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
    from medrelease.data.aggregate import CountTable
    from medrelease.plan import ReleasePlan
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
    # a relational dataset: each table's rows read (the parent table first)
    table_rows: dict[str, int] = field(default_factory=dict)
    # what to review that does not stop a release (e.g. a max_children drafted from the data)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings


@dataclass(frozen=True)
class Request:
    """What a release request says besides the dataset (``medrelease release``'s options and
    the form's fields), so that ``check`` plans exactly the release that would run."""

    input_path: str | None = None
    mechanism: str | None = None
    epsilon: float | None = None
    params: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None           # a TEST release: the test store, never published
    destination: str | None = None
    void_confirmed: bool = False


def check_dataset(dataset: str, input_path: str | None = None, mechanism: str | None = None,
                  epsilon: float | None = None, target_error: float | None = None,
                  request: Request | None = None) -> CheckReport:
    """Every check a release runs before it spends, each stage's problems collected; then the
    declared analyses' expected errors at the epsilon (and, with ``target_error``, the smallest
    epsilon that meets it), so that epsilon is chosen before it is spent.

    The stages are the flow's, by the same functions (issue 55: whatever ``release`` would
    refuse before its charge, ``check`` reports): the plan (``plan_for_config``) and the
    ledger stage's rules (``medrelease/refusals.py``), the extract's files and their shape
    (``refuse_several_files``), the input schema and the drop limit, the count (the joint
    domain, then the count stage's rules: a fixed node, the noise rows), the stores stage
    (the folders and the ledger's integrity)."""
    started = time.perf_counter()
    request = request or Request(input_path, mechanism, epsilon)
    report = CheckReport(dataset)
    try:
        config = find_config(dataset)
    except ConfigError as exc:
        report.findings += _config_findings(str(exc))
        report.findings += _taxonomies_of_unloadable_config(dataset)
        report.seconds = time.perf_counter() - started
        return report
    report.dataset, report.config_file = config.name, config.config_file
    report.warnings += _unreviewed_bounds(config)
    config, usable = _taxonomies_checked(config, report)
    config = _domain_checked(config, report)
    plan = _planned(config, request, report) if usable else None
    counts = _input_checked(config, request.input_path, report, plan)
    if plan is not None:
        _counted(config, plan, counts, report)
        _stores_checked(config, plan, request, report)
        _release_panel(config, request.mechanism, plan, report)
        report.errors = _expected_errors(config, request.mechanism, request.epsilon,
                                         target_error)
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


def _input_checked(config: DatasetConfig, input_path: str | None, report: CheckReport,
                   plan: ReleasePlan | None) -> CountTable | None:
    """The extract's files and their shape, then the input schema on each, as a release reads
    them; for a mechanism that reads counts, the count table the release would build (the
    same encoding), when every file passed."""
    from medrelease.data.extract import refuse_several_files, resolve_extract
    from medrelease.mechanisms import capabilities

    try:  # (the row digest is the count's, in a release: nothing it could refuse)
        extract = resolve_extract(config, input_path, rows_by_count=True)
    except MedreleaseError as exc:
        report.findings.append(Finding("input file", str(exc)))
        if config.relational is not None:
            report.findings += _missing_table_files(config, input_path, str(exc))
        return None
    try:  # the snapshots resolution took are raw data: removed when the check ends
        if config.relational is not None:  # one file per table: read as the release reads
            _tables_checked(config, extract, report)
            return None
        if plan is not None:
            try:
                refuse_several_files(extract, config, capabilities(plan.mechanism).kind == "rows",
                                     plan.unit.column if plan.unit is not None else None)
            except MedreleaseError as exc:
                report.findings.append(Finding("input file", str(exc)))
        counted = plan is not None and capabilities(plan.mechanism).kind != "rows"
        report.rows, counts = _rows_checked(config, extract, report, counted)
        return counts
    finally:
        extract.discard()


def _missing_table_files(config: DatasetConfig, input_path: str | None,
                         said: str) -> list[Finding]:
    """A relational extract's files that are not there, each table's on its own (resolving
    the extract stops at the first; ``said`` is what it said, not repeated)."""
    try:
        files = config.table_files(input_path)
    except MedreleaseError:
        return []
    return [Finding("input file", f"table {table}: its file {path} is missing (or not a "
                                  "regular file)")
            for table, path in files.items() if not path.is_file() and str(path) not in said]


def _tables_checked(config: DatasetConfig, extract, report: CheckReport) -> None:
    """A relational extract, read and checked as the release reads it (``read_tables``: each
    table's file as text, then every table and every reference); when the release would
    refuse it, every problem is a finding of its own: one sentence each, counts only, never
    a value (``schema.problems``)."""
    from medrelease.data.reading import named_as_the_extract
    from medrelease.relational.reading import read_tables

    try:
        schema = config.relational_schema
    except MedreleaseError as exc:
        if not any(f.problem == str(exc) for f in report.findings):
            report.findings.append(Finding("tables", str(exc)))
        return
    try:
        with named_as_the_extract(extract.files):
            frames, _ = read_tables(config, extract)
    except MedreleaseError as exc:
        report.findings += _table_findings(config, schema, extract) or [
            Finding("tables", str(exc))]
        return
    report.table_rows = {table: len(frame) for table, frame in frames.items()}
    report.rows = sum(report.table_rows.values())


def _table_findings(config: DatasetConfig, schema, extract) -> list[Finding]:
    """What ``read_tables`` refused, one finding per problem: each table read on its own (a
    file that cannot be read is its own finding), then ``schema.problems`` on the tables
    read."""
    from medrelease.relational.reading import read_config_table
    from medrelease.relational.schema import problems

    frames = {}
    findings = []
    where = {}
    for table, file in zip(schema.tables, extract.files, strict=True):
        where[table.name] = f"input {Path(file.path).name}"
        try:
            frames[table.name] = read_config_table(config, table, file.read_from)
        except MedreleaseError as exc:
            findings.append(Finding(where[table.name],
                                    str(exc).replace(str(file.read_from), file.path)))
    for sentence in problems(schema, frames):
        table = next((t.name for t in schema.tables
                      if sentence.startswith((f"table {t.name} ", f"table {t.name}:",
                                              f"table {t.name},"))), None)
        if table is not None and table not in frames:
            continue  # ("was not given": its read failed, said above)
        findings.append(Finding(where.get(table or "", "input"), sentence))
    return findings


def _unreviewed_bounds(config: DatasetConfig) -> list[str]:
    """A relational dataset's max_children no steward has marked reviewed: drafted by
    ``medrelease init``, it is read from this extract (a public parameter should come from
    what is known of the source); a warning, as init's review list says, not a refusal."""
    if config.relational is None:
        return []
    return [f"table {table.table}: max_children {table.max_children} is not marked reviewed "
            "(medrelease init drafts it from the data): set it from what you know of the "
            "source, then max_children_reviewed: true"
            for table in config.relational.tables if not table.max_children_reviewed]


def _rows_checked(config: DatasetConfig, extract, report: CheckReport,
                  counted: bool = False) -> tuple[int, CountTable | None]:
    """Each file of ``extract`` read and validated; the findings go to ``report``. With
    ``counted``, each valid file's count table (``aggregate``: the release's encoding, its
    joint-domain and drop-limit rules), merged as the release merges them."""
    from medrelease.data.aggregate import aggregate, check_drop_limit, merge_count_tables
    from medrelease.data.input_schema import fill_missing_categories, missing_rows, validate_input
    from medrelease.storage.io import counting_positions, read_input

    several = len(extract.files) > 1
    total = 0
    parts: list[CountTable] = []
    clean = True
    for path in extract.paths:
        where = f"input {path.name}" if several else "input"
        try:
            with counting_positions(config, path):
                frame = read_input(config, path)
                total += len(frame)
                try:
                    validate_input(frame, config)
                except InputValidationError as exc:
                    clean = False
                    word = "row" if path.suffix.lower() == ".parquet" or \
                        config.input.format == "parquet" else "file line"
                    report.findings += _input_findings(exc, where, word)
                    report.steward_log = write_steward_log(steward_log_dir(), config.name, exc)
                filled = fill_missing_categories(frame, config)
                needed = [c for c in config.dimensions + config.informative
                          + config.class_columns if c in filled.columns]
                if config.missing == "drop_rows" and needed:
                    check_drop_limit(len(missing_rows(filled, needed)), len(filled), config)
                if counted and clean:
                    parts.append(aggregate(frame, config))
        except MedreleaseError as exc:
            clean = False
            report.findings.append(Finding(where, str(exc)))
    if not (counted and clean and parts):
        return total, None
    try:
        return total, merge_count_tables(parts)
    except MedreleaseError as exc:
        report.findings.append(Finding("input", str(exc)))
        return total, None


def _counted(config: DatasetConfig, plan: ReleasePlan, counts: CountTable | None,
             report: CheckReport) -> None:
    """What the release refuses once it has counted the extract, before its charge: a fixed
    node outside its limits, noise rows over the policy's limit (the count stage's rules of
    ``medrelease/refusals.py``, which the flow runs too; the key's store is the release's
    only)."""
    if counts is None:
        return
    from medrelease.mechanisms.base import ReleaseContext
    from medrelease.refusals import Facts, refusals

    context = ReleaseContext.from_counts(counts)
    for refusal in refusals("count", Facts(config, plan, context=context)):
        report.findings.append(Finding("plan", str(refusal)))


def _stores_checked(config: DatasetConfig, plan: ReleasePlan, request: Request,
                    report: CheckReport) -> None:
    """The release and steward folders can be written and the ledger holds every spend on
    record (the flow's last step before the charge); a pseudonymization key where the check
    can see one (``MEDRELEASE_PSEUDONYM_KEY``: a Prefect Secret block is looked for by the
    release only, as ``check`` never starts Prefect)."""
    from medrelease.refusals import Facts, refusals
    from medrelease.settings import ledger_location

    facts = Facts(config, plan, ledger_path=ledger_location(), destination=request.destination)
    for refusal in refusals("stores", facts):
        report.findings.append(Finding("stores", str(refusal)))


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
        if text == "missing column":  # (the release's words: "missing declared column(s)")
            text = "missing declared column: the input lacks it"
        if problem.get("distinct_values"):
            text = f"{problem['distinct_values']} distinct value(s) {text}"
        findings.append(Finding(where, text, problem.get("column"), rows, lines))
    return findings


def _planned(config: DatasetConfig, request: Request, report: CheckReport
             ) -> ReleasePlan | None:
    """The plan the flow makes (``plan_for_config``: mechanism, parameters, guarantee, policy,
    lattice, joint domain and work limits), held to the ledger stage's rules as the flow's
    resolve step holds it (``medrelease/refusals.py``: the source's policy, a new source's cap,
    the void confirmation, the budget left); None when it cannot be made."""
    from medrelease.refusals import ledger_facts, plan_for_config, refusals
    from medrelease.release import resolve_mechanism
    from medrelease.settings import ledger_location

    try:
        resolved = resolve_mechanism(config, request.mechanism, request.epsilon,
                                     request.params)
        plan = plan_for_config(config, resolved.name, resolved.params, request.seed)
    except MedreleaseError as exc:
        report.findings.append(Finding("plan", str(exc)))
        return None
    facts = ledger_facts(config, plan, ledger_location(), request.void_confirmed)
    for refusal in refusals("ledger", facts):
        report.findings.append(Finding("ledger", str(refusal)))
    return plan


def _release_panel(config: DatasetConfig, mechanism: str | None, plan: ReleasePlan,
                   report: CheckReport) -> None:
    """The release that would run: mechanism, epsilon, unit, guarantee and the work it means,
    from public facts and the input's size."""
    import os

    from medrelease.mechanisms import capabilities
    from medrelease.release import lattice_size

    nodes = lattice_size(config)
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
    if capabilities(plan.mechanism).needs_secret:
        report.release.append(
            ("key", "MEDRELEASE_PSEUDONYM_KEY is set" if os.environ.get(
                "MEDRELEASE_PSEUDONYM_KEY") else "MEDRELEASE_PSEUDONYM_KEY is not set: the "
             f"release looks for the Prefect Secret block {plan.params.key_source!r} and is "
             "refused without one (check does not start Prefect to look)"))


def _expected_work(config: DatasetConfig, plan: Any, nodes: int, rows: int | None) -> str:
    """What the run will do, from public facts (and the rows read, for the steward)."""
    from medrelease.mechanisms import capabilities

    kind = capabilities(plan.mechanism).kind
    size = f"{rows:,} rows read; " if rows is not None else ""
    if kind == "relational" and config.relational is not None:
        tables = len(config.relational.tables) + 1
        size = f"{rows:,} rows read in {tables} tables; " if rows is not None else ""
        return f"{size}one model per child table ({tables - 1}), then the synthetic tables"
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
