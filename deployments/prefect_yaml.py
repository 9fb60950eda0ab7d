"""``deployments/prefect.yaml``, written from :func:`deployments.serve.build_deployments`.

The deployments are declared once, in ``serve.py``; ``prefect deploy`` with a work pool needs
them as YAML, so this module renders that file from the same objects (names, entrypoints,
descriptions, tags, parameters, schedules, triggers). ``tests/flow/test_deployments_declared_once.py``
fails when the committed file and the declaration disagree; regenerate with

    python -m deployments.prefect_yaml            # rewrite deployments/prefect.yaml
    python -m deployments.prefect_yaml --check    # exit 1 if it is out of date
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from pathlib import Path
from typing import Any

import yaml

PREFECT_YAML = Path(__file__).with_name("prefect.yaml")
WORK_POOL = "medrelease-local"
HEADER = """\
# GENERATED from deployments/serve.py by `python -m deployments.prefect_yaml`: edit serve.py.
# The same deployments as `medrelease serve`, for `prefect deploy` with a process work pool.
#   cd <checkout> && prefect work-pool create medrelease-local --type process
#   MEDRELEASE_CHECKOUT=$PWD prefect deploy --all --prefect-file deployments/prefect.yaml
#   MEDRELEASE_CHECKOUT=$PWD prefect worker start --pool medrelease-local
# For on-arrival runs and the watcher, the worker's environment names the inbox and its
# dataset, as `medrelease serve --inbox DIR --dataset NAME` sets them (a run's parameters
# cannot): MEDRELEASE_INBOX=/abs/inbox MEDRELEASE_INBOX_DATASETS='{"/abs/inbox": "NAME"}'
# The forms' help that reads the ledger (budget left, datasets ready) is kept current by
# `medrelease serve` (flows/forms.py); with a worker alone it stays as `prefect deploy` wrote it.
"""


def _schedule(schedule: Any) -> dict[str, Any]:
    """A deployment schedule as prefect.yaml spells it (cron schedules only are declared)."""
    inner = schedule.schedule
    return {"cron": inner.cron, "timezone": inner.timezone or "UTC"}


def _trigger(trigger: Any) -> dict[str, Any]:
    """An event trigger as prefect.yaml spells it."""
    match = trigger.match.model_dump() if hasattr(trigger.match, "model_dump") else trigger.match
    return {"type": "event", "name": trigger.name, "enabled": trigger.enabled,
            "match": dict(match), "expect": sorted(trigger.expect),
            "parameters": dict(trigger.parameters or {})}


def deployment_entry(deployment: Any) -> dict[str, Any]:
    """One ``deployments:`` item of prefect.yaml for a served deployment."""
    entry: dict[str, Any] = {"name": deployment.name, "entrypoint": deployment.entrypoint,
                             "description": deployment.description,
                             "tags": list(deployment.tags)}
    if deployment.parameters:
        entry["parameters"] = deployment.parameters
    if deployment.schedules:
        entry["schedules"] = [_schedule(s) for s in deployment.schedules]
    if deployment.triggers:
        entry["triggers"] = [_trigger(t) for t in deployment.triggers]
    entry["work_pool"] = {"name": WORK_POOL}
    return entry


def prefect_yaml_text(deployments: list[Any] | None = None) -> str:
    """The whole prefect.yaml for ``deployments`` (default: every served deployment)."""
    if deployments is None:
        from deployments.serve import build_deployments

        deployments = build_deployments()
    document = {
        "name": "medrelease",
        "prefect-version": importlib.metadata.version("prefect"),
        "pull": [{"prefect.deployments.steps.set_working_directory":
                  {"directory": "{{ $MEDRELEASE_CHECKOUT }}"}}],
        "deployments": [deployment_entry(d) for d in deployments],
    }
    body = yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=100)
    return HEADER + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 (and say so) if deployments/prefect.yaml is out of date")
    args = parser.parse_args(argv)
    text = prefect_yaml_text()
    if args.check:
        if PREFECT_YAML.read_text() != text:
            print(f"{PREFECT_YAML} is out of date: run python -m deployments.prefect_yaml",
                  file=sys.stderr)
            return 1
        return 0
    PREFECT_YAML.write_text(text)
    print(f"wrote {PREFECT_YAML}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
