"""Flow benchmark: a release of the NPS-like table through the whole Prefect flow.

Generates the table (default 1,361,000 rows, the IPA paper's size) as CSV under
``var/bench/`` and a dataset config for it, then prints, in one run: the floor (DuckDB reading
the file and grouping it by the same columns), the project's input side, the engine alone, the
whole flow in this process (evaluation included) with its time per task and outside tasks, and
the CLI as a steward runs it (``medrelease release``, a fresh process): against a running
Prefect server (started here), until the release folder is published and until the command
returns with the evidence report, and with Prefect's ephemeral API — each as a ratio to the floor.

    python benchmarks/flow_bench.py [--rows 1361000] [--mechanism ipa] [--batch-size 64]
                                    [--no-evaluate] [--row-wise] [--no-cli]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

from medrelease.data.lattice import DEFAULT_BATCH_SIZE

ROOT = Path(__file__).resolve().parent.parent


def make_dataset(rows: int, folder: Path) -> Path:
    from medrelease.data.nps import generate_nps

    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"nps_{rows}.csv"
    if not data.exists():
        generate_nps(rows, seed=11).to_csv(data, index=False)
    return write_config(data, folder)


def write_config(data: Path, folder: Path) -> Path:
    """The bench dataset config: nps-sample's columns and taxonomies, ``data`` as input."""
    sample = yaml.safe_load((ROOT / "datasets/nps-sample/dataset.yaml").read_text())
    sample["name"] = "nps-bench"
    sample["input"]["path"] = str(data)
    # the largest cap a source may have: 100 releases at eps 1 (move var/bench/home aside after)
    sample["privacy"]["lifetime_epsilon"] = 100.0
    for spec in sample["columns"].values():  # taxonomy and domain files beside the config
        for key in ("taxonomy", "domain"):
            if key in spec:
                source = (ROOT / "datasets/nps-sample" / spec[key]).resolve()
                shutil.copy(source, folder / source.name)
                spec[key] = source.name
    config = folder / "dataset.yaml"
    config.write_text(yaml.safe_dump(sample))
    return config


def duckdb_floor(data: Path, columns: list[str]) -> tuple[float, int]:
    """The floor: DuckDB reading the same file and grouping it by the same columns."""
    import duckdb

    names = ", ".join(f'"{c}"' for c in columns)
    best, groups = float("inf"), 0
    for _ in range(2):  # best of two, as for the input side: the file is in the page cache
        started = time.perf_counter()
        groups = duckdb.sql(f"SELECT {names}, count(*) FROM read_csv('{data}', all_varchar=true) "
                            "GROUP BY ALL").to_arrow_table().num_rows
        best = min(best, time.perf_counter() - started)
    return best, groups


def input_side(config) -> tuple[float, object]:
    """The flow's input side (as ``tasks.inputs.validate_and_aggregate``: the grouped count
    taking the row digest in its pass), and the row-wise pass it replaced, on the same file."""
    from medrelease.data.grouped_input import grouped_count
    from medrelease.storage.io import file_sha256

    grouped = float("inf")
    for _ in range(2):
        started = time.perf_counter()
        counts = grouped_count(config, config.input_path, row_sums=True).counts
        file_sha256(config.input_path)
        grouped = min(grouped, time.perf_counter() - started)
    assert counts is not None, "DuckDB declined the bench file"
    return grouped, counts


def row_wise(config) -> float:
    from medrelease.data.aggregate import aggregate_chunks
    from medrelease.data.input_schema import validate_input
    from medrelease.storage.io import iter_chunks

    started = time.perf_counter()
    aggregate_chunks((validate_input(c, config) for c in iter_chunks(config)), config)
    return time.perf_counter() - started


def cli_release(config_path: Path, env: dict[str, str], mechanism: str) -> tuple[float, float]:
    """``medrelease release`` in a fresh process: seconds until it says the release folder is
    published, and until it returns (the evidence report written)."""
    command = [str(Path(sys.executable).with_name("medrelease")), "release", str(config_path),
               "--mechanism", mechanism, "--epsilon", "1"]
    started = time.perf_counter()
    published = float("nan")
    with subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as proc:
        output = []
        for line in proc.stdout:
            output.append(line)
            if line.startswith("published ") and published != published:
                published = time.perf_counter() - started
    total = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError("medrelease release failed:\n" + "".join(output[-20:]))
    return published, total


def cli_timings(config_path: Path, args, bench: Path) -> dict[str, list[tuple[float, float]]]:
    """The CLI against a running server and with the ephemeral API, ``args.rounds`` runs each
    after one that is not counted (it warms the server, or migrates a new database)."""
    from deployments.local_server import running_server, server_env

    base = {"MEDRELEASE_HOME": os.environ["MEDRELEASE_HOME"],
            "MEDRELEASE_DATASETS": os.environ["MEDRELEASE_DATASETS"], "COLUMNS": "200"}
    home = bench / "server"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    out: dict[str, list[tuple[float, float]]] = {}

    def cli_env(prefect_home: Path, api_url: str | None = None) -> dict[str, str]:
        env = {**server_env(prefect_home, api_url), **base}
        env.pop("PREFECT_LOGGING_LEVEL")  # the server's; the CLI reads its runs' INFO lines
        return env

    def runs(env: dict[str, str]) -> list[tuple[float, float]]:
        cli_release(config_path, env, args.mechanism)
        return [cli_release(config_path, env, args.mechanism) for _ in range(args.rounds)]

    # As on a machine that writes bytecode when it imports (this sandbox sets
    # PYTHONDONTWRITEBYTECODE): the CLI then loads the project's modules compiled.
    subprocess.run([sys.executable, "-m", "compileall", "-q", "medrelease", "flows", "tasks",
                    "schemas", "deployments"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    with running_server(home) as api_url:
        out["server"] = runs(cli_env(home, api_url))
    # Its own Prefect home: this process's ephemeral API still holds bench/prefect's database.
    out["ephemeral"] = runs(cli_env(bench / "cli-prefect"))
    return out


def run_flow(config_path: Path, args) -> tuple[float, dict, dict[str, float]]:
    """One release through the flow; its wall time, result and task time per task name."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.release import ReleaseRequest, release_flow
    from tasks.prefect_defaults import without_heartbeats

    started = time.perf_counter()
    with without_heartbeats():  # as the CLI runs it
        result = release_flow(ReleaseRequest(
            dataset=str(config_path), seed=1, mechanism=args.mechanism, epsilon=1.0,
            evaluate=args.evaluate, run_settings={"batch_size": args.batch_size},
            void_lifetime_guarantee=True))  # (a scratch home: its sources are throwaway)
    wall = time.perf_counter() - started
    ids = [result["flow_run_id"]]
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))
    per_task: dict[str, float] = {}
    for run in runs:
        name = run.name.rsplit("-", 1)[0]
        per_task[name] = per_task.get(name, 0.0) + run.total_run_time.total_seconds()
    scoring = [r for r in runs if r.name.startswith("score-node-batch") and r.start_time]
    if scoring:  # the batches run side by side: their wall span, not their sum, is spent
        per_task["score-node-batch (wall span)"] = (
            max(r.end_time for r in scoring) - min(r.start_time for r in scoring)).total_seconds()
    per_task["evaluation (its three tasks)"] = sum(per_task.get(name, 0.0) for name in EVALUATION)
    return wall, result, per_task


EVALUATION = ("load-release-and-input", "evaluate-release", "write-evaluation-report")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_361_000)
    parser.add_argument("--mechanism", default="ipa")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    parser.add_argument("--no-evaluate", dest="evaluate", action="store_false")
    parser.add_argument("--row-wise", action="store_true", help="also time the row-wise pass")
    parser.add_argument("--no-cli", dest="cli", action="store_false",
                        help="skip the CLI runs (a server and four fresh processes)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="interleaved rounds of floor / input side; engine runs; CLI runs of each kind")
    args = parser.parse_args()
    bench = ROOT / "var" / "bench"
    os.environ.setdefault("MEDRELEASE_HOME", str(bench / "home"))
    os.environ.setdefault("PREFECT_HOME", str(bench / "prefect"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("MEDRELEASE_DATASETS", str(bench))
    shutil.rmtree(bench / "home", ignore_errors=True)
    config_path = make_dataset(args.rows, bench)

    import pandas as pd

    from medrelease.data.config import load_config
    from medrelease.mechanisms import capabilities
    from medrelease.plan import PublicFacts
    from medrelease.release import plan_release, release_from_counts
    from medrelease.synthetic.release import release_synthetic

    config = load_config(config_path)
    columns = config.dimensions + config.informative
    floors, sides, ratios = [], [], []
    for _ in range(args.rounds):  # interleaved, so a busy moment hits both sides alike
        floor, groups = duckdb_floor(config.input_path, columns)
        grouped, counts = input_side(config)
        floors.append(floor)
        sides.append(grouped)
        ratios.append(grouped / floor)
    floor, grouped = statistics.median(floors), statistics.median(sides)
    engines = []
    for _ in range(args.rounds):
        started = time.perf_counter()
        if capabilities(args.mechanism).kind == "synthetic":
            plan = plan_release(args.mechanism, {"epsilon": 1.0}, 0, 1, PublicFacts.of(config))
            release_synthetic(counts, config, plan)
        else:
            release_from_counts(counts, args.mechanism, {"epsilon": 1.0}, seed=1,
                                batch_size=args.batch_size, workers=2)
        engines.append(time.perf_counter() - started)
    engine = statistics.median(engines)
    del counts
    cold, _, _ = run_flow(config_path, args)  # includes the ephemeral API's start
    wall, result, per_task = run_flow(config_path, args)
    evaluation = per_task.pop("evaluation (its three tasks)")
    in_tasks = sum(v for k, v in per_task.items()
                   if k not in (*EVALUATION, "score-node-batch"))
    cli = cli_timings(config_path, args, bench) if args.cli else {}

    print(f"rows {args.rows:,} ({groups:,} distinct rows), mechanism {args.mechanism}, "
          f"batch size {args.batch_size}, {os.cpu_count()} cores")
    print(f"medians of {args.rounds} interleaved rounds (each the best of two runs)")
    print(f"DuckDB floor (read + group by {len(columns)} columns): {floor:5.2f} s")
    print(f"input side (DuckDB group + row digest + value checks + encode + sha256): "
          f"{grouped:5.2f} s"
          f"  = {statistics.median(ratios):.2f}x the floor (rounds: "
          f"{', '.join(f'{r:.2f}' for r in ratios)})")
    if args.row_wise:
        old = row_wise(config)
        print(f"row-wise pass it replaced (pandas chunks + pandera):  {old:5.2f} s"
              f"  = {old / floor:.1f}x the floor")
    print(f"engine (release from counts; aim: its rounds + sampling): {engine:5.2f} s (rounds: "
          f"{', '.join(f'{e:.2f}' for e in engines)})")
    print(f"whole flow, warm (evaluation {'on' if args.evaluate else 'off'}):          "
          f"{wall:5.2f} s  = {wall / floor:.1f}x the floor   (cold, with API start: {cold:.1f} s)")
    print(f"  release tasks {in_tasks:.2f} s (scoring by its wall span), evaluation "
          f"{evaluation:.2f} s; flow code and Prefect outside tasks "
          f"{wall - in_tasks - evaluation:.2f} s")
    for name, label in (("server", "against a running server"),
                        ("ephemeral", "with Prefect's ephemeral API")):
        if name in cli:
            published = statistics.median(run[0] for run in cli[name])
            total = statistics.median(run[1] for run in cli[name])
            print(f"CLI `medrelease release`, {label} (median of {len(cli[name])}): published "
                  f"{published:5.2f} s = {published / floor:.1f}x the floor; returned (evidence "
                  f"report written) {total:5.2f} s = {total / floor:.1f}x  (runs: "
                  + ", ".join(f"{p:.2f}/{t:.2f}" for p, t in cli[name]) + ")")
    print(pd.Series(per_task).sort_values(ascending=False).round(2).to_string())
    print(f"released rows: {result['manifest']['released_rows']:,} -> {result['path']}")


if __name__ == "__main__":
    main()
