"""The evidence report's plots: well-formed SVG whatever the labels, axes covering the data."""

from __future__ import annotations

import itertools
import math
from xml.etree import ElementTree

import pytest

from medrelease.evidence.svg_charts import Series, horizontal_bars, line_panels, nice_ticks

SVG = "{http://www.w3.org/2000/svg}"


@pytest.mark.parametrize(("low", "high"), [(0, 11), (0, 1.84), (0, 3712), (0.001, 0.004),
                                           (5, 5), (-3, 7)])
def test_ticks_are_round_and_cover_the_data(low: float, high: float) -> None:
    ticks = nice_ticks(low, high)
    assert ticks[0] <= low and ticks[-1] >= high and len(ticks) >= 2
    step = ticks[1] - ticks[0]
    assert all(math.isclose(b - a, step) for a, b in itertools.pairwise(ticks))
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert any(math.isclose(mantissa, m) for m in (1, 2, 5)), ticks


def test_labels_are_escaped_and_a_missing_value_breaks_the_line() -> None:
    chart = line_panels("a < b & c", [("sex = <F>", [
        Series("original", [0, 5, 10, 15], [1.0, float("nan"), 3.0, 4.0]),
        Series("release", [0, 5, 10, 15], [2.0, 2.0, 2.0, 2.0], dashed=True, square=True)])],
        "age", "stays")
    root = ElementTree.fromstring(chart)  # well-formed despite < and &
    assert root.findtext(f"{SVG}title") == "a < b & c"
    lines = root.findall(f"{SVG}polyline")
    assert len(lines) == 2  # "original" drawn from 10 on only (a single point is no line)
    assert len(root.findall(f"{SVG}circle")) == 3 and len(root.findall(f"{SVG}rect")) >= 4
    bars = ElementTree.fromstring(horizontal_bars("Budget <split>", ["cells", "node & x"],
                                                  [0.62, 0.05], "epsilon"))
    assert len([r for r in bars.iter(f"{SVG}rect") if r.get("fill") != "white"]) == 2
