"""The publication boundary: what a release folder may carry, field by field (an allow-list).

A DP release is only as private as the least private byte that ships with it. Everything a
release run knows is gathered as *facts* (``public_facts`` and ``steward_facts`` in
tasks/publish.py); ``split_facts`` is the gate that sends each fact to exactly one side:

* ``PUBLISHED`` — the public ``manifest.json`` (and ``report.md``, rendered from it alone). Each
  field states its *basis*, which is also what the publication audit checks:
  - ``public``: fixed before the data were read (request, config, code) — byte-identical for
    neighbouring inputs;
  - ``identity``: the run's own id and clock — independent of the data, format-checked;
  - ``output``: an output of the mechanism, covered by its guarantee;
  - ``released``: computed from the released rows alone — the audit recomputes it from the
    published data file.
* ``STEWARD_ONLY`` — the steward record (``var/steward/...``), never published, each with the
  reason it must stay internal.

A fact on neither list is an error: a new field must be placed on one side deliberately.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pandas as pd

from medrelease.data.config import DatasetConfig
from medrelease.data.extract import InputInfo
from medrelease.errors import MedreleaseError
from medrelease.evidence.risk import risk_of_cells
from medrelease.evidence.verdict import analysis_entry, publication_verdict
from medrelease.mechanisms import capabilities
from medrelease.mechanisms.base import ReleaseContext
from medrelease.plan import CheckReport, MaterializedRelease, ReleasePlan
from medrelease.privacy.ledger import Charge
from medrelease.storage.released_rows import ROWS, ReleasedRows
from medrelease.storage.store import CSV_TEXT_SAFETY


class Basis(StrEnum):
    PUBLIC = "public"
    IDENTITY = "identity"
    OUTPUT = "output"
    RELEASED = "released"


@dataclass(frozen=True)
class PublishedField:
    basis: Basis
    why: str


PUBLISHED: dict[str, PublishedField] = {
    "release_id": PublishedField(Basis.IDENTITY, "clock + random id; says nothing about the data"),
    "created_at": PublishedField(Basis.IDENTITY, "the day the request was made (no time of "
                                                 "day: it would tell how long the run took)"),
    "test_release": PublishedField(Basis.PUBLIC, "whether the request fixed a seed"),
    "dataset": PublishedField(Basis.PUBLIC, "the dataset config's name"),
    "source": PublishedField(Basis.PUBLIC, "the declared ledger source id"),
    "package_version": PublishedField(Basis.PUBLIC, "the code that made the release"),
    "mechanism": PublishedField(Basis.PUBLIC, "requested"),
    "parameters": PublishedField(Basis.PUBLIC, "requested, or fixed by the config (never by "
                                               "the data: the default delta is a constant)"),
    "guarantee": PublishedField(Basis.PUBLIC, "a function of the parameters"),
    "budget_steps": PublishedField(Basis.PUBLIC, "a function of the parameters"),
    "epsilon_spent": PublishedField(Basis.PUBLIC, "sum of the budget steps"),
    "delta_spent": PublishedField(Basis.PUBLIC, "sum of the budget steps"),
    "lifetime": PublishedField(Basis.PUBLIC, "the ledger: sums of earlier releases' public "
                                             "parameters, the cap and its changes (day, old, "
                                             "new, the steward's reason), whether a published "
                                             "non-DP release voided the lifetime guarantee"),
    "seed_policy": PublishedField(Basis.PUBLIC, "whether the request fixed a seed"),
    "randomness": PublishedField(Basis.PUBLIC, "the random source in words (fixed by the seed "
                                               "policy and whether the mechanism draws noise)"),
    "columns": PublishedField(Basis.PUBLIC, "the released columns' roles, types, taxonomy and "
                                            "domain file names, declared class values"),
    "checks": PublishedField(Basis.PUBLIC, "the output checks, phrased over public values; "
                                           "a release that fails them is never published"),
    "files": PublishedField(Basis.PUBLIC, "the folder's file names"),
    "text_safety": PublishedField(Basis.PUBLIC, "how spreadsheet formulas in text cells are "
                                                "neutralised in the CSV"),
    "chosen_node": PublishedField(Basis.OUTPUT, "the exponential mechanism's choice (or the "
                                                "fixed node)"),
    "chosen_node_height": PublishedField(Basis.OUTPUT, "sum of the chosen node's levels"),
    "mechanism_details": PublishedField(Basis.OUTPUT, "the mechanism's own released summary "
                                                      "(DiffGen's cut and set-valued splits; ipa's ladder "
                                                      "nodes; a degenerate-release warning)"),
    "error_bars": PublishedField(Basis.OUTPUT, "95 % intervals and bounds for the researcher, "
                                               "computed from the mechanism's outputs and public "
                                               "parameters only (post-processing): the declared "
                                               "steps' noise laws and thresholds; aim's noisy "
                                               "measurements, model and sampled rows"),
    "released_rows": PublishedField(Basis.RELEASED, "rows of the data file"),
    "risk": PublishedField(Basis.RELEASED, "re-identification figures of the released rows"),
    "verdict": PublishedField(Basis.RELEASED, "the publication verdict (fit / use with care / "
                                              "not fit for the declared analyses), computed "
                                              "from the released rows, the mechanism's "
                                              "published outputs and public parameters and "
                                              "config facts, never the input, so acting on it "
                                              "(publishing, rejecting, rerunning) is "
                                              "post-processing; the audit recomputes it"),
}

# The entries of ``mechanism_details`` that may be published, each with its basis: outputs of
# the mechanism's private steps (no raw value, no un-noised count), or public notices.
DETAILS: dict[str, Basis] = {
    "leaf_partitions": Basis.OUTPUT,       # DiffGen: noisy leaf partitions
    "cut": Basis.OUTPUT,                   # DiffGen: the cut its private choices reached
    "set_specializations": Basis.OUTPUT,   # DiffGen: item-set splits (noisy tests)
    "ladder": Basis.OUTPUT,                # ipa: the rungs' chosen nodes
    "degenerate": Basis.OUTPUT,            # a warning computed from the released cells
    "budget_steps_drawn": Basis.OUTPUT,    # which declared steps were drawn / passed over
    "synthetic": Basis.PUBLIC,             # aim: the notice (a constant)
    "rho": Basis.PUBLIC,                   # aim: the guarantee's rho, for one privacy unit
    "rounds_rho": Basis.PUBLIC,            # aim: rho / m^2, what the rounds calibrate at
    "rho_used": Basis.OUTPUT,              # aim: the rounds' spend (their private choices)
    "measurements": Basis.OUTPUT,          # aim: columns, levels, sigma, selection eps
    "one_way_sigma": Basis.PUBLIC,         # aim: a function of the parameters
    "merged_rare_values": Basis.OUTPUT,    # aim: from the noisy 1-way marginals
    "synthetic_rows_ceiling": Basis.PUBLIC,  # aim: the parameter max_synthetic_rows
    "noisy_total_clipped": Basis.OUTPUT,   # aim: whether the noisy total reached the ceiling
    "merged_value_expansion": Basis.PUBLIC,  # aim: how merged values become leaves (a constant)
    "impossible_rows_redrawn": Basis.OUTPUT,  # aim: rows drawn again (model + sampler draws)
    "unit_cut": Basis.OUTPUT,              # the unit bound's rows removed: its own DP step
    "tables": Basis.OUTPUT,                # relational: each released table, its key, what it
                                           # references, its bound, its released rows
}

# Tables a mechanism publishes beside its data (``Capabilities.published_tables``), column by
# column with each column's basis. A column named after a released column holds the public
# labels of its cells (taxonomy levels, the declared domain, "<parent> (rare)" groups chosen
# from round 0's noisy counts); it is checked against ``PUBLISHED_TABLE_LABELS``.
PUBLISHED_TABLES: dict[str, dict[str, Basis]] = {
    # every estimate a researcher reads with its 95 % interval (privacy/interval_table.py):
    # post-processing of the released counts, the steps' public noise laws and thresholds, and
    # aim's noisy measurements; ``released`` the audit re-derives from the data file
    "intervals.csv": {
        "what": Basis.PUBLIC,       # count / total / marginal: the kinds of estimate
        "columns": Basis.PUBLIC,    # the released columns it is about (config names)
        "cell": Basis.OUTPUT,       # released labels (data.csv's) or declared public values
        "released": Basis.RELEASED,  # from the released rows (aim: the synthetic rows)
        "lower": Basis.OUTPUT,      # interval: released counts / measurements + public laws
        "upper": Basis.OUTPUT,
        "level": Basis.PUBLIC,      # 0.95
        "holds": Basis.PUBLIC,      # per estimate / simultaneous
    },
    "measurements.parquet": {
        "round": Basis.OUTPUT,        # aim: which round measured it (0: the 1-way marginals)
        "marginal": Basis.OUTPUT,     # the columns measured (the round's private choice)
        "levels": Basis.OUTPUT,       # their taxonomy levels (the same choice)
        "sigma": Basis.OUTPUT,        # the round's noise scale (annealing follows the data)
        "noisy_count": Basis.OUTPUT,  # the discrete-Gaussian measurement itself
    },
}
PUBLISHED_TABLE_LABELS = Basis.PUBLIC

STEWARD_ONLY: dict[str, str] = {
    "flow_run_id": "links the release to Prefect's logs and parameters, which are for stewards",
    "ledger_spend_id": "internal bookkeeping id",
    "requested_at": "the request's time of day (with the publish time, the run's duration)",
    "published_at": "the publish time: how long the run took grows with the input's rows",
    "ledger_charge": "what the release charged to its source (to rebuild a lost ledger)",
    "input_file": "the extract's absolute path on the hospital's machine",
    "input_sha256": "a deterministic function of the raw data: tells any two neighbouring "
                    "tables apart with certainty",
    "input_rows_sha256": "the digest of the input's parsed rows (the ledger's content claim): "
                         "as deterministic a function of the raw data as input_sha256",
    "input_rows": "the exact number of input rows",
    "dropped_rows": "rows missing: drop_rows removed (a count from the input)",
    "unit_bound": "units, rows before and after the privacy unit's bound (counts of the input)",
    "dataset_config": "the full config, with the machine's paths",
    "information_loss": "compares the released counts with the true ones (Rate x rows is the "
                        "noise itself)",
    "selection": "candidate scores and selection probabilities are computed from the input",
    "output_checks": "expectations built from true counts and input values (row bound, the "
                     "input's informative values)",
    "lifetime_cap_note": "a difference between the config and the ledger's cap",
    "declared_rows_check": "whether the input exceeded the declared row bound: a function of n",
}


class BoundaryError(MedreleaseError):
    """A fact is on neither side of the publication boundary, or a published one is missing."""


def split_facts(facts: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(public manifest, steward facts): every fact on exactly one side, by the allow-list."""
    unplaced = sorted(set(facts) - set(PUBLISHED) - set(STEWARD_ONLY))
    if unplaced:
        raise BoundaryError(
            f"release fact(s) {', '.join(unplaced)} are on neither side of the publication "
            "boundary: add each to PUBLISHED (with its basis) or STEWARD_ONLY in "
            "medrelease/privacy/publication.py")
    missing = sorted(set(PUBLISHED) - set(facts))
    if missing:
        raise BoundaryError(f"published field(s) {', '.join(missing)} were not computed")
    public = {name: facts[name] for name in PUBLISHED}
    steward = {name: facts[name] for name in STEWARD_ONLY if name in facts}
    return public, steward


def published_file_names(test: bool, tables: tuple[str, ...] = (),
                         data_tables: tuple[str, ...] = ()) -> list[str]:
    """The only files a release folder holds: data, manifest, report, and the tables its
    mechanism declares (``Capabilities.published_tables``, each on ``PUBLISHED_TABLES``).
    A relational release (``data_tables``: its table names) holds one pair of data files per
    table, named after it, instead of ``data.*``."""
    unknown = sorted(set(tables) - set(PUBLISHED_TABLES))
    if unknown:
        raise BoundaryError(f"published table(s) {', '.join(unknown)} are not on the allow-list "
                            "PUBLISHED_TABLES in medrelease/privacy/publication.py")
    prefix = "TEST-" if test else ""
    data = [f"{prefix}{name}.{suffix}" for name in (data_tables or ("data",))
            for suffix in ("parquet", "csv")]
    return [*data, "manifest.json", "report.md", *sorted(tables)]


def table_columns_allowed(name: str, columns: list[str], released: list[str]) -> list[str]:
    """Columns of a published table that are on neither its allow-list nor a released
    column's label column (those are what the boundary check reports)."""
    allowed = set(PUBLISHED_TABLES.get(name, {})) | set(released)
    return [c for c in columns if c not in allowed]


def released_figures(released: ReleasedRows | pd.DataFrame, dimensions: list[str]
                     ) -> dict[str, Any]:
    """The ``released``-basis fields, from the released rows alone (the audit recomputes them
    from the published file); counted on distinct rows, never on expanded ones."""
    if isinstance(released, pd.DataFrame):
        released = ReleasedRows.from_frame(released)
    return {"released_rows": len(released),
            "risk": risk_of_cells(released.cell_table(), dimensions, ROWS)}


def public_columns(config, columns: list[str]) -> dict[str, dict[str, Any]]:
    """Public description of the released columns: from the config, never from the data."""
    out: dict[str, dict[str, Any]] = {}
    for name in columns:
        spec = config.columns[name]
        entry: dict[str, Any] = {"role": spec.role, "type": spec.type}
        if spec.taxonomy:
            entry["taxonomy"] = Path(spec.taxonomy).name
            taxonomy = (config.informative_taxonomy if spec.role == "informative"
                        else config.taxonomies[name])
            entry["taxonomy_levels"] = taxonomy.height + 1
        if spec.domain:
            entry["domain"] = Path(spec.domain).name
        if spec.values:
            entry["values"] = list(spec.values)
        if spec.description:
            entry["description"] = spec.description
        out[name] = entry
    return out


def relational_columns(config) -> dict[str, dict[str, Any]]:
    """A relational release's released columns, ``<table>.<column>``: from the config."""
    schema = config.relational_schema
    out = {}
    for table in schema.tables:
        for column in table.columns:
            spec = (config.columns.get(column.name) if table is schema.root else
                    next(t for t in config.relational.tables
                         if t.table == table.name).columns[column.name])
            entry: dict[str, Any] = {"table": table.name,
                                     "role": getattr(spec, "role", "dimension"),
                                     "values": len(column.taxonomy.level_labels[0])}
            if getattr(spec, "taxonomy", None):
                entry["taxonomy"] = Path(spec.taxonomy).name
            if getattr(spec, "description", ""):
                entry["description"] = spec.description
            out[f"{table.name}.{column.name}"] = entry
    return out


def render_public_report(manifest: dict[str, Any]) -> str:
    """report.md: the public manifest in plain words (a function of the manifest alone)."""
    guarantee = manifest["guarantee"]
    lines = [f"# Release {manifest['release_id']} of `{manifest['dataset']}`", "",
             *_verdict_line(manifest), *how_to_use(manifest)]
    if manifest["test_release"]:
        lines += ["> **TEST RELEASE — NOT FOR PUBLICATION**: made with a fixed seed; anyone "
                  "who knows the seed can remove the noise. It lives in the test store only.",
                  ""]
    if not guarantee["proven"]:
        lines += [f"> **{guarantee['label'].upper()}.** {guarantee['notes']}", ""]
    if manifest["lifetime"].get("voided_by_this_release"):
        lines += [f"> **THIS RELEASE VOIDED THE LIFETIME GUARANTEE of source "
                  f"`{manifest['lifetime']['source']}`**: it makes no proven DP claim, and the "
                  "steward confirmed that from it on no total of the source's releases is a DP "
                  "guarantee.", ""]
    details = manifest.get("mechanism_details") or {}
    if details.get("degenerate"):
        lines += [f"> **{details['degenerate']}**", ""]
    node = ", ".join(f"{k} level {v}" for k, v in manifest["chosen_node"].items()) or "none"
    for rung, ladder_node in enumerate(details.get("ladder") or [], start=1):
        node += (f"; ladder rung {rung} (rows of cells too small at the node): "
                 + ", ".join(f"{k} level {v}" for k, v in ladder_node.items()))
    synthetic = bool(details.get("synthetic"))
    what = (f"- mechanism: `{manifest['mechanism']}`; synthetic rows at the taxonomies' finest "
            "level (no generalization)" if synthetic else
            f"- mechanism: `{manifest['mechanism']}`; generalization (lattice node): {node}")
    lines += [
        "## Guarantee", guarantee["statement"], "",
        *guarantee_meaning(manifest),
        "## Lifetime of the source", manifest["lifetime"]["statement"], "",
        "## What was released", what,
        *(_synthetic_lines(manifest) if synthetic else
          [f"- rows released: {manifest['released_rows']:,}"]),
        f"- files: {', '.join(f'`{f}`' for f in manifest['files'])}",
        f"- seed policy: {manifest['seed_policy']}",
        f"- random source: {manifest.get('randomness', 'not recorded')}",
        f"- text cells: {manifest['text_safety']['csv']}",
        "",
        *render_analyses(manifest),
        *render_error_bars(manifest.get("error_bars") or {}),
        "## Re-identification risk of the released rows",
        *_risk_lines(manifest["risk"], synthetic),
        "",
        "## Budget",
        "| step | epsilon | delta |",
        "|---|---|---|",
    ]
    lines += [f"| {s['step']} | {s['epsilon']:g} | {s['delta']:g} |"
              for s in manifest["budget_steps"]]
    lines += [f"| **total** | **{manifest['epsilon_spent']:g}** | "
              f"**{manifest['delta_spent']:g}** |", "", "## Checks passed before publication"]
    lines += [f"- {_markdown_text(check)}" for check in manifest["checks"]["checks"]]
    lines.append("")
    return "\n".join(lines)


# The cells of one declared analysis report.md lists (the manifest's error bars hold them all).
REPORT_ANALYSIS_CELLS = 100


def how_to_use(manifest: dict[str, Any]) -> list[str]:
    """The report's opening for a researcher: how to read the released numbers, with one
    worked example taken from this release's own ``intervals.csv`` (its row in the manifest's
    ``error_bars.intervals.example``), and what every interval is about."""
    bars = manifest.get("error_bars") or {}
    files = manifest.get("files") or []
    synthetic = bool((manifest.get("mechanism_details") or {}).get("synthetic"))
    lines = ["## How to use these numbers"]
    intervals = bars.get("intervals")
    if not intervals:
        lines += [_markdown_text(bars.get("statement") or "This release states no intervals."),
                  ""]
        return lines
    rows = intervals.get("rows") or {}
    data = next((f for f in files if f.endswith("data.csv")), "data.csv")
    tables = (manifest.get("mechanism_details") or {}).get("tables")
    if tables:
        lines += [
            f"{len(tables)} related tables (below: how they join); the synthetic patients "
            "and their rows are drawn from models of the real tables, so a count of them is "
            "an estimate of the real count. `intervals.csv` lists every marginal the models "
            "measured, in patients, with the range the true figure lies in (95 %): "
            "`released` is what the released tables say, `lower` to `upper` the interval "
            "(what a cell counts: \"Error bars\" below).", "",
            *joins_lines(tables, files), ""]
        return lines
    what = ("the synthetic rows are drawn from a model of the real table, so a count of them "
            "is an estimate of the real count" if synthetic else
            "every count in it has noise added, so a count is an estimate of the true count")
    lines += [
        f"`{data}` holds the released rows; {what}. `intervals.csv` lists every estimate you "
        "can read from this release, one per row, with the range the true count lies in: "
        "`released` is what the release says, `lower` to `upper` the 95 % interval of the "
        "true count. `what` says which kind of estimate it is (`count`: a released cell; "
        "`total`: all rows of one value; `marginal`: a cell of a declared analysis or of one "
        "column's distribution), `columns` and `cell` which one.", ""]
    example = intervals.get("example") or {}
    if example.get("what"):
        kind = {"total": "the total of", "count": "the released cell", "marginal": "the cell"}
        lines += [
            f"**Worked example** (a row of this release's `intervals.csv`): "
            f"{kind.get(example['what'], '')} {_markdown_text(example['columns'])} = "
            f"{_markdown_text(example['cell'])}. The release shows {example['released']:,}; "
            f"the true count lies between {example['lower']:,} and {example['upper']:,}, with "
            f"95 % confidence. Report it as {example['released']:,} "
            f"(95 % interval {example['lower']:,}–{example['upper']:,}), not as an exact "
            "number."
            + (" The interval is not centred on the released figure: rows the release could "
               "not publish (too few to pass a threshold, pooled away) may still belong here, "
               "so the true count can be larger than what you see."
               if example["upper"] - example["released"] > 2 * max(
                   1, example["released"] - example["lower"]) else ""), ""]
    simultaneous = sum(v for k, v in rows.items() if k.endswith("simultaneous"))
    lines += [
        "- Each row marked `per estimate` holds with 95 % probability on its own: among 100 "
        "such rows, about 5 miss. If you read many at once — a whole table, a ranking, the "
        "largest of many — use the rows marked `simultaneous`"
        + (f" ({simultaneous:,} rows here)" if simultaneous else "")
        + ": they are wider, and all of them hold together with 95 % probability.",
        f"- {_markdown_text(intervals.get('about') or bars.get('about') or '')}",
        *([f"- {_markdown_text(cut['statement'])}"] if (cut := (
            manifest.get("mechanism_details") or {}).get("unit_cut")) else []),
        "- A difference between two released counts is not significant unless their "
        "intervals are far apart; an interval that reaches 0 means the data cannot tell that "
        "count from nothing.", ""]
    return lines


def joins_lines(tables: list[dict[str, Any]], files: list[str]) -> list[str]:
    """How a relational release's tables join, for the report (from the manifest's
    ``mechanism_details.tables``: the config's declarations and the released row counts)."""
    def file_of(name: str) -> str:
        return next((f for f in files if f.endswith(f"{name}.csv")), f"{name}.csv")

    key_of = {t["table"]: t.get("key", "") for t in tables}
    lines = ["### The tables and how they join", "",
             "| table | file | rows | key | references | at most per parent |", "|---|---|---|---|---|---|"]
    for t in tables:
        ref = (f"`{t['references']}` → `{t['parent']}.{key_of.get(t['parent'], '')}`"
               if t.get("parent") else "—")
        lines.append(f"| {t['table']} | `{file_of(t['table'])}` | {t['rows']:,} | "
                     f"`{t.get('key', '')}` | {ref} | {t.get('max_children', '—')} |")
    joins = [f"`{t['table']}.{t['references']}` = `{t['parent']}.{key_of.get(t['parent'])}`"
             for t in tables if t.get("parent")]
    lines += ["", "Join them on the keys: " + "; ".join(joins) + ". Keys are fresh "
              "(`<table>-<n>`), never the hospital's; every reference names a released row. A "
              "parent's rows were cut to at most the bound above before anything was measured, "
              "so no released parent has more."]
    return lines


def guarantee_meaning(manifest: dict[str, Any]) -> list[str]:
    """What the guarantee means, in plain words, inside the release itself (a researcher has
    the release, not the project's repository)."""
    guarantee = manifest["guarantee"]
    epsilon, delta = guarantee.get("epsilon"), guarantee.get("delta")
    lines = ["## What the guarantee means"]
    if epsilon is None:
        return [*lines, "This release makes no differential-privacy claim: "
                        f"{_markdown_text(guarantee.get('label', ''))}. Nothing here bounds "
                        "what can be learned about a person from it.", ""]
    who = guarantee.get("neighbouring", "")
    lines += [
        f"Take any one {_markdown_text(_protected(who))}: imagine the data with it and "
        "without it. Differential privacy says the release could have come out of either "
        f"with nearly the same probability: no outcome is more than e^{epsilon:g} "
        f"= {math.exp(epsilon):.3g} times likelier one way than the other, except with "
        f"probability at most {delta:g}. So whatever anyone concludes about one "
        f"{_markdown_text(_protected(who))} from this release, they could have concluded "
        "almost as well had it never been in the data. The neighbouring relation, exactly: "
        f"{_markdown_text(who)}.",
        "",
        "- What it covers: everything in this folder (the rows, `intervals.csv` and every "
        "figure in the manifest are computed from the mechanism's noisy outputs and public "
        "parameters only), and anything computed from it later.",
        "- What it does not cover: what is true of everyone (a released rate describes the "
        "whole population, including people who were not in the data), and other releases: "
        "the guarantees of several releases of the same source add up (the section below "
        "gives the source's total).",
        "- Epsilon is the budget this release spent; smaller is more private and noisier. "
        "The noise is why every number comes with an interval.",
    ]
    if not guarantee.get("proven"):
        lines.append("- **This claim is not upheld by a proof** (see the label above): treat "
                     "the release as not differentially private.")
    return [*lines, ""]


def _protected(neighbouring: str) -> str:
    """Who the neighbouring relation protects, in a few words ("row", "patient ...")."""
    text = neighbouring.removeprefix("add/remove one ").strip()
    return text.split(" (")[0] or "row"


def _verdict_line(manifest: dict[str, Any]) -> list[str]:
    """The report's first line: the publication verdict, what a researcher reads first."""
    verdict = manifest.get("verdict") or {}
    if not verdict.get("level"):
        return []
    return [f"**Publication verdict:** {_markdown_text(verdict.get('headline', ''))}", ""]


def render_analyses(manifest: dict[str, Any]) -> list[str]:
    """Each declared analysis: its verdict, how the release serves each of its columns (kept,
    coarser, generalized away at the chosen node) and, where the error bars carry it (aim),
    its released table with the 95 % interval of the true count per cell."""
    analyses = (manifest.get("verdict") or {}).get("analyses") or []
    if not analyses:
        return []
    tables = (manifest.get("error_bars") or {}).get("analyses") or []
    lines = ["## Declared analyses",
             "The tables the dataset's steward declared that researchers need, and how this "
             "release serves each (the verdict's rules: docs/PRIVACY.md, \"What the review may "
             "look at\").", ""]
    for analysis in analyses:
        served = "; ".join(_served_words(s) for s in analysis.get("served") or [])
        lines.append(f"- **{_markdown_text(analysis['name'])}**: {analysis['status']} — "
                     f"{_markdown_text(analysis['why'])}"
                     + (f" (served: {_markdown_text(served)})" if served else ""))
        entry = analysis_entry(analysis["name"], analysis.get("columns") or [],
                               analysis.get("levels") or [], tables)
        if entry:
            lines += ["", *_analysis_table(entry), ""]
    lines.append("")
    return lines


def _served_words(served: dict[str, Any]) -> str:
    column, how = served.get("column", ""), served.get("how", "")
    released, declared = served.get("released_level"), served.get("declared_level", 0)
    if how == "kept" and released is not None:
        return f"{column} at level {released}"
    if how == "coarser":
        return f"{column} at level {released}, declared {declared}"
    if how == "synthetic":
        return f"{column} synthetic, at its finest level"
    return f"{column} {how}"


def _analysis_table(entry: dict[str, Any]) -> list[str]:
    """One declared analysis's released table with its 95 % intervals (aim's error bars)."""
    cells = entry.get("cells") or []
    shown = cells[:REPORT_ANALYSIS_CELLS]
    level, sigma = entry.get("level"), entry.get("sigma")
    about = [f"{len(cells):,} cells"]
    if isinstance(sigma, int | float):
        about.append(f"measured with sigma {sigma:.3g}")
    if isinstance(level, int | float):
        about.append(f"each interval holds with probability {level:.0%} "
                     f"({entry.get('holds', 'per estimate')})")
    columns = " × ".join(str(c) for c in entry.get("columns") or []) or "cell"
    lines = [_markdown_text("; ".join(about)), "",
             f"| {_table_text(columns)} | released | 95 % interval of the true count |",
             "|---|---|---|"]
    for cell in shown:
        label = " × ".join(str(v) for v in cell.get("cell") or [])
        lines.append(f"| {_table_text(label)} | {cell.get('released', '')} | "
                     f"[{cell.get('lower', '')}, {cell.get('upper', '')}] |")
    if len(cells) > len(shown):
        lines += ["", f"{len(cells) - len(shown):,} more cells: manifest.json, "
                      "error\\_bars.analyses"]
    return lines


def _table_text(text: str) -> str:
    """Text in a Markdown table cell: escaped, and its '|' kept from ending the cell."""
    return _markdown_text(text).replace("|", "\\|")


def _synthetic_lines(manifest: dict[str, Any]) -> list[str]:
    """aim in its own terms: its rounds, the marginals it measured, the rows it sampled from
    the fitted model and how many marginals its error bars vouch for (no lattice, no class)."""
    details = manifest.get("mechanism_details") or {}
    measured = details.get("measurements") or []
    rounds = max((m.get("round", 0) for m in measured), default=0)
    named = [f"{' × '.join(m['columns'])} (levels {', '.join(str(x) for x in m['levels'])})"
             for m in measured]
    rho, used = details.get("rho"), details.get("rho_used")
    merged = details.get("merged_rare_values") or {}
    marginals = (manifest.get("error_bars") or {}).get("marginals") or []
    vouched = [m for m in marginals if m.get("basis") != "none" and m.get("tvd_bound", 1) < 1]
    lines = [f"- rounds: {rounds} after the 1-way marginals of every column"
             + (f"; rho used {used / rho:.0%} of {rho:.4g}" if rho and used is not None else ""),
             f"- marginals measured with noise: {len(named)}"
             + (f" — {_markdown_text('; '.join(named))}" if named else ""),
             f"- synthetic rows sampled from the model fitted to those measurements: "
             f"{manifest['released_rows']:,}" if not details.get("tables") else
             "- synthetic rows drawn from the models fitted to those measurements: "
             + ", ".join(f"{t['table']} {t['rows']:,}" for t in details["tables"])]
    if merged:
        lines.append("- rare values merged before sampling (from the noisy 1-way counts): "
                     + _markdown_text(", ".join(f"{c} {n:,}" for c, n in merged.items())))
    if marginals:
        lines.append(f"- error bars: {len(vouched)} of {len(marginals)} workload marginals "
                     "have a bound below 1 (the table under 'Error bars'); the others the "
                     "measurements cannot vouch for at this size and budget")
    return lines


def _markdown_text(text: str) -> str:
    """Text shown as itself in Markdown: '*' (the suppressed label) and '_' escaped."""
    return text.replace("\\", "\\\\").replace("*", "\\*").replace("_", "\\_")


def _risk_lines(risk: dict[str, Any], synthetic: bool) -> list[str]:
    if synthetic:
        return ["- synthetic rows: no released row describes a real patient, so class sizes "
                "and prosecutor risk do not describe anyone's risk; the guarantee bounds what "
                "can be learned about any patient"]
    return [f"- classes on the released dimensions: {risk['classes']:,}; smallest class: "
            f"{risk['smallest_class']:,}; rows unique on the dimensions: "
            f"{risk['unique_row_share']:.1%}",
            f"- prosecutor risk: max {risk['prosecutor_risk_max']:.3f}, mean "
            f"{risk['prosecutor_risk_mean']:.3f} (for a DP mechanism the guarantee, not these "
            "figures, bounds what can be learned about anyone)"]


def render_error_bars(bars: dict[str, Any]) -> list[str]:
    """The researcher's error bars in words and tables (from the manifest's ``error_bars``)."""
    if not bars:
        return []
    level = bars.get("level")
    title = f"## Error bars ({100 * level:g} % confidence)" if level else "## Error bars"
    lines = [title, bars.get("statement", ""), ""]
    for c in bars.get("cells") or []:  # a list, not a table: it wraps on a laptop screen
        lines.append(
            f"- **{_markdown_text(c['applies_to'])}** ({_markdown_text(c['noise'])}): the true "
            f"count of a released count R lies in [R - {c['half_width']}, "
            f"R + {c['half_width']}]" + (f" for R ≥ {c['far_from']}" if c.get("far_from") else "")
            + ("; every released count's own interval, near the threshold too, is its row in "
               "`intervals.csv`" if bars.get("intervals") else ""))
    if bars.get("cells"):
        lines.append("")
    if bars.get("totals"):
        lines += [_markdown_text(bars["totals"]), ""]
    marginals = bars.get("marginals") or []
    useful = [m for m in marginals if m["basis"] != "none" and m["tvd_bound"] < 1]
    if marginals:
        nothing = sum(1 for m in marginals if m["basis"] == "none")
        vacuous = len(marginals) - len(useful) - nothing
        lines += ["Beyond the cell-by-cell intervals of `intervals.csv`, a bound on how far a "
                  "whole marginal of the released rows is from the source's (total variation "
                  "distance; levels are taxonomy levels, 0 = the raw values)."
                  + (f" No bound for {nothing} marginal(s): no measurement covers them."
                     if nothing else "")
                  + (f" {vacuous} more get only the trivial bound 1: the measurements are "
                     "too noisy at this size and budget to say anything about them; read "
                     "their 1-way cells in `intervals.csv` instead." if vacuous else ""), ""]
    if useful:
        lines += ["| marginal | levels | bound from | within (TVD) |", "|---|---|---|---|"]
        for m in useful:
            levels = ", ".join(str(x) for x in m.get("levels", [])) or "0"
            lines.append(f"| {' × '.join(m['columns'])} | {levels} | {m['basis']} | "
                         f"{m['tvd_bound']:.3f} |")
        lines.append("")
    return lines


# -- the run's facts, as the publication splits them ------------------------------------

# Mechanism summaries that may be published, each with its basis (privacy/publication.py).
PUBLIC_DETAILS = tuple(DETAILS)
# The record attribute (log ``extra``) with the published folder: the CLI says "published"
# from it without parsing the message, before the evidence report is written.
PUBLISHED_KEY = "medrelease_published"


def package_version() -> str:
    try:
        return version("medrelease")
    except PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class PublishResult:
    release_id: str
    path: str
    manifest: dict
    record: dict
    test_release: bool


@dataclass(frozen=True)
class RunFacts:
    """What one release run produced, before it is split at the publication boundary."""

    config: DatasetConfig
    input_info: InputInfo
    release_plan: ReleasePlan
    context: ReleaseContext | None
    chosen: MaterializedRelease
    charge: Charge
    checks: CheckReport
    candidates: pd.DataFrame
    flow_run_id: str | None
    requested_at: datetime | None = None  # when the request was resolved, before any read
    release_id: str | None = None  # drawn at resolution (the run's first log lines name it)


def _selection(candidates: pd.DataFrame, chosen_index: int) -> dict[str, Any]:
    """How the node was chosen (computed from the input: steward only)."""
    if candidates.empty or "selection_probability" not in candidates:
        return {"candidates": 0}
    probs = candidates.set_index("index")["selection_probability"]
    best = candidates.sort_values(["il", "index"]).iloc[0]
    scored = {}
    if "score" in candidates and candidates["score"].notna().any():  # ipa: the score U
        top = candidates.loc[candidates["score"].idxmax()]
        scored = {"top_score_node_index": int(top["index"]),
                  "top_score_probability": float(top["selection_probability"])}
    return {**scored, "candidates": len(candidates), "chosen_index": chosen_index,
            "chosen_probability": float(probs.get(chosen_index, float("nan"))),
            "best_il_node_index": int(best["index"]),
            "best_il_node_probability": float(probs[int(best["index"])]),
            "uniform_probability": 1.0 / len(candidates),
            "il_min": float(candidates["il"].min()), "il_max": float(candidates["il"].max())}


def _declared_rows_check(config: DatasetConfig, rows: int) -> str | None:
    bound = config.privacy.max_rows
    if bound is None:
        return None
    where = "within" if rows <= bound else "ABOVE"
    return f"the input has {rows:,} rows, {where} the declared bound privacy.max_rows={bound:,}"


def public_facts(run: RunFacts, release_id: str) -> dict[str, Any]:
    """What the published manifest carries: public parameters, identities, the mechanism's
    outputs and figures of the released rows (``PUBLISHED`` says each field's basis)."""
    plan, chosen, config = run.release_plan, run.chosen, run.config
    guarantee = plan.guarantee
    steps = [s.as_dict() for s in plan.budget_steps]
    columns = chosen.rows.columns
    dims = [c for c in config.dimensions + config.set_valued if c in columns]
    node = (dict(zip(run.context.counts.dimensions, map(int, chosen.node), strict=True))
            if run.context is not None else {})
    facts = {
        "release_id": release_id,
        # the day only: a time of day would tell how long the run took (it grows with n)
        "created_at": (run.requested_at or datetime.now(UTC)).date().isoformat(),
        "test_release": plan.random.test_release,
        "dataset": config.name, "source": config.source_id,
        "package_version": package_version(),
        "mechanism": plan.mechanism, "parameters": plan.params.model_dump(mode="json"),
        "guarantee": {**guarantee.as_dict(), "statement": guarantee.statement()},
        "budget_steps": steps,
        "epsilon_spent": sum(s["epsilon"] for s in steps),
        "delta_spent": sum(s["delta"] for s in steps),
        "lifetime": run.charge.public_lifetime(),
        "seed_policy": plan.random.seed_policy,
        "randomness": randomness_words(plan),
        "columns": (relational_columns(config) if chosen.data_tables
                    else public_columns(config, columns)),
        "checks": {"passed": run.checks.success, "checks": run.checks.public},
        "files": published_file_names(plan.random.test_release, tuple(chosen.tables),
                                      tuple(chosen.data_tables)),
        "text_safety": {"csv": CSV_TEXT_SAFETY, "parquet": "raw values"},
        "chosen_node": node, "chosen_node_height": int(sum(chosen.node)),
        "mechanism_details": {k: v for k, v in chosen.details.items() if k in PUBLIC_DETAILS},
        "error_bars": chosen.error_bars or no_error_bars(plan.mechanism),
        **released_figures(chosen.rows, dims),
    }
    # from the facts above that are published (never the input), the released rows and the
    # config's public declarations: the audit recomputes it from the published folder
    facts["verdict"] = publication_verdict(facts, chosen.rows, config).as_dict()
    return facts


def randomness_words(plan: Any) -> str:
    """The random source in words. A mechanism with no budget step (kanon, mondrian,
    pseudonymize) draws no noise: its report named the noise source as if it used one (issue
    56). It says "none", and what the source still does: shuffle the released rows' order."""
    if any(step.epsilon > 0 for step in plan.budget_steps):
        return plan.random.randomness
    return (f"none: {plan.mechanism} draws no noise (the same input gives the same rows); "
            f"only the order of the released rows is shuffled, from {plan.random.randomness}")


def declared_tables(chosen: MaterializedRelease, mechanism: str) -> dict[str, pd.DataFrame]:
    """The tables the mechanism declares it publishes, exactly those (a missing or an extra
    one stops the release before anything is written)."""
    declared = set(capabilities(mechanism).published_tables)
    if set(chosen.tables) != declared:
        raise BoundaryError(f"{mechanism} declares published tables {sorted(declared)} but its "
                            f"release made {sorted(chosen.tables)}")
    return dict(chosen.tables)


def no_error_bars(mechanism: str) -> dict[str, Any]:
    """What a release without intervals says instead (a mechanism that adds no noise, or one
    whose intervals are not derived here)."""
    caps = capabilities(mechanism)
    statement = ("no noise is added: released counts are the input's for the rows released; "
                 "rows suppressed or withheld are missing from them (see the checks)"
                 if not caps.draws_declared_steps and caps.kind != "synthetic" else
                 "no error bars are derived for this mechanism")
    return {"level": None, "statement": statement}


def steward_facts(run: RunFacts) -> dict[str, Any]:
    """What only the steward record carries: everything computed from the raw input, and the
    run's internal identities."""
    plan, chosen, config = run.release_plan, run.chosen, run.config
    guarantee, il = plan.guarantee, chosen.il
    return {
        "flow_run_id": run.flow_run_id, "ledger_spend_id": run.charge.spend_id,
        "requested_at": (run.requested_at or datetime.now(UTC)).isoformat(timespec="seconds"),
        "published_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "ledger_charge": {"source": config.source_id, "mechanism": plan.mechanism,
                          "epsilon": float(guarantee.epsilon or 0.0),
                          "delta": float(guarantee.delta or 0.0), "dp": guarantee.proven,
                          "cap_epsilon": run.charge.lifetime.lifetime_epsilon,
                          "cap_delta": run.charge.lifetime.lifetime_delta,
                          "privacy_unit": guarantee.neighbouring,
                          # the journaled request: claims, input, policy, owner (to restore)
                          "request": run.charge.request},
        "input_file": run.input_info.path, "input_sha256": run.input_info.sha256,
        "input_rows_sha256": run.input_info.rows_sha256,
        "input_rows": run.input_info.rows, "dropped_rows": run.input_info.dropped_rows,
        "unit_bound": run.input_info.unit_bound,
        "dataset_config": config.model_dump(mode="json"),
        "information_loss": ({"ncp": il.ncp, "emd": il.emd, "rate": il.rate, "il": il.il}
                             if il is not None else {}),
        "selection": _selection(run.candidates, chosen.index),
        "output_checks": {"success": run.checks.success, "results": run.checks.results},
        "lifetime_cap_note": run.charge.lifetime.cap_note,
        "declared_rows_check": _declared_rows_check(config, run.input_info.rows),
    }


def steward_files(run: RunFacts) -> dict[str, str]:
    """The steward record's files beside record.json: every candidate's score and the output
    checks (computed from the raw input: never in the published folder)."""
    return {"candidates.csv": run.candidates.to_csv(index=False),
            "checks.json": json.dumps({"success": run.checks.success,
                                       "results": run.checks.results,
                                       "suite": run.checks.suite}, indent=2, default=str)}
