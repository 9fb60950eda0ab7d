"""Dataset config: one YAML per dataset, validated by pydantic.

The config says where the input is, what role each column plays, how missing values are
handled, the dataset's lifetime privacy budget and its mechanism (when it names none, the
registry's rule picks one: ``medrelease.mechanisms.default_mechanism``). Relative paths in the
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

from medrelease.data.binning import NUMERIC_TYPES, canonical_number
from medrelease.data.taxonomy import DEFAULT_MAX_LEAVES, Taxonomy, load_taxonomy
from medrelease.errors import ConfigError, InputValidationError
from medrelease.settings import (
    dataset_roots,
    extra_input_roots,
    inbox_bindings,
    inbox_roots,
    project_root,
)

DATASET_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
Role = Literal["dimension", "informative", "class", "set_valued", "identifier", "drop"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InputSpec(_Strict):
    """Where the extract is and how to read it.

    ``folders`` are the only places an extract of this dataset may be read from (besides the
    inbox the service watches); default: the folder of ``path``.
    """

    path: str
    format: Literal["csv", "parquet"] = "csv"
    delimiter: str = Field(default=",", min_length=1, max_length=1)
    encoding: str = "utf-8"
    folders: list[str] = Field(default_factory=list, max_length=20)

    @field_validator("encoding")
    @classmethod
    def _known_encoding(cls, value: str) -> str:
        import codecs

        try:
            codecs.lookup(value)
        except LookupError:
            raise ValueError(f"unknown text encoding {value!r} (e.g. utf-8, latin-1)") from None
        return value


class ColumnSpec(_Strict):
    """A column's role; dimensions need a taxonomy, set-valued columns a separator."""

    role: Role
    type: Literal["integer", "decimal", "string"] = "string"
    taxonomy: str | None = None
    separator: str | None = None
    domain: str | None = None
    values: list[str] | None = None
    missing: str | None = Field(
        default=None, description="dimension or informative column: the category a missing "
                                  "value becomes (a leaf of the dimension's taxonomy, a value "
                                  "of the informative column's domain)")
    domain_reviewed: bool = Field(
        default=False, description="a steward has reviewed a domain or taxonomy file that "
                                   "'medrelease init' read from the data (its values or range "
                                   "are now public knowledge, not the table's); init never "
                                   "sets it")
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
        if self.role == "identifier" and (self.taxonomy or self.domain or self.separator):
            raise ValueError("an 'identifier' column (a patient or record id, never released) "
                             "takes no taxonomy, domain or separator")
        if self.missing is not None and self.role not in ("dimension", "informative"):
            raise ValueError(
                f"'missing' (the category a missing value becomes) is for dimension and "
                f"informative columns, not for a {self.role!r} column; for missing values "
                "anywhere, the dataset-wide 'missing: drop_rows' drops their rows")
        if self.missing is not None and not self.missing.strip():
            raise ValueError("'missing' names the category a missing value becomes, so it "
                             "cannot be an empty text; to drop rows with missing values use "
                             "the dataset-wide 'missing: drop_rows' instead")
        if self.domain_reviewed and not (self.domain or (self.role == "dimension"
                                                          and self.taxonomy)):
            raise ValueError("'domain_reviewed' marks a reviewed 'domain' file, or a "
                             "dimension's reviewed 'taxonomy'; this column declares neither")
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
    unit: str | None = Field(
        default=None, description="the privacy unit: an 'identifier' column (e.g. patient_id); "
                                  "neighbouring extracts then differ in all rows of one unit")
    max_rows_per_unit: int = Field(
        default=1, ge=1, le=1000,
        description="with 'unit': each unit's rows are cut to at most this many, chosen at "
                    "random, before anything else (a public parameter)")
    unit_noun: str | None = Field(
        default=None, min_length=1, max_length=40,
        description="what one unit is, in words (the guarantee says it; with 'unit' and no "
                    "noun: 'patient'; without 'unit', what the row note says a row is not)")
    row_noun: str | None = Field(default=None, min_length=1, max_length=40,
                                 description="what one row is, in words (e.g. admission); "
                                             "none: 'row'")

    @property
    def one_row_per_unit(self) -> bool:
        """The steward's nouns say one row is one unit (``row_noun`` = ``unit_noun``, not
        'row'): without ``unit``, the guarantee then protects one of them (issue 55)."""
        return bool(self.row_noun) and self.row_noun != "row" and self.row_noun == self.unit_noun

    @property
    def unit_words(self) -> str:
        """One unit, in words, for the unit relation (``unit`` declared)."""
        return self.unit_noun or "patient"

    @property
    def row_words(self) -> str:
        return self.row_noun or "row"

    @field_validator("source")
    @classmethod
    def _source_is_slug(cls, value: str | None) -> str | None:
        if value is not None and not DATASET_NAME.match(value):
            raise ValueError("must be lower-case letters, digits, '-' or '_' (at most 64)")
        return value


class WorkloadSet(_Strict):
    """One marginal a researcher needs (``aim`` aims its measurements at these)."""

    columns: list[str] = Field(min_length=1, max_length=6)
    weight: float = Field(default=1.0, gt=0, le=1000, allow_inf_nan=False)


class AnalysisSpec(_Strict):
    """A table researchers need, declared so that the release is judged on it first (e.g. the
    outcome rate by treatment): released columns, each optionally at a taxonomy level (0 = its
    leaves, the default). ``aim`` measures every declared analysis early with a stated share of
    its budget; the other mechanisms say how they serve it (kept, coarsened, generalized away).

    YAML: ``- [rx, status]`` or ``- {columns: [chapter, age], levels: {age: 1}}``."""

    columns: list[str] = Field(min_length=1, max_length=4)
    levels: dict[str, int] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _short_form(cls, data: Any) -> Any:
        if isinstance(data, (list, tuple)):
            return {"columns": list(data)}
        if isinstance(data, str):
            return {"columns": [c.strip() for c in data.split(",") if c.strip()]}
        return data

    @model_validator(mode="after")
    def _levels_of_its_columns(self) -> AnalysisSpec:
        if len(set(self.columns)) != len(self.columns):
            raise ValueError(f"analysis {self.columns}: a column is named twice")
        stray = sorted(set(self.levels) - set(self.columns))
        if stray:
            raise ValueError(f"analysis {self.columns}: 'levels' names column(s) "
                             f"{', '.join(stray)} that the analysis does not list")
        if any(level < 0 for level in self.levels.values()):
            raise ValueError(f"analysis {self.columns}: a taxonomy level is 0 (the values "
                             "themselves) or more (coarser)")
        return self

    def level_of(self, column: str) -> int:
        return self.levels.get(column, 0)

    @property
    def name(self) -> str:
        """How reports name it: ``rx × status`` (a level other than 0 in brackets)."""
        return " × ".join(c + (f" (level {self.levels[c]})" if self.levels.get(c) else "")
                          for c in self.columns)


class ImpossibleSpec(_Strict):
    """A combination of values no real row can hold (e.g. a cause of death for a person alive
    at follow-up): per column, the values (labels of any taxonomy level, or domain values) that
    cannot occur together. No released row of a mechanism that draws rows holds one.

    YAML: ``- {when: {status: ["0"], cause: [cancer, heart]}, reason: "alive, with a cause"}``
    (or the ``when`` mapping alone)."""

    when: dict[str, list[str]] = Field(min_length=1, max_length=6)
    reason: str = Field(default="", max_length=300)

    @model_validator(mode="before")
    @classmethod
    def _short_form(cls, data: Any) -> Any:
        if isinstance(data, dict) and "when" not in data:
            return {"when": data}
        return data

    @field_validator("when")
    @classmethod
    def _values_as_text(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for column, values in value.items():
            if not values:
                raise ValueError(f"impossible combination: column {column!r} lists no value")
        return {c: [str(v) for v in values] for c, values in value.items()}


class MechanismSpec(_Strict):
    """The dataset's own mechanism; no ``name`` means the registry's rule for a dataset
    (``default_mechanism``: ``aim`` with a declared informative domain, else ``ipa``)."""

    name: str | None = Field(default=None, min_length=1)
    params: dict[str, Any] = Field(default_factory=dict)


TABLE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
# a release folder's own files: no table may be named like one (its files would collide)
RESERVED_TABLE_NAMES = frozenset({"data", "manifest", "report", "intervals", "measurements"})


def table_name_of(path: str) -> str:
    """A table's name from its file: the stem, lower-case (``ADMISSIONS.csv`` -> admissions);
    the released file is named after it."""
    return Path(path).stem.lower()


class ChildColumnSpec(_Strict):
    """A released column of a child table: a taxonomy file (its leaves are the values) or a
    public list of values, and optionally the category a missing value becomes."""

    taxonomy: str | None = None
    values: list[str] | None = None
    missing: str | None = None
    description: str = ""
    from_data: bool = Field(default=False, description="'medrelease init' listed these values "
                                                       "from the data (it sets this)")
    domain_reviewed: bool = Field(
        default=False, description="a steward has reviewed values or a taxonomy file that "
                                   "'medrelease init' read from the data; init never sets it")

    @model_validator(mode="after")
    def _one_vocabulary(self) -> ChildColumnSpec:
        if (self.taxonomy is None) == (self.values is None):
            raise ValueError("a child table's column needs either 'taxonomy' (a file) or "
                             "'values' (every possible value), not both")
        if self.values is not None and (not self.values or len(set(self.values))
                                        != len(self.values)):
            raise ValueError("'values' lists every possible value, each once")
        return self


class ChildTableSpec(_Strict):
    """A table whose rows reference a row of its parent (the parent table by default):
    ``path`` its file, ``references`` its column holding the parent's key, ``key`` its own key
    (needed when a table below references it), ``max_children`` the public bound on a parent's
    rows in it (each parent's rows are cut to at most that many, at random)."""

    path: str
    name: str | None = Field(default=None, description="default: the file's stem, lower-case")
    parent: str | None = Field(default=None, description="default: the parent table")
    references: str = Field(min_length=1)
    key: str | None = None
    max_children: int = Field(ge=1, le=1000)
    max_children_reviewed: bool = Field(
        default=False, description="a steward has reviewed a max_children that 'medrelease "
                                   "init' drafted from the data; init never sets it")
    columns: dict[str, ChildColumnSpec] = Field(min_length=1)
    format: Literal["csv", "parquet"] = "csv"
    delimiter: str = Field(default=",", min_length=1, max_length=1)

    @property
    def table(self) -> str:
        return self.name or table_name_of(self.path)


class RelationalSpec(_Strict):
    """A relational dataset: the config's own input and columns are the parent table (one row
    per patient, keyed by ``privacy.unit``); ``tables`` the tables that reference it, one or
    more levels deep (patients -> admissions -> diagnoses). ``analyses``: tables researchers
    need across tables, as ``<table>.<column>`` names (a count: ``<table>.n_<child>``)."""

    name: str | None = Field(default=None, description="the parent table's name (default: "
                                                        "its file's stem, lower-case)")
    tables: list[ChildTableSpec] = Field(min_length=1, max_length=20)
    analyses: list[list[str]] = Field(default_factory=list, max_length=50)

    @field_validator("analyses", mode="before")
    @classmethod
    def _analysis_short_form(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [[c.strip() for c in a.split(",") if c.strip()] if isinstance(a, str) else a
                    for a in value]
        return value


DP_MECHANISMS = ("ipa", "histogram", "diffgen", "aim", "relational")


class ReleasePolicy(_Strict):
    """What a steward allows for this dataset; the form, the CLI and every trigger obey it.

    By default only the DP mechanisms may run, a release may spend at most ``max_epsilon``, and
    a mechanism whose guarantee is not proven (``ipa-paper``, ``histogram`` without a public
    domain, the syntactic models, pseudonymization) needs both a place in ``mechanisms`` and
    ``allow_unproven: true``.
    """

    mechanisms: list[str] = Field(default_factory=lambda: list(DP_MECHANISMS), min_length=1)
    max_epsilon: float = Field(default=2.0, gt=0, le=100, allow_inf_nan=False)
    min_k: int = Field(default=10, ge=2, le=1_000_000)
    allow_unproven: bool = False
    # Work limits, checked from public parameters before any spend (the refusal names them).
    max_lattice_nodes: int = Field(
        default=20_000, ge=1, le=10_000_000,
        description="refuse a lattice (product of taxonomy heights + 1) with more nodes")
    max_taxonomy_leaves: int = Field(
        default=DEFAULT_MAX_LEAVES, ge=1, le=5_000_000,
        description="refuse a taxonomy with more leaves (refused before it is built)")
    max_noise_rows: int = Field(
        default=2_000_000, ge=0, le=10**9,
        description="refuse a release whose noise is expected to add more rows than this")
    max_leaf_cells: int = Field(
        default=5_000_000, ge=1, le=10**9,
        description="diffgen: refuse specializations whose final cut could have more leaf "
                    "partitions x class values than this (every one is drawn)")
    # Input limits, checked on the file's header or Parquet footer before a row is read.
    max_input_columns: int = Field(
        default=1000, ge=1, le=1_000_000,
        description="refuse an extract with more columns than this (its CSV header or Parquet "
                    "schema, counted before it is read)")
    max_input_bytes: int = Field(
        default=4 * 2**30, ge=1, le=2**50,
        description="refuse an extract larger than this unpacked: a CSV file's size; a Parquet "
                    "file's size, and its read columns' uncompressed size from its footer")


class DatasetConfig(_Strict):
    """A dataset as the release pipeline sees it."""

    model_config = ConfigDict(extra="forbid", frozen=True, ignored_types=(cached_property,))

    name: str
    description: str = ""
    input: InputSpec
    columns: dict[str, ColumnSpec]
    missing: Literal["reject", "drop_rows"] = "reject"
    drop_limit: float = Field(default=0.05, ge=0, le=1, allow_inf_nan=False,
                              description="drop_rows: refuse when more than this share of "
                                          "rows would be dropped")
    privacy: PrivacySpec
    mechanism: MechanismSpec = Field(default_factory=MechanismSpec)
    policy: ReleasePolicy = Field(default_factory=ReleasePolicy)
    schedule: str | None = None
    review: Literal["off", "required"] = Field(
        default="off", description="required: every release of this dataset (form, CLI, "
                                   "schedule, arrival) is built into a staging area with its "
                                   "evidence and waits for a steward's approve / reject before "
                                   "anything is published; the spend counts either way")
    review_timeout_hours: float = Field(
        default=168.0, gt=0, le=8760, allow_inf_nan=False,
        description="a review left open this long ends the run as 'Not published' (nothing "
                    "published, the spend counted)")
    workload: list[WorkloadSet] | None = Field(
        default=None, max_length=500,
        description="the marginals researchers need (aim); default: every 2- and 3-way")
    analyses: list[AnalysisSpec] = Field(
        default_factory=list, max_length=50,
        description="the tables researchers need (column sets, optionally at a taxonomy "
                    "level): aim measures them first, every release says how it serves them, "
                    "and the publication verdict judges the release on them")
    impossible: list[ImpossibleSpec] = Field(
        default_factory=list, max_length=200,
        description="combinations of values no real row holds: never released")
    relational: RelationalSpec | None = Field(
        default=None, description="a relational dataset: the tables that reference the parent "
                                  "table (this config's input), released together by the "
                                  "'relational' mechanism")
    expected_rows: int | None = Field(
        default=None, ge=1, le=10**12,
        description="the steward's expected size of an extract (rows), for choosing epsilon "
                    "before spending ('medrelease check --epsilon / --target-error'); never "
                    "read from the data, never used by a release")
    base_dir: str = "."
    config_file: str = Field(default="", description="set when loaded: the YAML it came from")

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

    @model_validator(mode="after")
    def _workload_names_released_columns(self) -> DatasetConfig:
        released = set(self.dimensions + self.informative)
        for entry in self.workload or []:
            unknown = sorted(set(entry.columns) - released)
            if unknown or len(set(entry.columns)) != len(entry.columns):
                raise ValueError(
                    f"workload entry {entry.columns}: every column must be a distinct "
                    f"dimension or informative column (not: {', '.join(unknown) or 'repeated'})")
        return self

    @model_validator(mode="after")
    def _analyses_and_impossible_name_released_columns(self) -> DatasetConfig:
        released = set(self.dimensions + self.informative)
        for analysis in self.analyses:
            unknown = sorted(set(analysis.columns) - released)
            if unknown:
                raise ValueError(
                    f"analysis {analysis.columns}: {', '.join(unknown)} is not a dimension or "
                    f"informative column (released: {', '.join(sorted(released))})")
        for combination in self.impossible:
            unknown = sorted(set(combination.when) - released)
            if unknown:
                raise ValueError(
                    f"impossible combination {sorted(combination.when)}: {', '.join(unknown)} "
                    "is not a dimension or informative column")
        return self

    @model_validator(mode="after")
    def _unit_is_an_identifier(self) -> DatasetConfig:
        unit = self.privacy.unit
        if unit is None:
            if self.privacy.max_rows_per_unit != 1:
                raise ValueError("privacy.max_rows_per_unit needs privacy.unit (the identifier "
                                 "column whose rows it bounds)")
            return self
        spec = self.columns.get(unit)
        if spec is None or spec.role != "identifier":
            raise ValueError(f"privacy.unit {unit!r} must name a column with role 'identifier' "
                             f"(identifier columns: {', '.join(self.identifiers) or 'none'})")
        return self

    @model_validator(mode="after")
    def _relational_tables(self) -> DatasetConfig:
        """A relational dataset: the parent table keyed by the privacy unit (one row per
        patient), released columns a taxonomy or a list of values, tables named once."""
        spec = self.relational
        if spec is None:
            return self
        if self.privacy.unit is None:
            raise ValueError("a relational dataset needs privacy.unit: the parent table's key "
                             "(one row per patient), whose rows in every table are protected")
        if self.privacy.max_rows_per_unit != 1:
            raise ValueError("a relational dataset's parent table has one row per unit: leave "
                             "privacy.max_rows_per_unit at 1 (each child table's "
                             "max_children bounds a patient's rows there)")
        unsupported = [c for c, s in self.columns.items()
                       if s.role in ("informative", "set_valued")
                       or (s.role == "class" and not s.values)]
        if unsupported:
            raise ValueError(f"relational dataset: column(s) {', '.join(unsupported)} of the "
                             "parent table need role 'dimension' (a taxonomy) or 'class' with "
                             "'values'; an item set or an informative column is not released "
                             "in a relational release (put items in a child table)")
        names = [self.root_table] + [t.table for t in spec.tables]
        bad = [n for n in names if not TABLE_NAME.match(n) or n in RESERVED_TABLE_NAMES]
        if bad:
            raise ValueError(f"table name(s) {', '.join(bad)}: lower-case letters, digits and "
                             "'_', starting with a letter, and none of "
                             f"{', '.join(sorted(RESERVED_TABLE_NAMES))} (a release folder's "
                             "own files); set 'name:' for a file whose stem is not one")
        if len(set(names)) != len(names):
            raise ValueError(f"two tables have the same name ({', '.join(names)}); set 'name:' "
                             "on one of them")
        return self

    @model_validator(mode="after")
    def _files_where_the_steward_put_them(self) -> DatasetConfig:
        """Taxonomy and domain files only from the config's own folder or ``taxonomies/``."""
        allowed = [Path(self.base_dir).resolve(), (project_root() / "taxonomies").resolve()]
        for column, spec in self.columns.items():
            for key in ("taxonomy", "domain"):
                relative = getattr(spec, key)
                if relative and not _inside(self.resolve(relative), allowed):
                    raise ValueError(
                        f"column {column!r}: the {key} file must lie in the dataset config's "
                        f"own folder or in the project's taxonomies/ folder (symbolic links "
                        f"are followed before this check)")
        return self

    def extract_path(self, override: str | None = None) -> Path:
        """The extract to read: the config's own, or ``override`` if it lies in a declared
        input folder (or the watched inbox). Resolved, symbolic links included, before any
        byte is read; the message names the rule, never the file's content."""
        if override is None:
            self._refuse_another_inbox(self.input_path)
            return self.input_path
        path = Path(override)
        if not path.is_absolute():
            raise ConfigError(f"input path {override!r} must be absolute")
        allowed = [*self.input_folders, *extra_input_roots()]
        if not _inside(path, allowed):
            raise ConfigError(
                f"input path {override!r} is not in an input folder of dataset {self.name!r}: "
                f"extracts are read only from {', '.join(str(f) for f in allowed)} (declare "
                "more with input.folders in the dataset config); symbolic links are resolved "
                "before this check")
        self._refuse_another_inbox(path)
        return path

    def _refuse_another_inbox(self, path: Path) -> None:
        """A file inside a served inbox (``held/`` included) belongs to that inbox's dataset
        alone: named by any other dataset, on demand or in its YAML, it would be published
        without the inbox dataset's review and charged to another source. The inbox's dataset
        is the one ``serve --inbox DIR --dataset NAME`` fixed; an inbox without one releases
        nothing. Symbolic links are resolved first, so a link in another dataset's folder
        that points into the inbox is refused too."""
        real = Path(os.path.realpath(path))
        for inbox in inbox_roots():
            root = Path(os.path.realpath(inbox))
            if real != root and not real.is_relative_to(root):
                continue
            bindings = inbox_bindings()
            bound = (bindings or {}).get(str(root))
            if bound is None:
                raise ConfigError(
                    f"input path {str(path)!r} lies in the inbox {root}, which has no dataset "
                    "fixed for it (MEDRELEASE_INBOX_DATASETS, set by 'medrelease serve --inbox "
                    "DIR --dataset NAME'): its extracts are released by that dataset only. "
                    "Nothing was read or spent.")
            owner = _inbox_owner(bound)
            if owner.name == self.name and (not owner.config_file or not self.config_file or
                                            os.path.realpath(owner.config_file)
                                            == os.path.realpath(self.config_file)):
                return
            raise ConfigError(
                f"input path {str(path)!r} lies in the inbox {root}, whose extracts belong to "
                f"dataset {owner.name!r} only (fixed by 'medrelease serve --inbox DIR --dataset "
                f"NAME'; its review and its source's budget apply to them): dataset "
                f"{self.name!r} cannot release them. Nothing was read or spent.")

    def extract_files(self, override: str | None = None) -> list[Path]:
        """The extract's files: the one file, or — when the file name holds a pattern (``*``,
        ``?``, ``[``), e.g. ``visits-*.parquet`` — every regular file it matches in that
        folder, sorted by name: the partitions of one extract, read apart and merged. Each
        match obeys the input-folder rule on its own (a symbolic link cannot lead out)."""
        path = self.extract_path(override)
        if PATTERN_CHARS & set(str(path.parent)):
            raise ConfigError(f"input path {str(path)!r}: only the file name may hold a pattern")
        if not PATTERN_CHARS & set(path.name):
            return [path]
        allowed = [*self.input_folders, *extra_input_roots()]
        matches = sorted(p for p in path.parent.glob(path.name)
                         if p.is_file() and not p.name.startswith("."))
        outside = [p.name for p in matches if not _inside(p, allowed)]
        if outside:
            raise ConfigError(f"input file(s) {', '.join(outside[:3])} matched by {path.name!r} "
                              "lead out of the dataset's input folders (symbolic links)")
        for match in matches:  # a link among the matches may lead into an inbox
            self._refuse_another_inbox(match)
        if not matches:
            raise InputValidationError(f"no file matches the input pattern {path}: nothing to "
                                       "release")
        return matches

    @property
    def root_table(self) -> str:
        """A relational dataset's parent table name (its file's stem unless declared)."""
        spec = self.relational
        return (spec.name if spec and spec.name else None) or table_name_of(self.input.path)

    def table_files(self, override: str | None = None) -> dict[str, Path]:
        """A relational dataset's files by table, the parent table first (``override``
        replaces the parent table's file only; the other tables are the config's). Every file
        obeys the input-folder rule."""
        spec = self.relational
        if spec is None:
            raise ConfigError(f"dataset {self.name!r} is not relational")
        if override is not None and Path(os.path.realpath(override)) != Path(
                os.path.realpath(self.input_path)):
            raise ConfigError(
                f"dataset {self.name!r} is relational: its tables are read together from the "
                "files its config names, and another input path would replace the parent "
                "table alone (its patients would lose or gain rows in the other tables). "
                "Put the new extract's files where the config says (or a copy of the config "
                "naming them). Nothing was read or spent.")
        files = {self.root_table: self.extract_path(override)}
        allowed = [*self.input_folders, *extra_input_roots()]
        for table in spec.tables:
            path = self.resolve(table.path)
            if PATTERN_CHARS & set(str(path)):
                raise ConfigError(f"table {table.table}: its file name cannot hold a pattern")
            if not _inside(path, allowed):
                raise ConfigError(
                    f"table {table.table}: its file {str(path)!r} is not in an input folder of "
                    f"dataset {self.name!r} ({', '.join(str(f) for f in allowed)}; declare "
                    "more with input.folders); symbolic links are resolved before this check")
            self._refuse_another_inbox(path)
            files[table.table] = path
        return files

    @cached_property
    def relational_schema(self) -> Any:
        """The ``medrelease.relational.schema.RelSchema`` of a relational dataset: the parent
        table (its dimensions and class column, keyed by ``privacy.unit``), then its tables."""
        from medrelease.relational.schema import RelColumn, RelSchema, RelTable

        spec = self.relational
        if spec is None:
            raise ConfigError(f"dataset {self.name!r} is not relational")
        root_columns = []
        for column, col in self.columns.items():
            if col.role == "dimension":
                root_columns.append(RelColumn(column, self.taxonomies[column], col.missing))
            elif col.role == "class":
                root_columns.append(RelColumn.of_values(column, col.values or []))
        tables = [RelTable(self.root_table, tuple(root_columns), key=self.privacy.unit)]
        for table in spec.tables:
            columns = []
            for column, col in table.columns.items():
                if col.values is not None:
                    columns.append(RelColumn.of_values(column, col.values, col.missing))
                    continue
                path = self.resolve(col.taxonomy or "")
                allowed = [Path(self.base_dir).resolve(), (project_root() / "taxonomies").resolve()]
                if not _inside(path, allowed):
                    raise ConfigError(f"table {table.table}, column {column!r}: its taxonomy "
                                      "file must lie in the dataset config's own folder or in "
                                      "the project's taxonomies/ folder")
                taxonomy = load_taxonomy(path, column, self.policy.max_taxonomy_leaves)
                if col.missing is not None and col.missing not in taxonomy.level_labels[0]:
                    raise ConfigError(f"table {table.table}, column {column!r}: missing: "
                                      f"{col.missing!r} is not a leaf of its taxonomy")
                columns.append(RelColumn(column, taxonomy, col.missing))
            tables.append(RelTable(table.table, tuple(columns), key=table.key,
                                   parent=table.parent or self.root_table,
                                   parent_key=table.references,
                                   max_children=table.max_children))
        return RelSchema(tuple(tables), unit_noun=self.privacy.unit_words,
                         analyses=tuple(tuple(a) for a in spec.analyses))

    @property
    def input_folders(self) -> list[Path]:
        folders = self.input.folders or [str(Path(self.input.path).parent)]
        return [self.resolve(f) for f in folders]

    @property
    def source_id(self) -> str:
        """The ledger's name for the data this config reads (shared by configs of one source)."""
        return self.privacy.source or self.name

    @property
    def input_key(self) -> str:
        """The config's own extract, canonical: the ledger ties it to one source id."""
        return str(self.input_path.resolve())

    def with_role(self, role: str) -> list[str]:
        """The columns of one role, in the config's order."""
        return [c for c, s in self.columns.items() if s.role == role]

    @property
    def dimensions(self) -> list[str]:
        return self.with_role("dimension")

    @property
    def set_valued(self) -> list[str]:
        """Columns holding a set of items (e.g. an admission's ICD-9 codes) in one cell."""
        return self.with_role("set_valued")

    @property
    def informative(self) -> list[str]:
        return self.with_role("informative")

    @property
    def class_columns(self) -> list[str]:
        return self.with_role("class")

    @property
    def class_domain(self) -> list[str] | None:
        """The public list of class values, when the config declares one (``values:``)."""
        if len(self.class_columns) != 1:
            return None
        return self.columns[self.class_columns[0]].values

    @property
    def identifiers(self) -> list[str]:
        """Patient or record ids: read to bound each unit's rows, never released."""
        return self.with_role("identifier")

    @property
    def unit_column(self) -> str | None:
        """The privacy unit's identifier column (``privacy.unit``), or None: one row."""
        return self.privacy.unit

    @property
    def unit_warning(self) -> str | None:
        """Said in the report and the form when ids are declared but the unit is one row."""
        if self.privacy.unit is None and self.identifiers and not self.privacy.one_row_per_unit:
            return (f"{self.name} declares identifier column(s) {', '.join(self.identifiers)} "
                    "but no privacy unit: the guarantee protects one row, and one "
                    f"{self.privacy.unit_noun or 'id'} with several rows is protected less (declare "
                    "privacy.unit and privacy.max_rows_per_unit)")
        return None

    @property
    def declared(self) -> list[str]:
        """Columns the release may carry (everything but 'drop' and identifiers)."""
        return [c for c, s in self.columns.items() if s.role not in ("drop", "identifier")]

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
        values = [v for v in domain_file_lines(path, columns[0])[1] if v]
        if self.columns[columns[0]].type in NUMERIC_TYPES:  # 3 and 3.0 are one value
            values = [str(canonical_number(v)) for v in values]
        if len(set(values)) != len(values) or not values:
            raise ConfigError(f"domain file {path} must list distinct, non-empty values"
                              + (" (numbers compared as numbers: 3 and 3.0 are one)"
                                 if self.columns[columns[0]].type in NUMERIC_TYPES else ""))
        label = self.columns[columns[0]].missing
        if label is not None and label not in values:
            raise ConfigError(
                f"column {columns[0]!r}: missing: {label!r} is not a value of its domain file "
                f"{path.name}; add it as a line so missing values have a place")
        return values

    @cached_property
    def domain_read_from_data(self) -> str | None:
        """The informative column whose domain file says it was read from the data (written
        by ``medrelease init``) and that no steward has marked reviewed, else None.

        Such a domain is a list of the values this table happens to hold: releasing it says
        which values occur, which no epsilon covers; the guarantee says so in words until the
        steward reviews the list and sets ``domain_reviewed: true``."""
        columns = self.informative
        if len(columns) != 1 or not self.columns[columns[0]].domain:
            return None
        spec = self.columns[columns[0]]
        comments, _ = domain_file_lines(self.resolve(spec.domain or ""), columns[0])
        marked = any(line.startswith(READ_FROM_DATA_MARK) for line in comments)
        return columns[0] if marked and not spec.domain_reviewed else None

    @cached_property
    def taxonomies_read_from_data(self) -> list[str]:
        """The dimensions whose taxonomy file says it was read from the data (a value list or
        bands from the data's minimum to its maximum, written by ``medrelease init``) and that
        no steward has marked reviewed (``domain_reviewed: true``), in the config's order.

        Such a taxonomy holds the values this table happens to hold, or its exact range:
        releasing over it says which values occur, which no epsilon covers; the guarantee says
        so in words until the steward reviews the file. Only the leading comment lines are
        read; a file that cannot be read is left to the taxonomy loader to name."""
        marked = []
        for column in self.dimensions:
            spec = self.columns[column]
            if spec.domain_reviewed:
                continue
            try:
                with self.resolve(spec.taxonomy or "").open(encoding="utf-8") as handle:
                    for line in handle:
                        if not line.lstrip().startswith("#"):
                            break
                        if line.strip().startswith(READ_FROM_DATA_MARK):
                            marked.append(column)
                            break
            except (OSError, UnicodeDecodeError):
                continue
        return marked

    @cached_property
    def child_values_from_data(self) -> list[str]:
        """A relational dataset's child columns (``<table>.<column>``) whose values init read
        from the data (``from_data``, or a taxonomy file with init's mark) and that no steward
        has marked ``domain_reviewed``: the guarantee says so, as for the parent's."""
        out = []
        for table in (self.relational.tables if self.relational else []):
            for column, spec in table.columns.items():
                if spec.domain_reviewed:
                    continue
                marked = spec.from_data
                if spec.taxonomy and not marked:
                    try:
                        with self.resolve(spec.taxonomy).open(encoding="utf-8") as handle:
                            marked = any(line.strip().startswith(READ_FROM_DATA_MARK)
                                         for line in handle if line.lstrip().startswith("#"))
                    except (OSError, UnicodeDecodeError):
                        marked = False
                if marked:
                    out.append(f"{table.table}.{column}")
        return out

    @property
    def bounds_not_reviewed(self) -> list[str]:
        """A relational dataset's child tables whose ``max_children`` no steward has marked
        reviewed (``medrelease init`` drafts it from the data: its tail is then disclosed)."""
        return [t.table for t in (self.relational.tables if self.relational else [])
                if not t.max_children_reviewed]

    @cached_property
    def informative_taxonomy(self) -> Taxonomy | None:
        """A taxonomy over the informative column's values, when declared (``aim`` measures
        generalized marginals of it, e.g. diagnosis chapter -> block -> code)."""
        columns = self.informative
        if len(columns) != 1 or not self.columns[columns[0]].taxonomy:
            return None
        return load_taxonomy(self.resolve(self.columns[columns[0]].taxonomy or ""), columns[0],
                             self.policy.max_taxonomy_leaves)

    @cached_property
    def taxonomies(self) -> dict[str, Taxonomy]:
        """Taxonomy per dimension and per set-valued column (over its items), loaded once."""
        loaded = {
            c: load_taxonomy(self.resolve(self.columns[c].taxonomy or ""), c,
                             self.policy.max_taxonomy_leaves)
            for c in self.dimensions + self.set_valued
        }
        for column, taxonomy in loaded.items():
            label = self.columns[column].missing
            if label is not None and label not in taxonomy.level_labels[0]:
                raise ConfigError(
                    f"column {column!r}: missing: {label!r} is not a leaf of its taxonomy "
                    f"{Path(taxonomy.source).name}; add it (a line '{label};...;*', or "
                    f"'missing: {label}' in a numeric taxonomy) so missing values have a place")
        return loaded


PATTERN_CHARS = frozenset("*?[")
# The first line of a domain file that ``medrelease init`` read from the data.
READ_FROM_DATA_MARK = "# medrelease: values read from the data"


def domain_file_lines(path: Path, column: str) -> tuple[list[str], list[str]]:
    """A domain file's leading comment lines (``#``) and its values, one a line, stripped.

    Only lines at the top may be comments: a value further down that starts with ``#`` is a
    value. The error names the file, never its content."""
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the domain file of {column!r} ({path}): "
                          f"{type(exc).__name__}") from None
    header = 0
    while header < len(lines) and lines[header].startswith("#"):
        header += 1
    return lines[:header], lines[header:]


def _inbox_owner(bound: str) -> DatasetConfig:
    """The dataset an inbox is bound to: a dataset name, or the path of its YAML."""
    if bound.endswith((".yaml", ".yml")):
        return load_config(bound)
    return find_config(bound)


def _inside(path: Path, roots: list[Path]) -> bool:
    """Whether ``path`` (symbolic links resolved) lies inside one of ``roots`` (resolved)."""
    real = Path(os.path.realpath(path))
    return any(real == Path(os.path.realpath(r)) or real.is_relative_to(os.path.realpath(r))
               for r in roots)


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
        return DatasetConfig(**{**data, "base_dir": str(base_dir),
                                "config_file": source if source != "<dict>" else ""})
    except ValidationError as exc:
        raise ConfigError(f"dataset config {source} is invalid:\n{_explain(exc)}") from None
    except TypeError as exc:
        raise ConfigError(f"dataset config {source} is invalid: {exc}") from None


MAX_CONFIG_BYTES = 256 * 1024
MAX_YAML_ALIASES = 20


class _LimitedLoader(yaml.SafeLoader):
    """A safe YAML loader that refuses more than a few aliases (a YAML alias bomb expands to
    gigabytes when the config is copied or written out)."""

    aliases = 0

    def compose_node(self, parent, index):  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_YAML_ALIASES:
                raise ConfigError(f"dataset config uses more than {MAX_YAML_ALIASES} YAML "
                                  "aliases (*name); write the values out instead")
        return super().compose_node(parent, index)


def read_yaml(path: Path, what: str = "dataset config") -> Any:
    """Safe, bounded YAML: at most 256 kB and 20 aliases; errors say where, not what."""
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{what} {path} is larger than {MAX_CONFIG_BYTES // 1024} kB")
        text = path.read_text(encoding="utf-8")
        return yaml.load(text, Loader=_LimitedLoader)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {what} {path}: {type(exc).__name__}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(f"{what} {path} is not valid YAML{where}: "
                          f"{getattr(exc, 'problem', None) or 'syntax error'}") from None


def _one_dataset_named(name: str, roots: list[Path]) -> Path:
    """The one ``<root>/<name>/dataset.yaml``: a name found in two roots is refused (one would
    shadow the other, with its own policy and source), and so is a dataset folder that is a
    symbolic link out of its root."""
    found = [(root, root / name / "dataset.yaml") for root in roots
             if (root / name / "dataset.yaml").is_file()]
    distinct = {path.resolve(): (root, path) for root, path in found}
    if not distinct:
        known = sorted({p.parent.name for r in roots for p in r.glob("*/dataset.yaml")})
        raise ConfigError(f"no dataset named {name!r}; known datasets: {', '.join(known)}")
    if len(distinct) > 1:
        raise ConfigError(
            f"dataset {name!r} is defined in {len(distinct)} dataset folders "
            f"({', '.join(str(p) for _, p in distinct.values())}): one would shadow the other. "
            "Rename or remove one; nothing was read or spent.")
    root, path = next(iter(distinct.values()))
    if not _inside(path, [root]):
        raise ConfigError(
            f"dataset {name!r}: its folder under {root} is a symbolic link that leads out of "
            "that dataset root; put the dataset folder itself there. Nothing was read.")
    return path


def load_config(path: str | Path) -> DatasetConfig:
    """Read and validate a dataset YAML; relative paths resolve against its folder."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"dataset config not found: {path}")
    return config_from_dict(read_yaml(path), path.parent.resolve(), source=str(path.resolve()))


def find_config(name_or_path: str | Path) -> DatasetConfig:
    """A dataset by name (``<dataset root>/<name>/dataset.yaml``) or by path to its YAML.

    A path must lie in a dataset root (``settings.dataset_roots``): a form user cannot make the
    pipeline read a file the steward did not put there.
    """
    text = str(name_or_path)
    roots = dataset_roots()
    if DATASET_NAME.match(text) and not text.endswith((".yaml", ".yml")):
        return load_config(_one_dataset_named(text, roots))
    if not text.endswith((".yaml", ".yml")) or not _inside(Path(text), roots):
        raise ConfigError(
            f"dataset {text!r}: give a dataset name, or the path of a dataset YAML inside "
            f"{', '.join(str(r) for r in roots)} (MEDRELEASE_DATASETS adds folders)")
    return load_config(text)
