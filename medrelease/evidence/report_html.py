"""One HTML page per release evaluation, with plots (matplotlib, PNG files beside the page).

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

INTERNAL = ("INTERNAL — this page compares the release with the raw input. It is evidence for "
            "the data steward and must not be published with the release.")


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plot_queries(evaluation: Evaluation, folder: Path) -> list[tuple[str, str]]:
    plt = _figure()
    side = evaluation.queries
    out = []
    for metric, title, ylabel in (
        ("stays", "Stays per 5-year age group", "stays"),
        ("avg_los", "Average length of stay per 5-year age group", "days"),
    ):
        sexes = list(dict.fromkeys(side["sex"]))
        fig, axes = plt.subplots(1, len(sexes), figsize=(5 * len(sexes), 3.6), sharey=True,
                                 squeeze=False)
        for ax, sex in zip(axes[0], sexes, strict=True):
            part = side[side["sex"] == sex]
            ax.plot(part["age_group"], part[f"original_{metric}"], marker="o", label="original")
            ax.plot(part["age_group"], part[f"released_{metric}"], marker="s",
                    linestyle="--", label="release")
            ax.set_title(f"sex = {sex}")
            ax.set_xlabel("age group (start)")
            ax.set_ylabel(ylabel)
            ax.legend()
        fig.suptitle(f"{title} — diagnosis {evaluation.query_summary['diagnosis']}, "
                     "non-surgical")
        fig.tight_layout()
        name = f"query_{metric}.png"
        fig.savefig(folder / name, dpi=90)
        plt.close(fig)
        out.append((name, f"{title}: original (solid) vs release (dashed)"))
    return out


def _plot_il(evaluation: Evaluation, folder: Path) -> list[tuple[str, str]]:
    plt = _figure()
    frame = evaluation.il_by_height
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for part in [c for c in ("il", "ncp", "emd", "rate") if c in frame.columns]:
        ax.plot(frame["height"], frame[part], marker="o", label=part.upper())
    ax.set_xlabel("lattice node height (sum of generalization levels)")
    ax.set_ylabel("mean information loss")
    ax.set_title("Information loss per lattice height (cf. IPA paper Fig. 8)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(folder / "il_by_height.png", dpi=90)
    plt.close(fig)
    return [("il_by_height.png", "Mean IL and its parts over the lattice nodes of each height")]


def _plot_budget(evaluation: Evaluation, folder: Path) -> list[tuple[str, str]]:
    steps = [s for s in evaluation.budget_steps if s["epsilon"] > 0]
    if not steps:
        return []
    plt = _figure()
    fig, ax = plt.subplots(figsize=(6, 0.6 + 0.5 * len(steps)))
    ax.barh([s["step"] for s in steps], [s["epsilon"] for s in steps], color="#4c72b0")
    ax.invert_yaxis()
    ax.set_xlabel("epsilon")
    ax.set_title(f"Budget split (total {sum(s['epsilon'] for s in steps):.4g})")
    fig.tight_layout()
    fig.savefig(folder / "budget.png", dpi=90)
    plt.close(fig)
    return [("budget.png", "How the release's epsilon is split over its steps")]


def _plot_classification(evaluation: Evaluation, folder: Path) -> list[tuple[str, str]]:
    plt = _figure()
    names = list(evaluation.classification)
    values = [evaluation.classification[n]["accuracy"] * 100 for n in names]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.bar(names, values, color=["#999999"] + ["#4c72b0"] * (len(names) - 1))
    ax.set_ylabel("accuracy %")
    ax.set_ylim(0, 100)
    ax.set_title("Classification: LA, BA (raw) and CA (release)")
    fig.tight_layout()
    fig.savefig(folder / "classification.png", dpi=90)
    plt.close(fig)
    out = [("classification.png", "Accuracy of a decision tree and a random forest")]
    if evaluation.information_gain is not None:
        gain = evaluation.information_gain
        fig, ax = plt.subplots(figsize=(6, 3.2))
        x = range(len(gain))
        ax.bar([i - 0.2 for i in x], gain["before"], width=0.4, label="input")
        ax.bar([i + 0.2 for i in x], gain["after"], width=0.4, label="release")
        ax.set_xticks(list(x), gain["attribute"], rotation=30, ha="right")
        ax.set_ylabel("bits")
        ax.set_title("Information gain on the class per attribute")
        ax.legend()
        fig.tight_layout()
        fig.savefig(folder / "information_gain.png", dpi=90)
        plt.close(fig)
        out.append(("information_gain.png", "Information gain before and after release"))
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
