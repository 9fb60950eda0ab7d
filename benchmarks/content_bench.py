"""What resolving an extract costs (issue 36, cases 5-7) against reading it: the byte hash
alone (before), the snapshot (copy + SHA-256 in one pass), the row digest (one DuckDB pass),
``resolve_extract`` (both) and DuckDB's grouped count of the same file (the release's read).

    python benchmarks/content_bench.py [--rows 1400000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def timed(step: Callable[[], object], runs: int = 3) -> str:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return (f"median {statistics.median(times):.2f} s "
            f"(runs {', '.join(f'{t:.2f}' for t in times)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_400_000)
    args = parser.parse_args()
    from scale_bench import write_extract

    source = write_extract(args.rows, ROOT / "var" / "bench")
    os.environ["MEDRELEASE_HOME"] = tempfile.mkdtemp(prefix="medrelease-content-bench-")
    os.environ["MEDRELEASE_INPUT_ROOTS"] = str(source.parent)
    from medrelease.data.config import find_config
    from medrelease.data.content import row_digest
    from medrelease.data.extract import resolve_extract, snapshot_file
    from medrelease.data.grouped_input import grouped_count, grouped_count_table
    from medrelease.storage.io import file_sha256

    config = find_config("nps-sample")
    copies = Path(tempfile.mkdtemp(prefix="medrelease-snapshot-bench-"))

    def snapshot() -> None:
        for old in copies.iterdir():
            old.unlink()
        snapshot_file(source, copies)

    print(f"{args.rows:,} rows, {source.stat().st_size / 1e6:.1f} MB ({os.cpu_count()} cores)")
    print("byte hash alone (before)            ", timed(lambda: file_sha256(source)))
    print("snapshot: copy + SHA-256, one pass  ", timed(snapshot))
    print("row digest (DuckDB, one pass)       ", timed(lambda: row_digest(config, source)))
    print("resolve_extract (snapshot + digest) ",
          timed(lambda: resolve_extract(config, str(source)).discard()))
    print("the read: DuckDB's grouped count    ", timed(lambda: grouped_count_table(config, source)))
    print("resolve_extract for a count (no digest)",
          timed(lambda: resolve_extract(config, str(source), rows_by_count=True).discard()))
    print("grouped count + row digest, one pass",
          timed(lambda: grouped_count(config, source, row_sums=True)))


if __name__ == "__main__":
    main()
