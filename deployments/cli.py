"""``medrelease``: run releases, read the ledger, and try the product on bundled data.

The engine never imports Prefect: the commands that run flows import ``flows`` when called.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from medrelease.data.config import find_config
from medrelease.data.lattice import DEFAULT_BATCH_SIZE
from medrelease.errors import MedreleaseError
from medrelease.privacy.ledger_backends import ledger_exists, open_ledger
from medrelease.settings import ledger_location, store_root
from medrelease.storage.links import (
    DEFAULT_PORTAL_HOST,
    DEFAULT_PORTAL_PORT,
    PORTAL_URL_VARIABLE,
)

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Differentially private microdata releases (IPA and friends) on Prefect.")
console = Console()
TASK_NAME = re.compile(r"Task run '([a-z-]+)-[0-9a-f]+'")
LINE_EVERY_S = 5.0  # without a terminal: a step still going is printed again this often


class _PrefectUse:
    """Whether this process talked to a Prefect API: only then are Prefect's log and event
    workers drained at exit. Draining in a process that never ran a flow would start the
    ephemeral API just to find nothing to send (10 s under a refusal or ``release --help``)."""

    used = False


def _defaults() -> None:
    from tasks.prefect_defaults import apply_prefect_defaults

    apply_prefect_defaults()


class _ProgressHandler(logging.Handler):
    """Drives the progress bar from the run's log records: a long step's ``StepProgress``
    (aim's rounds, lattice nodes scored, audit runs; ``flows/progress.py``), else the running
    task's name; and says when the release folder is complete (the record that carries its
    path, ``tasks/publish.py``): the evidence report is written after it.

    On a console that is not a terminal (a pipe, a CI log) a bar cannot redraw: each step is
    one line instead, when it starts (every aim round is a step) and when it is finished."""

    def __init__(self, progress: Progress, task_id: Any, progress_key: str,
                 published_key: str) -> None:
        super().__init__(logging.INFO)
        self.progress, self.task_id = progress, task_id
        self.progress_key, self.published_key = progress_key, published_key
        self.started = time.perf_counter()
        self.lines = not progress.console.is_terminal
        self.last_line: tuple[str, bool] | None = None
        self.last_print = 0.0
        # a step with a size keeps the bar until it is finished: the names of the tasks it
        # runs (aim's "score batch", "select measure" every round) would hide "round k of n"
        self.step_holds_the_bar = False

    def emit(self, record: logging.LogRecord) -> None:
        published = getattr(record, self.published_key, None)
        if published:
            self.progress.console.print(
                f"[green]published[/] {escape(published)} "
                f"({time.perf_counter() - self.started:.1f} s); writing the evidence report",
                soft_wrap=True)
            return
        step = getattr(record, self.progress_key, None)
        if step is not None:
            self._show_step(step)
            return
        name = getattr(record, "task_run_name", None) or ""
        match = TASK_NAME.search(name) or TASK_NAME.search(record.getMessage())
        if match and not self.step_holds_the_bar:
            self.progress.update(self.task_id, description=match.group(1).replace("-", " "),
                                 detail="")

    def _show_step(self, step: Any) -> None:
        """``step``: a ``flows.progress.StepProgress``."""
        self.step_holds_the_bar = step.total is not None and not step.finished
        self.progress.update(self.task_id, description=step.step, completed=step.completed,
                             total=step.total, detail=step.detail_with_estimate)
        line = (step.step, step.finished)
        now = time.perf_counter()
        # a new step, or the same one still going after LINE_EVERY_S (issue 55: a long
        # scoring said "0/17,496 nodes" and nothing more for 267 s)
        if self.lines and (line != self.last_line or now - self.last_print >= LINE_EVERY_S
                           or getattr(step, "headline", False)):
            self.last_line, self.last_print = line, now
            self.progress.console.print(
                f"{escape(step.step)}: {escape(step.detail_with_estimate)} "
                f"({now - self.started:.1f} s)", soft_wrap=True, highlight=False)


def _said_in_the_panel(record: logging.LogRecord) -> bool:
    """The accuracy warnings of the run's log: the panel shows them (``tasks/evaluate.py``)."""
    return not getattr(record, "medrelease_summary", False)


def _run_flow(request: Any) -> dict[str, Any]:
    """Run the release flow in-process with a progress bar instead of Prefect's log lines
    (its state, read with ``result_of``: 'Not published' is a CANCELLED state)."""
    from flows.release import release_flow
    from flows.states import result_of

    return result_of(_with_progress(release_flow, request, return_state=True))


def _with_progress(flow_function: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a flow in-process; its log lines drive a progress bar."""
    from flows.progress import PROGRESS_KEY, PROGRESS_LOGGER
    from tasks.prefect_defaults import without_heartbeats
    from tasks.publish import PUBLISHED_KEY

    loggers = [logging.getLogger(n)
               for n in ("prefect.flow_runs", "prefect.task_runs", PROGRESS_LOGGER)]
    with Progress(SpinnerColumn(), TextColumn("{task.description:<30}"), BarColumn(),
                  TextColumn("{task.fields[detail]}"), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        task_id = progress.add_task("starting Prefect", total=None, detail="")
        _LiveProgress.current = progress
        handler = _ProgressHandler(progress, task_id, PROGRESS_KEY, PUBLISHED_KEY)
        quiet: list[tuple[logging.Handler, int]] = []
        for logger in loggers:
            logger.addHandler(handler)
        for logger in [*loggers, logging.getLogger("prefect"), logging.getLogger()]:
            for existing in logger.handlers:
                if existing is not handler and type(existing).__name__ == "PrefectConsoleHandler":
                    quiet.append((existing, existing.level))
                    existing.setLevel(logging.WARNING)
                    existing.addFilter(_said_in_the_panel)
        _PrefectUse.used = True
        try:
            with without_heartbeats():
                return flow_function(*args, **kwargs)
        finally:
            _LiveProgress.current = None
            for logger in loggers:
                logger.removeHandler(handler)
            for existing, level in quiet:
                existing.setLevel(level)
                existing.removeFilter(_said_in_the_panel)


def _show_result(result: dict[str, Any], seconds: float) -> None:
    manifest, record = result["manifest"], result.get("record") or {}
    guarantee = manifest["guarantee"]
    style = "green" if guarantee["proven"] else "yellow"
    il = record.get("information_loss") or {}
    body = [
        f"[bold]release[/]   {result['path']}",
        f"[bold]manifest[/]  {Path(result['path']) / 'manifest.json'}",
        f"[bold]report[/]    {Path(result['path']) / 'report.md'}",
        f"[bold]rows[/]      {record.get('input_rows', 0):,} in -> "
        f"{manifest['released_rows']:,} out",
        f"[bold]node[/]      {manifest['chosen_node'] or '(no lattice node: ' + manifest['mechanism'] + ')'}",
        "[bold]IL[/]        " + (f"{il['il']:.3f}" if il else "n/a for this mechanism"),
        f"[bold]guarantee[/] [{style}]{guarantee['statement']}[/]",
        f"[bold]lifetime[/]  {manifest['lifetime']['statement']}",
        f"[bold]flow run[/]  {result['flow_run_id']}   ({seconds:.1f} s)",
    ]
    details = manifest.get("mechanism_details") or {}
    for rung, node in enumerate(details.get("ladder") or [], start=1):
        body.insert(5, f"[bold]ladder {rung}[/]  {node}  (rows of cells too small at the node)")
    if details.get("degenerate"):
        body.append(f"[red bold]{details['degenerate']}[/]")
    accuracy = result.get("accuracy") or {}
    if accuracy.get("verdict"):  # steward only: it compares with the input
        body.insert(4, "[bold]accuracy[/]  (the steward's raw-data evaluation) "
                       f"{escape(accuracy['verdict'])}")
        for line in accuracy.get("warnings", []):
            body.insert(5, f"[yellow bold]{escape(line)}[/]")
    if result.get("evaluation"):
        body.append(f"[bold]evidence[/]  {result['evaluation']}  (internal: compares with raw data)")
    if manifest["test_release"]:
        body.append("[red bold]TEST RELEASE — NOT FOR PUBLICATION[/] (fixed seed; kept in the "
                    "test store)")
    body[0:0] = _verdict_lines(manifest)  # first: what the release is fit for (public)
    console.print(Panel("\n".join(body), title=f"released {manifest['dataset']}"))


def _verdict_lines(manifest: dict[str, Any]) -> list[str]:
    """The publication verdict (published in the manifest: computed from the release alone),
    coloured by its level, then one line per declared analysis."""
    verdict = manifest.get("verdict") or {}
    if not verdict.get("level"):
        return []
    colour = {"fit": "green", "use with care": "yellow"}.get(verdict["level"], "red")
    return [f"[bold]verdict[/]   [{colour} bold]{escape(verdict.get('headline', ''))}[/]",
            *(f"            {escape(a['name'])}: {escape(a['status'])} — {escape(a['why'])}"
              for a in verdict.get("analyses") or [])]


def _fail(exc: BaseException, what: str = "release refused") -> None:
    console.print(f"[red bold]{what}:[/] {escape(str(exc))}")
    raise typer.Exit(1)


def parse_param(text: str) -> tuple[str, Any]:
    """``name=value``; the value is read as JSON when it parses (numbers, true, lists), else text."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise MedreleaseError(f"--param needs name=value, got {text!r}")
    try:
        return name.strip(), json.loads(value)
    except json.JSONDecodeError:
        return name.strip(), value


@app.command()
def release(
    dataset: str = typer.Argument(..., help="dataset name or path to its dataset.yaml"),
    mechanism: str | None = typer.Option(
        None, help="a registered mechanism (see `medrelease mechanisms`); default: the dataset "
                   "config's"),
    epsilon: float | None = typer.Option(
        None, help="total privacy budget of this release (default: the dataset config's, else 1)"),
    param: list[str] = typer.Option(
        [], "--param", "-p", help="a mechanism parameter as name=value (repeatable), checked "
                                  "against the mechanism's parameters, e.g. -p "
                                  "suppression_threshold=3"),
    input_path: Path | None = typer.Option(None, "--input", help="release this file instead"),
    seed: int | None = typer.Option(None, help="TEST ONLY: fixed seed; the release goes to the "
                                               "test store, never published"),
    batch_size: int = typer.Option(DEFAULT_BATCH_SIZE, help="lattice nodes per scoring task"),
    destination: str | None = typer.Option(None, help="sub-folder of the release store"),
    void_lifetime_guarantee: bool = typer.Option(
        False, "--void-lifetime-guarantee",
        help="confirm a mechanism without a proven DP guarantee (kanon, mondrian, ...): this "
             "release then voids the source's lifetime guarantee for good; without it such a "
             "request is refused before anything is read or spent"),
    approve: bool = typer.Option(
        False, "--approve", help="a dataset with 'review: required': publish the release once "
                                 "it is built and evaluated (for scripts)"),
    reject: str | None = typer.Option(
        None, "--reject", metavar="REASON",
        help="a dataset with 'review: required': publish nothing, with this reason (the spend "
             "stays counted). Without --approve / --reject a terminal is asked; with no "
             "terminal the run waits for its form in the Prefect UI, like a served run"),
) -> None:
    """Release a dataset through the Prefect flow (the same request the UI form sends)."""
    _defaults()
    from pydantic import ValidationError

    from flows.release import ReleaseRequest

    try:
        parameters = dict(parse_param(p) for p in param)
        request = ReleaseRequest(dataset=dataset, mechanism=mechanism, epsilon=epsilon,
                                 parameters=parameters, seed=seed, batch_size=batch_size,
                                 destination=destination,
                                 void_lifetime_guarantee=void_lifetime_guarantee,
                                 input_path=str(input_path) if input_path else None)
    except MedreleaseError as exc:
        _fail(exc)
    except ValidationError as exc:
        _fail(MedreleaseError("; ".join(f"{'.'.join(map(str, e['loc'])) or 'request'}: "
                                        f"{e['msg']}" for e in exc.errors())))
    if approve and reject is not None:
        _fail(MedreleaseError("give --approve or --reject REASON, not both"))
    from flows.review import set_local_reviewer

    set_local_reviewer(_local_reviewer(approve, reject))
    started = time.perf_counter()
    try:
        result = _run_flow(request)
    except MedreleaseError as exc:
        _fail(exc)
    finally:
        set_local_reviewer(None)
    if isinstance(result, dict) and result.get("not_published"):
        console.print(Panel(f"[yellow bold]Not published[/]: {escape(result['not_published'])}"
                            + (f"\n[bold]evidence[/]  {result['evaluation']}"
                               if result.get("evaluation") else ""),
                            title=f"reviewed {dataset}"))
        return
    _show_result(result, time.perf_counter() - started)


def _local_reviewer(approve: bool, reject: str | None) -> Any:
    """How this terminal answers a review (``flows/review.py``): a flag's decision, else a
    question when there is a terminal, else None (the run waits for its form in the UI)."""
    from flows.review import ReviewDecision

    if approve:
        return lambda summary: ReviewDecision(decision="approve",
                                              reason="approved with medrelease release --approve")
    if reject is not None:
        return lambda summary: ReviewDecision(decision="reject", reason=reject)
    if not sys.stdin.isatty():
        return None
    return _ask_in_the_terminal


def _ask_in_the_terminal(summary: Any) -> Any:
    """The review form's text (``ReviewSummary``: the publication verdict, never the raw-data
    evaluation), then approve / reject and a reason (the progress bar paused)."""
    from flows.review import RAW_EVALUATION_NOTE, ReviewDecision

    live = _LiveProgress.current
    if live is not None:
        live.stop()
    colour = {"fit": "green", "use with care": "yellow"}.get(summary.verdict_level, "red")
    body = [f"[bold]verdict[/]   [{colour} bold]{escape(summary.verdict_headline)}[/]",
            *(f"            {escape(line)}" for line in summary.verdict_analyses),
            f"[bold]release[/]   {summary.release_id} (staged: {summary.staged_path})",
            f"[bold]mechanism[/] {summary.mechanism} — {escape(summary.guarantee)}",
            f"[bold]rows[/]      {summary.released_rows:,}",
            f"[bold]budget[/]    epsilon {summary.epsilon_spent:g} is spent and stays counted "
            "whichever you choose (the noise was drawn)",
            escape(RAW_EVALUATION_NOTE)]
    console.print(Panel("\n".join(body), title=f"review {summary.dataset} before publishing"))
    choice = typer.prompt("approve or reject", type=click_choice(["approve", "reject"]))
    reason = typer.prompt("reason (kept in the steward record and the ledger)", default="",
                          show_default=False)
    if live is not None:
        live.start()
    return ReviewDecision(decision=choice, reason=reason)


class _LiveProgress:
    """The progress bar of the flow this process runs (a terminal question pauses it)."""

    current: Progress | None = None


@app.command()
def init(
    csv_file: Path = typer.Argument(..., metavar="CSV", help="the table to draft a config for"),
    name: str = typer.Option(..., help="dataset name: lower-case letters, digits, - or _"),
    informative: str | None = typer.Option(
        None, help="the column released as it is (e.g. the diagnosis); asked for when the "
                   "terminal allows, else the candidates are listed"),
    unit: str | None = typer.Option(
        None, help="the privacy unit's id column, or 'row' (default: the id column whose rows "
                   "repeat, if any)"),
    root: Path | None = typer.Option(
        None, help="the dataset root to write under (default: the first; must be one of "
                   "them: datasets/, the data home's datasets/, MEDRELEASE_DATASETS)"),
    delimiter: str | None = typer.Option(None, help="the CSV's delimiter (default: sniffed)"),
    analysis: list[str] | None = typer.Option(
        None, "--analysis", metavar="COL,COL",
        help="a table researchers need, as its columns (e.g. treatment,outcome); repeat for "
             "more. Written as analyses: aim measures them first, every release says how it "
             "serves them. Without it, suggestions are written commented out"),
    child: list[Path] | None = typer.Option(
        None, "--child", metavar="CSV",
        help="a relational dataset: a table whose rows reference an earlier table's rows (CSV "
             "is then the parent table, one row per patient); repeat for more, each with its "
             "--key, parents before their children"),
    key: list[str] | None = typer.Option(
        None, "--key", metavar="COL",
        help="with each --child, in the same order: its column that references an earlier "
             "table, named as that table's key column (the first --key is the parent table's "
             "key and the privacy unit; e.g. --child ADMISSIONS.csv --key subject_id --child "
             "DIAGNOSES.csv --key hadm_id)"),
) -> None:
    """Draft datasets/NAME/dataset.yaml and its taxonomies from one pass over CSV (never
    overwrites); prints what it decided and what to review. No Prefect, no budget.
    With --child/--key: a relational dataset (CSV the parent table, each --child a table
    referencing the earlier table whose key column is its --key)."""
    from medrelease.data.draft import (
        InformativeNeeded,
        draft_dataset,
        profile_csv,
        write_draft,
    )
    from medrelease.settings import dataset_roots

    roots = dataset_roots()
    target = (root or roots[0]).resolve()
    if target not in [r.resolve() for r in roots]:
        _fail(MedreleaseError(f"--root {target} is not a dataset root; roots: "
                              f"{', '.join(str(r) for r in roots)} (MEDRELEASE_DATASETS adds "
                              "one)"), "init refused")
    if child or key:
        _init_relational(csv_file, name, target, child or [], key or [], delimiter,
                         informative, unit, analysis or [])
        return
    try:
        if (target / name / "dataset.yaml").exists():
            raise MedreleaseError(f"{target / name / 'dataset.yaml'} exists: init never "
                                  "overwrites a config; pick another --name")
        profile = profile_csv(csv_file, delimiter)
        try:
            draft = draft_dataset(profile, name, target, informative, unit, analysis or ())
        except InformativeNeeded as exc:
            if not (sys.stdin.isatty() and exc.candidates):
                raise
            chosen = typer.prompt(f"informative column ({', '.join(exc.candidates)})",
                                  type=click_choice(exc.candidates))
            draft = draft_dataset(profile, name, target, chosen, unit, analysis or ())
        written = write_draft(draft)
    except MedreleaseError as exc:
        _fail(exc, "init refused")
    _show_draft(draft, written)


def _init_relational(csv_file: Path, name: str, target: Path, children: list[Path],
                     keys: list[str], delimiter: str | None, informative: str | None,
                     unit: str | None, analysis: list[str]) -> None:
    """``init`` with ``--child``: the parent table and its child tables, each ``--key`` with
    the ``--child`` at its position (``medrelease.data.draft.draft_relational``)."""
    from medrelease.data.draft import draft_relational, profile_csv, write_draft

    try:
        if len(children) != len(keys):
            raise MedreleaseError(
                f"give one --key per --child, in the same order (e.g. --child ADMISSIONS.csv "
                f"--key subject_id): {len(children)} --child and {len(keys)} --key given; "
                "nothing was written")
        if informative is not None or analysis:
            raise MedreleaseError("--informative and --analysis are for a single table: a "
                                  "relational dataset releases dimensions of every table "
                                  "(declare relational.analyses in dataset.yaml); nothing was "
                                  "written")
        if unit is not None and unit != keys[0]:
            raise MedreleaseError(f"--unit {unit!r}: a relational dataset's privacy unit is "
                                  f"the parent table's key, the first --key ({keys[0]!r}); "
                                  "nothing was written")
        if (target / name / "dataset.yaml").exists():
            raise MedreleaseError(f"{target / name / 'dataset.yaml'} exists: init never "
                                  "overwrites a config; pick another --name")
        draft = draft_relational(profile_csv(csv_file, delimiter),
                                 [(profile_csv(path, delimiter), key)
                                  for path, key in zip(children, keys, strict=True)],
                                 name, target)
        written = write_draft(draft)
    except MedreleaseError as exc:
        _fail(exc, "init refused")
    _show_relational_draft(draft, written)


def _show_relational_draft(draft: Any, written: list[Path]) -> None:
    table = Table(title=f"{draft.folder / 'dataset.yaml'} ({len(draft.tables) + 1} tables)",
                  expand=True)
    for column in ("table", "rows", "references", "key", "max_children", "released columns",
                   "left out"):
        table.add_column(column, overflow="fold")
    dimensions = [c.name for c in draft.columns if c.role == "dimension"]
    others = [c.name for c in draft.columns if c.role != "dimension" and c.name != draft.key]
    table.add_row(escape(draft.root), f"{draft.rows:,}", "-", escape(draft.key), "-",
                  escape(", ".join(dimensions)), escape(", ".join(others) or "-"))
    for child in draft.tables:
        table.add_row(escape(child.name), f"{child.rows:,}",
                      escape(f"{child.parent} by {child.references}"), escape(child.key or "-"),
                      f"{child.max_children} (read from the data)",
                      escape(", ".join(c.name for c in child.columns)),
                      escape(", ".join(c.name for c in child.left_out) or "-"))
    console.print(table)
    console.print(f"[bold]privacy unit[/] {escape(draft.key)} (one {escape(draft.unit_noun)} "
                  f"with all their rows in every table)   [bold]mechanism[/] relational   "
                  f"[bold]files[/] {len(written)}", soft_wrap=True)
    _review_and_next(draft)


def _review_and_next(draft: Any) -> None:
    """What init read from the data and the steward must review, then the next commands."""
    if draft.review:
        console.print("[yellow bold]review before a release that matters:[/]")
        for line in draft.review:
            console.print(f"  - {escape(line)}", soft_wrap=True, highlight=False)
    console.print(f"next: [bold]medrelease check {draft.name}[/], then "
                  f"[bold]medrelease release {draft.name}[/]", soft_wrap=True)


def click_choice(options: list[str]) -> Any:
    import click

    return click.Choice(options)


def _show_draft(draft: Any, written: list[Path]) -> None:
    table = Table(title=f"{draft.folder / 'dataset.yaml'} ({draft.rows:,} rows read)",
                  expand=True)
    for column in ("column", "role", "why", "file"):
        table.add_column(column, overflow="fold")
    for column in draft.columns:
        table.add_row(escape(column.name), column.role, escape(column.reason),
                      escape(column.taxonomy or column.domain or ""))
    console.print(table)
    unit = (f"{draft.unit} (at most {draft.max_rows_per_unit} rows each)" if draft.unit
            else "one row")
    console.print(f"[bold]privacy unit[/] {escape(unit)}   [bold]missing values[/] "
                  f"{draft.dataset_missing}   [bold]lattice[/] {draft.lattice_nodes:,} nodes   "
                  f"[bold]files[/] {len(written)}", soft_wrap=True)
    if draft.analyses:
        console.print("[bold]analyses[/] " + escape("; ".join(" × ".join(a)
                                                                for a in draft.analyses)),
                      soft_wrap=True, highlight=False)
    else:
        console.print("[bold]analyses[/] none declared: dataset.yaml suggests the informative "
                      "column against each dimension, commented out (--analysis a,b declares "
                      "one)", soft_wrap=True, highlight=False)
    _review_and_next(draft)


@app.command()
def check(
    dataset: str = typer.Argument(..., help="dataset name or path to its dataset.yaml"),
    input_path: Path | None = typer.Option(None, "--input", help="check this file instead"),
    mechanism: str | None = typer.Option(None, help="check the plan for this mechanism"),
    epsilon: float | None = typer.Option(
        None, help="check the plan at this epsilon, and show each declared analysis's "
                   "expected 95 % error there (from expected_rows, never the input)"),
    target_error: float | None = typer.Option(
        None, "--target-error",
        help="print the smallest epsilon (up to the policy's max_epsilon) at which every "
             "declared analysis is within this share of an average cell: the 95 % half-width "
             "per cell, e.g. 0.1 = ±10 % (aim; needs expected_rows)"),
    param: list[str] = typer.Option(
        [], "--param", "-p", help="a mechanism parameter as name=value, as release takes it"),
    seed: int | None = typer.Option(None, help="check the TEST release this seed would make "
                                               "(its store)"),
    destination: str | None = typer.Option(None, help="sub-folder of the release store"),
    void_lifetime_guarantee: bool = typer.Option(
        False, "--void-lifetime-guarantee",
        help="the confirmation a mechanism without a proven DP guarantee needs, as release"),
) -> None:
    """Validate the config, its taxonomies and the input, list every problem at once, and
    show the release that would run, with its declared analyses' expected errors: whatever
    the same release would refuse before its charge is a problem here (the same checks). No
    Prefect, nothing spent."""
    from medrelease.checkup import Request, check_dataset

    if target_error is not None and not 0 < target_error < float("inf"):
        raise typer.BadParameter("a positive share of an average cell, e.g. 0.1 for ±10 %",
                                 param_hint="--target-error")
    try:
        params = dict(parse_param(p) for p in param)
    except MedreleaseError as exc:
        _fail(exc, "check refused")
    request = Request(str(input_path.resolve()) if input_path else None, mechanism, epsilon,
                      params, seed, destination, void_lifetime_guarantee)
    report = check_dataset(dataset, target_error=target_error, request=request)
    source = f" ({report.config_file})" if report.config_file else ""
    if report.findings:
        table = Table(title=f"{len(report.findings)} problem(s) in {report.dataset}{source}",
                      expand=True, show_lines=True)
        for column in ("#", "where", "column", "problem", "rows", "first lines"):
            table.add_column(column, overflow="fold")
        for number, finding in enumerate(report.findings, start=1):
            table.add_row(str(number), finding.stage, escape(finding.column or "-"),
                          escape(finding.problem),
                          f"{finding.rows:,}" if finding.rows is not None else "-",
                          escape(finding.first_lines or "-"))
        console.print(table)
        if report.steward_log:
            console.print(f"example values, for the steward only: {report.steward_log}",
                          soft_wrap=True)
    else:
        rows = (": " + ", ".join(f"{escape(t)} {n:,}" for t, n in report.table_rows.items())
                + " rows" if report.table_rows
                else f": {report.rows:,} rows" if report.rows is not None else "")
        console.print(f"[green bold]no problems[/] in {report.dataset}{source}{rows}",
                      soft_wrap=True)
    for warning in report.warnings:
        console.print(f"[yellow bold]review:[/] {escape(warning)}", soft_wrap=True,
                      highlight=False)
    if report.release:
        title = "the release it would run" + (" (once the problems are fixed)"
                                               if report.findings else "")
        console.print(Panel("\n".join(f"[bold]{k:<9}[/] {escape(v)}" for k, v in report.release),
                            title=title))
    errors = report.errors
    if isinstance(errors, str):
        console.print(escape(errors), soft_wrap=True, highlight=False)
    elif errors is not None and not errors.analyses:
        console.print("; ".join(errors.notes), soft_wrap=True, highlight=False)
    elif errors is not None:
        header, rows = errors.table()
        table = Table(title=errors.title, expand=True)
        for column in header:
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(*(escape(cell) for cell in row))
        console.print(table)
        for note in errors.notes:
            console.print(f"  - {escape(note)}", soft_wrap=True, highlight=False)
        if errors.target is not None:
            console.print(f"[bold]--target-error {errors.target.target:g}[/]: "
                          f"{escape(errors.target.message)}", soft_wrap=True, highlight=False)
    console.print(f"checked in {report.seconds:.1f} s; nothing spent", highlight=False)
    if report.findings:
        raise typer.Exit(1)


@app.command()
def mechanisms() -> None:
    """The registered mechanisms: guarantee, what they take, and their parameters."""
    from medrelease.mechanisms import MECHANISMS, label
    from medrelease.plan import PUBLIC_FACTS

    table = Table(title="release mechanisms (registry)", expand=True)
    for column in ("mechanism", "parameters (name: description)"):
        table.add_column(column, overflow="fold")
    for name, impl in sorted(MECHANISMS.items()):
        params = [f"{field}: {info.description or ''}"
                  for field, info in impl.Params.model_fields.items()
                  if field not in PUBLIC_FACTS]
        table.add_row(label(name), "\n".join(params) or "-")
    console.print(table)


WIDE_LEDGER = 140  # columns a ledger table needs to show full release ids
ledger_app = typer.Typer(help="The privacy-budget ledger: spends per source, and its cap.")
app.add_typer(ledger_app, name="ledger")


@ledger_app.callback(invoke_without_command=True)
def ledger(ctx: typer.Context,
           source: str | None = typer.Option(None, help="only this source")) -> None:
    """Show every privacy-budget spend, per source, with what is left."""
    if ctx.invoked_subcommand is not None:
        return
    try:
        book = open_ledger(ledger_location())
    except MedreleaseError as exc:
        _fail(exc)
    spends = book.spends(source)
    if console.width >= WIDE_LEDGER:
        _ledger_table(spends)
    else:  # a table would cut release ids at this width: one block per spend instead
        console.print(f"privacy budget ledger ({ledger_location()})", soft_wrap=True)
        for s in spends:
            console.print(f"- {s.created_at[:19]}  {s.source} / {s.dataset}: {s.mechanism}, "
                          f"eps {s.epsilon:g}, delta {s.delta:g}, {_status(s)}\n"
                          f"  release {s.release_id or '-'}", soft_wrap=True, highlight=False)
    for name in sorted({s.source for s in spends}):
        console.print(book.state(name).statement())
    for change in book.cap_changes(source):
        console.print(f"cap of {change.source} changed at {change.changed_at}: epsilon "
                      f"{change.old_epsilon:g} -> {change.new_epsilon:g}, delta "
                      f"{change.old_delta:g} -> {change.new_delta:g} ({change.reason})")


def _status(spend) -> str:
    colour = {"released": "green", "failed": "red"}.get(spend.status, "yellow")
    return f"[{colour}]{spend.status_text}[/]"


def _ledger_table(spends) -> None:
    table = Table(title=f"privacy budget ledger ({ledger_location()})")
    for column in ("source", "dataset", "mechanism", "epsilon", "delta", "status", "release",
                   "when"):
        table.add_column(column, no_wrap=column in ("release", "when"))
    for s in spends:
        table.add_row(s.source, s.dataset, s.mechanism, f"{s.epsilon:g}", f"{s.delta:g}",
                      _status(s), s.release_id or "-", s.created_at[:19])
    console.print(table)


@ledger_app.command("init")
def ledger_init() -> None:
    """Create an empty ledger for a new installation (refused where releases are on record)."""
    from medrelease.settings import steward_root
    from medrelease.storage.store import StewardRecords

    location = ledger_location()
    records = StewardRecords(steward_root()).records()
    try:
        if ledger_exists(location) and open_ledger(location).holds_spends():
            _fail(MedreleaseError(f"{location} already holds spends; nothing changed"))
    except MedreleaseError as exc:
        _fail(exc)
    if records:
        _fail(MedreleaseError(f"{len(records)} release(s) are on record under {steward_root()}: "
                              "a new empty ledger would restart their budgets; use "
                              "'medrelease ledger restore' instead"))
    open_ledger(location).forget_head()  # a new start: the journal this host saw is gone
    console.print(f"new empty ledger: {location}")


@ledger_app.command("restore")
def ledger_restore(
    from_journal: Path | None = typer.Option(
        None, help="PostgreSQL ledger only: first replay this SQLite ledger's journal "
                   "(ledger.sqlite.journal.jsonl), to move a ledger from SQLite to PostgreSQL"),
) -> None:
    """Rebuild a lost or emptied ledger: its journal replayed, then releases on record."""
    from medrelease.privacy.journal import FileJournal, JournalDamaged, chain_problems
    from medrelease.privacy.ledger_backends import restore_from_records
    from medrelease.privacy.ledger_url import is_database_url
    from medrelease.settings import steward_root, test_store_root
    from medrelease.storage.store import StewardRecords, published_manifests

    location = ledger_location()
    records = StewardRecords(steward_root()).records()
    manifests = published_manifests(store_root(), test_store_root())
    try:
        if is_database_url(location):
            from medrelease.privacy.ledger_pg import PostgresLedger

            events = None
            if from_journal:  # an altered journal is not moved into a new ledger
                try:
                    links = FileJournal(from_journal).links()
                except JournalDamaged as exc:
                    _fail(MedreleaseError(f"{exc}; nothing was restored"))
                broken = chain_problems(links)
                if broken:
                    _fail(MedreleaseError(f"the journal {from_journal} was altered "
                                          f"({'; '.join(broken[:4])}); nothing was restored"))
                events = [link.event for link in links]
            restored = PostgresLedger(location).restore(records, manifests, events)
        elif from_journal is not None:
            _fail(MedreleaseError("--from-journal is for a PostgreSQL ledger "
                                  "(MEDRELEASE_LEDGER_URL); a SQLite ledger replays its own"))
        else:
            restored = restore_from_records(location, records, manifests)
    except MedreleaseError as exc:
        _fail(exc)
    console.print(f"restored {restored.spends} spend(s) into {location}: "
                  f"{restored.from_journal} from its journal (with every source's cap, policy, "
                  "owner config and content claims), "
                  f"{restored.from_records} from steward records and {restored.from_manifests} "
                  f"from published manifests that the journal lacked (journaled now; a "
                  "manifest carries no content hash). Checked against "
                  f"{len(records)} steward record(s) and {len(manifests)} manifest(s).")
    if not restored.from_journal and (restored.from_records or restored.from_manifests):
        console.print("The journal held nothing: runs that failed after their charge are "
                      "recorded only there; check the Prefect run history for them.")


@ledger_app.command("migrate")
def ledger_migrate(
    sqlite: Path | None = typer.Option(
        None, "--sqlite", help="the SQLite ledger file to migrate (default: this installation's "
                               "ledger); to move an older SQLite ledger to PostgreSQL, migrate "
                               "it here first, then 'ledger restore --from-journal'"),
) -> None:
    """Bring a SQLite ledger an older version wrote to this one, once (checked against its
    journal and this host's head first; the old files kept beside it). A ledger that needs it
    is refused until then."""
    from medrelease.privacy.ledger_migrate import migrate_sqlite
    from medrelease.privacy.ledger_url import is_database_url

    location = str(sqlite) if sqlite is not None else ledger_location()
    if is_database_url(location):
        _fail(MedreleaseError("a PostgreSQL ledger migrates its schema with 'medrelease ledger "
                              "init-db'; 'migrate' is for a SQLite ledger file (--sqlite PATH)"))
    try:
        done = migrate_sqlite(location)
    except MedreleaseError as exc:
        _fail(exc)
    if not done:
        console.print(f"ledger {location} is already this version's; nothing changed")
        return
    for sentence in done:
        console.print(f"- {sentence}", soft_wrap=True, highlight=False)
    console.print(f"ledger {location} migrated; 'medrelease ledger verify' checks it")


@ledger_app.command("verify")
def ledger_verify() -> None:
    """Check the ledger against its journal, the steward records and the published releases
    (what every release checks before its charge); exit 1 naming what differs."""
    from medrelease.privacy.ledger_backends import reconcile
    from medrelease.settings import steward_root, test_store_root
    from medrelease.storage.store import StewardRecords, published_manifests

    location = ledger_location()
    try:
        manifests = published_manifests(store_root(), test_store_root())  # (before records)
        reconcile(location, StewardRecords(steward_root()).records(), manifests)
        spends = len(open_ledger(location).spends()) if ledger_exists(location) else 0
    except MedreleaseError as exc:
        console.print(f"[red bold]ledger inconsistent ({type(exc).__name__}):[/] {exc}",
                      soft_wrap=True)
        raise typer.Exit(1) from None
    console.print(f"ledger {location} matches its journal, the steward records and the "
                  f"published releases ({spends} spend(s))")


@ledger_app.command("set-cap")
def ledger_set_cap(
    source: str = typer.Argument(..., help="the ledger source id"),
    epsilon: float = typer.Option(..., help="new lifetime epsilon of the source"),
    delta: float = typer.Option(..., help="new lifetime delta of the source"),
    reason: str = typer.Option(..., help="why (kept in the ledger with the time)"),
) -> None:
    """Change a source's lifetime cap (the YAML's value only applies at the first spend)."""
    try:
        open_ledger(ledger_location()).set_cap(source, epsilon, delta, reason)
    except MedreleaseError as exc:
        _fail(exc)
    console.print(f"cap of {source}: epsilon {epsilon:g}, delta {delta:g} (recorded: {reason})")


@ledger_app.command("init-db")
def ledger_init_db(
    admin_url: str = typer.Option(
        ..., help="postgresql://ADMIN@HOST:PORT/DB of a role that may create roles and schemas "
                  "(its password from PGPASSWORD or ~/.pgpass, not this command line)"),
    owner: str = typer.Option("medrelease_owner", help="the role that owns the ledger schema"),
    service: str = typer.Option("medrelease_service",
                                help="the role releases run as: SELECT and INSERT only"),
) -> None:
    """Create (or migrate) the PostgreSQL ledger: schema 'medrelease' owned by the owner role,
    and the service role that may only read and append (docs/OPERATIONS.md). The service's
    password, if any, is read from MEDRELEASE_LEDGER_SERVICE_PASSWORD."""
    from medrelease.privacy.ledger_pg import SCHEMA_VERSION, init_db

    try:
        url, applied = init_db(admin_url, owner, service,
                               os.environ.get("MEDRELEASE_LEDGER_SERVICE_PASSWORD") or None)
    except MedreleaseError as exc:
        _fail(exc)
    done = (f"applied migration(s) {', '.join(map(str, applied))}" if applied
            else "already up to date")
    console.print(f"ledger schema at version {SCHEMA_VERSION} ({done}); owner role {owner}, "
                  f"service role {service} (SELECT and INSERT only).\nSet on every host that "
                  f"releases: MEDRELEASE_LEDGER_URL={url} (with the service's password, or "
                  "PGPASSWORD / ~/.pgpass)", soft_wrap=True)


@app.command()
def demo(
    mechanism: str | None = typer.Option(
        None, help="a registered mechanism (see `medrelease mechanisms`); default: the sample's "
                   "dataset default"),
    epsilon: float = typer.Option(1.0, help="total privacy budget"),
    void_lifetime_guarantee: bool = typer.Option(
        False, "--void-lifetime-guarantee",
        help="confirm a mechanism without a proven DP guarantee (it voids the sample's "
             "lifetime guarantee for good)"),
) -> None:
    """Release the bundled NPS-like sample with Prefect's ephemeral API and show what came out."""
    _defaults()
    from pydantic import ValidationError

    from flows.outcome import artifacts_of_run
    from flows.release import ReleaseRequest
    from medrelease.mechanisms import DEFAULT_RULE
    from medrelease.release import resolve_mechanism

    try:
        request = ReleaseRequest(mechanism=mechanism, epsilon=epsilon,
                                 void_lifetime_guarantee=void_lifetime_guarantee)
        config = find_config(request.dataset)
        chosen = resolve_mechanism(config, request.mechanism).name
    except MedreleaseError as exc:
        _fail(exc)
    except ValidationError as exc:  # an unregistered mechanism, or one that takes no epsilon
        _fail(MedreleaseError("; ".join(f"{'.'.join(map(str, e['loc'])) or 'request'}: "
                                        f"{e['msg']}" for e in exc.errors())))
    why = ("as asked" if request.mechanism else
           f"the dataset's default, named in {config.name}'s dataset.yaml" if config.mechanism.name
           else f"the dataset's default: {DEFAULT_RULE}")
    console.print("[bold]medrelease demo[/]: releasing the bundled NPS-like sample "
                  f"(20,000 synthetic admissions) with [bold]{chosen}[/] ({why}), "
                  f"epsilon {epsilon}")
    console.print(f"ledger: {ledger_location()}   release store: {store_root()}")
    started = time.perf_counter()
    try:
        result = _run_flow(request)
    except MedreleaseError as exc:
        _fail(exc)
    _show_result(result, time.perf_counter() - started)
    table = Table(title="Prefect artifacts of this flow run")
    for column in ("key", "type", "description"):
        table.add_column(column)
    for row in artifacts_of_run(result["flow_run_id"]):
        table.add_row(*row)
    console.print(table)
    console.print("See them with [bold]prefect artifact ls[/] or in the UI "
                  "([bold]prefect server start[/], then http://127.0.0.1:4200).")


def _require_server() -> None:
    if not os.environ.get("PREFECT_API_URL"):
        console.print("[red bold]PREFECT_API_URL is not set.[/] Deployments and events need a "
                      "running Prefect server:\n  prefect server start   (in another shell)\n"
                      "  export PREFECT_API_URL=http://127.0.0.1:4200/api")
        raise typer.Exit(2)


@app.command()
def serve(
    inbox: Path | None = typer.Option(None, help="also watch this inbox folder for extracts"),
    dataset: str = typer.Option("nps-sample", help="dataset the inbox's extracts are released "
                                "and charged as (fixed: no run's parameters change it)"),
    interval: float = typer.Option(1.0, help="inbox poll interval in seconds"),
    portal_port: int = typer.Option(DEFAULT_PORTAL_PORT,
                                    help="port of the release portal started beside the "
                                         "deployments (on --portal-host)"),
    portal_host: str = typer.Option(DEFAULT_PORTAL_HOST, help="address the portal listens on"),
    no_portal: bool = typer.Option(False, "--no-portal",
                                   help="do not start the portal (one runs elsewhere)"),
) -> None:
    """Serve the on-demand and scheduled deployments and the release portal beside them; with
    --inbox, also watch the inbox and serve its on-arrival and watch-inbox deployments (on one
    host only)."""
    _defaults()
    _require_server()
    _PrefectUse.used = True
    from deployments.serve import serve_all

    if inbox is not None:
        try:  # every arrival is released as this dataset: a wrong name fails now, not per file
            served = find_config(dataset)
        except MedreleaseError as exc:
            console.print(f"[red]--dataset {escape(dataset)}: {escape(str(exc))}[/]")
            raise typer.Exit(2) from None
        if served.relational is not None:  # one file arriving would replace one table only
            console.print(f"[red]--dataset {escape(dataset)} is relational: its tables are "
                          "read together from the files its config names, never from one "
                          "arriving file; serve it without --inbox[/]")
            raise typer.Exit(2)
        inbox.mkdir(parents=True, exist_ok=True)
        console.print(f"watching {inbox.resolve()} for extracts of {dataset}")
    portal = None if no_portal else _start_portal(portal_host, portal_port)
    try:
        serve_all(inbox, dataset, interval)
    finally:
        if portal is not None:
            portal.should_exit = True


def _start_portal(host: str, port: int) -> Any:
    """The portal in a thread of ``serve``; its URL goes to the served runs' links
    (``MEDRELEASE_PORTAL_URL``, unless whoever deploys set it, e.g. behind a proxy). A portal
    that cannot start is a warning: the deployments are served all the same."""
    from deployments.portal import PortalRefused, is_loopback, start_in_thread

    try:
        server = start_in_thread(host, port)
    except PortalRefused as exc:
        console.print(f"[yellow bold]release portal not started:[/] {escape(str(exc))}",
                      soft_wrap=True)
        return None
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    if PORTAL_URL_VARIABLE not in os.environ and not is_loopback(host):
        console.print(f"[yellow]the runs' links say {url}: set {PORTAL_URL_VARIABLE} to the "
                      "address stewards open (e.g. the TLS proxy's)[/]", soft_wrap=True)
    os.environ.setdefault(PORTAL_URL_VARIABLE, url)
    logins = server.logins.describe()
    console.print(f"release portal: {url} "
                  + (f"({escape(logins)})" if logins else "(no secret and no account: open to this "
                     "machine only)"), soft_wrap=True)
    return server


portal_app = typer.Typer(help="The release portal: serve it; its accounts (researchers, "
                                "stewards).")
app.add_typer(portal_app, name="portal")


@portal_app.callback(invoke_without_command=True)
def portal(
    ctx: typer.Context,
    port: int = typer.Option(DEFAULT_PORTAL_PORT, help="port to listen on"),
    host: str = typer.Option(DEFAULT_PORTAL_HOST,
                             help="address to listen on (beyond loopback only with a secret "
                                  "or accounts)"),
) -> None:
    """Serve the release portal: catalogue, release pages and downloads for researchers, and
    the steward area (/steward) for stewards, read-only, behind portal accounts and the Prefect
    server's secret. No Prefect, no flow."""
    if ctx.invoked_subcommand is not None:
        return
    from deployments.portal import PortalRefused, is_loopback, portal_server

    try:
        server, sock = portal_server(host, port)
    except PortalRefused as exc:
        _fail(exc, "portal refused")
    logins = server.logins.describe()
    console.print(f"release portal on http://{host}:{port} (steward area: /steward); "
                  + (escape(logins) or "[yellow]no secret and no account: open to anyone on this "
                               "machine[/]"), soft_wrap=True)
    if logins and not is_loopback(host):
        console.print("[yellow]passwords travel in clear over HTTP: beyond loopback, put the "
                      "portal behind a TLS reverse proxy (docs/OPERATIONS.md)[/]",
                      soft_wrap=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[sock])


def _read_password(confirm: bool = True) -> str:
    """The new password: from stdin when it is not a terminal (one line; never an argument,
    which ``ps`` and shell history would show), else asked twice without echo."""
    import getpass

    if not sys.stdin.isatty():
        return sys.stdin.readline().rstrip("\r\n")
    password = getpass.getpass("password: ")
    if confirm and getpass.getpass("again: ") != password:
        _fail(MedreleaseError("the two passwords differ; nothing changed"), "add-user refused")
    return password


@portal_app.command("add-user")
def portal_add_user(
    name: str = typer.Argument(..., help="the account's name (lower-case letters, digits, "
                                         "'.', '_', '-', '@')"),
    role: str = typer.Option(..., help="researcher: releases and downloads; steward: "
                                       "everything, the steward area included",
                             case_sensitive=True),
    admin_url: str | None = typer.Option(
        None, help="PostgreSQL ledger only: postgresql://ADMIN@HOST/DB of the role that ran "
                   "'ledger init-db' (the service role may only read accounts; the password "
                   "from PGPASSWORD or ~/.pgpass)"),
    replace: bool = typer.Option(False, "--replace",
                                 help="replace an existing account's password and role"),
    no_password: bool = typer.Option(
        False, "--no-password", help="single sign-on only: no password opens the account "
                                     "(MEDRELEASE_PORTAL_USER_HEADER, docs/OPERATIONS.md)"),
) -> None:
    """Add a portal account. The password is read from stdin (one line), or asked twice at a
    terminal; only its scrypt hash is stored, beside the ledger."""
    from medrelease.storage.accounts import check_role, open_accounts

    try:
        check_role(role)  # before a password is asked for
        accounts = open_accounts(admin_url)
        password = None if no_password else _read_password()
        account = accounts.add(name, role, password, replace=replace)
    except MedreleaseError as exc:
        _fail(exc, "add-user refused")
    how = "single sign-on only" if no_password else "password set"
    console.print(f"portal account {account.name}: {account.role} ({how}) in "
                  f"{accounts.location}", soft_wrap=True, highlight=False)


@portal_app.command("remove-user")
def portal_remove_user(
    name: str = typer.Argument(..., help="the account's name"),
    admin_url: str | None = typer.Option(
        None, help="PostgreSQL ledger only: as for add-user"),
) -> None:
    """Remove a portal account: its next request is refused (a portal remembers no login)."""
    from medrelease.storage.accounts import open_accounts

    try:
        accounts = open_accounts(admin_url)
        removed = accounts.remove(name)
    except MedreleaseError as exc:
        _fail(exc, "remove-user refused")
    if not removed:
        _fail(MedreleaseError(f"no portal account {name} in {accounts.location}"),
              "remove-user refused")
    console.print(f"portal account {name} removed from {accounts.location}", soft_wrap=True,
                  highlight=False)


@portal_app.command("list-users")
def portal_list_users() -> None:
    """The portal's accounts: name, role, since when (never a password or a hash)."""
    from medrelease.storage.accounts import open_accounts

    try:
        accounts = open_accounts()
        found = accounts.accounts()
    except MedreleaseError as exc:
        _fail(exc, "list-users refused")
    console.print(f"portal accounts ({accounts.location}): {len(found)}", soft_wrap=True,
                  highlight=False)
    for account in found:
        how = "" if account.has_password else "  (single sign-on only)"
        console.print(f"- {account.name}  {account.role}  since {account.created_at}{how}",
                      soft_wrap=True, highlight=False)


@app.command()
def watch(
    inbox: Path = typer.Argument(..., help="folder where extracts are dropped"),
    dataset: str = typer.Option("nps-sample", help="dataset the extracts belong to"),
    interval: float = typer.Option(1.0, help="poll interval in seconds"),
) -> None:
    """Announce each complete extract in INBOX as a Prefect event (until Ctrl-C)."""
    _defaults()
    _require_server()
    _PrefectUse.used = True
    from flows.watch import watch_loop

    try:
        if find_config(dataset).relational is not None:
            console.print(f"[red]--dataset {escape(dataset)} is relational: its tables are "
                          "read together from the files its config names, never from one "
                          "arriving file[/]")
            raise typer.Exit(2)
    except MedreleaseError as exc:
        console.print(f"[red]--dataset {escape(dataset)}: {escape(str(exc))}[/]")
        raise typer.Exit(2) from None

    inbox.mkdir(parents=True, exist_ok=True)
    console.print(f"watching {inbox.resolve()} for extracts of {dataset} (Ctrl-C to stop)")
    try:
        watch_loop(inbox, dataset, interval,
                   on_arrival=lambda a: console.print(f"announced {a.path.name}"))
    except KeyboardInterrupt:
        console.print("stopped")


@app.command()
def audit(
    mechanism: str = typer.Option("ipa-paper", help="mechanism to audit"),
    eps: float = typer.Option(1.0, "--eps", help="the epsilon it claims"),
    runs: int = typer.Option(200, help="runs on each of the two neighbouring tables"),
    design: str | None = typer.Option(
        None, help="unique, tipping, classification (statistical only; default: "
                   "classification for diffgen, else unique), or publication (the whole "
                   "release flow on neighbours, every published byte inspected, then the "
                   "statistical designs)"),
    pairs: int = typer.Option(1, help="publication design: seeded neighbour pairs per design"),
) -> None:
    """Empirical privacy audit: a 95 % lower bound on epsilon from worst-case neighbours."""
    _defaults()
    if design == "publication":
        _publication_audit(mechanism, eps, runs, pairs)
        return
    from flows.audit import audit_flow

    try:
        result = _with_progress(audit_flow, mechanism=mechanism, epsilon=eps, runs=runs,
                                design=design)
    except (MedreleaseError, ValueError) as exc:
        _fail(exc)
    console.print(Panel(_audit_text(result, runs, eps), title=f"audit of {mechanism}"))


def _audit_text(result: dict[str, Any], runs: int, eps: float) -> str:
    colour = {"exceeds its claim": "red bold", "inconclusive": "yellow bold"}.get(
        result["verdict"], "green")
    half = runs - runs // 2
    return (f"design: {result['design']}\nevent: {result['event']}\n"
            f"second-half hits: {result['hits_with']}/{half} with the target, "
            f"{result['hits_without']}/{half} without\n"
            f"epsilon lower bound ({result['confidence']:.0%}): "
            f"[bold]{result['epsilon_lower_bound']:.2f}[/] vs claimed {eps:g} -> "
            f"[{colour}]{result['verdict']}[/]\n"
            f"ceiling: {runs} runs per table can show at most {result['ceiling']:.2f}")


def _publication_audit(mechanism: str, eps: float, runs: int, pairs: int) -> None:
    from flows.audit import publication_audit_flow

    try:
        result = _with_progress(publication_audit_flow, mechanism=mechanism, epsilon=eps,
                                runs=runs, pairs=pairs)
    except (MedreleaseError, ValueError) as exc:
        _fail(exc)
    lines = [f"designs: {', '.join(result['designs'])} ({pairs} pair(s) each, whole release "
             "flow, same seed both sides)"]
    lines += [f"[red]{escape(f)}[/]" for f in result["findings"]] or [
        "[green]published bytes: only allow-listed files and fields; public fields identical "
        "between neighbours; released figures re-derived; no unique value[/]"]
    for stat in result["statistical"]:
        lines.append(f"statistical ({stat['design']}): eps >= {stat['epsilon_lower_bound']:.2f}"
                     f" -> {stat['verdict']} (ceiling {stat['ceiling']:.2f})")
    colour = {"FLAGGED": "red bold", "inconclusive": "yellow bold"}.get(result["verdict"],
                                                                          "green bold")
    lines.append(f"verdict: [{colour}]{result['verdict']}[/]")
    console.print(Panel("\n".join(lines), title=f"publication audit of {mechanism}"))


@app.command("prepare-mimic")
def prepare_mimic(
    source: Path = typer.Option(Path("../shared/data/mimic-iii-demo"),
                                help="folder with ADMISSIONS, PATIENTS and DIAGNOSES_ICD CSVs"),
    output: Path | None = typer.Option(None, help="where to write (default: the mimic-demo "
                                                  "dataset's input path)"),
) -> None:
    """Join the MIMIC-III demo per admission (the DiffGen experiment's table) into a CSV."""
    from medrelease.data.mimic import write_admissions

    target = output or find_config("mimic-demo").input_path
    try:
        rows = write_admissions(source, target)
    except MedreleaseError as exc:
        _fail(exc)
    console.print(f"{rows} admissions -> {target}")


@app.command()
def show(release: Path = typer.Argument(..., help="a release folder or its manifest.json")) -> None:
    """Print a release's public facts, and the steward record's when this machine has it."""
    from medrelease.settings import steward_root
    from medrelease.storage.store import StewardRecords, StoreError

    folder = release.parent if release.name == "manifest.json" else release
    data = json.loads((folder / "manifest.json").read_text())
    verdict = data.get("verdict") or {}
    console.print_json(json.dumps({**{k: data[k] for k in (
        "release_id", "dataset", "source", "mechanism", "guarantee", "epsilon_spent",
        "delta_spent", "lifetime", "chosen_node", "released_rows", "seed_policy",
        "test_release")}, "verdict": {  # the publication verdict (published, post-processing)
        "level": verdict.get("level"), "headline": verdict.get("headline"),
        "reasons": verdict.get("reasons", []),
        "analyses": [f"{a['name']}: {a['status']} — {a['why']}"
                     for a in verdict.get("analyses") or []]} if verdict else None}))
    try:
        record = StewardRecords(steward_root()).read(data["dataset"], data["release_id"])
    except StoreError:
        console.print("(no steward record on this machine: only the public facts are shown)")
        return
    console.print("[bold]steward record[/] (internal, never published):")
    console.print_json(json.dumps({k: record.get(k) for k in (
        "status", "input_file", "input_sha256", "input_rows", "information_loss",
        "flow_run_id", "ledger_spend_id", "lifetime_cap_note", "declared_rows_check")}))


def main() -> None:  # pragma: no cover - console entry point
    code: int | str | None = 0
    try:
        app()
    except MedreleaseError as exc:
        console.print(f"[red bold]error:[/] {exc}")
        code = 1
    except SystemExit as exc:
        code = exc.code
    _exit_now(code)


def _exit_now(code: int | str | None) -> None:
    """Exit once everything is written: Prefect's log and event workers drained and every
    exit handler run (the ephemeral API stops in one), but without the interpreter's teardown
    of a heap that held a million-row table (0.4 s of a CLI release; issue 27)."""
    import atexit

    if _PrefectUse.used and "prefect" in sys.modules:
        # Waiting for them is the point here: Prefect's "Still processing items: n items
        # remaining..." (its workers' loggers, named after them) is noise under a refusal.
        for worker in ("EventsWorker", "APILogWorker"):
            logging.getLogger(worker).setLevel(logging.ERROR)
        with contextlib.suppress(Exception):
            from deployments.local_server import drain_prefect_workers

            drain_prefect_workers()
    atexit._run_exitfuncs()
    logging.shutdown()
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)
