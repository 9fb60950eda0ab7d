"""What patient-level privacy costs: row level against one patient of at most m rows.

On an NPS-like table with repeat admissions (1-5 per patient, ``generate_nps(...,
repeat_admissions=True)``) this releases with ``ipa`` and ``aim`` at the row level and at
patient level for each m, and prints, against the *whole* input (every admission):

* rows after the bound (share of the input's rows);
* workload error: mean TVD of the 2-way and 3-way marginals (EVALUATION.md);
* rows kept (ipa: released under a non-'*' class, share of the input's rows).

It also prints, for the MIMIC-III demo, how many admissions each m keeps. Numbers go to stdout;
docs/results/privacy_unit.md holds a run.

    python benchmarks/privacy_unit.py                        # 100,000 rows, eps 1, 2 seeds
    python benchmarks/privacy_unit.py --rows 20000 --seeds 1 --mechanisms ipa
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def unit_config(m: int | None):
    """nps-sample's config with patient_id as the unit (``m`` rows at most), or row level."""
    from medrelease.data.config import config_from_dict, find_config

    base = find_config("nps-sample")
    raw = base.model_dump(exclude={"base_dir", "config_file"})
    if m is not None:
        raw["columns"]["patient_id"] = {"role": "identifier"}
        raw["privacy"] = {**raw["privacy"], "unit": "patient_id", "max_rows_per_unit": m,
                          "row_noun": "admission"}
    return config_from_dict(raw, Path(base.base_dir))


def one_run(table: pd.DataFrame, m: int | None, mechanism: str, epsilon: float, seed: int,
            counts) -> dict:
    from medrelease.evidence.workload import rows_kept_share, workload_error
    from medrelease.release import release

    config = unit_config(m)
    started = time.perf_counter()
    result = release(table, config, mechanism, {"epsilon": epsilon}, seed=seed, workers=2)
    seconds = time.perf_counter() - started
    error = workload_error(counts, result.table)
    kept = (rows_kept_share(result.table, counts.dimensions, counts.n_rows)
            if mechanism != "aim" else float("nan"))
    return {"tvd2": error.mean_two_way, "tvd3": error.mean_three_way, "kept": kept,
            "seconds": seconds}


def bounded_share(table: pd.DataFrame, m: int) -> float:
    sizes = table.groupby("patient_id").size().to_numpy()
    return float(np.minimum(sizes, m).sum() / sizes.sum())


def mimic_rows() -> None:
    from medrelease.data.mimic import admissions_table

    folder = ROOT.parent / "shared" / "data" / "mimic-iii-demo"
    if not folder.is_dir():
        return
    table = admissions_table(folder)
    sizes = table.groupby("subject_id").size().to_numpy()
    print(f"\nMIMIC-III demo: {len(table)} admissions of {len(sizes)} patients "
          f"(largest {sizes.max()})")
    for m in (1, 2, 3, 5):
        print(f"  m = {m}: {int(np.minimum(sizes, m).sum())} admissions kept "
              f"({np.minimum(sizes, m).sum() / sizes.sum():.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--eps", type=float, default=1.0)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--units", type=int, nargs="+", default=[1, 2, 3, 5])
    parser.add_argument("--mechanisms", nargs="+", default=["ipa", "aim"])
    args = parser.parse_args()

    from medrelease.data.aggregate import aggregate
    from medrelease.data.nps import generate_nps

    table = generate_nps(args.rows, seed=42, repeat_admissions=True)
    sizes = table.groupby("patient_id").size()
    print(f"NPS-like, {len(table):,} admissions of {len(sizes):,} patients "
          f"(rows per patient: {sizes.value_counts().sort_index().to_dict()}), eps {args.eps}, "
          f"{args.seeds} seed(s)")
    counts = aggregate(table.drop(columns="patient_id"), unit_config(None))
    print("| mechanism | unit | rows after bound | TVD 2-way | TVD 3-way | rows kept | s |")
    print("|---|---|---|---|---|---|---|")
    for mechanism in args.mechanisms:
        for m in [None, *args.units]:
            runs = [one_run(table, m, mechanism, args.eps, seed, counts)
                    for seed in range(1, args.seeds + 1)]
            mean = {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}
            unit = "one row" if m is None else f"patient, m = {m}"
            share = 1.0 if m is None else bounded_share(table, m)
            kept = "—" if np.isnan(mean["kept"]) else f"{mean['kept']:.3f}"
            print(f"| {mechanism} | {unit} | {share:.3f} | {mean['tvd2']:.3f} | "
                  f"{mean['tvd3']:.3f} | {kept} | {mean['seconds']:.1f} |", flush=True)
    mimic_rows()


if __name__ == "__main__":
    main()
