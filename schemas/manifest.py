"""The release manifest: what was released, how, at what privacy cost, from which input.

A pydantic model so it is validated before it is written; ``manifest.schema.json`` beside this
file is its JSON Schema (regenerate with ``python -m schemas.manifest``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class GuaranteeRecord(BaseModel):
    mechanism: str
    epsilon: float | None
    delta: float | None
    neighbouring: str
    proven: bool
    label: str
    notes: str = ""
    statement: str


class BudgetStepRecord(BaseModel):
    step: str
    epsilon: float
    delta: float
    mechanism: str
    description: str = ""


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    release_id: str
    dataset: str
    created_at: str
    package_version: str
    flow_run_id: str | None
    input_file: str
    input_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    dataset_config: dict[str, Any]
    mechanism: str
    parameters: dict[str, Any]
    guarantee: GuaranteeRecord
    budget_steps: list[BudgetStepRecord]
    epsilon_spent: float
    delta_spent: float
    ledger_spend_id: str
    seed_policy: str
    for_publication: bool
    chosen_node: dict[str, int]
    chosen_node_height: int
    input_rows: int
    released_rows: int
    information_loss: dict[str, float]
    risk: dict[str, float | int]
    mechanism_details: dict[str, Any] = Field(
        default_factory=dict,
        description="the mechanism's own released summary (diffgen: final cut, set-valued splits)")
    checks_passed: bool
    files: list[str]


SCHEMA_PATH = Path(__file__).with_name("manifest.schema.json")


def write_json_schema() -> None:
    SCHEMA_PATH.write_text(json.dumps(Manifest.model_json_schema(), indent=2) + "\n")


if __name__ == "__main__":
    write_json_schema()
