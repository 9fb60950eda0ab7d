"""The public manifest and the steward record, validated before they are written.

``PublicManifest`` has exactly the fields of ``medrelease.privacy.publication.PUBLISHED`` (a test checks
that the two never drift); ``schemas/manifest.schema.json`` is its JSON Schema, written by
``python -m schemas.manifest``. ``StewardRecord`` is what stays internal.
"""

from __future__ import annotations

from typing import Any, Literal

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


class LifetimeRecord(BaseModel):
    source: str
    epsilon_spent: float
    delta_spent: float
    epsilon_cap: float
    delta_cap: float
    cap_changes: list[dict[str, Any]] = Field(
        default_factory=list, description="every change of the cap: day, old, new, reason")
    void: bool
    void_reason: str | None
    voided_by_this_release: bool = Field(
        default=False, description="this release made no proven DP claim and voided the "
                                   "source's lifetime guarantee (the steward confirmed it)")
    privacy_units: list[dict[str, Any]] = Field(
        default_factory=list, description="per neighbouring relation (the privacy unit, in "
                                          "words): the epsilon and delta spent under it")
    mixed_units: bool = Field(default=False, description="spends under more than one unit: "
                                                         "the statement says what that means")
    statement: str


class ChecksRecord(BaseModel):
    passed: bool
    checks: list[str]


class VerdictRecord(BaseModel):
    """``medrelease.evidence.verdict.PublicationVerdict.as_dict``: what the review gate, the
    run's final state and the portal read."""

    level: Literal["fit", "use with care", "not fit"]
    headline: str
    reasons: list[str]
    analyses: list[dict[str, Any]] = Field(
        description="per declared analysis: name, columns, levels, status, why, how each "
                    "column is served (kept, coarser, generalized away, ...), figures")
    domains: list[dict[str, Any]] = Field(
        default_factory=list, description="per declared domain: values declared and released")
    impossible_rows: int | None = Field(
        default=None, description="released rows holding a declared impossible combination "
                                  "(None: none declared)")
    thresholds: dict[str, float]
    basis: str


class PublicManifest(BaseModel):
    """What researchers receive with the data (see docs/PRIVACY.md, "What is published")."""

    model_config = ConfigDict(extra="forbid")

    release_id: str = Field(pattern=r"^(TEST-)?\d{8}T\d{6}Z-[a-z0-9-]+-[0-9a-f]{8}$")
    created_at: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    test_release: bool
    dataset: str
    source: str
    package_version: str
    mechanism: str
    parameters: dict[str, Any]
    guarantee: GuaranteeRecord
    budget_steps: list[BudgetStepRecord]
    epsilon_spent: float
    delta_spent: float
    lifetime: LifetimeRecord
    seed_policy: str
    randomness: str  # the random source in words (CSPRNG for anything publishable)
    columns: dict[str, dict[str, Any]]
    checks: ChecksRecord
    files: list[str]
    text_safety: dict[str, str]
    chosen_node: dict[str, int]
    chosen_node_height: int
    mechanism_details: dict[str, Any] = Field(
        default_factory=dict,
        description="the mechanism's own released summary (diffgen: final cut, set-valued splits)")
    error_bars: dict[str, Any] = Field(
        description="95 % intervals and bounds for the researcher, from the mechanism's "
                    "outputs and public parameters only (docs/PRIVACY.md, \"Error bars\")")
    released_rows: int
    risk: dict[str, float | int]
    verdict: VerdictRecord = Field(
        description="the publication verdict: level (fit, use with care, not fit), headline, "
                    "reasons, each declared analysis and how the release serves it, the "
                    "thresholds; computed from the released rows, the mechanism's published "
                    "outputs and public parameters only (docs/PRIVACY.md, \"What the review "
                    "may look at\")")


class StewardRecord(BaseModel):
    """Never published: everything about the release that was computed from the raw input."""

    model_config = ConfigDict(extra="forbid")

    release_id: str
    dataset: str
    test_release: bool
    status: str
    requested_at: str | None = None
    published_at: str | None = None
    published_path: str | None = None
    staged_path: str | None = None  # review: required: where it waited for the review
    review: dict[str, Any] | None = None  # the review's decision, reason and time
    error: str | None = None
    flow_run_id: str | None
    ledger_spend_id: str
    ledger_charge: dict[str, Any]
    input_file: str
    input_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    # the digest of the parsed rows (medrelease.data.content); None when it was not taken
    input_rows_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    input_rows: int
    dropped_rows: int = 0
    unit_bound: dict[str, int] | None = None  # the privacy unit bound's counts (input facts)
    dataset_config: dict[str, Any]
    information_loss: dict[str, float]
    selection: dict[str, Any]
    output_checks: dict[str, Any]
    lifetime_cap_note: str | None = None
    declared_rows_check: str | None = None
