"""One ``aim`` release for ``benchmarks/peers.py``, in a process of its own (jax compiles cold,
as for a user): the table is read and aggregated, released with ``aim``'s defaults and the given
eps, delta and seed, and the rows written as leaf codes per column; prints the seconds
(aggregation + release).

    python -m benchmarks.aim_worker '{"dataset": "adult-ipa", "rows": 0, "epsilon": 1.0,
                                      "delta": 1e-6, "seed": 1000, "out": "aim.npz"}'
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    from medrelease.data.config import find_config
    from medrelease.release import release

    job = json.loads(sys.argv[1])
    config = find_config(job["dataset"])
    if job["dataset"] == "nps-sample" and job.get("rows") and job["rows"] != 20_000:
        from medrelease.data.nps import generate_nps

        table = generate_nps(job["rows"], seed=2020)
    else:
        from medrelease.data.input_schema import validate_input
        from medrelease.storage.io import read_input

        table = validate_input(read_input(config), config)
    started = time.perf_counter()
    params = {"epsilon": job["epsilon"], "delta": job["delta"]}
    if job.get("workload_degree"):
        params["workload_degree"] = job["workload_degree"]
    result = release(table, config, "aim", params, seed=job["seed"])
    seconds = time.perf_counter() - started
    frame = result.table.to_frame() if hasattr(result.table, "to_frame") else result.table
    from benchmarks.peers import public_domains

    out = {c: pd.Categorical(frame[c].astype(str), categories=v).codes.astype(np.int64)
           for c, v in public_domains(config).items()}
    if any((v < 0).any() for v in out.values()):
        raise SystemExit("aim released a value outside the public domain")
    np.savez(job["out"], **out)
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KB -> GB (Linux)
    print(json.dumps({"seconds": seconds, "peak_gb": peak}))


if __name__ == "__main__":
    main()
