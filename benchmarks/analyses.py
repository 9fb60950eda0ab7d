"""Declared analyses in ``aim`` (issue 53), measured against ``aim`` as it is at git HEAD.

A dataset config may declare ``analyses:`` (column sets, optionally at taxonomy levels); ``aim``
then measures each one first with a share of its budget (``analyses_share``, 0.3) and never
merges a column an analysis reads at its leaves. This script releases four tables with three
variants, seed by seed, at eps 0.5 / 1 / 2:

* ``today``: the committed code (a ``git worktree`` of HEAD, ``--baseline``), nothing declared;
* ``new, none``: the working tree, the same config (nothing declared) — its code copied when
  the run starts (``medrelease``, ``schemas``, ``taxonomies``; the fingerprint is printed), so
  that edits made meanwhile reach no release;
* ``new, declared``: the working tree, the table's analyses declared.

Tables: Adult (``datasets/adult-ipa``), the NPS-like sample (``datasets/nps-sample``), the
MIMIC-III demo (``medrelease prepare-mimic``; an ``aim`` config: the class
``died_in_hospital`` as a dimension, the ICD-9 code set dropped, patient level m = 2) and the
generated cohort (``medrelease.data.cohort``: 8,000 rows, seed 1; a treatment effect on the
outcome and a death rate rising with the creatinine band). Each config is copied into a
scratch folder with its taxonomy and domain files beside it; the ``today`` configs carry no
``analyses:`` / ``impossible:`` / ``expected_rows:`` (HEAD's config model refuses them), and
``impossible:`` is declared in no variant.

Each release runs in a fresh process (``--worker``; the tree is chosen by ``PYTHONPATH`` and
the working directory, one process at a time) through ``medrelease.release.release`` — the
privacy unit's bound, the aggregation, the plan from the config's public facts and ``aim``'s
rounds and sampling, as ``medrelease release`` runs them — and measures, against the whole
validated input (every row, before the unit's bound):

* **declared-analysis error**: per declared analysis, the TVD between the input's and the
  release's joint distribution at the analysis's levels (leaf labels mapped up the column's
  taxonomy), averaged over the table's analyses — for every variant, also those that did not
  declare them; for a 2-column analysis also the largest absolute difference, input against
  release, of the rate of a value of the second column within a group of the first (groups
  with at least ``RATE_MIN_ROWS`` input rows that the release has rows for);
* **workload error**: the evaluation's mean TVD of every 2-way and 3-way marginal
  (``medrelease.evidence.accuracy.workload_accuracy``, the same code in both trees);
* the release's wall time (aggregation, rounds and sampling; reading the CSV not included).

Raw results go to ``--out`` (JSON lines; a rerun skips what is there), the tables to stdout.

    git -C /work/main worktree add /work/baseline HEAD     # once (reused when it exists)
    python benchmarks/analyses.py                          # 4 tables x 3 eps x 3 variants x 5
    python benchmarks/analyses.py --tables cohort --eps 1 --seeds 2
    python benchmarks/analyses.py --report                 # the tables from --out only
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BASELINE = Path("/work/baseline")
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "analyses.jsonl"
MIMIC_SOURCE = ROOT.parent / "shared" / "data" / "mimic-iii-demo"
RATE_MIN_ROWS = 30  # as the evaluation's rate tables (medrelease/evidence/accuracy.py)
EPSILONS = (0.5, 1.0, 2.0)
VARIANTS = ("today", "new, none", "new, declared")
TIMEOUT = 1800  # seconds a release may take before the run gives up on it

Analysis = dict[str, Any]  # {"columns": [...], "levels": {column: level}}


@dataclass(frozen=True)
class Table:
    """A benchmark table: its name, how its plain config is made and what it declares."""

    name: str
    title: str
    analyses: tuple[Analysis, ...]
    build: Callable[[Path], tuple[dict[str, Any], Path]]  # scratch -> (spec, source folder)


def _bundled(dataset: str) -> Callable[[Path], tuple[dict[str, Any], Path]]:
    def build(scratch: Path) -> tuple[dict[str, Any], Path]:
        import yaml

        source = ROOT / "datasets" / dataset
        return yaml.safe_load((source / "dataset.yaml").read_text()), source
    return build


def _mimic(scratch: Path) -> tuple[dict[str, Any], Path]:
    """The bundled mimic-demo config as ``aim`` takes it (see the module's docstring)."""
    import yaml

    source = ROOT / "datasets" / "mimic-demo"
    extract = scratch / "mimic" / "admissions.csv"
    extract.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(Path(sys.executable).with_name("medrelease")), "prepare-mimic",
                    "--source", str(MIMIC_SOURCE), "--output", str(extract)],
                   cwd=ROOT, check=True, capture_output=True, text=True)
    (extract.parent / "died_in_hospital.csv").write_text("no;*\nyes;*\n")
    spec = yaml.safe_load((source / "dataset.yaml").read_text())
    spec["name"] = "mimic-aim"
    spec["input"]["path"] = str(extract)
    spec["columns"]["icd9_codes"] = {"role": "drop"}
    spec["columns"]["died_in_hospital"] = {
        "role": "dimension", "taxonomy": str(extract.parent / "died_in_hospital.csv")}
    spec["mechanism"] = {"name": "aim", "params": {"epsilon": 1.0}}
    return spec, source


def _cohort(scratch: Path) -> tuple[dict[str, Any], Path]:
    """``generate_cohort(8000, seed=1)`` written by ``write_cohort_dataset`` without analyses
    or impossible combinations (``write_configs`` adds the analyses to the declared config)."""
    import yaml

    sys.path.insert(0, str(ROOT))
    from medrelease.data.cohort import generate_cohort, write_cohort_dataset

    folder = scratch / "cohort-source"
    path = write_cohort_dataset(folder, generate_cohort(8000, seed=1), analyses=False,
                                impossible=False)
    spec = yaml.safe_load(path.read_text())
    spec.pop("expected_rows", None)
    return spec, folder


TABLES = {
    "adult": Table("adult", "Adult (adult-ipa, 30,162 rows)", (
        {"columns": ["education", "occupation"], "levels": {}},
        {"columns": ["sex", "occupation"], "levels": {}},
        {"columns": ["age", "marital-status"], "levels": {"age": 1}},
    ), _bundled("adult-ipa")),
    "nps": Table("nps", "NPS-like sample (nps-sample, 20,000 rows)", (
        {"columns": ["age", "diagnosis"], "levels": {"age": 1, "diagnosis": 1}},
        {"columns": ["surgery", "sex"], "levels": {}},
        {"columns": ["surgery", "length_of_stay"], "levels": {"length_of_stay": 1}},
    ), _bundled("nps-sample")),
    "mimic": Table("mimic", "MIMIC-III demo (129 admissions, 100 patients, m = 2)", (
        {"columns": ["admission_type", "died_in_hospital"], "levels": {}},
        {"columns": ["insurance", "died_in_hospital"], "levels": {}},
    ), _mimic),
    "cohort": Table("cohort", "generated cohort (8,000 rows, seed 1)", (
        {"columns": ["rx", "outcome"], "levels": {}},
        {"columns": ["creat", "death"], "levels": {}},
    ), _cohort),
}


# --- configs ---------------------------------------------------------------------------------

def write_configs(table: Table, scratch: Path) -> dict[str, Path]:
    """The table's two configs, ``plain`` (nothing declared: ``today`` and ``new, none``) and
    ``declared``, each in a folder of its own holding its taxonomy and domain files and naming
    the extract by its absolute path."""
    import yaml

    spec, source = table.build(scratch)
    for key in ("analyses", "impossible", "expected_rows"):
        spec.pop(key, None)
    spec["input"]["path"] = str((source / spec["input"]["path"]).resolve())
    paths = {}
    for kind in ("plain", "declared"):
        folder = scratch / table.name / kind
        folder.mkdir(parents=True, exist_ok=True)
        variant = json.loads(json.dumps(spec))
        for column in variant["columns"].values():
            for key in ("taxonomy", "domain"):
                if column.get(key):
                    file = (source / column[key]).resolve()
                    shutil.copyfile(file, folder / file.name)
                    column[key] = file.name
        if kind == "declared":
            variant["analyses"] = [{"columns": a["columns"], "levels": a["levels"]}
                                   if a["levels"] else list(a["columns"])
                                   for a in table.analyses]
        (folder / "dataset.yaml").write_text(yaml.safe_dump(variant, sort_keys=False))
        paths[kind] = folder / "dataset.yaml"
    return paths


# --- the worker (runs in either tree) ---------------------------------------------------------

def _level_labels(config: Any, column: str, values: pd.Series, level: int) -> np.ndarray:
    """Each value's label at ``level`` of its column's taxonomy (the value's text for a column
    without one: the informative column with a domain only)."""
    taxonomy = (config.taxonomies[column] if column in config.dimensions
                else config.informative_taxonomy)
    if taxonomy is None:
        if level:
            raise SystemExit(f"{column} has no taxonomy, hence no level {level}")
        return values.astype(str).to_numpy(dtype=object)
    leaves = taxonomy.encode(values)
    return taxonomy.labels(level)[taxonomy.level_codes[level][leaves]]


def _rates(first_in: np.ndarray, second_in: np.ndarray, first_out: np.ndarray,
           second_out: np.ndarray) -> dict[str, Any]:
    """The rate of each value of the second column within each group of the first, input
    against release, on the groups with ``RATE_MIN_ROWS`` input rows the release has rows for:
    the largest absolute difference, and (a two-valued second column) the rate of its last
    value per group."""
    table_in = pd.crosstab(first_in, second_in)
    table_out = pd.crosstab(first_out, second_out)
    groups = [g for g in table_in.index[table_in.sum(axis=1) >= RATE_MIN_ROWS]
              if g in table_out.index]
    values = sorted(set(table_in.columns) | set(table_out.columns))
    if not groups:
        return {"max_rate_diff": None, "groups": 0}
    rate_in = table_in.reindex(index=groups, columns=values, fill_value=0)
    rate_out = table_out.reindex(index=groups, columns=values, fill_value=0)
    rate_in = rate_in.div(rate_in.sum(axis=1), axis=0)
    rate_out = rate_out.div(rate_out.sum(axis=1), axis=0)
    result: dict[str, Any] = {
        "max_rate_diff": float((rate_in - rate_out).abs().to_numpy().max()),
        "groups": len(groups)}
    if len(table_in.columns) == 2:
        value = sorted(table_in.columns)[-1]
        result["rate_of"] = str(value)
        result["rates"] = {str(g): [float(rate_in.loc[g, value]), float(rate_out.loc[g, value])]
                           for g in groups}
    return result


def measure_analysis(config: Any, frame: pd.DataFrame, released: pd.DataFrame,
                     analysis: Analysis) -> dict[str, Any]:
    """The analysis's joint TVD at its levels (and its rates for two columns)."""
    columns, levels = analysis["columns"], analysis["levels"]
    labels_in = [_level_labels(config, c, frame[c], levels.get(c, 0)) for c in columns]
    labels_out = [_level_labels(config, c, released[c], levels.get(c, 0)) for c in columns]
    joint_in = pd.DataFrame(dict(enumerate(labels_in))).value_counts(normalize=True)
    joint_out = pd.DataFrame(dict(enumerate(labels_out))).value_counts(normalize=True)
    tvd = 0.5 * float(joint_in.sub(joint_out, fill_value=0.0).abs().sum())
    result = {"analysis": analysis_name(analysis), "tvd": tvd}
    if len(columns) == 2:
        result.update(_rates(labels_in[0], labels_in[1], labels_out[0], labels_out[1]))
    return result


def worker(job: dict[str, Any]) -> dict[str, Any]:
    """One release of ``job["config"]`` at ``job["epsilon"]``, ``job["seed"]`` in the tree this
    process imports, with its measures."""
    import medrelease.release as engine
    from medrelease.data.config import load_config
    from medrelease.data.input_schema import validate_input
    from medrelease.evidence.accuracy import workload_accuracy
    from medrelease.storage.io import read_input

    if not Path(engine.__file__).resolve().is_relative_to(Path(job["tree"]).resolve()):
        raise SystemExit(f"imported {engine.__file__}, not the tree {job['tree']}")
    config = load_config(job["config"])
    frame = validate_input(read_input(config), config)
    started = time.perf_counter()
    result = engine.release(frame, config, "aim", {"epsilon": job["epsilon"]}, seed=job["seed"])
    seconds = time.perf_counter() - started
    released = result.table.to_frame() if hasattr(result.table, "to_frame") else result.table
    workload, _ = workload_accuracy(frame, None, released, config)
    if workload is None:
        raise SystemExit("the workload yardstick does not apply")
    return {"seconds": seconds, "rows": len(released), "input_rows": len(frame),
            "tvd2": workload.mean(2), "tvd3": workload.mean(3),
            "analyses": [measure_analysis(config, frame, released, a) for a in job["analyses"]]}


# --- the run ----------------------------------------------------------------------------------

def analysis_name(analysis: Analysis) -> str:
    return " × ".join(c + (f" (level {analysis['levels'][c]})"
                           if analysis["levels"].get(c) else "") for c in analysis["columns"])


def run_job(tree: Path, job: dict[str, Any]) -> dict[str, Any]:
    """``job`` in a fresh process importing ``tree``; its last stdout line is the result."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker",
                           json.dumps({**job, "tree": str(tree)})], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT)
    if done.returncode != 0:
        raise RuntimeError(f"worker failed ({done.returncode}): {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def snapshot_tree(dest: Path) -> str:
    """A copy of the working tree's code (``medrelease``, ``schemas``, ``taxonomies``), so that
    edits made by others while the benchmark runs do not reach half of its releases; returns a
    fingerprint of its Python files (sha256, 12 hex digits)."""
    digest = hashlib.sha256()
    for part in ("medrelease", "schemas", "taxonomies"):
        shutil.copytree(ROOT / part, dest / part,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for file in sorted((dest / part).rglob("*.py")):
            digest.update(str(file.relative_to(dest)).encode() + b"\0" + file.read_bytes())
    shutil.copyfile(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return digest.hexdigest()[:12]


def ensure_baseline(baseline: Path) -> None:
    if (baseline / "medrelease" / "release.py").is_file():
        return
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", str(baseline), "HEAD"],
                   check=True)


def git_head(tree: Path) -> str:
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()


def key_of(row: dict[str, Any]) -> tuple[str, float, str, int]:
    return row["table"], float(row["epsilon"]), row["variant"], int(row["seed"])


def read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run(args: argparse.Namespace) -> None:
    ensure_baseline(args.baseline)
    done = {key_of(r) for r in read_rows(args.out)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="medrelease-analyses-"))
    new_tree = scratch / "working-tree"
    print(f"working tree copied to {new_tree}: Python files' sha256 "
          f"{snapshot_tree(new_tree)}; today: {args.baseline} at "
          f"{git_head(args.baseline)}", flush=True)
    configs: dict[str, dict[str, Path]] = {}
    for name in args.tables:
        try:
            configs[name] = write_configs(TABLES[name], scratch)
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"{name}: cannot be prepared, left out ({exc})", file=sys.stderr)
    started = time.perf_counter()
    for seed in range(args.seeds):
        for name, paths in configs.items():
            table = TABLES[name]
            for eps in args.eps:
                for variant in VARIANTS:
                    key = (name, float(eps), variant, seed)
                    if key in done:
                        continue
                    tree = args.baseline if variant == "today" else new_tree
                    config = paths["declared" if variant == "new, declared" else "plain"]
                    job = {"config": str(config), "epsilon": eps, "seed": 1000 + seed,
                           "analyses": list(table.analyses)}
                    try:
                        result = run_job(tree, job)
                    except (RuntimeError, subprocess.TimeoutExpired) as exc:
                        print(f"{name} eps {eps:g} {variant} seed {seed}: {exc}",
                              file=sys.stderr)
                        continue
                    row = {"table": name, "epsilon": eps, "variant": variant, "seed": seed,
                           **result}
                    with args.out.open("a") as handle:
                        handle.write(json.dumps(row) + "\n")
                    print(f"[{time.perf_counter() - started:7.0f} s] {name} eps {eps:g} "
                          f"{variant:13s} seed {seed}: analyses "
                          f"{np.mean([a['tvd'] for a in result['analyses']]):.4f} "
                          f"workload {result['tvd2']:.4f} / {result['tvd3']:.4f} "
                          f"{result['seconds']:.1f} s", flush=True)
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"\nrun: {time.perf_counter() - started:.0f} s", flush=True)


# --- the report -------------------------------------------------------------------------------

def _spread(values: Iterable[float | None], digits: int = 4) -> str:
    """'mean (min-max)' of the values (none: '—')."""
    kept = [v for v in values if v is not None]
    if not kept:
        return "—"
    if len(kept) == 1:
        return f"{kept[0]:.{digits}f}"
    return f"{np.mean(kept):.{digits}f} ({min(kept):.{digits}f}-{max(kept):.{digits}f})"


def _mean_analysis(row: dict[str, Any], key: str) -> float | None:
    values = [a[key] for a in row["analyses"] if a.get(key) is not None]
    return float(np.mean(values)) if values else None


def report(rows: list[dict[str, Any]]) -> str:
    """The markdown tables: per table, eps and variant; the ratios; per analysis; the rates
    of the two-valued analyses (the cohort's effects)."""
    out: list[str] = []
    tables = [t for t in TABLES if any(r["table"] == t for r in rows)]
    for name in tables:
        mine = [r for r in rows if r["table"] == name]
        seeds = len({r["seed"] for r in mine})
        out += [f"### {TABLES[name].title}", "",
                f"Declared: {'; '.join(analysis_name(a) for a in TABLES[name].analyses)}. "
                f"{seeds} seed(s) per cell: mean (min-max).", "",
                "| eps | variant | declared-analysis TVD | largest rate difference | "
                "workload 2-way | workload 3-way | seconds |",
                "|---|---|---|---|---|---|---|"]
        for eps in sorted({float(r["epsilon"]) for r in mine}):
            for variant in VARIANTS:
                cell = [r for r in mine if float(r["epsilon"]) == eps and r["variant"] == variant]
                if not cell:
                    continue
                out.append(
                    f"| {eps:g} | {variant} | "
                    f"{_spread(_mean_analysis(r, 'tvd') for r in cell)} | "
                    f"{_spread((_mean_analysis(r, 'max_rate_diff') for r in cell), 3)} | "
                    f"{_spread(r['tvd2'] for r in cell)} | {_spread(r['tvd3'] for r in cell)} | "
                    f"{_spread((r['seconds'] for r in cell), 1)} |")
        out.append("")
    out += ["### Ratios (means over seeds)", "",
            "| table | eps | declared-analysis TVD: declared / today | workload 2-way: new, "
            "none / today | workload 3-way: new, none / today | workload 2-way: declared / "
            "today | workload 3-way: declared / today |", "|---|---|---|---|---|---|---|"]
    for name in tables:
        for eps in sorted({float(r["epsilon"]) for r in rows if r["table"] == name}):
            def mean(variant: str, key: str, name: str = name, eps: float = eps) -> float:
                cell = [r for r in rows if r["table"] == name and float(r["epsilon"]) == eps
                        and r["variant"] == variant]
                values = [_mean_analysis(r, "tvd") if key == "analysis" else r[key]
                          for r in cell]
                return float(np.mean(values)) if values else float("nan")

            today = {k: mean("today", k) for k in ("analysis", "tvd2", "tvd3")}
            out.append(
                f"| {name} | {eps:g} | {mean('new, declared', 'analysis') / today['analysis']:.2f}"
                f" | {mean('new, none', 'tvd2') / today['tvd2']:.3f} | "
                f"{mean('new, none', 'tvd3') / today['tvd3']:.3f} | "
                f"{mean('new, declared', 'tvd2') / today['tvd2']:.3f} | "
                f"{mean('new, declared', 'tvd3') / today['tvd3']:.3f} |")
    out += ["", "### Each declared analysis's TVD (mean over seeds)", "",
            "| table | analysis | eps | today | new, none | new, declared |",
            "|---|---|---|---|---|---|"]
    for name in tables:
        for index, analysis in enumerate(TABLES[name].analyses):
            for eps in sorted({float(r["epsilon"]) for r in rows if r["table"] == name}):
                cells = []
                for variant in VARIANTS:
                    values = [r["analyses"][index]["tvd"] for r in rows
                              if r["table"] == name and float(r["epsilon"]) == eps
                              and r["variant"] == variant]
                    cells.append(f"{np.mean(values):.4f}" if values else "—")
                out.append(f"| {name} | {analysis_name(analysis)} | {eps:g} | "
                           + " | ".join(cells) + " |")
    out += ["", "### Rates of the two-valued analyses: input, then each variant's release "
            "(mean over seeds)", "",
            "| table | analysis | group | eps | input | today | new, none | new, declared |",
            "|---|---|---|---|---|---|---|---|"]
    for name in tables:
        for index, analysis in enumerate(TABLES[name].analyses):
            first = next((r["analyses"][index] for r in rows if r["table"] == name), {})
            if "rates" not in first:
                continue
            label = f"{analysis_name(analysis)}: rate of {first['rate_of']}"
            for eps in sorted({float(r["epsilon"]) for r in rows if r["table"] == name}):
                for group, (rate_in, _) in first["rates"].items():
                    cells = []
                    for variant in VARIANTS:
                        values = [r["analyses"][index]["rates"][group][1] for r in rows
                                  if r["table"] == name and float(r["epsilon"]) == eps
                                  and r["variant"] == variant
                                  and group in r["analyses"][index].get("rates", {})]
                        cells.append(_spread(values, 3))
                    out.append(f"| {name} | {label} | {group} | {eps:g} | {rate_in:.3f} | "
                               + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--tables", nargs="+", choices=list(TABLES), default=list(TABLES))
    parser.add_argument("--eps", nargs="+", type=float, default=list(EPSILONS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--baseline", type=Path, default=DEFAULT_BASELINE,
                        help="a git worktree of HEAD: aim as it is today")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--report", action="store_true", help="only the tables from --out")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    if not args.report:
        print(f"# {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores", flush=True)
        run(args)
    print(report([r for r in read_rows(args.out) if r["table"] in args.tables]))


if __name__ == "__main__":
    main()
