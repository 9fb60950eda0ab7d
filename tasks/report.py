"""The run's artifacts for stewards: release summary, per-node IL, from the public manifest and
the steward record (Prefect's UI is a steward tool; the public report is ``report.md``)."""

from __future__ import annotations

import pandas as pd
from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from medrelease.publication import render_public_report
from tasks.budget import artifact_key


def steward_summary_markdown(manifest: dict, record: dict, candidates: pd.DataFrame) -> str:
    """The public report plus what only stewards see (input, information loss, selection)."""
    lines = [render_public_report(manifest), "## For the steward (not published)", ""]
    il = record.get("information_loss") or {}
    lines.append(f"- input: `{record['input_file']}` (sha256 `{record['input_sha256'][:16]}…`), "
                 f"{record['input_rows']:,} rows")
    if il:
        lines.append(f"- information loss: IL {il['il']:.3f} = NCP {il['ncp']:.3f} + EMD "
                     f"{il['emd']:.3f} + Rate {il['rate']:.3f}")
    for note in (record.get("lifetime_cap_note"), record.get("declared_rows_check")):
        if note:
            lines.append(f"- {note}")
    lines += ["", _selection_text(record.get("selection") or {}, candidates), ""]
    return "\n".join(lines)


def _selection_text(selection: dict, candidates: pd.DataFrame) -> str:
    if not selection.get("candidates"):
        return "No lattice search: this mechanism releases from the rows directly."
    if selection.get("chosen_probability", 0) >= 1.0:
        return (f"{selection['candidates']} lattice node(s) evaluated; the node was chosen "
                "deterministically (fixed node, or least loss among feasible nodes).")
    top = ""
    if "top_score_probability" in selection:
        chosen = selection["top_score_node_index"] == selection["chosen_index"]
        top = (f" The top-scored node (node {selection['top_score_node_index']}) had "
               f"probability {selection['top_score_probability']:.4f} of being chosen"
               f"{' and was chosen' if chosen else ''}.")
    return (f"{selection['candidates']} lattice nodes were scored.{top} The chosen node had "
            f"probability {selection['chosen_probability']:.4f}; the lowest-IL node "
            f"(IL {selection['il_min']:.3f}) had {selection['best_il_node_probability']:.4f} "
            f"(uniform: {selection['uniform_probability']:.4f}; highest IL "
            f"{selection['il_max']:.3f}).")


@task(name="release-artifacts", cache_policy=NO_CACHE)
def publish_artifacts(manifest: dict, record: dict, candidates: pd.DataFrame) -> None:
    dataset = manifest["dataset"]
    if len(candidates):
        scored = "score" in candidates and candidates["score"].notna().any()
        columns = ["index", "height", *(["score"] if scored else []), "ncp", "emd", "rate", "il",
                   "selection_probability", "classes", "suppressed_rows", "noise_rows",
                   "released_rows", *[c for c in candidates.columns if c.startswith("level_")]]
        create_table_artifact(
            table=candidates[columns].round(6).to_dict(orient="records"),
            key=artifact_key(dataset, "node-information-loss"),
            description="Information loss (NCP, EMD, Rate) of every scored lattice node "
                        "(steward only: computed from the input)",
        )
    create_markdown_artifact(
        markdown=steward_summary_markdown(manifest, record, candidates),
        key=artifact_key(dataset, "release-summary"),
        description=f"Release {manifest['release_id']}: {manifest['guarantee']['statement']}",
    )
