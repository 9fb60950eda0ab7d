"""Runs inside the peers' own virtual environment (made by ``benchmarks/peers.py``).

Fits MST or AIM from ``dpmm`` on a CSV whose columns are all categorical strings, with every
column's categories given as its public domain (so dpmm spends no budget on preprocessing and
imputes no domain from the data), and writes as many synthetic rows as the input has.
It imports nothing from medrelease: the peers pin numpy/pandas versions the product does not use.

    python peers_worker.py '{"tool": "mst", "data": ..., "domain": ..., "out": ...,
                             "epsilon": 1.0, "delta": 1e-6, "seed": 1}'
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    job = json.loads(sys.argv[1])
    import pandas as pd
    from dpmm.pipelines import AIMPipeline, MSTPipeline

    with open(job["domain"], encoding="utf-8") as handle:
        domain = json.load(handle)
    frame = pd.read_csv(job["data"], dtype=str, keep_default_na=False)
    pipeline_class = {"mst": MSTPipeline, "aim": AIMPipeline}[job["tool"]]
    started = time.perf_counter()
    # proc_epsilon=None with categorical columns and public categories: no budget for binning
    pipeline = pipeline_class(epsilon=job["epsilon"], delta=job["delta"], proc_epsilon=None,
                              n_jobs=job.get("jobs", 2))
    pipeline.fit(frame, domain={c: {"categories": v} for c, v in domain.items()},
                 random_state=job["seed"])
    fitted = time.perf_counter()
    synthetic = pipeline.generate(n_records=len(frame), random_state=job["seed"])
    synthetic.to_csv(job["out"], index=False)
    print(json.dumps({"fit_seconds": fitted - started,
                      "seconds": time.perf_counter() - started}))


if __name__ == "__main__":
    main()
