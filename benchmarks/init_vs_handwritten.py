"""Does a config drafted by ``medrelease init`` release as well as a hand-written one?

For each table (UCI Adult from ``../shared/data/adult``; the MIMIC-III demo extract written by
``medrelease prepare-mimic``) ``init`` drafts a config in a scratch dataset root, with no edit;
then the drafted config and the hand-written one (``datasets/adult-ipa``, ``datasets/mimic-demo``)
are each released through the real flow (``flows.release.release_flow``, ``evaluate=True``) with
the same mechanism, eps and seed, each in a process of its own with a scratch
``MEDRELEASE_HOME`` (own ledger: the two configs read one extract under different source ids).
The figure is the evaluation's 2-way workload error (``accuracy.workload.mean_2way``: mean TVD
over every 2-way marginal of the released columns, raw leaf domains). When the two configs
release different columns, the mean over the 2-way marginals of the columns both release is
shown as well (the evaluation lists every marginal by name).

    python benchmarks/init_vs_handwritten.py                      # ipa and aim, eps 1, both tables
    python benchmarks/init_vs_handwritten.py --tables adult --mechanisms aim
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
PYTHON = sys.executable

# table -> (CSV to draft from, hand-written config (or a function writing its variant),
# --informative, extra init options)
TABLES = {
    "adult": (SHARED / "data" / "adult" / "adult.csv", "adult-ipa", "occupation", []),
    "mimic": (ROOT / "var" / "mimic-demo" / "admissions.csv", "mimic_hand_variant",
              "died_in_hospital", []),
}


def mimic_hand_variant(datasets: Path) -> str:
    """``mimic-demo`` as ``ipa`` and ``aim`` accept it: its hand-written taxonomies, unit and
    nouns, with the set-valued ``icd9_codes`` dropped (neither mechanism releases item sets)
    and the class ``died_in_hospital`` as the informative column (its public values: no, yes;
    the drafted config makes the same column informative). ``mimic-demo`` as it is runs only
    ``diffgen``, which needs a class column ``init`` never drafts."""
    import yaml

    source = ROOT / "datasets" / "mimic-demo" / "dataset.yaml"
    spec = yaml.safe_load(source.read_text())
    folder = datasets / "mimic-hand"
    folder.mkdir(parents=True, exist_ok=True)
    spec["name"] = "mimic-hand"
    spec["input"]["path"] = str((source.parent / spec["input"]["path"]).resolve())
    for column in spec["columns"].values():
        if "taxonomy" in column:
            column["taxonomy"] = str((source.parent / column["taxonomy"]).resolve())
    spec["columns"]["icd9_codes"] = {"role": "drop"}
    spec["columns"]["died_in_hospital"] = {"role": "informative", "domain": "died.txt"}
    spec.pop("mechanism", None)
    (folder / "died.txt").write_text("no\nyes\n")
    (folder / "dataset.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return "mimic-hand"


def one_release(dataset: str, mechanism: str, eps: float, seed: int) -> dict:
    """Run in a child process: one release, its evaluation's workload figures."""
    from tasks.prefect_defaults import apply_prefect_defaults

    apply_prefect_defaults()
    os.environ["PREFECT_LOGGING_TO_API_ENABLED"] = "false"
    from flows.release import ReleaseRequest, release_flow

    started = time.perf_counter()
    result = release_flow(ReleaseRequest(dataset=dataset, mechanism=mechanism, epsilon=eps,
                                         seed=seed, evaluate=True))
    data = getattr(result, "data", result)
    if not isinstance(data, dict) or "path" not in data:
        return {"refused": str(getattr(result, "message", result))[:300]}
    found = sorted(Path(os.environ["MEDRELEASE_HOME"]).rglob("evaluation.json"))
    evaluation = json.loads(found[-1].read_text())
    workload = evaluation["accuracy"]["workload"]
    return {"mean_2way": workload["mean_2way"], "columns": workload["columns"],
            "marginals": workload["marginals"],
            "seconds": round(time.perf_counter() - started, 1)}


def _child(dataset: str, mechanism: str, eps: float, seed: int, scratch: Path,
           tag: str) -> dict:
    home = scratch / f"home-{tag}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MEDRELEASE_HOME": str(home),
           "MEDRELEASE_DATASETS": str(scratch / "datasets")}
    done = subprocess.run([PYTHON, __file__, "--one", dataset, mechanism, str(eps), str(seed)],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        return {"refused": f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def shared_mean(run: dict, shared: set[str]) -> float | None:
    """Mean TVD over the 2-way marginals whose columns both configs release."""
    import itertools

    from medrelease.evidence.workload import marginal_name

    names = {marginal_name(pair) for pair in itertools.combinations(run["columns"], 2)
             if set(pair) <= shared}
    values = [tvd for name, tvd in run["marginals"].items() if name in names]
    return sum(values) / len(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", nargs="+", default=list(TABLES), choices=list(TABLES))
    parser.add_argument("--mechanisms", nargs="+", default=["ipa", "aim"])
    parser.add_argument("--eps", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="medrelease-init-bench-"))
    rows = []
    try:
        for table in args.tables:
            csv, handwritten, informative, extra = TABLES[table]
            if not csv.is_file():
                print(f"{table}: {csv} missing (run `medrelease prepare-mimic` first)")
                continue
            drafted = f"{table}-init"
            if handwritten.endswith("_variant"):
                handwritten = globals()[handwritten](scratch / "datasets")
            env = {**os.environ, "PYTHONPATH": str(ROOT), "MEDRELEASE_HOME": str(scratch / "h"),
                   "MEDRELEASE_DATASETS": str(scratch / "datasets")}
            argv = ["medrelease", "init", str(csv), "--name", drafted, "--root",
                    str(scratch / "datasets"), "--informative", informative, *extra]
            init = subprocess.run([PYTHON, "-c", "import sys; from deployments.cli import main; "
                                   f"sys.argv = {argv!r}; main()"],
                                  capture_output=True, text=True, env=env, cwd=ROOT)
            if init.returncode != 0:
                print(f"{table}: init failed: {init.stdout[-1500:]}{init.stderr[-1500:]}")
                continue
            for mechanism in args.mechanisms:
                runs = {tag: _child(name, mechanism, args.eps, args.seed, scratch,
                                    f"{tag}-{table}-{mechanism}")
                        for tag, name in (("hand", handwritten), ("init", drafted))}
                rows.append((table, mechanism, runs))
                _print_row(table, mechanism, args.eps, runs)
    finally:
        if args.keep:
            print(f"scratch kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


def _print_row(table: str, mechanism: str, eps: float, runs: dict) -> None:
    hand, init = runs["hand"], runs["init"]
    if "refused" in hand or "refused" in init:
        print(f"| {table} | {mechanism} | {eps:g} | {hand.get('mean_2way', hand.get('refused'))}"
              f" | {init.get('mean_2way', init.get('refused'))} | - |", flush=True)
        return
    ratio = init["mean_2way"] / hand["mean_2way"]
    line = (f"| {table} | {mechanism} | {eps:g} | all columns | {hand['mean_2way']:.4f} | "
            f"{init['mean_2way']:.4f} | {ratio:.2f} | {hand['seconds']} / {init['seconds']} s |")
    print(line, flush=True)
    if set(hand["columns"]) != set(init["columns"]):
        shared = set(hand["columns"]) & set(init["columns"])
        a, b = shared_mean(hand, shared), shared_mean(init, shared)
        only_hand = sorted(set(hand["columns"]) - shared)
        only_init = sorted(set(init["columns"]) - shared)
        if a and b is not None:
            print(f"| {table} | {mechanism} | {eps:g} | shared {len(shared)} columns | {a:.4f} | "
                  f"{b:.4f} | {b / a:.2f} | only hand-written: {', '.join(only_hand) or '-'}; "
                  f"only drafted: {', '.join(only_init) or '-'} |", flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--one":
        print(json.dumps(one_release(sys.argv[2], sys.argv[3], float(sys.argv[4]),
                                     int(sys.argv[5]))))
    else:
        main()
