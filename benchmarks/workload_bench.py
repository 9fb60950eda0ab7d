"""How fast the workload yardstick measures every 1-, 2- and 3-way marginal of a release.

NPS-like input (``generate_nps``, the bundled nps-sample config's taxonomies) against:
(a) a raw release of the same size (the input with its columns shuffled independently);
(b) a generalized release (ages as their 10-year label, 30 % of rows '*' on every dimension);
(c) a stress case of intervals: every row's age and stay an interval of random width around its
    value (hundreds of overlapping intervals, none a level label), 30 % of rows '*' on every
    dimension;
(d) Mondrian's release (k = 10; ``medrelease.mechanisms.mondrian``), real overlapping
    intervals from its partitions (``--no-mondrian`` skips it: it takes ~10 s to run).
For each: building ``Yardstick.from_counts``, then the 41 marginals of the 6 released columns;
and, as the floor, DuckDB computing the same 41 input-side group-bys on a table it already holds.
Prints numbers; asserts nothing.

    .venv/bin/python benchmarks/workload_bench.py            # 1,361,000 rows
    .venv/bin/python benchmarks/workload_bench.py --rows 200000
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def shuffled(raw: pd.DataFrame, columns: list[str], seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({c: rng.permutation(raw[c].to_numpy()) for c in columns})


def generalized(raw: pd.DataFrame, columns: list[str], config, dimensions: tuple[str, ...],
                seed: int) -> pd.DataFrame:
    """Ages as their level-1 label; 30 % of rows '*' on every dimension."""
    age = config.taxonomies["age"]
    out = raw[columns].copy()
    out["age"] = np.asarray(age.level_labels[1], dtype=object)[
        age.level_codes[1][age.encode(raw["age"])]]
    return starred(out, dimensions, seed)


def intervals(raw: pd.DataFrame, columns: list[str], dimensions: tuple[str, ...],
              seed: int) -> pd.DataFrame:
    """Ages and stays as ``[lo-hi]`` intervals of random widths around each value (overlapping
    each other, none a level label); 30 % of rows '*' on every dimension."""
    rng = np.random.default_rng(seed)
    out = raw[columns].copy()
    for column, (low, high), widths in (("age", (1, 100), 12), ("length_of_stay", (1, 400), 30)):
        values = raw[column].to_numpy()
        lo = np.clip(values - rng.integers(0, widths, values.size), low, high)
        hi = np.clip(values + rng.integers(1, widths, values.size), low, high)
        # Few distinct intervals, as a partition-based release has: snap to a coarse grid.
        lo, hi = np.minimum(lo - lo % 3 + 1, values), np.maximum(hi - hi % 3 + 2, values)
        out[column] = pd.Series(lo).astype(str).str.cat(pd.Series(hi).astype(str), sep="-")
        out[column] = "[" + out[column] + "]"
    return starred(out, dimensions, seed)


def starred(frame: pd.DataFrame, dimensions: tuple[str, ...], seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed + 1)
    star = rng.random(len(frame)) < 0.3
    out = frame.astype({d: object for d in dimensions})
    for column in dimensions:
        out.loc[star, column] = "*"
    return out


def duckdb_floor(raw: pd.DataFrame, sets: list[tuple[str, ...]]) -> tuple[float, int]:
    """The 41 input-side group-bys in DuckDB (2 threads), on a table it already holds."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET threads = 2")
    con.register("frame", raw)
    con.execute("CREATE TABLE t AS SELECT * FROM frame")
    started = time.perf_counter()
    cells = 0
    for columns in sets:
        names = ", ".join(columns)
        result = con.sql(f"SELECT {names}, count(*) AS n FROM t GROUP BY {names}").fetchnumpy()
        cells += len(result["n"])
    return time.perf_counter() - started, cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_361_000)
    parser.add_argument("--seed", type=int, default=2020)
    parser.add_argument("--no-mondrian", action="store_true", help="skip case (d)")
    args = parser.parse_args()

    from medrelease.data.aggregate import aggregate
    from medrelease.data.config import find_config
    from medrelease.data.nps import generate_nps
    from medrelease.evidence.workload import Yardstick, workload_error

    config = find_config("nps-sample")
    started = time.perf_counter()
    raw = generate_nps(args.rows, seed=args.seed)
    generated = time.perf_counter() - started
    started = time.perf_counter()
    counts = aggregate(raw, config)
    aggregated = time.perf_counter() - started
    columns = list(counts.dimensions) + list(counts.informative.columns)
    sets = [c for k in (1, 2, 3) for c in itertools.combinations(columns, k)]
    print(f"NPS-like input: {len(raw):,} rows ({generated:.1f} s to generate), "
          f"{counts.cell_keys.size:,} cells ({aggregated:.2f} s to aggregate); "
          f"{len(columns)} released columns, {len(sets)} marginals (1- to 3-way)")

    floor, cells = duckdb_floor(raw[columns], sets)
    print(f"DuckDB floor, the {len(sets)} input-side group-bys: {floor:.2f} s "
          f"({cells:,} groups in all)")

    releases = {
        "(a) raw (columns shuffled)": shuffled(raw, columns, seed=1),
        "(b) generalized (age 10-year, 30 % all '*')": generalized(raw, columns, config,
                                                                    counts.dimensions, seed=2),
        "(c) stress: random intervals (age, stay; 30 % all '*')": intervals(
            raw, columns, counts.dimensions, seed=3),
    }
    if not args.no_mondrian:
        from medrelease.mechanisms.mondrian import Mondrian, MondrianParams

        started = time.perf_counter()
        released, _ = Mondrian().release_counts(counts, MondrianParams(k=10),
                                                np.random.default_rng(4))
        releases["(d) Mondrian k=10"] = released
        print(f"(Mondrian ran in {time.perf_counter() - started:.1f} s)")
    print("| release | layers per column | build | 41 marginals | total | mean TVD 1/2/3-way "
          "| workload_error |")
    print("|---|---|---|---|---|---|---|")
    for name, released in releases.items():
        started = time.perf_counter()
        yardstick = Yardstick.from_counts(counts, released)
        built = time.perf_counter() - started
        layers = "/".join(map(str, yardstick.layer_counts.values()))
        started = time.perf_counter()
        marginals = yardstick.marginals(3)
        measured = time.perf_counter() - started
        means = "/".join(f"{np.mean([v for c, v in marginals.items() if len(c) == k]):.3f}"
                         for k in (1, 2, 3))
        started = time.perf_counter()
        workload_error(counts, released)
        fixed = time.perf_counter() - started
        print(f"| {name} | {layers} | {built:.2f} s | {measured:.2f} s | "
              f"{built + measured:.2f} s | {means} | {fixed:.2f} s |")

    started = time.perf_counter()
    taxonomies = {c: config.taxonomies.get(c) for c in columns}
    from_rows = Yardstick.from_rows(raw, releases["(b) generalized (age 10-year, 30 % all '*')"],
                                    taxonomies, domains={"diagnosis": config.informative_domain})
    built = time.perf_counter() - started
    started = time.perf_counter()
    from_rows.marginals(3)
    print(f"from_rows on the {len(raw):,} raw rows against (b): build {built:.2f} s, "
          f"41 marginals {time.perf_counter() - started:.2f} s")


if __name__ == "__main__":
    main()
