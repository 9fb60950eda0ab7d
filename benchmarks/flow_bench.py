"""Flow benchmark: a release of the NPS-like table through the whole Prefect flow.

Generates the table (default 1,361,000 rows, the IPA paper's size) as CSV under
``var/bench/`` and a dataset config for it, then prints, in one run: the floor (DuckDB reading
the file and grouping it by the same columns), the project's input side, the engine alone, and
the whole flow (Prefect's ephemeral API, evaluation included) with its time per task and
outside tasks — each as a ratio to the floor.

    python benchmarks/flow_bench.py [--rows 1361000] [--mechanism ipa] [--batch-size 32]
                                    [--no-evaluate] [--row-wise]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from pathlib import Path

import yaml

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
    sample["privacy"]["lifetime_epsilon"] = 1e9
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
    """The flow's input side (as ``tasks.inputs.validate_and_aggregate``), and the row-wise
    pass it replaced, on the same file."""
    from medrelease.data.grouped_input import grouped_count_table
    from medrelease.storage.io import file_sha256

    grouped = float("inf")
    for _ in range(2):
        started = time.perf_counter()
        counts = grouped_count_table(config, config.input_path)
        file_sha256(config.input_path)
        grouped = min(grouped, time.perf_counter() - started)
    assert counts is not None, "DuckDB declined the bench file"
    return grouped, counts


def row_wise(config) -> float:
    from medrelease.data.aggregate import aggregate_chunks
    from medrelease.storage.io import iter_chunks
    from schemas.input import validate_input

    started = time.perf_counter()
    aggregate_chunks((validate_input(c, config) for c in iter_chunks(config)), config)
    return time.perf_counter() - started


def run_flow(config_path: Path, args) -> tuple[float, dict, dict[str, float]]:
    """One release through the flow; its wall time, result and task time per task name."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.release import ReleaseRequest, release_flow

    started = time.perf_counter()
    result = release_flow(ReleaseRequest(
        dataset=str(config_path), seed=1, batch_size=args.batch_size,
        mechanism=args.mechanism, epsilon=1.0, evaluate=args.evaluate))
    wall = time.perf_counter() - started
    ids = [result["flow_run_id"]]
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))
        subflows = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_task_run_id={"any_": [r.id for r in runs]})) if args.evaluate else []
    per_task: dict[str, float] = {}
    for run in runs:
        name = run.name.rsplit("-", 1)[0]
        per_task[name] = per_task.get(name, 0.0) + run.total_run_time.total_seconds()
    scoring = [r for r in runs if r.name.startswith("score-node-batch") and r.start_time]
    if scoring:  # the batches run side by side: their wall span, not their sum, is spent
        per_task["score-node-batch (wall span)"] = (
            max(r.end_time for r in scoring) - min(r.start_time for r in scoring)).total_seconds()
    per_task.pop("medrelease-evaluate", None)  # the subflow's wrapper task, counted below
    for sub in subflows:
        per_task["evaluate (subflow)"] = sub.total_run_time.total_seconds()
    return wall, result, per_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_361_000)
    parser.add_argument("--mechanism", default="ipa")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--no-evaluate", dest="evaluate", action="store_false")
    parser.add_argument("--row-wise", action="store_true", help="also time the row-wise pass")
    parser.add_argument("--rounds", type=int, default=5,
                        help="interleaved rounds of floor / input side, and engine runs")
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
    from medrelease.release import PublicFacts, plan_release, release_from_counts
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
    in_tasks = sum(v for k, v in per_task.items()
                   if k not in ("evaluate (subflow)", "score-node-batch"))

    print(f"rows {args.rows:,} ({groups:,} distinct rows), mechanism {args.mechanism}, "
          f"batch size {args.batch_size}, {os.cpu_count()} cores")
    print(f"medians of {args.rounds} interleaved rounds (each the best of two runs)")
    print(f"DuckDB floor (read + group by {len(columns)} columns): {floor:5.2f} s")
    print(f"input side (DuckDB group + distinct-value checks + encode + sha256): {grouped:5.2f} s"
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
          f"{per_task.get('evaluate (subflow)', 0.0):.2f} s; flow code and Prefect outside "
          f"tasks {wall - in_tasks - per_task.get('evaluate (subflow)', 0.0):.2f} s")
    print(pd.Series(per_task).sort_values(ascending=False).round(2).to_string())
    print(f"released rows: {result['manifest']['released_rows']:,} -> {result['path']}")


if __name__ == "__main__":
    main()
