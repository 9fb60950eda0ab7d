"""Audits that can fail: each step design passes the sound mechanism and flags its broken variant.

The run counts are the smallest at which every broken variant here is still flagged (the
benchmark, ``benchmarks/step_audit.py``, runs 1,000 per table and prints each design's power).
"""

from __future__ import annotations

import pytest

from medrelease.evidence.step_audit import designs, misreported, run_design

RUNS = {"ipa cells: new cell": 1000, "ipa cells: tipping cell": 400,
        "ipa ladder rung: new cell": 400, "ipa pool: new value": 400,
        "ipa selection: top node": 400, "ipa cells: one patient, m = 2": 1000,
        "aim round: measurement": 1000,
        "diffgen leaf counts": 400}
DESIGNS = {d.name: d for d in designs()}


def _design(name: str):
    from dataclasses import replace

    design = DESIGNS[name]
    scale = 8 if name == "ipa selection: top node" else 1
    return replace(design, runs=RUNS[name] * scale)


def test_every_design_has_a_run_count() -> None:
    assert set(RUNS) == set(DESIGNS)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_sound_mechanism_stays_within_each_steps_claim(name: str) -> None:
    design = _design(name)
    result = run_design(design, "sound", seed=11)
    assert not result.violated, result.as_row()
    assert result.hits_a > 0  # the event is exercised: the design measures something
    if name == "ipa cells: new cell":  # the same runs catch a delta claimed 10x too small
        assert misreported(design, result).violated


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_each_design_flags_its_broken_variant(name: str) -> None:
    result = run_design(_design(name), "broken", seed=12)
    assert result.violated, result.as_row()
