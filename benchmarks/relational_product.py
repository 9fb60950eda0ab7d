"""A relational release through the product, against the engine alone (issue 58).

For the generated hospital (``--patients``, default 5,000) and the bundled MIMIC-III demo
(``mimic-relational``, after ``medrelease prepare-mimic``): the engine's release in this process
(``release_relational``, the same parameters), then ``medrelease release`` (the CLI: Prefect's
ephemeral API, the whole flow: resolution, reading and checks, the charge, the models, the
output checks, publication, the steward's evaluation) in a fresh process; prints the seconds of
each, their ratio, and the steward evaluation's cross-table figures of the CLI's release.

    python benchmarks/relational_product.py [--patients 5000] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from medrelease.data.config import find_config, load_config  # noqa: E402
from medrelease.relational.hospital import write_hospital_dataset  # noqa: E402
from medrelease.relational.mechanism import RelationalParams, release_relational  # noqa: E402
from medrelease.relational.reading import read_table_files  # noqa: E402


def measure(name: str, config_path: Path, seed: int, home: Path) -> None:
    config = load_config(config_path)
    frames = read_table_files(config, config.table_files())
    params = RelationalParams(**config.mechanism.params)
    started = time.perf_counter()
    release_relational(config.relational_schema, frames, params, seed=seed)
    engine = time.perf_counter() - started
    env = {**os.environ, "MEDRELEASE_HOME": str(home), "MEDRELEASE_DATASETS": str(
        config_path.parent.parent), "MEDRELEASE_INPUT_ROOTS": str(config_path.parent)}
    env.pop("PREFECT_API_URL", None)
    started = time.perf_counter()
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "medrelease"), "release",
                           str(config_path), "--seed", str(seed)], env=env,
                          capture_output=True, text=True)
    cli = time.perf_counter() - started
    if done.returncode:
        print(done.stdout[-2000:], done.stderr[-2000:])
        raise SystemExit(f"{name}: the CLI release failed")
    [evaluation] = list((home / "steward").rglob("evaluation.json"))
    figures = json.loads(evaluation.read_text())
    rows = {t: len(f) for t, f in frames.items()}
    print(f"{name}: {rows}")
    print(f"  engine alone {engine:.2f} s; CLI release (ephemeral Prefect, whole flow, "
          f"evaluation included) {cli:.2f} s; ratio {cli / engine:.1f}x")
    for table, entry in figures["cross_table"].items():
        children = figures["children_per_parent"][table]["tvd"]
        print(f"  {table}: children per parent TVD {children:.3f}; parent x child pairs on "
              f"the join: mean TVD {entry['mean_tvd']:.3f} over {entry['pairs']}")
    print(f"  integrity of the released tables: {figures['integrity']}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--patients", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch)
        hospital = write_hospital_dataset(base / "datasets" / "hospital", args.patients)
        measure(f"hospital ({args.patients:,} patients)", hospital, args.seed, base / "h-home")
        mimic = find_config("mimic-relational")
        if all(p.is_file() for p in mimic.table_files().values()):
            measure("mimic-relational", Path(mimic.config_file), args.seed, base / "m-home")
        else:
            print("mimic-relational: run `medrelease prepare-mimic` first")


if __name__ == "__main__":
    main()
