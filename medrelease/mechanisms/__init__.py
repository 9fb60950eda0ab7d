"""Registry of release mechanisms by name (the name is what configs, flows and the CLI use)."""

from __future__ import annotations

from medrelease.errors import ParameterError
from medrelease.mechanisms.base import LatticeMechanism, NodeSummary, ReleaseContext
from medrelease.mechanisms.diffgen import DiffGen
from medrelease.mechanisms.histogram import Histogram
from medrelease.mechanisms.ipa import IPA
from medrelease.mechanisms.ipa_paper import IPAPaper
from medrelease.mechanisms.kanon import KAnonymity
from medrelease.mechanisms.mondrian import Mondrian
from medrelease.mechanisms.pseudonymize import Pseudonymize

MECHANISMS: dict[str, LatticeMechanism] = {
    m.name: m
    for m in (IPA(), IPAPaper(), Histogram(), KAnonymity(), Mondrian(), Pseudonymize(),
              DiffGen())
}


def uses_lattice(name: str) -> bool:
    """Lattice mechanisms score nodes; the others release from the rows or counts directly."""
    return getattr(get_mechanism(name), "kind", "lattice") == "lattice"
DEFAULT_MECHANISM = "ipa"


def get_mechanism(name: str) -> LatticeMechanism:
    try:
        return MECHANISMS[name]
    except KeyError:
        raise ParameterError(
            f"unknown mechanism {name!r}; available: {', '.join(sorted(MECHANISMS))}"
        ) from None


SET_VALUED_MECHANISMS = ("diffgen",)


def check_fits(config, name: str) -> None:
    """Refuse a mechanism that cannot release the dataset as declared (before any spend)."""
    if name == "diffgen" and (len(config.class_columns) != 1 or not config.class_domain):
        raise ParameterError(
            "diffgen needs exactly one column with role 'class', with its public values "
            "declared ('values: [...]'); the dataset config has "
            f"{len(config.class_columns)} class column(s)")
    if config.set_valued and name not in SET_VALUED_MECHANISMS:
        raise ParameterError(
            f"mechanism {name!r} cannot release set-valued column(s) "
            f"{', '.join(repr(c) for c in config.set_valued)} of dataset {config.name!r}; use "
            f"{' or '.join(repr(m) for m in SET_VALUED_MECHANISMS)}, or give them role 'drop'"
        )


__all__ = ["DEFAULT_MECHANISM", "MECHANISMS", "NodeSummary", "ReleaseContext", "check_fits", "get_mechanism"]


def output_columns(config, name: str) -> list[str]:
    """The columns a mechanism's release carries (anything else must not appear)."""
    if name == "diffgen":
        return config.dimensions + config.set_valued + config.class_columns
    if name == "pseudonymize":
        return config.dimensions + config.informative + config.class_columns
    return config.dimensions + config.informative
