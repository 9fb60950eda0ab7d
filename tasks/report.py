"""Release summary text and the run's artifacts (budget steps, per-node IL, summary)."""

from __future__ import annotations

import pandas as pd
from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from tasks.budget import artifact_key


def release_summary_markdown(manifest: dict, candidates: pd.DataFrame) -> str:
    """A plain-language summary a privacy officer can read without the code."""
    guarantee = manifest["guarantee"]
    lines = [f"# Release {manifest['release_id']} of `{manifest['dataset']}`", ""]
    if not guarantee["proven"]:
        lines += [f"> **{guarantee['label'].upper()}.** {guarantee['notes']}", ""]
    if not manifest["for_publication"]:
        lines += ["> **NOT FOR PUBLICATION**: made with a fixed seed (test only); anyone who "
                  "knows the seed can remove the noise.", ""]
    node = ", ".join(f"{k} level {v}" for k, v in manifest["chosen_node"].items()) or "none"
    il = manifest["information_loss"] or {"il": float("nan"), "ncp": float("nan"),
                                          "emd": float("nan"), "rate": float("nan")}
    lines += [
        "## Guarantee",
        guarantee["statement"],
        "",
        "## What was released",
        f"- mechanism: `{manifest['mechanism']}`; chosen lattice node: {node} "
        f"(height {manifest['chosen_node_height']})",
        f"- rows: {manifest['input_rows']:,} in, {manifest['released_rows']:,} out",
        f"- information loss of the release: IL {il['il']:.3f} = NCP {il['ncp']:.3f} + "
        f"EMD {il['emd']:.3f} + Rate {il['rate']:.3f}",
        f"- input: `{manifest['input_file']}` (sha256 `{manifest['input_sha256'][:16]}…`)",
        f"- seed policy: {manifest['seed_policy']}",
        "",
        "## Re-identification risk (released dimensions)",
        f"- classes: {manifest['risk']['classes']:,}; smallest class (k achieved): "
        f"{manifest['risk']['smallest_class']}; rows unique on the dimensions: "
        f"{manifest['risk']['unique_row_share']:.1%}",
        f"- prosecutor risk: max {manifest['risk']['prosecutor_risk_max']:.3f}, mean "
        f"{manifest['risk']['prosecutor_risk_mean']:.3f} (for DP mechanisms the guarantee, not "
        "these numbers, bounds what can be learned)",
        "",
        "## Budget",
        "| step | epsilon | delta | mechanism |",
        "|---|---|---|---|",
    ]
    for step in manifest["budget_steps"]:
        lines.append(f"| {step['step']} | {step['epsilon']:g} | {step['delta']:g} | "
                     f"{step['mechanism']} |")
    lines += [
        f"| **total** | **{manifest['epsilon_spent']:g}** | **{manifest['delta_spent']:g}** | |",
        "",
        "## Node selection",
    ]
    probs = candidates["selection_probability"] if len(candidates) else None
    if probs is None:
        lines.append("No lattice search: this mechanism releases from the rows directly.")
    elif probs.max() >= 1.0:
        lines.append(f"{len(candidates)} lattice node(s) evaluated; the node was chosen "
                     "deterministically (fixed node, or least loss among feasible nodes).")
    else:
        lines.append(
            f"{len(candidates)} lattice nodes were scored. Selection probabilities range from "
            f"{probs.min():.4f} to {probs.max():.4f} (uniform would be "
            f"{1 / len(candidates):.4f}); lowest-IL node: IL {candidates['il'].min():.3f}, "
            f"highest: {candidates['il'].max():.3f}. With sensitivity 3 the exponential "
            "mechanism can barely prefer low-loss nodes unless the selection budget is large.")
    lines.append("")
    return "\n".join(lines)


@task(name="release-artifacts", cache_policy=NO_CACHE)
def publish_artifacts(manifest: dict, candidates: pd.DataFrame) -> None:
    dataset = manifest["dataset"]
    if len(candidates):
        columns = ["index", "height", "ncp", "emd", "rate", "il", "selection_probability",
                   "classes", "suppressed_rows", "noise_rows", "released_rows",
                   *[c for c in candidates.columns if c.startswith("level_")]]
        create_table_artifact(
            table=candidates[columns].round(6).to_dict(orient="records"),
            key=artifact_key(dataset, "node-information-loss"),
            description="Information loss (NCP, EMD, Rate) of every scored lattice node",
        )
    create_markdown_artifact(
        markdown=release_summary_markdown(manifest, candidates),
        key=artifact_key(dataset, "release-summary"),
        description=f"Release {manifest['release_id']}: {manifest['guarantee']['statement']}",
    )
