"""What a release's flow spends outside the mechanism, section by section, on one release.

Reads the newest release of ``flow_bench.py``'s table (``var/bench``: 1,361,000 NPS-like rows;
run ``flow_bench.py --mechanism aim`` once first) or ``--release FOLDER``, and times, each the
best of ``--rounds`` runs, wall and CPU (this process's, every thread): the evaluation by its
sections (the input from the count table, the released Parquet read, the workload error of
41 marginals, the informative column, the IPA queries, the synthetic match risk) and whole;
then the publishing side on the same rows held as distinct cells and counts (as ``aim`` hands
them over): the cell table the output checks read, and the Parquet + CSV files written.

    python benchmarks/evaluation_bench.py [--release FOLDER] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def clock(label: str, rounds: int, run: Callable[[], object]) -> object:
    """Best wall and best CPU of ``rounds`` runs, printed; the last run's result."""
    walls, cpus, out = [], [], None
    for _ in range(rounds):
        wall, cpu = time.perf_counter(), time.process_time()
        out = run()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    print(f"{label:44s} wall {min(walls):6.2f} s   cpu {min(cpus):6.2f} s")
    return out


def newest_release(bench: Path) -> Path:
    found = sorted((bench / "home").glob("**/manifest.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"no release under {bench / 'home'}: run benchmarks/flow_bench.py first")
    return found[-1].parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", type=Path, help="a release folder of the bench table")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=1_361_000)
    args = parser.parse_args()

    import numpy as np

    from benchmarks.flow_bench import make_dataset
    from medrelease.data.config import load_config
    from medrelease.data.grouped_input import grouped_count_table
    from medrelease.evidence import accuracy, evaluation
    from medrelease.evidence.risk import synthetic_match_risk
    from medrelease.evidence.utility import AnalysisQuery, compare_queries
    from medrelease.storage.released_rows import ROWS, ReleasedRows
    from medrelease.storage.store import write_data_files

    bench = ROOT / "var" / "bench"
    config = load_config(make_dataset(args.rows, bench))
    folder = args.release or newest_release(bench)
    counts = grouped_count_table(config, config.input_path)
    rounds = args.rounds
    print(f"release {folder.name}; {os.cpu_count()} cores; best of {rounds}")
    given = clock("input from the count table (InputRows)", rounds,
                  lambda: evaluation.InputRows.from_counts(counts, config))
    released = clock("released rows read (Parquet)", rounds,
                     lambda: evaluation._released_rows(folder))
    print(f"  {given.n_rows:,} input rows in {len(given.table):,} cells; "
          f"{len(released):,} released rows")
    table, weights = given.table, given.weights
    clock("accuracy: workload error (41 marginals)", rounds,
          lambda: accuracy._workload(table, weights, released, config, {}))
    clock("accuracy: informative column, rates", rounds,
          lambda: accuracy._informative(table, weights, released, config, "", {}))
    clock("utility: the IPA paper's queries", rounds,
          lambda: compare_queries(table, released, config, AnalysisQuery(),
                                  original_weights=weights))
    columns = [c for c in config.declared if c in released.columns]
    clock("risk: synthetic rows matching unique records", rounds,
          lambda: synthetic_match_risk(table, weights, released, columns))
    clock("evaluate_release (all of it)", rounds,
          lambda: evaluation.evaluate_release(folder, given, config).as_json())

    grouped = released.groupby(list(released.columns), observed=True, sort=False).size()
    cells = grouped.reset_index(name=ROWS)
    cell_counts = cells.pop(ROWS).to_numpy()
    for column in config.informative:  # as aim hands them over: dimensions as categories
        cells[column] = cells[column].astype(object)
    print(f"  publishing side: {len(cells):,} distinct released rows as cells and counts")

    def cell_table():
        rows = ReleasedRows(cells, cell_counts, np.random.SeedSequence(5))
        return rows.cell_table()

    clock("output checks' cell table", rounds, cell_table)
    scratch = Path(tempfile.mkdtemp(dir=ROOT / "var"))
    try:
        clock("data files written (Parquet + CSV)", rounds, lambda: write_data_files(
            ReleasedRows(cells, cell_counts, np.random.SeedSequence(5)),
            scratch / "data.parquet", scratch / "data.csv"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
