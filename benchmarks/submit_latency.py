"""Submit -> release folder on a warm ``medrelease serve``, as the form's Submit does it (issue 27).

Starts a real ``prefect server`` (own SQLite database, loopback port) and ``medrelease serve``
with the product's own settings, waits until the on-demand deployment is registered and the
runner polls, then creates flow runs of ``medrelease-release/on-demand`` with the deployment's
default parameters (what Submit with the defaults sends) one after another, and prints for each:
seconds from the API call to the run starting (the runner's poll and the run's process start),
to the release folder's manifest existing, and to the run's completion (evaluation included).

    python benchmarks/submit_latency.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _wait_for_deployment(client, name: str):
    while True:
        try:
            return client.read_deployment_by_name(name)
        except Exception:  # not registered yet
            time.sleep(0.5)


def _one_submit(client, deployment, releases: Path) -> tuple[float, float, float]:
    before = set(releases.glob("*/*/manifest.json")) if releases.exists() else set()
    started = time.monotonic()
    run = client.create_flow_run_from_deployment(deployment.id)
    running = folder = None
    while True:
        state = client.read_flow_run(run.id).state
        now = time.monotonic() - started
        if running is None and state and (state.is_running() or state.is_final()):
            running = now
        if folder is None and releases.exists() and set(
                releases.glob("*/*/manifest.json")) - before:
            folder = now
        if state and state.is_final():
            if os.environ.get("SUBMIT_LATENCY_STATES"):  # where the seconds go, per state
                created = client.read_flow_run(run.id).created
                print("   ", ", ".join(f"{s.name} +{(s.timestamp - created).total_seconds():.1f}"
                                      for s in client.read_flow_run_states(run.id)))
            return running or now, folder or float("nan"), now
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from deployments.local_server import running_serve, running_server

    base = Path(tempfile.mkdtemp(prefix="medrelease-submit-"))
    with (running_server(base) as api_url,
          temporary_settings(updates={PREFECT_API_URL: api_url}),
          running_serve(base, api_url),
          get_client(sync_client=True) as client):
        deployment = _wait_for_deployment(client, "medrelease-release/on-demand")
        time.sleep(5)  # the runner is polling: a warm serve
        print("| submit | run started (s) | release folder (s) | run completed (s) |")
        print("|---|---|---|---|")
        for i in range(args.runs):
            running, folder, done = _one_submit(client, deployment, base / "home" / "releases")
            print(f"| {i + 1} | {running:.1f} | {folder:.1f} | {done:.1f} |", flush=True)
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
