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

from medrelease.evidence.accuracy import STEWARD_BASIS
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


def _plot_accuracy(evaluation: Evaluation, folder: Path) -> list[tuple[str, str]]:
    """The worst marginals as bars, and the informative column's most frequent values, input
    against release (where people would rather look than read)."""
    acc, out = evaluation.accuracy, []
    workload = (acc or {}).get("workload")
    if workload and workload.get("worst"):
        worst = workload["worst"]
        (folder / "accuracy_worst.svg").write_text(horizontal_bars(
            "The worst marginals (TVD, 0 = same as the input)", [w["marginal"] for w in worst],
            [w["tvd"] for w in worst], "total variation distance", width=640),
            encoding="utf-8")
        out.append(("accuracy_worst.svg", f"The {len(worst)} marginals furthest from the "
                                          "input's (total variation distance)"))
    info = (acc or {}).get("informative")
    if info and info.get("values"):
        top = sorted(info["values"], key=lambda v: -v["input"])[:12]
        names = [str(v["value"])[:14] for v in top]
        (folder / "accuracy_values.svg").write_text(vertical_bars(
            f"{info['column']}: rows per value, input and release", names,
            [("input", [v["input"] for v in top]), ("release", [v["released"] for v in top])],
            "rows", width=max(560, 70 * len(top))), encoding="utf-8")
        out.append(("accuracy_values.svg", f"The {len(top)} most frequent {info['column']} "
                                           "values: input rows against released rows"))
    return out


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
    "rate": ("0 to 1", "lower is better", "share of released rows that are noise (rows added or "
             "removed by the noise over rows released), averaged over classes"),
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


def release_facts(e: Evaluation) -> str:
    """The line after the accuracy verdict: the guarantee, rows in and out, the risk."""
    parts = [f"guarantee: {e.guarantee.rstrip('.')}",
             f"{e.released_rows:,} rows released for {e.input_rows:,} input rows"]
    if e.information_loss.get("il") is not None:
        parts.append(f"information loss {plain(e.information_loss['il'])} of 3 (lower is "
                     "better)")
    if e.risk_release:
        parts.append(f"smallest released class {plain(e.risk_release.get('smallest_class'))} "
                     f"row(s), {plain(100 * e.risk_release.get('unique_row_share', 0))} % of "
                     "rows unique on the dimensions")
    if e.risk_synthetic:
        parts.append(f"{plain(100 * e.risk_synthetic['unique_match_share'])} % of the "
                     "synthetic rows equal a unique input record (rows drawn from the 1-way "
                     f"marginals: {plain(100 * e.risk_synthetic['baseline_share'])} %)")
    return "; ".join(parts) + "."


def _left_out(e: Evaluation, section: str) -> str:
    """One line in place of a section that does not apply, never an empty section."""
    reason = e.left_out.get(section)
    return f"<p class='left-out'>Not shown: {html.escape(reason)}.</p>" if reason else ""


def _accuracy_section(e: Evaluation) -> list[str]:
    """Accuracy first: verdict, warnings, workload error, the informative column."""
    acc = e.accuracy
    if not acc:
        return []
    parts = ["<h2>Accuracy: how far the release is from the input</h2>"]
    workload = acc.get("workload")
    if workload:
        means = {f"{way}-way marginals": workload[f"mean_{way}way"] for way in (1, 2, 3)
                 if workload.get(f"mean_{way}way") is not None}
        parts += ["<h3>Workload error (mean total variation distance)</h3>",
                  f"<p>{html.escape(workload['yardstick'][:1].upper() + workload['yardstick'][1:])}"
                  ". Over the released columns "
                  f"{html.escape(', '.join(workload['columns']))}.</p>",
                  _table(pd.DataFrame({"marginals": list(means),
                                       "mean TVD": [round(v, 3) for v in means.values()]})),
                  "<h3>The worst marginals</h3>",
                  _table(pd.DataFrame(workload["worst"]).rename(columns={"tvd": "TVD"})
                         .round({"TVD": 3}))]
        if workload.get("declared"):
            declared = workload["declared"]
            parts += [f"<p>The dataset's declared workload: mean TVD "
                      f"{plain(declared['mean'])}.</p>",
                      _table(pd.DataFrame({"marginal": list(declared["marginals"]),
                                           "TVD": list(declared["marginals"].values())}))]
        for column, reason in workload.get("left_out", {}).items():
            parts.append(f"<p class='left-out'>{html.escape(column)}: {html.escape(reason)}.</p>")
    elif "workload" in acc.get("not_applicable", {}):
        parts.append(f"<p class='left-out'>Workload error not measured: "
                     f"{html.escape(acc['not_applicable']['workload'])}.</p>")
    info = acc.get("informative")
    if info:
        parts += _informative_section(info)
    elif "informative" in acc.get("not_applicable", {}):
        parts.append(f"<p class='left-out'>Informative column not measured: "
                     f"{html.escape(acc['not_applicable']['informative'])}.</p>")
    if acc.get("research"):
        parts += _research_section(acc["research"])
    elif "research" in acc.get("not_applicable", {}):
        parts.append(f"<p class='left-out'>What researchers need not measured: "
                     f"{html.escape(acc['not_applicable']['research'])}.</p>")
    return parts


def _research_section(research: dict) -> list[str]:
    """What researchers need (``research.py``): each column's 1-way distance and means, the
    dimensions' inflated values, the associations input against release, impossible rows."""
    parts = ["<h3>What researchers need</h3>",
             f"<p class='basis'><b>Not a basis for publishing:</b> "
             f"{html.escape(STEWARD_BASIS)}.</p>"]
    distributions = research["distributions"]
    frame = pd.DataFrame(distributions["columns"])
    if not frame.empty:
        frame = frame.assign(
            tvd=frame["tvd"].round(3),
            generalized_share=(100 * frame["generalized_share"]).round(1),
            collapsed=frame["collapsed"].map({True: "COLLAPSED", False: ""})).rename(columns={
                "tvd": "1-way TVD", "generalized_share": "generalized rows %",
                "input_mean": "input mean", "released_mean": "released mean",
                "collapsed": "finding"})
        parts += ["<h4>1-way distributions</h4>",
                  f"<p>{html.escape(distributions['rule'][:1].upper() + distributions['rule'][1:])}"
                  ".</p>", _table(_dashed(frame))]
    inflated = research["inflated"]
    rows = [{"column": column, **v} for column, values in inflated["values"].items()
            for v in values]
    parts += ["<h4>Inflated dimension values</h4>",
              f"<p>{html.escape(inflated['rule'][:1].upper() + inflated['rule'][1:])}; "
              "the informative column's inflated values are in its value-by-value "
              "section.</p>"]
    if rows:
        table = pd.DataFrame(rows)
        table["factor"] = [("new" if f is None or f != f else f"×{f:.3g}")
                           for f in table["factor"]]
        counts = ", ".join(f"{c}: {n:,}" for c, n in inflated["counts"].items())
        parts += [f"<p>Inflated per column: {html.escape(counts)} (the worst listed).</p>",
                  _table(table)]
    else:
        parts.append("<p>No dimension value inflated.</p>")
    associations = research["associations"]
    parts += ["<h4>Associations, input against release</h4>",
              f"<p>{html.escape(associations['rule'][:1].upper() + associations['rule'][1:])}"
              ".</p>"]
    summary = []
    for a in associations["items"]:
        finding = ("ERASED" if a["erased"] else "REVERSED" if a["reversed"]
                   else "kept" if a["shows_association"] else a["note"] or "-")
        high, low = a["input_groups"] or ("", "")
        summary.append({
            "association": a["name"], "declared": "yes" if a["declared"] else "",
            "value": a["value"] or "",
            "input rates (high, low group)": (
                f"{a['input_rates'][0]:.3f} ({high}), {a['input_rates'][1]:.3f} ({low})"
                if a["input_rates"] else ""),
            "released rates": (f"{a['released_rates'][0]:.3f}, {a['released_rates'][1]:.3f}"
                               if a["released_rates"] else ""),
            "spread input": a["input_spread"], "spread released": a["released_spread"],
            "largest rate difference": a["largest_difference"], "joint TVD": a["tvd"],
            "finding": finding})
    if summary:
        parts.append(_table(_dashed(pd.DataFrame(summary))))
    for a in associations["items"]:
        if a["declared"] and a["rates"]:
            rates = pd.DataFrame(a["rates"])
            rates = rates.assign(input_rate=(100 * rates["input_rate"]).round(2),
                                 released_rate=(100 * rates["released_rate"]).round(2),
                                 difference=(100 * rates["difference"]).round(2)).rename(
                columns={"input_rate": "input %", "released_rate": "release %",
                         "difference": "difference (points)",
                         "group_rows": "input rows of the group"})
            parts += [f"<h4>Declared analysis {html.escape(a['name'])}: rate of each "
                      f"{html.escape(a['columns'][-1])} value by group</h4>", _table(rates)]
    impossible = research.get("impossible")
    if impossible:
        parts += ["<h4>Impossible combinations</h4>",
                  f"<p>{impossible['released_rows']:,} released row(s); "
                  f"{impossible['input_rows']:,} input row(s) (a data-quality finding in the "
                  f"input). {html.escape(impossible['rule'][:1].upper() + impossible['rule'][1:])}"
                  ".</p>",
                  _table(pd.DataFrame(impossible["combinations"]).assign(
                      columns=lambda f: f["columns"].map(", ".join)))]
    for section, reason in research.get("not_applicable", {}).items():
        parts.append(f"<p class='left-out'>{html.escape(section)}: {html.escape(reason)}.</p>")
    return parts


def _dashed(frame: pd.DataFrame) -> pd.DataFrame:
    """A table's missing numbers (a mean or a rate not computable) shown as '-'."""
    return frame.astype(object).where(pd.notna(frame), "-")


def _informative_section(info: dict) -> list[str]:
    column = html.escape(info["column"])
    values = pd.DataFrame(info["values"])
    changed = values.assign(rows_changed=(values["released"] - values["input"]).abs()) \
        .sort_values(["rows_changed", "input"], ascending=False).head(20)
    shown = changed[["value", "input", "released", "pooled"]].assign(
        change=[("new" if c is None or c != c else f"{100 * c:+.1f} %")
                for c in changed["change"]])
    inflated = info.get("inflated", [])
    parts = [f"<h3>{column}, value by value</h3>",
             f"<p>{len(values):,} value(s); lost (in the input, not released): "
             f"{len(info['lost']):,}; created (released, not in the input): "
             f"{len(info['created']):,}; released more than 10 % below the input's count: "
             f"{len(info['shrunk']):,}; inflated (released at least twice the input's count "
             f"and share of the rows, and 5 rows more): {len(inflated):,}. The 20 largest "
             "changes in rows:</p>",
             _table(shown)]
    if inflated:
        listed = ", ".join(f"{v['value']} ({v['input']:,} -> {v['released']:,}, "
                           f"×{v['factor']:.3g})" for v in inflated[:50])
        parts.append(f"<p><b>Inflated:</b> {html.escape(listed)}"
                     + (f" and {len(inflated) - 50:,} more" if len(inflated) > 50 else "")
                     + "</p>")
    if info["lost"]:
        parts.append(f"<p><b>Not released:</b> {html.escape(', '.join(info['lost'][:50]))}"
                     + (f" and {len(info['lost']) - 50:,} more" if len(info["lost"]) > 50
                        else "") + "</p>")
    if info["created"]:
        parts.append(f"<p><b>Released but not in the input:</b> "
                     f"{html.escape(', '.join(info['created'][:50]))}</p>")
    if info.get("suppression"):
        parts += ["<h4>What pooling and thresholds removed</h4><ul>"]
        parts += [f"<li>{html.escape(line)}</li>" for line in info["suppression"]]
        parts.append("</ul>")
    if info.get("rates"):
        rates = pd.DataFrame(info["rates"])
        rates = rates.assign(input_rate=100 * rates["input_rate"],
                             released_rate=100 * rates["released_rate"],
                             difference=100 * rates["difference"]).rename(columns={
                                 "input_rate": "input %", "released_rate": "release %",
                                 "difference": "difference (points)",
                                 "group_rows": "input rows of the group"})
        levels = "; ".join(f"{k}: {v}" for k, v in info.get("rate_levels", {}).items())
        parts += [f"<h4>{column} rate by dimension</h4>",
                  f"<p>{html.escape(info['rates_note'])}. Groups shown: "
                  f"{html.escape(levels)}.</p>", _table(rates)]
    elif info.get("rates_note"):
        parts.append(f"<p class='left-out'>{html.escape(info['rates_note'])}.</p>")
    return parts


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
        ".warning{background:#fff3cd;padding:.5em;border:1px solid #d9a400}"
        ".basis{font-style:italic}"
        ".left-out{color:#555;font-style:italic}"
        "table.numbers{border-collapse:collapse}table.numbers td,table.numbers th"
        "{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}"
        "table.numbers td:first-child{text-align:left}"
        "figure{margin:1em 0}</style></head><body>",
        f"<h1>Release {html.escape(e.release_id)} of {html.escape(e.dataset)}</h1>",
        f"<p class='internal'>{html.escape(INTERNAL)}</p>",
        f"<p class='verdict'><b>Verdict:</b> {html.escape(e.verdict or release_facts(e))}</p>",
        f"<p class='basis'><b>Not a basis for publishing:</b> {html.escape(STEWARD_BASIS)}.</p>",
        *[f"<p class='warning'>{html.escape(w)}</p>" for w in e.warnings],
        *_accuracy_section(e),
        *[_figure(name, caption) for name, caption in plots if name.startswith("accuracy")],
        "<h2>The release</h2>",
        f"<p class='facts'>{html.escape(release_facts(e))}</p>",
        f"<p><b>Mechanism</b> {html.escape(e.mechanism)} — <b>guarantee</b> "
        f"{html.escape(e.guarantee)}</p>",
        (f"<p class='internal'><b>Warning:</b> {html.escape(e.unit_warning)}</p>"
         if e.unit_warning else ""),
        f"<p><b>Input:</b> {html.escape(e.input_note or f'{e.input_rows:,} input rows')}; "
        f"<b>released:</b> {e.released_rows:,} rows"
        + ("" if e.for_publication else " — <b>NOT FOR PUBLICATION (fixed seed)</b>") + "</p>",
        "<h2>Privacy budget</h2>", _table(pd.DataFrame(e.budget_steps)) if e.budget_steps
        else "<p>No privacy budget: this mechanism makes no differential-privacy claim.</p>",
    ]
    if e.information_loss:
        parts += ["<h2>Information loss</h2>", _table(e.information_loss)]
    else:
        parts += ["<h2>Information loss</h2>", _left_out(e, "information loss")]
    if e.queries is not None:
        parts += ["<h2>Analysis queries (IPA paper)</h2>", _queries_explained(e),
                  _table(e.query_summary), _table(e.queries)]
    else:
        parts += ["<h2>Analysis queries (IPA paper)</h2>", _left_out(e, "analysis queries")]
    parts.append("<h2>Classification</h2>")
    if e.classification:
        flat = {f"{name} {metric}": value for name, scores in e.classification.items()
                for metric, value in scores.items()}
        parts += [f"<p>{html.escape(e.classification_note)}</p>", _table(flat)]
        if e.information_gain is not None:
            parts.append(_table(e.information_gain))
    else:
        parts.append(_left_out(e, "classification"))
    parts += ["<h2>Re-identification risk</h2>", *_risk_section(e)]
    if e.frequency_attack:
        parts += ["<h3>Frequency-matching attack on the pseudonyms</h3>",
                  _table(e.frequency_attack)]
    parts.append("<h2>Information loss per lattice height</h2>")
    if e.il_by_height is not None:
        parts.append(_table(e.il_by_height))
    else:
        parts.append(_left_out(e, "information loss per lattice height"))
    rest = [(name, caption) for name, caption in plots if not name.startswith("accuracy")]
    if rest:
        parts.append("<h2>Plots</h2>")
        parts += [_figure(name, caption) for name, caption in rest]
    parts.append("</body></html>")
    return "\n".join(parts)


def _figure(name: str, caption: str) -> str:
    return (f"<figure><img src='plots/{html.escape(name)}' alt='{html.escape(caption)}'>"
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def _risk_section(e: Evaluation) -> list[str]:
    """Figures that fit the release: matches of unique records for synthetic rows, class sizes
    and prosecutor risk for real rows."""
    if e.risk_synthetic:
        r = e.risk_synthetic
        return [f"<p>Synthetic rows describe no patient, so class sizes and prosecutor risk "
                f"do not apply. What can go wrong is a synthetic row that reproduces a real "
                f"record that is unique in the input: <b>"
                f"{plain(100 * r['unique_match_share'])} %</b> of the {r['released_rows']:,} "
                f"released rows do, against <b>{plain(100 * r['baseline_share'])} %</b> "
                f"expected of rows drawn independently from the input's 1-way marginals (a "
                f"release that knows no combination). The input has "
                f"{r['unique_input_records']:,} unique records.</p>", _table(
                    pd.DataFrame({"measure": list(r), "value": list(r.values())}))]
    return [_table(pd.DataFrame({"release": e.risk_release, "input": e.risk_input})
                   .reset_index(names="measure"))]


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
        plots = _plot_accuracy(evaluation, plots_dir) + plots
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
