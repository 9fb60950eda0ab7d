"""Small SVG charts for the evidence report: line panels and bar charts, written as text.

The report needs four kinds of plot with a few dozen points each. matplotlib drew them as PNGs
in 0.5-0.6 s of every release (0.3 s of it importing matplotlib) on the command's wait
(issue 27); these functions draw the same plots in milliseconds, and the browser scales them.
Every number in a plot is also in a table of the report.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")
FONT = "font-family='sans-serif' font-size='12'"
LEFT, RIGHT, TOP, BOTTOM = 64, 14, 30, 46  # margins of one panel's plot area, px


@dataclass(frozen=True)
class Series:
    """One line of a line panel; a NaN in ``ys`` breaks the line there."""

    name: str
    xs: Sequence[float]
    ys: Sequence[float]
    dashed: bool = False
    square: bool = False  # square markers (else round)


@dataclass(frozen=True)
class Scale:
    """A linear map from data values to pixels."""

    low: float
    high: float
    start: float
    end: float

    def __call__(self, value: float) -> float:
        span = self.high - self.low or 1.0
        return self.start + (value - self.low) / span * (self.end - self.start)


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten) from at or below ``low`` to at or
    above ``high``."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return [0.0, 1.0]
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(low / step) * step
    ticks = [first]
    while ticks[-1] < high - step * 1e-9 or len(ticks) < 2:
        ticks.append(round(first + step * len(ticks), 12))
    return ticks


def tick_text(value: float) -> str:
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.6f}".rstrip("0").rstrip(".")


def _text(x: float, y: float, text: str, anchor: str = "middle", extra: str = "") -> str:
    return (f"<text x='{x:.1f}' y='{y:.1f}' text-anchor='{anchor}' {FONT} {extra}>"
            f"{escape(text)}</text>")


def _document(width: float, height: float, title: str, body: list[str]) -> str:
    return "\n".join([
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width:.0f}' height='{height:.0f}' "
        f"viewBox='0 0 {width:.0f} {height:.0f}' role='img'>",
        f"<title>{escape(title)}</title>",
        f"<rect width='{width:.0f}' height='{height:.0f}' fill='white'/>",
        _text(width / 2, 18, title, extra="font-weight='bold'"),
        *body, "</svg>", ""])


def _y_axis(scale: Scale, ticks: list[float], left: float, right: float, label: str | None,
            ) -> list[str]:
    out = []
    for tick in ticks:
        y = scale(tick)
        out.append(f"<line x1='{left:.1f}' x2='{right:.1f}' y1='{y:.1f}' y2='{y:.1f}' "
                   "stroke='#e3e3e3'/>")
        out.append(_text(left - 6, y + 4, tick_text(tick), anchor="end"))
    if label:
        middle = (scale.start + scale.end) / 2
        out.append(_text(14, middle, label, extra=f"transform='rotate(-90 14 {middle:.1f})'"))
    return out


def _x_axis(scale: Scale, ticks: list[float], bottom: float, label: str) -> list[str]:
    out = [f"<line x1='{scale.start:.1f}' x2='{scale.end:.1f}' y1='{bottom:.1f}' "
           f"y2='{bottom:.1f}' stroke='#555'/>"]
    for tick in ticks:
        x = scale(tick)
        out.append(f"<line x1='{x:.1f}' x2='{x:.1f}' y1='{bottom:.1f}' y2='{bottom + 4:.1f}' "
                   "stroke='#555'/>")
        out.append(_text(x, bottom + 17, tick_text(tick)))
    out.append(_text((scale.start + scale.end) / 2, bottom + 35, label))
    return out


def _polyline(points: list[tuple[float, float]], colour: str, dashed: bool) -> str:
    dash = " stroke-dasharray='6 4'" if dashed else ""
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    return f"<polyline points='{path}' fill='none' stroke='{colour}' stroke-width='2'{dash}/>"


def _marker(x: float, y: float, colour: str, square: bool) -> str:
    if square:
        return f"<rect x='{x - 4:.1f}' y='{y - 4:.1f}' width='8' height='8' fill='{colour}'/>"
    return f"<circle cx='{x:.1f}' cy='{y:.1f}' r='4' fill='{colour}'/>"


def _series_marks(series: Series, colour: str, xs: Scale, ys: Scale) -> list[str]:
    """The series' line (broken at NaN) and its markers."""
    out, run = [], []
    for x, y in zip(series.xs, series.ys, strict=True):
        if y is None or not math.isfinite(float(y)):
            if len(run) > 1:
                out.append(_polyline(run, colour, series.dashed))
            run = []
            continue
        run.append((xs(float(x)), ys(float(y))))
    if len(run) > 1:
        out.append(_polyline(run, colour, series.dashed))
    points = [(xs(float(x)), ys(float(y))) for x, y in zip(series.xs, series.ys, strict=True)
              if y is not None and math.isfinite(float(y))]
    out += [_marker(px, py, colour, series.square) for px, py in points]
    return out


def _legend(names: list[tuple[str, str, bool]], right: float, y: float) -> list[str]:
    """One row of keys, right-aligned above the plot area (never over the data)."""
    out, x = [], right
    for name, colour, dashed in reversed(names):
        x -= 8 * len(name) + 44
        dash = " stroke-dasharray='6 4'" if dashed else ""
        out.append(f"<line x1='{x:.1f}' x2='{x + 24:.1f}' y1='{y - 4:.1f}' y2='{y - 4:.1f}' "
                   f"stroke='{colour}' stroke-width='3'{dash}/>")
        out.append(_text(x + 30, y, name, anchor="start"))
    return out


def _finite(values: Sequence[float]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def line_panels(title: str, panels: Sequence[tuple[str, Sequence[Series]]], xlabel: str,
                ylabel: str, panel_width: int = 440, height: int = 320) -> str:
    """Side-by-side line panels sharing the y axis (one per subtitle), with a legend each."""
    every = [s for _, group in panels for s in group]
    xs_all = [float(x) for s in every for x in s.xs] or [0.0, 1.0]
    ys_all = _finite([y for s in every for y in s.ys]) or [0.0, 1.0]
    y_ticks = nice_ticks(min(0.0, min(ys_all)), max(ys_all))
    x_low, x_high = min(xs_all), max(xs_all)
    if x_high <= x_low:
        x_high = x_low + 1.0
    x_ticks = [t for t in nice_ticks(x_low, x_high, 6) if x_low <= t <= x_high]
    top, bottom = TOP + 40, height - BOTTOM
    body: list[str] = []
    for number, (subtitle, group) in enumerate(panels):
        left = number * panel_width + LEFT
        right = (number + 1) * panel_width - RIGHT
        xs = Scale(x_low, x_high, left + 6, right - 6)
        ys = Scale(y_ticks[0], y_ticks[-1], bottom, top)
        body += _y_axis(ys, y_ticks, left, right, ylabel if number == 0 else None)
        body += _x_axis(xs, x_ticks, bottom, xlabel)
        if subtitle:
            body.append(_text(left, TOP + 12, subtitle, anchor="start",
                              extra="font-weight='bold'"))
        for index, series in enumerate(group):
            body += _series_marks(series, COLOURS[index % len(COLOURS)], xs, ys)
        body += _legend([(s.name, COLOURS[i % len(COLOURS)], s.dashed)
                         for i, s in enumerate(group)], right, TOP + 28)
    return _document(panel_width * len(panels), height, title, body)


def horizontal_bars(title: str, labels: Sequence[str], values: Sequence[float], xlabel: str,
                    width: int = 560) -> str:
    """One bar per label, top to bottom, each with its value written at its end."""
    label_width = min(260, 12 + 7 * max((len(str(x)) for x in labels), default=4))
    height = TOP + 24 * len(labels) + BOTTOM + 10
    ticks = nice_ticks(0.0, max(_finite(values) or [1.0]))
    xs = Scale(0.0, ticks[-1], label_width, width - RIGHT - 40)
    body: list[str] = []
    for row, (label, value) in enumerate(zip(labels, values, strict=True)):
        y = TOP + 10 + 24 * row
        body.append(f"<rect x='{xs.start:.1f}' y='{y:.1f}' width='{xs(value) - xs.start:.1f}' "
                    f"height='16' fill='{COLOURS[0]}'/>")
        body.append(_text(label_width - 6, y + 12, str(label), anchor="end"))
        body.append(_text(xs(value) + 4, y + 12, tick_text(float(f"{value:.4g}")),
                          anchor="start"))
    body += _x_axis(xs, ticks, TOP + 10 + 24 * len(labels), xlabel)
    return _document(width, height, title, body)


def vertical_bars(title: str, categories: Sequence[str],
                  series: Sequence[tuple[str, Sequence[float]]], ylabel: str,
                  top_value: float | None = None, width: int = 560, height: int = 320,
                  category_colours: Sequence[str] | None = None) -> str:
    """Grouped bars: one group per category, one bar per series (a legend when several);
    ``category_colours`` colours a single series' bars by category."""
    values = _finite([v for _, vs in series for v in vs]) or [1.0]
    ticks = nice_ticks(0.0, top_value if top_value is not None else max(values))
    top, bottom = TOP + 28, height - BOTTOM - 20
    ys = Scale(0.0, ticks[-1], bottom, top)
    left, right = LEFT, width - RIGHT
    slot = (right - left) / max(len(categories), 1)
    bar = slot * 0.7 / max(len(series), 1)
    body = _y_axis(ys, ticks, left, right, ylabel)
    body.append(f"<line x1='{left}' x2='{right}' y1='{bottom:.1f}' y2='{bottom:.1f}' "
                "stroke='#555'/>")
    for number, category in enumerate(categories):
        start = left + slot * number + slot * 0.15
        for index, (_, vs) in enumerate(series):
            value = float(vs[number])
            colour = (category_colours[number] if category_colours
                      else COLOURS[index % len(COLOURS)])
            body.append(f"<rect x='{start + bar * index:.1f}' y='{ys(value):.1f}' "
                        f"width='{bar - 2:.1f}' height='{bottom - ys(value):.1f}' "
                        f"fill='{colour}'/>")
        body.append(_text(left + slot * (number + 0.5), bottom + 16, str(category)))
    if len(series) > 1:
        body += _legend([(name, COLOURS[i % len(COLOURS)], False)
                         for i, (name, _) in enumerate(series)], right, TOP + 14)
    return _document(width, height, title, body)
