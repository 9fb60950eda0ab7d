"""Reproduce the seed papers' tables: IL over eps (IPA), DiffGen accuracy, seed 004 classification.

Writes ``results.md`` and plots into a results folder (default ``var/results/<timestamp>``):

* IL of ipa, ipa-paper, kanon (k = 10) and histogram for eps in {0.1, 0.25, 0.5, 1, 2}, the mean
  of ``--runs`` runs, on NPS-like data (``--rows``) and on Adult (occupation kept raw);
* DiffGen classification accuracy on Adult over eps and h (BA, LA, CA; paper: BA 85.3 %,
  LA 75.5 %, BA - CA about 3 % at eps = 1, h = 10);
* seed 004 on Adult: random forest accuracy and geometric mean of per-class recall on the raw
  table, on its pseudonymization (AES) and on Mondrian (k = 10), each on a 70/30 split of
  the table itself (paper: raw 75.37 %, Mondrian about 68 %, AES 73.57 %).

    python benchmarks/reproduce_papers.py [--runs 10] [--rows 100000] [--diffgen-runs 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

EPSILONS = [0.1, 0.25, 0.5, 1.0, 2.0]
PAPER_IL = {"ipa": 0.28, "kanon": 0.43, "histogram": 0.69}  # IPA paper, NPS, eps = 1


def il_over_eps(dataset: str, rows: int, runs: int) -> list[dict]:
    from il_comparison import counts_of, mean_il

    counts = counts_of(dataset, rows)
    out = []
    for name in ("ipa", "ipa-paper", "histogram"):
        for eps in EPSILONS:
            mean, released = mean_il(counts, name, {"epsilon": eps}, runs)
            out.append({"dataset": dataset, "mechanism": name, "eps": eps, **mean,
                        "rows_out": released})
            print(f"  {dataset} {name:>9} eps {eps:<4} IL {mean['il']:.3f}", flush=True)
    mean, released = mean_il(counts, "kanon", {"k": 10, "max_suppression": 0.02}, 1)
    for eps in EPSILONS:  # no eps: the same table at every eps
        out.append({"dataset": dataset, "mechanism": "kanon", "eps": eps, **mean,
                    "rows_out": released})
    return out


def diffgen_grid(runs: int, hs: list[int]) -> list[dict]:
    from medrelease.data.config import find_config
    from medrelease.data.input_schema import validate_input
    from medrelease.evidence.classification import diffgen_heldout, split
    from medrelease.storage.io import read_input

    config = find_config("adult")
    frame = validate_input(read_input(config), config)
    train, test = split(frame, 0.3, seed=0)
    out = []
    for eps in EPSILONS:
        for h in hs:
            accs = [diffgen_heldout(train, test, config,
                                    {"epsilon": eps, "specializations": h}, seed=run)[0]
                    for run in range(runs)]
            out.append({"eps": eps, "h": h, "BA": accs[0].baseline * 100,
                        "LA": accs[0].lower_bound * 100,
                        "CA": statistics.mean(a.release for a in accs) * 100})
            print(f"  diffgen eps {eps:<4} h {h:<3} CA {out[-1]['CA']:.1f}", flush=True)
    return out


def seed004_classification() -> list[dict]:
    import yaml

    from medrelease.data.config import config_from_dict, find_config
    from medrelease.data.input_schema import validate_input
    from medrelease.evidence.classification import model_scores, split
    from medrelease.release import release
    from medrelease.storage.io import read_input

    config = find_config("adult")
    frame = validate_input(read_input(config), config)
    label, predictors = config.class_columns[0], config.dimensions
    raw = yaml.safe_load((ROOT / "datasets/adult/dataset.yaml").read_text(encoding="utf-8"))
    raw["columns"][label] = {"role": "informative"}  # Mondrian keeps the class as a value
    mondrian_config = config_from_dict(raw, (ROOT / "datasets/adult").resolve())
    key = __import__("os").urandom(32)   # a throw-away key: never stored
    tables = {
        "raw": frame,
        "pseudonymize (AES)": release(frame, config, mechanism="pseudonymize",
                                      params={"method": "aes"}, key=key).table,
        "mondrian (k = 10)": release(frame, mondrian_config, mechanism="mondrian",
                                     params={"k": 10}).table,
    }
    out = []
    for name, table in tables.items():
        train, test = split(table, 0.3, seed=0)
        scores = model_scores(train[predictors], train[label], test[predictors], test[label],
                              kind="forest")
        out.append({"table": name, "accuracy": scores["accuracy"] * 100,
                    "gmean_recall": scores["gmean_recall"] * 100})
        print(f"  seed 004 {name}: accuracy {out[-1]['accuracy']:.1f}", flush=True)
    return out


def plots(il: list[dict], diffgen: list[dict], folder: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    frame = pd.DataFrame(il)
    names = []
    for dataset, part in frame.groupby("dataset"):
        fig, ax = plt.subplots(figsize=(6, 3.8))
        for mechanism, rows in part.groupby("mechanism"):
            ax.plot(rows["eps"], rows["il"], marker="o", label=mechanism)
        ax.set_xscale("log")
        ax.set_xlabel("epsilon")
        ax.set_ylabel("information loss (mean)")
        ax.set_title(f"IL over epsilon — {dataset}")
        ax.legend()
        fig.tight_layout()
        name = f"il_{dataset}.png"
        fig.savefig(folder / name, dpi=90)
        plt.close(fig)
        names.append(name)
    grid = pd.DataFrame(diffgen)
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for h, rows in grid.groupby("h"):
        ax.plot(rows["eps"], rows["CA"], marker="o", label=f"CA, h = {h}")
    ax.axhline(grid["BA"].iloc[0], color="green", linestyle="--", label="BA")
    ax.axhline(grid["LA"].iloc[0], color="grey", linestyle=":", label="LA")
    ax.set_xscale("log")
    ax.set_xlabel("epsilon")
    ax.set_ylabel("accuracy %")
    ax.set_title("DiffGen on Adult")
    ax.legend()
    fig.tight_layout()
    fig.savefig(folder / "diffgen_adult.png", dpi=90)
    plt.close(fig)
    return [*names, "diffgen_adult.png"]


def md_table(frame, index: bool = True, digits: int = 3) -> str:
    """A pandas frame as a GitHub markdown table (no extra dependency)."""
    frame = frame.reset_index() if index else frame
    cells = [[f"{v:.{digits}f}" if isinstance(v, float) else str(v) for v in row]
             for row in frame.itertuples(index=False)]
    header = [str(c) for c in frame.columns]
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(row) + " |" for row in cells])


def markdown(il: list[dict], diffgen: list[dict], seed004: list[dict], images: list[str],
             args: argparse.Namespace, seconds: float) -> str:
    import pandas as pd

    lines = [f"# Paper reproduction ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC)", "",
             f"{args.runs} runs per IL point, NPS-like {args.rows:,} rows, "
             f"{args.diffgen_runs} DiffGen runs per point; {seconds:.0f} s.", "",
             "## Information loss over epsilon (IPA paper Fig. 6; paper at eps = 1 on NPS: "
             "IPA 0.28, k-anonymity 0.43, histogram 0.69)", ""]
    frame = pd.DataFrame(il)
    for dataset, part in frame.groupby("dataset"):
        table = part.pivot(index="mechanism", columns="eps", values="il")
        lines += [f"### {dataset}", "", md_table(table), ""]
    grid = pd.DataFrame(diffgen)
    lines += ["## DiffGen on Adult: CA % (BA "
              f"{grid['BA'].iloc[0]:.1f} %, LA {grid['LA'].iloc[0]:.1f} %; paper BA 85.3 %, "
              "LA 75.5 %, BA - CA about 3 % at eps = 1, h = 10)", "",
              md_table(grid.pivot(index="h", columns="eps", values="CA"), digits=1), "",
              "## Seed 004 on Adult: random forest (paper: raw 75.37 %, Mondrian about 68 %, "
              "AES 73.57 %)", "", md_table(pd.DataFrame(seed004), index=False, digits=1),
              "", "## Plots", ""]
    lines += [f"![{name}]({name})" for name in images]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--diffgen-runs", type=int, default=3)
    parser.add_argument("--h", type=int, nargs="*", default=[5, 10, 15])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    folder = args.out or ROOT / "var" / "results" / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    print("IL over eps", flush=True)
    il = il_over_eps("nps", args.rows, args.runs) + il_over_eps("adult", args.rows, args.runs)
    print("DiffGen over eps and h", flush=True)
    diffgen = diffgen_grid(args.diffgen_runs, args.h)
    print("seed 004 classification", flush=True)
    seed004 = seed004_classification()
    images = plots(il, diffgen, folder)
    text = markdown(il, diffgen, seed004, images, args, time.perf_counter() - started)
    (folder / "results.md").write_text(text, encoding="utf-8")
    print(text)
    print(f"written to {folder}")


if __name__ == "__main__":
    main()
