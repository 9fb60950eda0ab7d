"""Where a new mechanism goes (docs/ARCHITECTURE.md): one file (tests/toy_mechanism.py) and one
``register`` line; the driver runs it by its declared kind, and the registry refuses one that
does not follow its kind's contract."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest

from medrelease.mechanisms import Capabilities, register, unregister
from medrelease.mechanisms.base import MechanismBase
from medrelease.privacy.randomness import selection_probabilities
from medrelease.release import lattice_size, release

from ..conftest import PAPER_TABLE_5
from ..toy_mechanism import ToyNoisyCells, ToyParams


@pytest.fixture
def toy():
    register(ToyNoisyCells())  # the one registry line
    try:
        yield ToyNoisyCells.name
    finally:
        unregister(ToyNoisyCells.name)


def test_a_toy_mechanism_runs_through_the_driver(toy: str, paper_config) -> None:
    result = release(PAPER_TABLE_5, paper_config, mechanism=toy, params={"epsilon": 2.0},
                     seed=4)
    assert result.mechanism == toy and result.params == {"epsilon": 2.0}
    assert [(s.step, s.epsilon) for s in result.budget_steps] == [
        ("node selection", 0.5), ("cells", 1.5)]
    assert result.epsilon_spent == pytest.approx(2.0) and not result.guarantee.proven
    # every node was a candidate (MechanismBase.candidate_nodes), scored by the default
    # score_node, and chosen by the exponential mechanism on 3 - IL at the selection step's eps
    frame = result.candidates
    assert len(frame) == lattice_size(paper_config) and result.node_index in set(frame["index"])
    expected = selection_probabilities(np.asarray(3.0 - frame["il"]), 0.5, 3.0, False)
    assert np.allclose(frame["selection_probability"], expected)
    assert result.details["budget_steps_drawn"] == {"node selection": "drawn", "cells": "drawn"}
    assert list(result.table.columns) == ["Age", "Gender", "Zipcode", "Disease"]
    again = release(PAPER_TABLE_5, paper_config, mechanism=toy, params={"epsilon": 2.0},
                    seed=4)
    assert again.node == result.node and again.table.equals(result.table)


def test_the_registry_refuses_a_mechanism_without_its_kinds_hooks() -> None:
    class NoRelease(MechanismBase):
        name: ClassVar[str] = "toy-without-release-rows"
        capabilities: ClassVar[Capabilities] = Capabilities(summary="toy", kind="rows")
        Params = ToyParams

        def guarantee(self, params): ...

        def row_bounds(self, params, shape): ...

    with pytest.raises(TypeError, match="'toy-without-release-rows' of kind 'rows' lacks "
                                        r"release_rows \(RowsMechanism, contract.py\)"):
        register(NoRelease())

    class NotInheriting:
        name: ClassVar[str] = "toy-not-inheriting"
        capabilities: ClassVar[Capabilities] = Capabilities(summary="toy")

    with pytest.raises(TypeError, match="does not inherit MechanismBase"):
        register(NotInheriting())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="declares kind 'table'; the kinds are lattice, rows"):
        register(type("OldKind", (NoRelease,), {
            "name": "toy-old-kind", "capabilities": Capabilities(summary="t", kind="table")})())
