"""Tasks of the evaluate flow: load a release with its input, evaluate, write the report."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from medrelease.data.aggregate import CountTable, prepare_table
from medrelease.data.config import DatasetConfig
from medrelease.errors import InputValidationError
from medrelease.evidence.accuracy import accuracy_markdown
from medrelease.evidence.evaluation import Evaluation, InputRows, evaluate_release
from medrelease.evidence.report_html import INTERNAL, write_report
from medrelease.settings import steward_root
from medrelease.storage.io import file_sha256, read_validated_input
from medrelease.storage.links import evidence_link
from medrelease.storage.store import StewardRecords
from tasks.artifacts import markdown_artifact, table_artifact
from tasks.budget import artifact_key

# Marks the run log's accuracy lines: a caller that shows the run's summary itself (the CLI's
# panel) leaves them out of its console, where they would be said twice.
SUMMARY_RECORD = "medrelease_summary"


@dataclass(frozen=True)
class ReleaseUnderEvaluation:
    """A published (or test) release with its steward record, per-node summaries and input."""

    manifest: dict
    record: dict
    config: DatasetConfig
    input_rows: InputRows
    candidates: pd.DataFrame
    steward_folder: Path


@task(name="load-release-and-input", cache_policy=NO_CACHE)
def load_release_and_input(release_path: str, input_path: str | None,
                           counts: CountTable | None = None) -> ReleaseUnderEvaluation:
    """The manifest, its steward record, the config it was made with, and the input: from
    ``counts`` when the release's own run hands over its count table (of the bytes it hashed)
    and that table describes the input's rows, else read from the file (checked against the
    hash the steward record keeps)."""
    folder = Path(release_path)
    manifest_file = folder / "manifest.json"
    if not manifest_file.is_file():
        raise InputValidationError(f"{folder} is not a release folder (no manifest.json)")
    manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
    records = StewardRecords(steward_root())
    record = records.for_release(folder)
    steward_folder = records.folder(manifest["dataset"], manifest["release_id"])
    config = DatasetConfig(**record["dataset_config"])
    candidates_file = steward_folder / "candidates.csv"
    candidates = (pd.read_csv(candidates_file) if candidates_file.is_file()
                  and candidates_file.stat().st_size > 1 else pd.DataFrame())
    given = InputRows.from_counts(counts, config) if counts is not None else None
    if given is not None:
        return ReleaseUnderEvaluation(manifest, record, config, given, candidates, steward_folder)
    source = Path(input_path or record["input_file"])
    if not source.is_file():
        raise InputValidationError(f"the release's input {source} is gone; pass --input")
    if file_sha256(source) != record["input_sha256"]:
        raise InputValidationError(
            f"{source} is not the file this release was made from (sha256 differs from the "
            "steward record): evaluating against it would be misleading")
    # Same bytes as the release's input, which passed validation then: read, not re-validated;
    # its missing-value policy applied as the release applied it, so every section of the
    # evaluation compares with the rows the release was made from (one input size).
    frame = prepare_table(read_validated_input(config, source), config,
                          include_class=True).reset_index(drop=True)
    return ReleaseUnderEvaluation(manifest, record, config, InputRows(frame), candidates,
                                  steward_folder)


@task(name="evaluate-release", cache_policy=NO_CACHE)
def evaluate(release_path: str, loaded: ReleaseUnderEvaluation) -> Evaluation:
    """The evaluation, and its verdict and warnings in the run's log (the first thing the run
    page shows): a value dropped or shrunk by more than 10 % is a WARNING line, never silent.
    The log names values only from a declared public domain; values taken from the data are
    raw values and are named in the steward's report and artifacts only."""
    evaluation = evaluate_release(release_path, loaded.input_rows, loaded.config,
                                  record=loaded.record, candidates=loaded.candidates)
    logger = get_run_logger()
    accuracy = evaluation.accuracy
    logger.info("evaluated release %s (%s): %s", evaluation.release_id, evaluation.mechanism,
                accuracy.get("log_verdict", ""))
    for line in accuracy.get("log_warnings", []):  # the record's level says WARNING already
        logger.warning("%s", line.removeprefix("WARNING: "), extra={SUMMARY_RECORD: True})
    return evaluation


@task(name="write-evaluation-report", cache_policy=NO_CACHE)
def write_evaluation_report(evaluation: Evaluation, target: str) -> str:
    """report.html + plots + evaluation.json, and the same numbers as Prefect artifacts."""
    folder = write_report(evaluation, target)
    if evaluation.accuracy:
        markdown_artifact(accuracy_markdown(evaluation.accuracy, evaluation.release_id),
                          key=artifact_key(evaluation.dataset, "accuracy"),
                          description=(("WARNING (steward's raw-data evaluation): "
                                        if evaluation.warnings else "")
                                       + evaluation.verdict)[:500])
    lines = [f"# Evaluation of {evaluation.release_id}", "", f"_{INTERNAL}_", "",
             f"- **accuracy: {evaluation.verdict}**",
             *[f"- **{line}**" for line in evaluation.warnings],
             f"- mechanism: **{evaluation.mechanism}** — {evaluation.guarantee}",
             f"- rows: {evaluation.input_note}; {evaluation.released_rows:,} released",
             f"- report: [open it in the release portal's steward area]"
             f"({evidence_link(evaluation.dataset, evaluation.release_id)})"]
    if evaluation.query_summary:
        s = evaluation.query_summary
        lines.append(f"- queries (diagnosis {s['diagnosis']}): stays mean abs error "
                     f"{s['stays_mean_abs_error']:.2f}, mean rel error "
                     f"{s['stays_mean_rel_error']:.3f}; avg LOS mean abs error "
                     f"{s['avg_los_mean_abs_error']:.2f} days")
    for name, scores in evaluation.classification.items():
        lines.append(f"- {name}: " + ", ".join(f"{k} {v:.3f}" for k, v in scores.items()))
    if evaluation.frequency_attack:
        lines.append(f"- frequency-matching attack re-identifies "
                     f"{evaluation.frequency_attack['records_reidentified_share']:.1%} of records")
    markdown_artifact("\n".join(lines),
                      key=artifact_key(evaluation.dataset, "evaluation"),
                      description="Utility and risk of the release (internal)")
    if evaluation.queries is not None:
        # short headers: the eight columns fit a 1440-px screen (the full names are in the
        # evidence report's evaluation.json)
        table_artifact(json.loads(evaluation.queries.rename(columns=QUERY_HEADERS).round(2)
                                  .to_json(orient="records")),
                       key=artifact_key(evaluation.dataset, "evaluation-queries"),
                       description="IPA paper queries, input vs release: stays and average "
                                   "length of stay (LOS) per age group and sex, and their errors")
    if evaluation.risk_synthetic:
        table_artifact([{"measure": k, "value": _shown(v)}
                        for k, v in evaluation.risk_synthetic.items()],
                       key=artifact_key(evaluation.dataset, "evaluation-risk"),
                       description="Synthetic rows matching a unique input record, "
                                   "against rows drawn from the 1-way marginals")
    else:
        risk = [{"measure": k, "release": _shown(evaluation.risk_release.get(k)),
                 "input": _shown(evaluation.risk_input.get(k))} for k in evaluation.risk_release]
        table_artifact(risk, key=artifact_key(evaluation.dataset, "evaluation-risk"),
                       description="Re-identification risk, release vs input")
    return str(folder)


QUERY_HEADERS = {"age_group": "age", "original_stays": "stays in", "released_stays": "stays out",
                 "original_avg_los": "LOS in", "released_avg_los": "LOS out",
                 "stays_abs_error": "stays err", "avg_los_abs_error": "LOS err"}


def _shown(value: Any) -> Any:
    """A figure as a table shows it: floats to 4 significant digits (not 0.9446122860020141)."""
    return float(f"{value:.4g}") if isinstance(value, float) else value


@task(name="evaluate-relational-release", cache_policy=NO_CACHE)
def evaluate_relational_release(release_path: str) -> dict[str, Any]:
    """A relational release against its input tables (steward only): referential integrity,
    children per parent, parent x child attributes on the join, the declared analyses. The
    input's files are checked against the digest the steward record keeps; the evidence goes
    to ``<steward record>/evaluation/`` (``evaluation.json`` and ``report.html``)."""
    import html

    from medrelease.data.extract import extract_digest
    from medrelease.relational.evaluate import evaluate_relational
    from medrelease.relational.reading import read_table_files

    folder = Path(release_path)
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    records = StewardRecords(steward_root())
    record = records.for_release(folder)
    steward_folder = records.folder(manifest["dataset"], manifest["release_id"])
    config = DatasetConfig(**record["dataset_config"])
    schema = config.relational_schema
    files = config.table_files()  # the record's config: its own files
    if extract_digest([(str(p), file_sha256(p)) for p in files.values()]) \
            != record["input_sha256"]:
        raise InputValidationError("the input tables are not the files this release was made "
                                   "from (their digest differs from the steward record)")
    truth = read_table_files(config, files)
    prefix = "TEST-" if manifest.get("test_release") else ""
    released = {t.name: pd.read_parquet(folder / f"{prefix}{t.name}.parquet").astype(str)
                for t in schema.tables}
    result = evaluate_relational(schema, truth, released)
    out = steward_folder / "evaluation"
    out.mkdir(parents=True, exist_ok=True)
    (out / "evaluation.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    rows = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{entry['tvd']:.3f}</td>"
        f"<td>{result['cross_table'][name]['mean_tvd']:.3f}</td>"
        f"<td>{result['cross_table'][name]['pairs']}</td></tr>"
        for name, entry in result["children_per_parent"].items())
    analyses = "".join(f"<li>{html.escape(' × '.join(a['columns']))}: TVD {a['tvd']:.3f}</li>"
                       for a in result["analyses"])
    broken = sum(result["integrity"].values())
    (out / "report.html").write_text(
        "<!doctype html><meta charset='utf-8'><title>Relational release evidence</title>"
        f"<h1>{html.escape(manifest['release_id'])}: cross-table accuracy (steward only)</h1>"
        f"<p>{INTERNAL}</p><p>Referential integrity of the released tables: "
        f"{'kept' if not broken else f'{broken} broken'} (duplicate keys, orphans, parents "
        "over max_children).</p><table border=1><tr><th>child table</th><th>TVD of children "
        "per parent</th><th>mean TVD, parent × child attributes on the join</th>"
        f"<th>pairs</th></tr>{rows}</table>"
        + (f"<h2>Declared analyses</h2><ul>{analyses}</ul>" if analyses else "")
        + "<p>TVD: total variation distance between the input's and the release's "
          "distribution (0 same, 1 disjoint); the input counted every row, before the "
          "bound.</p>", encoding="utf-8")
    worst = max((v["mean_tvd"] for v in result["cross_table"].values()), default=0.0)
    verdict = (f"cross-table pairs: mean TVD up to {worst:.3f}; integrity "
               f"{'kept' if not broken else 'BROKEN'}")
    get_run_logger().info("relational evaluation: %s (steward record: %s)", verdict, out)
    return {"report": str(out / "report.html"), "folder": str(out), "verdict": verdict,
            "warnings": [] if not broken else ["the released tables' references are broken"],
            "log_verdict": verdict, "log_warnings": [], "query_summary": {},
            "classification": {}, "relational": result}
