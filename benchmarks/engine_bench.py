"""Engine benchmark: wall time and peak memory of a whole-lattice release (issue 2).

Prints, for the NPS-like table at each row count and for both IPA mechanisms: time to aggregate,
time to perturb and score all 256 lattice nodes, time to select + materialize, and the peak
resident memory of a fresh process doing that work (so runs do not inflate each other).

    python benchmarks/engine_bench.py                  # 100,000 and 1,361,000 rows
    python benchmarks/engine_bench.py --rows 1361000 --workers 2
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from medrelease.data.lattice import DEFAULT_BATCH_SIZE

ROOT = Path(__file__).resolve().parent.parent


def one_run(rows: int, mechanism: str, workers: int, batch_size: int) -> dict:
    import pandas as pd  # noqa: F401  (imported here so the parent stays light)

    from medrelease.data.aggregate import aggregate
    from medrelease.data.config import find_config
    from medrelease.data.nps import generate_nps
    from medrelease.mechanisms.base import ReleaseContext
    from medrelease.release import release_from_counts

    config = find_config("nps-sample")
    table = generate_nps(rows, seed=7)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    counts = aggregate(table, config)
    t1 = time.perf_counter()
    del table
    result = release_from_counts(
        counts, mechanism, {"epsilon": 1.0}, seed=1, batch_size=batch_size, workers=workers
    )
    t2 = time.perf_counter()
    return {
        "rows": rows,
        "mechanism": mechanism,
        "workers": workers,
        "nodes": len(ReleaseContext.from_counts(counts).lattice),
        "cells": int(counts.cell_keys.size),
        "aggregate_s": round(t1 - t0, 2),
        "lattice_and_release_s": round(t2 - t1, 2),
        "engine_total_s": round(t2 - t0, 2),
        "released_rows": result.released_rows,
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2),
        "input_rss_gb": round(base_rss / 1e6, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="*", default=[100_000, 1_361_000])
    parser.add_argument("--mechanisms", nargs="*", default=["ipa-paper", "ipa"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_run(args.rows[0], args.mechanisms[0], args.workers, args.batch_size)))
        return
    header = (f"{'rows':>10} {'mechanism':>10} {'nodes':>5} {'cells':>9} {'aggregate s':>11} "
              f"{'lattice+release s':>17} {'total s':>8} {'peak GB':>8}")
    print(header)
    for rows in args.rows:
        for mechanism in args.mechanisms:
            out = subprocess.run(
                [sys.executable, __file__, "--child", "--rows", str(rows), "--mechanisms",
                 mechanism, "--workers", str(args.workers), "--batch-size", str(args.batch_size)],
                capture_output=True, text=True, check=True, cwd=ROOT,
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{r['rows']:>10,} {r['mechanism']:>10} {r['nodes']:>5} {r['cells']:>9,} "
                  f"{r['aggregate_s']:>11} {r['lattice_and_release_s']:>17} "
                  f"{r['engine_total_s']:>8} {r['peak_rss_gb']:>8}")
    print("peak GB = peak resident memory of the process, including the generated input table")


if __name__ == "__main__":
    main()
