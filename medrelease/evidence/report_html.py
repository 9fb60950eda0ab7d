"""One HTML page per release evaluation, with plots (SVG files beside the page).

Readable without the code: every plot has a title, axis labels and a caption, and every number
shown in a plot is also in a table. Written atomically (a hidden partial folder, then rename).
"""

from __future__ import annotations

import html
import json
import os
import shutil
import uuid
from pathlib import Path

import pandas as pd

from medrelease.evidence.evaluation import Evaluation
from medrelease.evidence.svg_charts import (
    COLOURS,
    Series,
    horizontal_bars,
    line_panels,
    vertical_bars,
)

INTERNAL = ("INTERNAL — this page compares the release with the raw input. It is evidence for "
            "the data steward and must not be published with the release.")


def _plot_queries(evaluation: Evaluation, folder: Path) -> list[tuple[str, str]]:
    side = evaluation.queries
    out = []
    for metric, title, ylabel in (
        ("stays", "Stays per 5-year age group", "stays"),
        ("avg_los", "Average length of stay per 5-year age group", "days"),
    ):
        panels = []
        for sex in dict.fromkeys(side["sex"]):
            part = side[side["sex"] == sex]
            ages = part["age_group"].tolist()
            panels.append((f"sex = {sex}", [
                Series("original", ages, part[f"original_{metric}"].tolist()),
                Series("release", ages, part[f"released_{metric}"].tolist(), dashed=True,
                       square=True)]))
        name = f"query_{metric}.svg"
        (folder / name).write_text(line_panels(
            f"{title} — diagnosis {evaluation.query_summary['diagnosis']}, non-surgical",
            panels, "age group (start)", ylabel), encoding="utf-8")
        out.append((name, f"{title}: original (solid) vs release (dashed)"))
    return out


def _plot_il(evaluation: Evaluation, folder: Path) -> list[tuple[str, str]]:
    frame = evaluation.il_by_height
    heights = frame["height"].tolist()
    series = [Series(part.upper(), heights, frame[part].tolist())
              for part in ("il", "ncp", "emd", "rate") if part in frame.columns]
    (folder / "il_by_height.svg").write_text(line_panels(
        "Information loss per lattice height (cf. IPA paper Fig. 8)", [("", series)],
        "lattice node height (sum of generalization levels)", "mean information loss",
        panel_width=600), encoding="utf-8")
    return [("il_by_height.svg", "Mean IL and its parts over the lattice nodes of each height")]


def _plot_budget(evaluation: Evaluation, folder: Path) -> list[tuple[str, str]]:
    steps = [s for s in evaluation.budget_steps if s["epsilon"] > 0]
    if not steps:
        return []
    total = sum(s["epsilon"] for s in steps)
    (folder / "budget.svg").write_text(horizontal_bars(
        f"Budget split (total {total:.4g})", [s["step"] for s in steps],
        [s["epsilon"] for s in steps], "epsilon"), encoding="utf-8")
    return [("budget.svg", "How the release's epsilon is split over its steps")]


def _plot_classification(evaluation: Evaluation, folder: Path) -> list[tuple[str, str]]:
    names = list(evaluation.classification)
    values = [evaluation.classification[n]["accuracy"] * 100 for n in names]
    (folder / "classification.svg").write_text(vertical_bars(
        "Classification: LA, BA (raw) and CA (release)", names, [("accuracy", values)],
        "accuracy %", top_value=100, width=max(560, 90 * len(names)),
        category_colours=["#999999"] + [COLOURS[0]] * (len(names) - 1)), encoding="utf-8")
    out = [("classification.svg", "Accuracy of a decision tree and a random forest")]
    if evaluation.information_gain is not None:
        gain = evaluation.information_gain
        (folder / "information_gain.svg").write_text(vertical_bars(
            "Information gain on the class per attribute", gain["attribute"].tolist(),
            [("input", gain["before"].tolist()), ("release", gain["after"].tolist())], "bits",
            width=max(560, 90 * len(gain))), encoding="utf-8")
        out.append(("information_gain.svg", "Information gain before and after release"))
    return out


# measure -> (range, which way is better, what it is): shown next to every measure table
MEASURES = {
    "il": ("0 to 3", "lower is better", "information loss = NCP + EMD + Rate"),
    "ncp": ("0 to 1", "lower is better", "how much of its domain a released label covers, "
            "averaged over rows (0 = raw values, 1 = all '*')"),
    "emd": ("0 to 1", "lower is better", "how far the informative values' distribution within "
            "released classes moved from the input's"),
    "rate": ("0 to 1", "lower is better", "share of input rows suppressed (released as '*')"),
    "stays_mean_abs_error": ("0 and up (rows)", "lower is better",
                             "mean absolute error of the stay counts per age group and sex"),
    "stays_mean_rel_error": ("0 and up", "lower is better", "the same, relative to the input"),
    "avg_los_mean_abs_error": ("0 and up (days)", "lower is better",
                               "mean absolute error of the average length of stay"),
    "rows": ("0 and up", "-", "rows in the table"),
    "classes": ("1 and up", "-", "distinct combinations of the dimension values"),
    "unique_row_share": ("0 to 1", "lower is safer", "share of rows unique on the dimensions"),
    "smallest_class": ("1 and up", "higher is safer", "rows in the smallest class"),
    "k_achieved": ("1 and up", "higher is safer", "the k of k-anonymity the table meets"),
    "prosecutor_risk_max": ("0 to 1", "lower is safer",
                            "1 / smallest class: chance to pick out a known target, worst row"),
    "prosecutor_risk_mean": ("0 to 1", "lower is safer", "the same, averaged over rows"),
}


def plain(value) -> str:
    """A number as people read it: no scientific notation, thousands separated."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if value != value:  # NaN
        return "-"
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    digits = 1 if abs(value) >= 1000 else 4 if abs(value) >= 0.001 else 10
    return f"{value:,.{digits}f}".rstrip("0").rstrip(".")


def _table(rows: dict | pd.DataFrame) -> str:
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(
        {"measure": list(rows), "value": list(rows.values())})
    frame = frame.map(plain)
    if "measure" in frame.columns and frame["measure"].isin(list(MEASURES)).any():
        known = frame["measure"].map(lambda m: MEASURES.get(m, ("", "", "")))
        frame = frame.assign(range=[k[0] for k in known], better=[k[1] for k in known],
                             meaning=[k[2] for k in known])
    return frame.to_html(index=False, border=0, classes="numbers")


def verdict(e: Evaluation) -> str:
    """One line a privacy officer reads first: the guarantee, what was kept, the risk."""
    parts = [f"guarantee: {e.guarantee.rstrip('.')}"]
    if e.input_rows:
        parts.append(f"{e.released_rows:,} rows released for {e.input_rows:,} input rows")
    if e.information_loss.get("il") is not None:
        parts.append(f"information loss {plain(e.information_loss['il'])} of 3 (lower is "
                     "better)")
    if e.risk_release:
        parts.append(f"smallest released class {plain(e.risk_release.get('smallest_class'))} "
                     f"row(s), {plain(100 * e.risk_release.get('unique_row_share', 0))} % of "
                     "rows unique on the dimensions")
    return "; ".join(parts) + "."


def _queries_explained(e: Evaluation) -> str:
    diagnosis = html.escape(str(e.query_summary.get("diagnosis", "")))
    return (f"<p>The queries count stays with diagnosis <b>{diagnosis}</b>, the input's most "
            "frequent one: with the most rows, its errors are least dominated by noise and "
            "suppression (the choice is computed from the input, which is why this page is "
            "internal).</p><p><b>Average length of stay:</b> a generalized length of stay counts "
            "at its interval's midpoint, and '*' at the midpoint of the whole domain (for "
            "1-400 days: 200.5). Where the release generalizes length of stay to '*', its "
            "average therefore sits near 200 days against about 10 in the input: that is the "
            "estimator, not the noise. Read the stay counts, or the average only where length "
            "of stay is released below '*'.</p>")


def render(evaluation: Evaluation, plots: list[tuple[str, str]]) -> str:
    e = evaluation
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>Evaluation of {html.escape(e.release_id)}</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}"
        ".internal{background:#fde;padding:.6em;border:1px solid #c66}"
        "table.numbers{border-collapse:collapse}table.numbers td,table.numbers th"
        "{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}"
        "figure{margin:1em 0}</style></head><body>",
        f"<h1>Release {html.escape(e.release_id)} of {html.escape(e.dataset)}</h1>",
        f"<p class='internal'>{html.escape(INTERNAL)}</p>",
        f"<p class='verdict'><b>Verdict:</b> {html.escape(verdict(e))}</p>",
        f"<p><b>Mechanism</b> {html.escape(e.mechanism)} — <b>guarantee</b> "
        f"{html.escape(e.guarantee)}</p>",
        (f"<p class='internal'><b>Warning:</b> {html.escape(e.unit_warning)}</p>"
         if e.unit_warning else ""),
        f"<p>{e.input_rows:,} input rows, {e.released_rows:,} released rows"
        + ("" if e.for_publication else " — <b>NOT FOR PUBLICATION (fixed seed)</b>") + "</p>",
        "<h2>Privacy budget</h2>", _table(pd.DataFrame(e.budget_steps)) if e.budget_steps
        else "<p>No privacy budget: this mechanism makes no differential-privacy claim.</p>",
    ]
    if e.information_loss:
        parts += ["<h2>Information loss</h2>", _table(e.information_loss)]
    if e.queries is not None:
        parts += ["<h2>Analysis queries (IPA paper)</h2>", _queries_explained(e),
                  _table(e.query_summary), _table(e.queries)]
    if e.classification:
        flat = {f"{name} {metric}": value for name, scores in e.classification.items()
                for metric, value in scores.items()}
        parts += ["<h2>Classification</h2>", f"<p>{html.escape(e.classification_note)}</p>",
                  _table(flat)]
        if e.information_gain is not None:
            parts.append(_table(e.information_gain))
    else:
        parts += ["<h2>Classification</h2>", f"<p>{html.escape(e.classification_note)}</p>"]
    parts += ["<h2>Re-identification risk</h2>",
              _table(pd.DataFrame({"release": e.risk_release, "input": e.risk_input})
                     .reset_index(names="measure"))]
    if e.frequency_attack:
        parts += ["<h3>Frequency-matching attack on the pseudonyms</h3>",
                  _table(e.frequency_attack)]
    if e.il_by_height is not None:
        parts += ["<h2>Information loss per lattice height</h2>", _table(e.il_by_height)]
    parts.append("<h2>Plots</h2>")
    for name, caption in plots:
        parts.append(f"<figure><img src='plots/{html.escape(name)}' alt='{html.escape(caption)}'>"
                     f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(evaluation: Evaluation, target: str | Path) -> Path:
    """Write ``report.html``, ``evaluation.json`` and ``plots/`` into ``target`` atomically."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.parent / f".partial-{target.name}-{uuid.uuid4().hex[:8]}"
    plots_dir = partial / "plots"
    plots_dir.mkdir(parents=True)
    try:
        plots: list[tuple[str, str]] = []
        if evaluation.queries is not None:
            plots += _plot_queries(evaluation, plots_dir)
        if evaluation.il_by_height is not None:
            plots += _plot_il(evaluation, plots_dir)
        plots += _plot_budget(evaluation, plots_dir)
        if evaluation.classification:
            plots += _plot_classification(evaluation, plots_dir)
        (partial / "report.html").write_text(render(evaluation, plots), encoding="utf-8")
        (partial / "evaluation.json").write_text(
            json.dumps(evaluation.as_json(), indent=2, default=float), encoding="utf-8")
        if target.exists():
            shutil.rmtree(target)
        os.replace(partial, target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return target
