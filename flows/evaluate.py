"""The evaluate flow: utility and risk evidence for one published release (also run by every
release at its end). The result compares with raw data, so it goes into the release's steward
record folder, never into a release store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.utilities.annotations import quote

from medrelease.data.aggregate import CountTable
from tasks.evaluate import (
    evaluate,
    evaluate_relational_release,
    load_release_and_input,
    write_evaluation_report,
)


@flow(name="medrelease-evaluate", description="Utility, risk and plots for one release",
      validate_parameters=True)
def evaluate_flow(release_path: str, input_path: str | None = None) -> dict[str, Any]:
    """Evaluate the release in ``release_path`` against its input (default: the one its
    steward record names); the report goes beside the steward record, never published."""
    return evaluate_steps(release_path, input_path)


def evaluate_steps(release_path: str, input_path: str | None = None,
                   counts: CountTable | None = None) -> dict[str, Any]:
    """The evaluation's tasks, in whichever flow calls them: the release flow runs them as its
    last tasks rather than as a subflow, whose start and end (Prefect joins its heartbeat
    thread, which sleeps in whole seconds) cost up to 1.2 s of every release (issue 27), and
    hands over its count table (``counts``) instead of reading the file again. A relational
    release has its own evaluation (cross-table accuracy)."""
    if _relational(release_path):
        return evaluate_relational_release(release_path)
    loaded = load_release_and_input(release_path, input_path, quote(counts))
    evaluation = evaluate(release_path, quote(loaded))  # quote: see flows/release.py
    folder = write_evaluation_report(quote(evaluation), str(loaded.steward_folder / "evaluation"))
    return {"report": str(Path(folder) / "report.html"), "folder": folder,
            "verdict": evaluation.verdict, "warnings": evaluation.warnings,
            "log_verdict": evaluation.accuracy.get("log_verdict"),
            "log_warnings": evaluation.accuracy.get("log_warnings", []),
            "query_summary": evaluation.query_summary,
            "classification": evaluation.classification}


def _relational(release_path: str) -> bool:
    """Whether a release folder holds a relational release (its manifest lists its tables)."""
    try:
        manifest = json.loads((Path(release_path) / "manifest.json").read_text("utf-8"))
    except (OSError, ValueError):
        return False
    return bool((manifest.get("mechanism_details") or {}).get("tables"))
