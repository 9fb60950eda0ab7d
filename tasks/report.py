"""The run's artifacts for stewards: release summary, per-node IL, from the public manifest and
the steward record (Prefect's UI is a steward tool; the public report is ``report.md``)."""

from __future__ import annotations

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from medrelease.evidence.accuracy import STEWARD_BASIS
from medrelease.privacy.publication import render_public_report
from medrelease.storage.links import evidence_link, release_link
from tasks.artifacts import markdown_artifact, table_artifact
from tasks.budget import artifact_key


def steward_summary_markdown(manifest: dict, record: dict, candidates: pd.DataFrame,
                             evaluated: dict | None = None) -> str:
    """What only stewards see first — the accuracy verdict, what it is no basis for, and its
    warnings (values lost, shrunk or inflated; distributions collapsed, associations erased,
    impossible rows: what researchers need) — then the public report and the rest of the
    steward's facts (input, information loss, selection)."""
    title, _, public = render_public_report(manifest).partition("\n")
    lines = [title, ""]
    if evaluated and evaluated.get("verdict"):
        lines += ["## Accuracy (steward only: compares with the input)", "",
                  f"**{evaluated['verdict']}**", "",
                  f"_Not a basis for publishing: {evaluated.get('basis') or STEWARD_BASIS}._",
                  ""]
        lines += [f"- **{line}**" for line in evaluated.get("warnings", [])]
        lines += ["", "Evidence report (steward area of the release portal): "
                      f"[open it]({evidence_link(manifest['dataset'], manifest['release_id'])})",
                  ""]
    lines += [public.lstrip("\n"), "## For the steward (not published)", ""]
    il = record.get("information_loss") or {}
    lines.append(f"- input: `{record['input_file']}` (sha256 `{record['input_sha256'][:16]}…`), "
                 f"{record['input_rows']:,} rows")
    life = manifest.get("lifetime") or {}
    if "epsilon_cap" in life:
        lines.append(f"- {'room under the cap (lifetime guarantee VOID)' if life.get('void') else 'left'}"
                     f" after this release on source `{life['source']}`: epsilon "
                     f"{max(0.0, life['epsilon_cap'] - life['epsilon_spent']):g} of "
                     f"{life['epsilon_cap']:g}, delta "
                     f"{max(0.0, life['delta_cap'] - life['delta_spent']):g} of "
                     f"{life['delta_cap']:g} (artifact `{manifest['dataset']}-budget`)")
    if il:
        lines.append(f"- information loss: IL {il['il']:.3f} = NCP {il['ncp']:.3f} + EMD "
                     f"{il['emd']:.3f} + Rate {il['rate']:.3f}")
    for note in (record.get("lifetime_cap_note"), record.get("declared_rows_check")):
        if note:
            lines.append(f"- {note}")
    synthetic = bool((manifest.get("mechanism_details") or {}).get("synthetic"))
    lines += ["", _selection_text(record.get("selection") or {}, candidates, synthetic), ""]
    return "\n".join(lines)


def _selection_text(selection: dict, candidates: pd.DataFrame, synthetic: bool = False) -> str:
    if synthetic:
        return ("aim fitted a model to its noisy marginal measurements and sampled the rows "
                "from it: its rounds are in the 'aim-rounds' artifact, the accuracy above.")
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


def named_nodes(candidates: pd.DataFrame, chosen_index: int | None) -> pd.DataFrame:
    """Nodes named by their generalization levels ("age 2 · sex 0 · ..."), the chosen node
    marked and listed first."""
    levels = [c for c in candidates.columns if c.startswith("level_")]
    names = [" · ".join(f"{c.removeprefix('level_')} {int(v)}" for c, v in zip(levels, row,
                                                                           strict=True))
             for row in candidates[levels].itertuples(index=False, name=None)]
    chosen = candidates["index"].eq(chosen_index) if chosen_index is not None else \
        pd.Series(False, index=candidates.index)
    named = candidates.assign(node=names, chosen=chosen.map({True: "◀ chosen", False: ""}))
    return pd.concat([named[chosen], named[~chosen]])


@task(name="release-artifacts", cache_policy=NO_CACHE)
def publish_artifacts(manifest: dict, record: dict, candidates: pd.DataFrame) -> None:
    dataset = manifest["dataset"]
    if len(candidates):
        scored = "score" in candidates and candidates["score"].notna().any()
        named = named_nodes(candidates, (record.get("selection") or {}).get("chosen_index"))
        # the chosen node, then the likeliest: a large lattice's table is cut to what one
        # Prefect event holds (tasks/artifacts.py), and these are the rows worth keeping
        others = named[named["chosen"] == ""]
        named = pd.concat([named[named["chosen"] != ""], others.sort_values(
            "selection_probability", ascending=False, kind="stable")])
        # The columns a steward compares, narrow enough for a laptop screen; NCP, EMD, Rate,
        # classes and noise rows per node are in the steward record's candidates.csv.
        columns = ["chosen", "node", *(["score"] if scored else []), "il",
                   "selection_probability", "released_rows"]
        table_artifact(
            table=named[columns].round(4).rename(columns={
                "selection_probability": "P(chosen)", "released_rows": "rows"}).to_dict(
                    orient="records"),
            key=artifact_key(dataset, "node-information-loss"),
            description="Information loss (IL = NCP + EMD + Rate) and selection probability of "
                        "every scored lattice node (steward only: computed from the input; every "
                        "column in the steward record's candidates.csv)",
        )


@task(name="release-summary", cache_policy=NO_CACHE)
def publish_release_summary(manifest: dict, record: dict, candidates: pd.DataFrame,
                            evaluated: dict | None) -> None:
    """The release summary artifact, opening with the accuracy verdict when the release was
    evaluated (``evaluated``: what the evaluation returned)."""
    verdict = (evaluated or {}).get("verdict")
    markdown_artifact(
        markdown=steward_summary_markdown(manifest, record, candidates, evaluated),
        key=artifact_key(manifest["dataset"], "release-summary"),
        # the card in the UI shows the description's start: the warning, then the verdict
        description=(_warning_head((evaluated or {}).get("warnings") or [])
                     + (verdict or manifest["guarantee"]["statement"])
                     + f" (release {manifest['release_id']})")[:500],
    )


def _warning_head(warnings: list[str]) -> str:
    """The card's first words: how many accuracy warnings (lost, shrunk or inflated values,
    collapsed distributions, erased associations, impossible rows), or nothing."""
    if not warnings:
        return ""
    return f"WARNING: {len(warnings)} accuracy finding(s) (values lost, shrunk or inflated, " \
           "or what researchers need); "


@task(name="budget-and-catalogue", cache_policy=NO_CACHE)
def publish_budget_artifacts(dataset: str) -> None:
    """After every run, refused ones included: the dataset's source budget (spent / left, every
    spend with its release) and its release catalogue, as artifacts a steward finds in the UI.

    A run refused before its dataset could be read (unknown name, broken config) or whose
    ledger is missing or cannot be read shows nothing here: its refusal message says why.
    """
    from medrelease.data.config import find_config
    from medrelease.errors import MedreleaseError
    from medrelease.privacy.ledger_backends import ledger_exists, open_ledger
    from medrelease.settings import ledger_location

    if not ledger_exists(ledger_location()):  # opening it would create one: a lost one stays lost
        return
    try:
        config = find_config(dataset)
        book = open_ledger(ledger_location())
        state = book.state(config.source_id, config.privacy.lifetime_epsilon,
                           config.privacy.lifetime_delta)
        spends = book.spends(config.source_id)
    except MedreleaseError:
        return
    markdown_artifact(markdown=budget_markdown(state, spends),
                      key=artifact_key(config.name, "budget"),
                      description=f"Privacy budget of source {config.source_id}: "
                                  f"eps {state.epsilon_spent:g} spent, "
                                  + ("lifetime guarantee VOID" if state.void
                                     else f"{state.epsilon_left:g} left"))
    markdown_artifact(markdown=catalogue_markdown(config.name,
                                                  release_catalogue(config.name, spends)),
                      key=artifact_key(config.name, "releases"),
                      description=f"Releases of {config.name}: id, date, mechanism, "
                                  "guarantee and a link to its page in the release portal")


def budget_markdown(state, spends) -> str:
    """Spent / left for eps and delta, and every spend of the source with its release."""
    # with the lifetime guarantee void, nothing is "left" to protect: the cap only limits spending
    room = "room under the cap (guarantee VOID)" if state.void else "left"
    lines = [f"# Privacy budget of source `{state.source}`", "",
             f"| | spent | cap | {room} |", "|---|---|---|---|",
             f"| epsilon | {state.epsilon_spent:g} | {state.lifetime_epsilon:g} | "
             f"{state.epsilon_left:g} |",
             f"| delta | {state.delta_spent:g} | {state.lifetime_delta:g} | "
             f"{state.delta_left:g} |", "", state.statement(), "",
             "## Every spend on this source", ""]
    # a list, not a seven-column table: it wraps on a laptop screen (issue 27)
    for s in spends:
        lines.append(f"- **{s.created_at[:16].replace('T', ' ')}** · {s.dataset} · "
                     f"{s.mechanism} · epsilon {s.epsilon:g}, delta {s.delta:g} · "
                     f"{s.status_text} · release `{s.release_id or '-'}`")
    return "\n".join(lines)


def catalogue_markdown(dataset: str, rows: list[dict]) -> str:
    """The catalogue as a list that wraps on a laptop screen, each release as a link to its
    page in the release portal (a ``file://`` link opens nothing from a browser; issue 39)."""
    lines = [f"# Releases of {dataset}", ""] + ([] if rows else ["No release yet."])
    for row in rows:
        kind = "TEST release" if row["test"] else "release"
        lines.append(f"- **`{row['release']}`** ({row['date'][:10]}, {row['mechanism']}, "
                     f"{kind}) — {row['guarantee']} "
                     f"[Open in the portal]({release_link(dataset, row['release'])})")
    return "\n".join(lines)


def release_catalogue(dataset: str, spends) -> list[dict]:
    """One row per release of ``dataset`` on record: id, date, mechanism, guarantee, folder."""
    import json

    from medrelease.settings import store_root, test_store_root
    from medrelease.storage.store import ReleaseStore

    folders = {p.name: p for test, root in ((False, store_root()), (True, test_store_root()))
               for p in ReleaseStore(root, test=test).releases(dataset)}
    rows = []
    for s in spends:
        folder = folders.get(s.release_id or "")
        if s.dataset != dataset or folder is None:
            continue
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        rows.append({"release": s.release_id, "date": s.created_at[:19],
                     "mechanism": s.mechanism,
                     "guarantee": manifest["guarantee"]["statement"],
                     "test": bool(s.test), "folder": str(folder)})
    return rows
