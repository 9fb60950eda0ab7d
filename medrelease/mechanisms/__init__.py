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


__all__ = ["DEFAULT_MECHANISM", "MECHANISMS", "NodeSummary", "ReleaseContext", "get_mechanism"]


def output_columns(config, name: str) -> list[str]:
    """The columns a mechanism's release carries (anything else must not appear)."""
    if name == "diffgen":
        return config.dimensions + config.class_columns
    if name == "pseudonymize":
        return config.dimensions + config.informative + config.class_columns
    return config.dimensions + config.informative
