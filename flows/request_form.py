"""The release request as the Prefect UI's form shows it: ``ReleaseRequest`` (dataset, a
mechanism dropdown labelled with each guarantee, epsilon with what it means and each dataset's
cap and budget left, advanced parameters the chosen mechanism checks, the void confirmation)
and ``RunSettings`` (engineering fields). The schema's help texts are built here, once, from
the registry and the bundled dataset configs; ``flows/release.py`` only runs what it asks.
"""

from __future__ import annotations

import functools
from typing import Any

from prefect.runtime import flow_run
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from medrelease.data.lattice import DEFAULT_BATCH_SIZE
from medrelease.errors import ParameterError
from medrelease.mechanisms import (
    DEFAULT_RULE,
    MECHANISMS,
    capabilities,
    check_fits,
    get_mechanism,
    labels,
    name_from_label,
)
from medrelease.mechanisms.base import parse
from medrelease.plan import PUBLIC_FACTS
from medrelease.release import resolve_mechanism
from medrelease.settings import ledger_location
from medrelease.storage.store import StoreError, safe_relative
from tasks.runners import RunnerKind

DATASET_DEFAULT = "dataset default — the mechanism and parameters in its dataset.yaml"
# The deployment that changes a source's cap (``flows/cap.py``, which imports the name from
# here: the release form's help names it, and this module imports no other flow module).
CAP_DEPLOYMENT = "set-cap"


def _mechanism_dropdown(schema: dict[str, Any]) -> None:
    """The form's dropdown, built from the registry each time a schema is made; each
    mechanism's line says what it gives and, where it cannot release a bundled dataset, why."""
    schema.pop("anyOf", None)
    schema.update(type="string", enum=[DATASET_DEFAULT, *labels()])
    schema["description"] = "Release mechanism, labelled with its privacy guarantee. " \
        f"*Dataset default*: the mechanism its dataset.yaml names; {_default_rule()}. " \
        "What each gives a researcher:\n\n" + "\n\n".join(
            f"- **{name}**: {capabilities(name).gives}{_not_for(name)}{_needs_a_key(name)}"
            for name in sorted(MECHANISMS))


# Prefect's UI route to a new block of a type (its catalogue's search lists "AWS Secret" first
# for "secret"; this opens Prefect's own Secret block, the one ``Secret.load`` reads).
SECRET_BLOCK_FORM = "/blocks/catalog/secret/create"


def _needs_a_key(mechanism: str) -> str:
    """For a mechanism that reads a key (``needs_secret``), what it needs, said before the run
    rather than in a refusal after it: the Secret block's name and a link to its form."""
    if not capabilities(mechanism).needs_secret:
        return ""
    fields = get_mechanism(mechanism).Params.model_fields
    block = fields["key_source"].default if "key_source" in fields else "medrelease-pseudonym-key"
    return (f". **Needs a key before the run**: a Prefect *Secret* block named `{block}` "
            f"([create it]({SECRET_BLOCK_FORM}): Blocks → + → **Secret**, not 'AWS Secret'; "
            "its value is the key: a long random string that only stewards keep), or "
            "MEDRELEASE_PSEUDONYM_KEY in the serving host's environment; without one the run "
            "is refused before anything is spent")


def _default_rule() -> str:
    """``DEFAULT_RULE``'s choice, and each bundled dataset's default (``resolve_mechanism``)."""
    defaults = []
    for config in _bundled_configs():
        try:
            defaults.append(f"{config.name}: {resolve_mechanism(config).name}")
        except Exception:  # a broken config is reported when it is released, not in the form
            continue
    return f"{DEFAULT_RULE} ({'; '.join(defaults)})" if defaults else DEFAULT_RULE


SHORT_REASONS = (("is relational", "related tables: only relational"),
                 ("is one table", "one table, not related tables"),
                 ("class", "no class column with declared values"),
                 ("set-valued", "a set-valued column"), ("public domains", "no declared domain"))


def _bundled_configs() -> list[Any]:
    """The bundled datasets' configs for the form's descriptions, read once per version of
    their files: Prefect builds the form's schema at import, and reading every config for every
    mechanism cost 0.4 s of each CLI run (issue 27)."""
    from medrelease.data.config import project_root

    paths = sorted((project_root() / "datasets").glob("*/dataset.yaml"))
    return list(_configs_of(tuple((str(p), p.stat().st_mtime_ns) for p in paths)))


@functools.lru_cache(maxsize=4)
def _configs_of(versions: tuple[tuple[str, int], ...]) -> tuple[Any, ...]:
    from medrelease.data.config import load_config

    configs = []
    for path, _ in versions:
        try:
            configs.append(load_config(path))
        except Exception:  # a broken config is reported when it is released, not in the form
            continue
    return tuple(configs)


def _not_for(mechanism: str) -> str:
    """" *(not for adult-ipa, nps-sample: no class column …)*" for the bundled datasets the
    mechanism cannot release (``check_fits``), so the form says why beside the option."""
    by_reason: dict[str, list[str]] = {}
    for config in _bundled_configs():
        try:
            check_fits(config, mechanism)
        except ParameterError as exc:
            reason = next((short for key, short in SHORT_REASONS if key in str(exc)), str(exc))
            by_reason.setdefault(reason, []).append(config.name)
        except Exception:
            continue
    parts = [f"{', '.join(names)}: {reason}" for reason, names in by_reason.items()]
    return f" *(not for {'; '.join(parts)})*" if parts else ""


def _dataset_units(schema: dict[str, Any]) -> None:
    """The bundled datasets beside the dataset box: those ready to release with their privacy
    unit (a warning where a config declares identifiers but no unit: the guarantee then
    protects one row), and apart those whose input is missing, with how to prepare it
    (issue 56: mimic-demo was offered and failed on "input file not found"). Read each time the
    schema is built: ``serve`` rebuilds it every few seconds (``flows/forms.py``)."""
    from flows.prepare import how_to_prepare, input_missing

    units, missing = [], []
    for config in _bundled_configs():
        if input_missing(config):
            missing.append(f"**{config.name}**: its input is missing — {how_to_prepare(config)}")
            continue
        privacy = config.privacy
        if config.relational is not None:
            tables = config.relational_schema.tables
            units.append(f"{config.name} (one {privacy.unit_words} with all their rows: "
                         + ", ".join(f"at most {t.max_children} {t.name} per "
                                     + (privacy.unit_words if t.parent == tables[0].name
                                        else f"row of {t.parent}")
                                     for t in tables[1:]) + ")")
        elif config.unit_column:
            units.append(f"{config.name} (one {privacy.unit_words}, at most "
                         f"{privacy.max_rows_per_unit} {privacy.row_words}s)")
        else:
            units.append(f"{config.name} (one row" + (" — WARNING: identifier column(s), no "
                                                      "unit declared" if config.unit_warning
                                                      else "") + ")")
    schema["description"] += ". Ready to release, with the privacy unit each protects: " + \
        ", ".join(units) + ("" if not missing else ". NOT READY: " + "; ".join(missing))


def _plain(kind: str):
    """One plain input box (left empty = not given) instead of a choice between a type and
    'None', which both Prefect UIs render as a toggle or hide."""
    def apply(schema: dict[str, Any]) -> None:
        schema.pop("anyOf", None)
        schema.pop("default", None)  # a null default would be sent as null and fail the type
        schema["type"] = kind
    return apply


def _budgets() -> dict[str, Any] | None:
    """Every source's budget in the ledger, by source, read once for a form's help (one
    read-only query; a PostgreSQL ledger, one connection); None: unreadable just now."""
    from medrelease.privacy.budget_glance import source_budgets

    budgets = source_budgets(ledger_location())
    return None if budgets is None else {b.source: b for b in budgets}


def _epsilon_help(schema: dict[str, Any]) -> None:
    """What epsilon means, then per bundled dataset its per-release cap and its source's
    budget left, and every other source's in the ledger: read each time the schema is built,
    which ``serve`` does every few seconds (``flows/forms.py``), so the form shows the ledger
    as it is when it opens (issue 56: it said "9 left" when 0 was left)."""
    _plain("number")(schema)
    from medrelease.planning import form_epsilon_summary

    budgets = _budgets()
    per_dataset, errors, bundled_sources = [], [], set()
    for config in _bundled_configs():
        try:  # the declared analyses' expected error at a few epsilons (public facts only)
            errors.append(form_epsilon_summary(config))
        except Exception:  # a broken config is reported when it is released, not in the form
            errors.append(None)
        known = (budgets or {}).get(config.source_id)
        cap = config.privacy.lifetime_epsilon
        budget = ("budget unreadable just now" if budgets is None
                  else f"{cap:g} of {cap:g} left" if known is None
                  else "lifetime guarantee VOID" if known.void
                  else f"{known.epsilon_left:g} left")
        per_dataset.append(f"{config.name}: at most {config.policy.max_epsilon:g} a release; "
                           f"source {config.source_id}: {budget}")
        bundled_sources.add(config.source_id)
    others = [f"source {b.source}: " + ("lifetime guarantee VOID" if b.void
                                        else f"{b.epsilon_left:g} left")
              for b in (budgets or {}).values() if b.source not in bundled_sources]
    schema["description"] = (
        "How much privacy this release may cost: smaller = more private and more noise (less "
        "accurate), larger = more accurate and less private; it is taken from the source's "
        "lifetime budget for good. Empty = the dataset config's value, else 1. Syntactic "
        "models and pseudonymization take none. Per-release cap and budget left, as the "
        "ledger held them when this form opened (a release refused for its budget says how "
        f"to raise the cap: the '{CAP_DEPLOYMENT}' deployment): "
        + "; ".join(per_dataset + others)
        + ". Expected 95 % error of a dataset's declared analyses at an epsilon, before "
        "spending: `medrelease check DATASET --epsilon E` (or `--target-error 0.1` for the "
        "smallest epsilon within ±10 % of an average cell)"
        + "".join(f"; {line}" for line in errors if line))


def _void_help(schema: dict[str, Any]) -> None:
    """Which source the switch voids, per bundled dataset, and whose guarantee is already void
    (read when the form opens, ``flows/forms.py``); then what happens once it is void, by
    design: nothing is left to confirm, and a mechanism without a DP guarantee spends no
    epsilon, so it publishes with no confirmation even when no budget is left."""
    budgets = _budgets() or {}
    sources: dict[str, list[str]] = {}
    for config in _bundled_configs():
        sources.setdefault(config.source_id, []).append(config.name)
    named = []
    for source, datasets in sorted(sources.items()):
        void = source in budgets and budgets[source].void
        named.append(f"{', '.join(datasets)} → source **{source}** "
                     + ("(already VOID)" if void else "(holds)"))
    schema["description"] += (
        " It voids the source of the dataset named above, never another: " + "; ".join(named)
        + " (a dataset given by path: the source its YAML names, privacy.source). Once a "
        "source's guarantee is VOID, by design: nothing is left to confirm, so kanon, mondrian, "
        "pseudonymize and ipa-paper publish with no confirmation, and, spending no epsilon, "
        "even when no budget is left; DP mechanisms still spend and are still held to the cap.")


def _parameters_help(schema: dict[str, Any]) -> None:
    hidden = {"epsilon", *PUBLIC_FACTS}
    lines = [f"{name}: {', '.join(f for f in impl.Params.model_fields if f not in hidden) or '-'}"
             for name, impl in sorted(MECHANISMS.items())]
    schema["description"] = ("Optional, as JSON, e.g. {\"suppression_threshold\": 3}; a "
                             "parameter the chosen mechanism does not take is refused by name "
                             "(`medrelease mechanisms` describes each). " + "; ".join(lines))


ENGINEERING_FIELDS = ("batch_size", "destination", "task_runner")


class RunSettings(BaseModel):
    """How the run is carried out, not what is released: for engineers (the steward's form
    keeps them under one heading, after its own fields; their defaults are right for a steward)."""

    model_config = ConfigDict(extra="forbid")

    batch_size: int = Field(
        default=DEFAULT_BATCH_SIZE, ge=1, le=4096,
        description="Lattice nodes per scoring task (1 = one per node)"
    )
    destination: str | None = Field(
        default=None, json_schema_extra=_plain("string"),
        description="Optional sub-folder of the release store for this release",
    )
    task_runner: RunnerKind = Field(
        default="thread", description="Fan-out of lattice scoring: 'thread' (default, fastest on "
                                      "one machine) or 'dask' (a local cluster, or the scheduler "
                                      "the deployment names in MEDRELEASE_DASK_ADDRESS)"
    )

    @field_validator("destination")
    @classmethod
    def _destination_inside_store(cls, value: str | None) -> str | None:
        # Checked here, before any budget is charged, not only when publishing.
        if value is not None:
            try:
                safe_relative(value, "destination")
            except StoreError as exc:
                raise ValueError(str(exc)) from None
        return value


class ReleaseRequest(BaseModel):
    """What a steward fills in to release a dataset: the mechanism, its epsilon and, optionally,
    advanced parameters that the chosen mechanism checks. Empty fields fall back to the
    dataset's own config, then to the registry's default for the dataset (aim where it
    declares an informative domain, else ipa) and the mechanism's own defaults. After Submit,
    the run is under Runs (left menu), named by dataset, mechanism and epsilon; its state says
    how it ended: Published with the release's portal URL, or Refused and why."""

    model_config = ConfigDict(extra="forbid")

    dataset: str = Field(
        default="nps-sample", title="Dataset",
        description="Dataset name (the folder under datasets/ holding its dataset.yaml) or the "
                    "path of a dataset YAML",
        json_schema_extra=_dataset_units,
    )
    mechanism: str | None = Field(
        default=DATASET_DEFAULT, title="Mechanism", validate_default=True,
        description="Release mechanism, labelled with its privacy guarantee",
        json_schema_extra=_mechanism_dropdown,
    )
    # right under the mechanism it confirms, far from 'Evaluate' (another switch): issue 56
    void_lifetime_guarantee: bool = Field(
        default=False, title="Void the lifetime guarantee of this dataset's source — "
                             "IRREVERSIBLE (only for a mechanism without a proven DP "
                             "guarantee)",
        json_schema_extra=_void_help,
        description="Needed for kanon, mondrian, pseudonymize, ipa-paper and any mechanism "
                    "labelled without a proven DP guarantee, while the source's lifetime "
                    "guarantee still holds. Ticking it accepts that this release voids that "
                    "guarantee FOR GOOD: every later release of the source says VOID, and no "
                    "total of its releases is a differential-privacy guarantee any more. "
                    "Without it such a request is refused before anything is read or spent. "
                    "A DP mechanism ignores it.",
    )
    epsilon: float | None = Field(
        default=None, title="Epsilon", json_schema_extra=_epsilon_help,
        description="The privacy budget this release spends",
    )
    parameters: dict[str, Any] = Field(
        default_factory=dict, title="Advanced: mechanism parameters",
        json_schema_extra=_parameters_help,
    )
    input_path: str | None = Field(
        default=None, json_schema_extra=_plain("string"),
        description="Release this file instead of the config's input (a new extract)"
    )
    seed: int | None = Field(
        default=None, ge=0, json_schema_extra=_plain("integer"),
        description="TEST ONLY: a fixed seed makes the release reproducible, so it becomes a "
                    "TEST release: written to the test store (never published) with TEST in "
                    "its file names, and marked as test in the ledger. Leave empty for a real "
                    "release.",
    )
    skip_unchanged: bool = Field(
        default=False, title="Skip if the input is unchanged",
        description="Release only if this extract differs from the last one released from "
                    "this dataset (scheduled runs set this); otherwise finish with 'no new "
                    "data' and spend nothing",
    )
    evaluate: bool = Field(
        default=True, description="Afterwards, write the internal utility/risk report with plots "
                                  "(evaluations folder, never published)"
    )

    run_settings: RunSettings = Field(
        default_factory=RunSettings, title="Run settings (for engineers: leave as they are)",
        description="Scoring batch size, task runner and a destination sub-folder: how the run "
                    "is carried out, not what is released")

    @model_validator(mode="before")
    @classmethod
    def _engineering_fields_flat(cls, data: Any) -> Any:
        """Also accept ``batch_size``, ``task_runner``, ``destination`` at the top level (the
        CLI, schedules, API callers and older runs send them there)."""
        if not isinstance(data, dict) or not set(ENGINEERING_FIELDS) & set(data):
            return data
        data = dict(data)
        settings = dict(data.get("run_settings") or {})
        for name in ENGINEERING_FIELDS:
            if name in data:
                settings[name] = data.pop(name)
        data["run_settings"] = settings
        return data

    @property
    def batch_size(self) -> int:
        return self.run_settings.batch_size

    @property
    def task_runner(self) -> str:
        return self.run_settings.task_runner

    @property
    def destination(self) -> str | None:
        return self.run_settings.destination

    @model_validator(mode="before")
    @classmethod
    def _nested_mechanism(cls, data: Any) -> Any:
        """Also accept ``mechanism: {"mechanism": name, **params}`` (API callers, older runs)."""
        if not isinstance(data, dict) or not isinstance(data.get("mechanism"), dict):
            return data
        data, nested = dict(data), dict(data["mechanism"])
        if data.get("parameters") or data.get("epsilon") is not None:
            raise ValueError("give the mechanism's parameters either nested in 'mechanism' or "
                             "as 'epsilon' and 'parameters', not both")
        data["mechanism"] = nested.pop("mechanism", None)
        data["epsilon"] = nested.pop("epsilon", None)
        data["parameters"] = nested
        return data

    @field_validator("mechanism")
    @classmethod
    def _registered(cls, value: str | None) -> str | None:
        if value is None or value == DATASET_DEFAULT or not value.strip():
            return None
        try:
            return name_from_label(value)
        except ParameterError as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _parameters_fit(self) -> ReleaseRequest:
        """Unknown or misplaced parameters are refused here, naming them, before any run work."""
        if self.mechanism is None:
            return self
        impl = get_mechanism(self.mechanism)
        known = set(impl.Params.model_fields) - set(PUBLIC_FACTS)
        unknown = sorted(set(self.parameters) - known)
        if unknown:
            raise ValueError(f"{self.mechanism} does not take {', '.join(unknown)}; it takes: "
                             f"{', '.join(sorted(known)) or 'nothing'}")
        if self.epsilon is not None and "epsilon" not in known:
            raise ValueError(f"{self.mechanism} takes no epsilon ({impl.capabilities.summary}); "
                             "leave epsilon empty")
        given = {**self.parameters, **({} if self.epsilon is None else {"epsilon": self.epsilon})}
        try:  # each value against the mechanism's own model (budget rules come at planning)
            parse(impl.Params, given, self.mechanism)
        except ParameterError as exc:
            raise ValueError(str(exc)) from None
        return self


def as_request(given: Any) -> ReleaseRequest:
    """The request as the form or an API caller sent it, checked field by field; what is wrong
    is refused as one sentence per field (which field, what is allowed)."""
    if isinstance(given, ReleaseRequest):
        return given
    try:
        return ReleaseRequest.model_validate(given if given is not None else {})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or 'request'}: "
            f"{str(error['msg']).removeprefix('Value error, ')}" for error in exc.errors())
        raise ParameterError(f"the request cannot be run — {problems}. Nothing was read or "
                             "spent.") from None


def dataset_named(given: Any) -> str:
    """The dataset whose budget artifacts to refresh, even when the request is refused."""
    if isinstance(given, ReleaseRequest):
        return given.dataset
    named = given.get("dataset") if isinstance(given, dict) else None
    return named if isinstance(named, str) and named else ReleaseRequest().dataset


def run_name() -> str:
    """'<dataset> · <mechanism> · eps <epsilon>': the run is findable in the Runs list by what
    it releases (the dataset's own mechanism and epsilon when the request names none). A
    request that cannot be read is named by its dataset only; the run itself refuses it."""
    given = (flow_run.parameters or {}).get("request")
    dataset = dataset_named(given)
    try:
        from medrelease.data.config import find_config

        request = as_request(given)
        config = find_config(request.dataset)
        resolved = resolve_mechanism(config, request.mechanism, request.epsilon,
                                     request.parameters)
    except Exception:  # refused inside the run, with its reason
        return f"{dataset} · request to check"[:120]
    epsilon = resolved.params.get("epsilon")
    if epsilon is None and "epsilon" in get_mechanism(resolved.name).Params.model_fields:
        epsilon = get_mechanism(resolved.name).Params.model_fields["epsilon"].default
    eps = f" · eps {epsilon:g}" if isinstance(epsilon, int | float) else ""
    return f"{config.name} · {resolved.name}{eps}"[:120]
