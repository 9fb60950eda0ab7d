"""Flow benchmark: a release of the NPS-like table through the whole Prefect flow.

Generates the table (default 1,361,000 rows, the IPA paper's size) as CSV under
``var/bench/``, writes a dataset config for it, runs the release flow with Prefect's ephemeral
API, and prints the flow's wall time next to the time spent inside its tasks (read back from
Prefect) and the engine alone on the same data — the difference is orchestration overhead.

    python benchmarks/flow_bench.py [--rows 1361000] [--mechanism ipa] [--batch-size 32]
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def make_dataset(rows: int, folder: Path) -> Path:
    from medrelease.nps import generate_nps

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
    for spec in sample["columns"].values():
        for key in ("taxonomy", "domain"):
            if key in spec:
                spec[key] = str((ROOT / "datasets/nps-sample" / spec[key]).resolve())
    config = folder / "dataset.yaml"
    config.write_text(yaml.safe_dump(sample))
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_361_000)
    parser.add_argument("--mechanism", default="ipa")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    bench = ROOT / "var" / "bench"
    os.environ.setdefault("MEDRELEASE_HOME", str(bench / "home"))
    os.environ.setdefault("PREFECT_HOME", str(bench / "prefect"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    shutil.rmtree(bench / "home", ignore_errors=True)
    config_path = make_dataset(args.rows, bench)

    import pandas as pd

    from medrelease.aggregate import aggregate_chunks
    from medrelease.config import load_config
    from medrelease.io import iter_chunks
    from medrelease.release import release_from_counts
    from schemas.input import validate_input

    config = load_config(config_path)
    t0 = time.perf_counter()
    counts = aggregate_chunks((validate_input(c, config) for c in iter_chunks(config)), config)
    t1 = time.perf_counter()
    release_from_counts(counts, args.mechanism, {"epsilon": 1.0}, seed=1,
                        batch_size=args.batch_size, workers=2)
    t2 = time.perf_counter()
    del counts

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.release import ReleaseRequest, release_flow

    started = time.perf_counter()
    result = release_flow(ReleaseRequest(
        dataset=str(config_path), seed=1, batch_size=args.batch_size,
        mechanism={"mechanism": args.mechanism, "epsilon": 1.0}))
    flow_wall = time.perf_counter() - started
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(
            id=FlowRunFilterId(any_=[result["flow_run_id"]])))
    per_task: dict[str, float] = {}
    for run in runs:
        name = run.name.rsplit("-", 1)[0]
        per_task[name] = per_task.get(name, 0.0) + run.total_run_time.total_seconds()
    print(f"rows {args.rows:,}, mechanism {args.mechanism}, batch size {args.batch_size}")
    print(f"engine alone: streamed read + validate + aggregate {t1 - t0:.1f} s, lattice + "
          f"release {t2 - t1:.1f} s, total {t2 - t0:.1f} s")
    print(f"flow wall time (incl. ephemeral API start): {flow_wall:.1f} s")
    print(pd.Series(per_task).sort_values(ascending=False).round(2).to_string())
    print(f"released rows: {result['manifest']['released_rows']:,} -> {result['path']}")


if __name__ == "__main__":
    main()
