"""The registry: the one list of release mechanisms, by the name configs, flows and the CLI use.

Everything else derives from what each mechanism declares in its own file (``Params`` with
field descriptions, ``guarantee``, ``budget_steps``, ``capabilities``, ``selection``): the flow's
form (dropdown labels, the advanced parameters), the CLI's ``--param`` checks, the release
driver, the evaluation and the audits. Adding a mechanism is its file plus ``register``
(the contract per kind: ``contract.py``; docs/ARCHITECTURE.md).
"""

from __future__ import annotations

from medrelease.errors import ParameterError
from medrelease.mechanisms.aim import AIM
from medrelease.mechanisms.base import (
    KINDS,
    Capabilities,
    MechanismBase,
    NodeSummary,
    ReleaseContext,
)
from medrelease.mechanisms.contract import PROTOCOLS, Mechanism, hooks
from medrelease.mechanisms.diffgen import DiffGen
from medrelease.mechanisms.histogram import Histogram
from medrelease.mechanisms.ipa import IPA
from medrelease.mechanisms.ipa_paper import IPAPaper
from medrelease.mechanisms.kanon import KAnonymity
from medrelease.mechanisms.mondrian import Mondrian
from medrelease.mechanisms.pseudonymize import Pseudonymize
from medrelease.mechanisms.relational import Relational

MECHANISMS: dict[str, Mechanism] = {}
LABEL_SEPARATOR = " — "
# A dataset whose config names no mechanism: ``aim`` (accurate marginals, synthetic rows) where
# it can run, else ``ipa`` (real rows; it drops rare informative values without saying so).
DEFAULT_RULE = ("a dataset that names no mechanism gets aim where it declares its informative "
                "column's domain ('domain:') and its policy allows aim, else ipa (a "
                "relational dataset: relational)")


def register(mechanism: Mechanism) -> Mechanism:
    """Add a mechanism (by its ``name``) to the registry; a second one of that name is refused,
    and so is one that does not inherit ``MechanismBase`` or lacks a hook of its kind."""
    if mechanism.name in MECHANISMS and MECHANISMS[mechanism.name] is not mechanism:
        raise ValueError(f"a mechanism named {mechanism.name!r} is already registered")
    if not isinstance(mechanism, MechanismBase):
        raise TypeError(f"mechanism {mechanism.name!r} does not inherit MechanismBase "
                        "(medrelease/mechanisms/base.py)")
    if not isinstance(getattr(mechanism, "capabilities", None), Capabilities):
        raise TypeError(f"mechanism {mechanism.name!r} declares no Capabilities")
    kind = mechanism.capabilities.kind
    if kind not in KINDS:
        raise TypeError(f"mechanism {mechanism.name!r} declares kind {kind!r}; the kinds are "
                        f"{', '.join(KINDS)}")
    protocol = PROTOCOLS[kind]
    missing = [hook for hook in hooks(protocol) if not hasattr(mechanism, hook)]
    if missing:
        raise TypeError(f"mechanism {mechanism.name!r} of kind {kind!r} lacks "
                        f"{', '.join(missing)} ({protocol.__name__}, contract.py)")
    MECHANISMS[mechanism.name] = mechanism
    return mechanism


def unregister(name: str) -> None:
    """Remove a mechanism (tests that register their own)."""
    MECHANISMS.pop(name, None)


for _mechanism in (IPA(), IPAPaper(), Histogram(), KAnonymity(), Mondrian(), Pseudonymize(),
                   DiffGen(), AIM(), Relational()):
    register(_mechanism)


def get_mechanism(name: str) -> Mechanism:
    try:
        return MECHANISMS[name]
    except KeyError:
        raise ParameterError(
            f"unknown mechanism {name!r}; available: {', '.join(sorted(MECHANISMS))}"
        ) from None


def capabilities(name: str) -> Capabilities:
    return get_mechanism(name).capabilities


def uses_lattice(name: str) -> bool:
    """Lattice mechanisms score nodes; the others release from the rows or counts directly."""
    return capabilities(name).kind == "lattice"


def uses_counts(name: str) -> bool:
    """Mechanisms that read the aggregated count table (lattice ones and ``aim``)."""
    return capabilities(name).kind in ("lattice", "synthetic")


def label(name: str) -> str:
    """The dropdown label: the name, then its guarantee in words."""
    return f"{name}{LABEL_SEPARATOR}{capabilities(name).summary}"


def labels() -> list[str]:
    """Every registered mechanism's label, by name (which one a dataset defaults to depends on
    the dataset: ``default_mechanism``; the form offers that as its own first entry)."""
    return [label(n) for n in sorted(MECHANISMS)]


def name_from_label(value: str) -> str:
    """Accept a bare name or a dropdown label; return the registered name."""
    name = value.split(LABEL_SEPARATOR, 1)[0].strip()
    get_mechanism(name)
    return name


def check_fits(config, name: str) -> None:
    """Refuse a mechanism that cannot release the dataset as declared (before any spend)."""
    caps = capabilities(name)
    if (caps.kind == "relational") != (config.relational is not None):
        raise ParameterError(
            f"dataset {config.name!r} is relational (its config declares tables): only "
            "'relational' releases it" if config.relational is not None else
            f"{name} releases a relational dataset (a config with 'relational:' tables); "
            f"dataset {config.name!r} is one table")
    if caps.needs_class_domain and (len(config.class_columns) != 1 or not config.class_domain):
        raise ParameterError(
            f"{name} needs exactly one column with role 'class', with its public values "
            "declared ('values: [...]'); the dataset config has "
            f"{len(config.class_columns)} class column(s)")
    if caps.kind == "synthetic" and config.informative and config.informative_domain is None:
        raise ParameterError(
            f"{name} releases values from public domains only: declare 'domain:' (a file of "
            f"every possible value) for the informative column {config.informative[0]!r} of "
            f"dataset {config.name!r}")
    if config.set_valued and not caps.set_valued_input:
        able = sorted(n for n, m in MECHANISMS.items() if m.capabilities.set_valued_input)
        raise ParameterError(
            f"mechanism {name!r} cannot release set-valued column(s) "
            f"{', '.join(repr(c) for c in config.set_valued)} of dataset {config.name!r}; use "
            f"{' or '.join(repr(m) for m in able)}, or give them role 'drop'"
        )


def default_mechanism(config) -> str:
    """The mechanism of a dataset whose config names none (``DEFAULT_RULE``): ``aim`` when the
    config declares an informative domain and ``aim`` fits the dataset (``check_fits``) and its
    policy, else ``ipa``. The one place the default is decided: the release, the CLI, the form
    and the docs derive from it. A relational dataset (``relational:``) gets ``relational``."""
    if config.relational is not None:
        return "relational"
    if config.informative_domain is not None and "aim" in config.policy.mechanisms:
        try:
            check_fits(config, "aim")
        except ParameterError:
            return "ipa"
        return "aim"
    return "ipa"


def output_columns(config, name: str) -> list[str]:
    """The columns a mechanism's release carries (anything else must not appear)."""
    by_role = {"dimension": config.dimensions, "informative": config.informative,
               "set_valued": config.set_valued, "class": config.class_columns}
    return [c for role in capabilities(name).output_roles for c in by_role[role]]


__all__ = ["DEFAULT_RULE", "MECHANISMS", "NodeSummary", "ReleaseContext", "capabilities",
           "check_fits", "default_mechanism", "get_mechanism", "label", "labels",
           "name_from_label", "output_columns", "register", "unregister", "uses_counts",
           "uses_lattice"]
