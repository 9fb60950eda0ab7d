"""Dataset config: one YAML per dataset, validated by pydantic.

The config says where the input is, what role each column plays, how missing values are
handled, the dataset's lifetime privacy budget and the default mechanism. Relative paths in the
YAML are resolved against the YAML file's folder, so a config and its taxonomies move together.
"""

from __future__ import annotations

import os
import re
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from medrelease.errors import ConfigError
from medrelease.taxonomy import Taxonomy, load_taxonomy

DATASET_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
Role = Literal["dimension", "informative", "class", "set_valued", "drop"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InputSpec(_Strict):
    """Where the extract is and how to read it."""

    path: str
    format: Literal["csv", "parquet"] = "csv"
    delimiter: str = ","
    encoding: str = "utf-8"


class ColumnSpec(_Strict):
    """A column's role; dimensions need a taxonomy, set-valued columns a separator."""

    role: Role
    type: Literal["integer", "string"] = "string"
    taxonomy: str | None = None
    separator: str | None = None
    domain: str | None = None
    values: list[str] | None = None
    description: str = ""

    @model_validator(mode="after")
    def _role_needs(self) -> ColumnSpec:
        if self.role == "dimension" and not self.taxonomy:
            raise ValueError("a 'dimension' column needs a 'taxonomy' file")
        if self.role == "set_valued" and not (self.separator and self.taxonomy):
            raise ValueError("a 'set_valued' column needs a 'separator' and an item 'taxonomy'")
        if self.values is not None and (self.role != "class" or not self.values
                                        or len(set(self.values)) != len(self.values)):
            raise ValueError("'values' (every possible class value, distinct) is for the class "
                             "column")
        if self.domain and self.role != "informative":
            raise ValueError("'domain' (a file of every possible value) is for informative columns")
        return self


class PrivacySpec(_Strict):
    """The source's lifetime budget, and public facts the mechanisms may depend on.

    ``source`` names the data source in the ledger: every config that reads the same extract
    must name the same source, so that they share one lifetime budget (the ledger refuses a
    second id for an input it already knows). The lifetime budget is fixed in the ledger at the
    first spend; editing it here later does not raise it (``medrelease ledger set-cap``).
    ``max_rows`` is a *declared* public bound on the table size: the only way the size of the
    table may enter a parameter (the default delta); the data's own row count never does.
    """

    lifetime_epsilon: float = Field(gt=0, allow_inf_nan=False)
    lifetime_delta: float = Field(default=1e-5, ge=0, lt=1, allow_inf_nan=False)
    source: str | None = Field(default=None, description="ledger source id (default: the "
                                                         "dataset name)")
    max_rows: int | None = Field(default=None, ge=1, le=10**12,
                                 description="declared public upper bound on the rows of an "
                                             "extract (sets the default delta)")

    @field_validator("source")
    @classmethod
    def _source_is_slug(cls, value: str | None) -> str | None:
        if value is not None and not DATASET_NAME.match(value):
            raise ValueError("must be lower-case letters, digits, '-' or '_' (at most 64)")
        return value


class MechanismSpec(_Strict):
    name: str = "ipa"
    params: dict[str, Any] = Field(default_factory=dict)


class DatasetConfig(_Strict):
    """A dataset as the release pipeline sees it."""

    model_config = ConfigDict(extra="forbid", frozen=True, ignored_types=(cached_property,))

    name: str
    description: str = ""
    input: InputSpec
    columns: dict[str, ColumnSpec]
    missing: Literal["reject", "drop_rows"] = "reject"
    privacy: PrivacySpec
    mechanism: MechanismSpec = Field(default_factory=MechanismSpec)
    schedule: str | None = None
    base_dir: str = "."

    @field_validator("name")
    @classmethod
    def _name_is_slug(cls, value: str) -> str:
        if not DATASET_NAME.match(value):
            raise ValueError(
                "must be lower-case letters, digits, '-' or '_' (at most 64), so it is safe as "
                "a folder name"
            )
        return value

    @model_validator(mode="after")
    def _has_dimensions(self) -> DatasetConfig:
        if not self.columns:
            raise ValueError("'columns' is empty")
        if not self.dimensions:
            raise ValueError("at least one column needs role 'dimension'")
        return self

    @property
    def source_id(self) -> str:
        """The ledger's name for the data this config reads (shared by configs of one source)."""
        return self.privacy.source or self.name

    @property
    def input_key(self) -> str:
        """The config's own extract, canonical: the ledger ties it to one source id."""
        return str(self.input_path.resolve())

    @property
    def dimensions(self) -> list[str]:
        return [c for c, s in self.columns.items() if s.role == "dimension"]

    @property
    def set_valued(self) -> list[str]:
        """Columns holding a set of items (e.g. an admission's ICD-9 codes) in one cell."""
        return [c for c, s in self.columns.items() if s.role == "set_valued"]

    @property
    def informative(self) -> list[str]:
        return [c for c, s in self.columns.items() if s.role == "informative"]

    @property
    def class_columns(self) -> list[str]:
        return [c for c, s in self.columns.items() if s.role == "class"]

    @property
    def class_domain(self) -> list[str] | None:
        """The public list of class values, when the config declares one (``values:``)."""
        if len(self.class_columns) != 1:
            return None
        return self.columns[self.class_columns[0]].values

    @property
    def declared(self) -> list[str]:
        """Columns the release may carry (everything but 'drop')."""
        return [c for c, s in self.columns.items() if s.role != "drop"]

    def resolve(self, relative: str) -> Path:
        path = Path(relative)
        return Path(os.path.normpath(path if path.is_absolute() else Path(self.base_dir) / path))

    @property
    def input_path(self) -> Path:
        return self.resolve(self.input.path)

    @cached_property
    def informative_domain(self) -> list[str] | None:
        """The public list of every possible informative value, when the config declares one.

        Mechanisms that release empty cells (``histogram``) need a domain that does not come from
        the data; with one declared, every mechanism uses it as ``Inf``.
        """
        columns = self.informative
        if len(columns) != 1 or not self.columns[columns[0]].domain:
            return None
        path = self.resolve(self.columns[columns[0]].domain or "")
        try:
            values = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
        except OSError as exc:
            raise ConfigError(f"cannot read the domain file of {columns[0]!r}: {exc}") from exc
        values = [v for v in values if v]
        if len(set(values)) != len(values) or not values:
            raise ConfigError(f"domain file {path} must list distinct, non-empty values")
        return values

    @cached_property
    def taxonomies(self) -> dict[str, Taxonomy]:
        """Taxonomy per dimension and per set-valued column (over its items), loaded once."""
        return {
            c: load_taxonomy(self.resolve(self.columns[c].taxonomy or ""), c)
            for c in self.dimensions + self.set_valued
        }


def _explain(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        lines.append(f"  {where}: {err['msg']}")
    return "\n".join(lines)


def config_from_dict(data: Any, base_dir: Path, source: str = "<dict>") -> DatasetConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"dataset config {source}: expected a mapping at the top level")
    try:
        return DatasetConfig(**{**data, "base_dir": str(base_dir)})
    except ValidationError as exc:
        raise ConfigError(f"dataset config {source} is invalid:\n{_explain(exc)}") from None
    except TypeError as exc:
        raise ConfigError(f"dataset config {source} is invalid: {exc}") from None


def load_config(path: str | Path) -> DatasetConfig:
    """Read and validate a dataset YAML; relative paths resolve against its folder."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"dataset config not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read dataset config {path}: {exc}") from None
    return config_from_dict(data, path.parent.resolve(), source=str(path))


def project_root() -> Path:
    """The checkout this package runs from (datasets/ and taxonomies/ live there)."""
    return Path(__file__).resolve().parent.parent


def find_config(name_or_path: str | Path) -> DatasetConfig:
    """A dataset by name (``datasets/<name>/dataset.yaml``) or by path to its YAML."""
    text = str(name_or_path)
    if DATASET_NAME.match(text) and not text.endswith((".yaml", ".yml")):
        candidate = project_root() / "datasets" / text / "dataset.yaml"
        if candidate.is_file():
            return load_config(candidate)
        known = sorted(p.parent.name for p in (project_root() / "datasets").glob("*/dataset.yaml"))
        raise ConfigError(f"no dataset named {text!r}; known datasets: {', '.join(known)}")
    return load_config(text)
