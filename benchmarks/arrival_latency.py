"""Latency from dropping an extract into the inbox to its completed release (issue 4).

Starts a real ``prefect server`` (own SQLite database, loopback port) and ``medrelease serve
--inbox``, drops ``--drops`` distinct extracts of the bundled sample one after another, and
prints for each: seconds from the copy to the arrival run's completion.

    python benchmarks/arrival_latency.py [--drops 3] [--rows 3000]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drops", type=int, default=3)
    parser.add_argument("--rows", type=int, default=3000)
    args = parser.parse_args()

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from deployments.local_server import running_serve, running_server

    sample = pd.read_csv(ROOT / "datasets/nps-sample/nps_sample.csv")
    base = Path(tempfile.mkdtemp(prefix="medrelease-latency-"))
    inbox = base / "inbox"
    with (running_server(base) as api_url,
          temporary_settings(updates={PREFECT_API_URL: api_url}),
          running_serve(base, api_url, ("--inbox", str(inbox), "--interval", "0.5")),
          get_client(sync_client=True) as client):
        while True:
            try:
                deployment = client.read_deployment_by_name("medrelease-on-arrival/on-arrival")
                break
            except Exception:  # not registered yet
                time.sleep(1)
        time.sleep(3)  # let the runner start polling
        for drop in range(args.drops):
            extract = base / f"extract-{drop}.csv"
            sample.sample(args.rows, random_state=drop).to_csv(extract, index=False)
            started = time.monotonic()
            shutil.copy(extract, inbox / extract.name)
            while True:
                runs = client.read_flow_runs(deployment_filter=DeploymentFilter(
                    id=DeploymentFilterId(any_=[deployment.id])))
                done = [r for r in runs if r.state and r.state.is_final()]
                if len(done) > drop:
                    break
                time.sleep(0.25)
            state = sorted(done, key=lambda r: r.start_time)[-1].state.name
            print(f"drop {drop + 1}: {args.rows} rows -> {state} after "
                  f"{time.monotonic() - started:.1f} s")
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
