"""The deployments are declared once (``deployments/serve.py``); ``prefect.yaml`` is generated.

A deployment added, renamed or rescheduled in ``serve.py`` without regenerating the YAML (or a
hand edit of the YAML) fails here, so ``prefect deploy`` never runs a different set of
deployments than ``medrelease serve``.
"""

from __future__ import annotations

import yaml
from prefect.cli.deploy._models import PrefectYamlModel

from deployments.prefect_yaml import PREFECT_YAML, prefect_yaml_text
from deployments.serve import build_deployments


def test_prefect_yaml_is_the_served_deployments_rendered() -> None:
    assert PREFECT_YAML.read_text() == prefect_yaml_text(), (
        "deployments/prefect.yaml is out of date: run python -m deployments.prefect_yaml")


def test_prefect_reads_every_served_deployment_from_the_yaml() -> None:
    document = PrefectYamlModel.model_validate(yaml.safe_load(PREFECT_YAML.read_text()))
    served = {d.name: d for d in build_deployments()}
    declared = {d.name: d for d in document.deployments}
    assert set(declared) == set(served)
    for name, deployment in served.items():
        assert declared[name].entrypoint == deployment.entrypoint
        assert (declared[name].parameters or {}) == (deployment.parameters or {})
        assert len(declared[name].triggers or []) == len(deployment.triggers or [])
        assert [s.cron for s in declared[name].schedules or []] == \
            [s.schedule.cron for s in deployment.schedules or []]
