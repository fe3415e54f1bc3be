"""Line charts as direct SVG (no plotting library): the one line-chart helper of the reports and
of the tasks' plots.

``chart_svg`` draws series of (x, y) points with markers, optional min-max error bars, point
marks, dashed lines, a log x axis, a zero line and dotted reference lines (``rules``). Its
markup is inline SVG for a page (each series a ``<g class='series' data-label=...>``, which
tests read back) or, with ``standalone``, a file of its own (``plots/*.svg``, a ``data:``
image). ``row_svg`` lays several charts (each a ``Chart``) side by side under one title. Only
finite points are drawn.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from depthprobe.probes.render.html import esc

SVG_NS = " xmlns='http://www.w3.org/2000/svg'"
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)


@dataclass(frozen=True)
class Series:
    """One line of a chart: points (x, y), optional (lo, hi) error bars and point marks."""

    label: str
    points: tuple[tuple[float, float], ...]
    spread: tuple[tuple[float, float], ...] = ()  # one (lo, hi) per point, or none
    marks: tuple[str, ...] = ()  # one annotation per point ('' for none), or none
    dashed: bool = False
    color: str | None = None


def finite(*v: Any) -> bool:
    """Whether every value is a finite int or float."""
    return all(isinstance(x, (int, float)) and math.isfinite(x) for x in v)


def budget_text(n: Any) -> str:
    """50000 -> '50K', 1600000 -> '1.6M' (a parameter budget for a legend or tick)."""
    v = float(n)
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(v) >= div:
            return f"{v / div:.3g}{unit}"
    return f"{v:.3g}"


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi] (steps of 1, 2, 2.5 or 5 times a power of 10)."""
    if not hi > lo:
        lo, hi = lo - 0.5, hi + 0.5
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step - 1e-9) * step
    ticks = []
    t = start
    while t <= hi + step * 1e-9:
        ticks.append(0.0 if abs(t) < step * 1e-9 else t)
        t += step
    return ticks


def _tick(v: float) -> str:
    return f"{v:.4g}"


@dataclass(frozen=True)
class _Frame:
    """The plot area in pixels and the data range it shows (x in log10 units with ``log_x``)."""

    left: float
    top: float
    plot_w: float
    plot_h: float
    x0: float
    x1: float
    y0: float
    y1: float
    fx: Callable[[float], float]

    def px(self, x: float) -> float:
        return self.left + (self.fx(x) - self.x0) / (self.x1 - self.x0) * self.plot_w

    def py(self, y: float) -> float:
        return self.top + (1 - (y - self.y0) / ((self.y1 - self.y0) or 1.0)) * self.plot_h


def _drawable(series: Sequence[Series], log_x: bool) -> list[Series]:
    """Each series with its drawable points only (finite; x > 0 on a log axis)."""
    kept: list[Series] = []
    for s in series:
        idx = [i for i, (x, y) in enumerate(s.points) if finite(x, y) and (x > 0 or not log_x)]  # drawable points only
        kept.append(
            Series(
                s.label,
                tuple(s.points[i] for i in idx),
                tuple(s.spread[i] for i in idx) if s.spread else (),
                tuple(s.marks[i] for i in idx) if s.marks else (),
                s.dashed,
                s.color,
            )
        )
    return kept


def _frame(
    kept: list[Series],
    log_x: bool,
    zero: bool,
    x_range: tuple[float, float] | None,
    size: tuple[int, int],
    rules: Sequence[float],
) -> tuple[_Frame | None, list[float]]:
    """The plot frame and the y ticks of the drawable series and rules (None when there is no point)."""
    xs = [x for s in kept for x, _ in s.points]
    ys = [y for s in kept for _, y in s.points]
    ys += [v for s in kept for lo_hi in s.spread for v in lo_hi if finite(v)]
    if zero:
        ys.append(0.0)
    ys += [r for r in rules if finite(r)]
    if not xs:
        return None, []
    fx = (lambda v: math.log10(v)) if log_x else (lambda v: v)
    if x_range is not None:
        x0, x1 = fx(x_range[0]), fx(x_range[1])
    else:
        x0, x1 = min(fx(x) for x in xs), max(fx(x) for x in xs)
        if x1 == x0:
            x0, x1 = x0 - 0.5, x1 + 0.5
        pad = (x1 - x0) * 0.05
        x0, x1 = x0 - pad, x1 + pad
    yt = nice_ticks(min(ys), max(ys))
    y0, y1 = min(yt[0], min(ys)), max(yt[-1], max(ys))
    y0, y1 = y0 - (y1 - y0) * 0.04, y1 + (y1 - y0) * 0.04
    width, height = size
    left, right, top, plot_h = 64, 16, 28, height - 28 - 46
    return _Frame(left, top, width - left - right, plot_h, x0, x1, y0, y1, fx), yt


def _axes(
    f: _Frame,
    yt: list[float],
    x_ticks: Sequence[tuple[float, str]] | None,
    log_x: bool,
    zero: bool,
    rules: Sequence[float],
) -> list[str]:
    """Grid lines, tick labels, the plot's border, the zero line and the dotted rules."""
    out = []
    for t in yt:
        y = f.py(t)
        out.append(f"<line x1='{f.left}' x2='{f.left + f.plot_w}' y1='{y:.1f}' y2='{y:.1f}' stroke='#e4e4e4'/>")
        out.append(f"<text x='{f.left - 5}' y='{y + 4:.1f}' text-anchor='end'>{esc(_tick(t))}</text>")
    if x_ticks is None:
        if log_x:
            lo_dec, hi_dec = math.ceil(f.x0), math.floor(f.x1)
            x_ticks = [(10.0**k, budget_text(10.0**k)) for k in range(lo_dec, hi_dec + 1)]
        else:
            x_ticks = [(t, _tick(t)) for t in nice_ticks(f.x0, f.x1) if f.x0 <= t <= f.x1]
    base = f.top + f.plot_h
    for t, text in x_ticks:
        if not (finite(t) and (t > 0 or not log_x)):
            continue
        x = f.px(t)
        out.append(f"<line x1='{x:.1f}' x2='{x:.1f}' y1='{f.top}' y2='{base}' stroke='#efefef'/>")
        out.append(f"<text x='{x:.1f}' y='{base + 14}' text-anchor='middle'>{esc(text)}</text>")
    out.append(f"<rect x='{f.left}' y='{f.top}' width='{f.plot_w}' height='{f.plot_h}' fill='none' stroke='#888'/>")
    if zero:
        out.append(
            f"<line class='zero' x1='{f.left}' x2='{f.left + f.plot_w}' y1='{f.py(0):.1f}' y2='{f.py(0):.1f}' "
            "stroke='#000' stroke-width='1.2'/>"
        )
    for r in rules:
        if finite(r):
            out.append(
                f"<line class='rule' x1='{f.left}' x2='{f.left + f.plot_w}' y1='{f.py(r):.1f}' y2='{f.py(r):.1f}' "
                f"stroke='#777' stroke-dasharray='2 3'><title>{esc(f'y = {r:.4g}')}</title></line>"
            )
    return out


def _series_svg(s: Series, color: str, f: _Frame) -> list[str]:
    """One series: error bars, the polyline, a circle per point (hover title) and point marks."""
    dash = " stroke-dasharray='6 4'" if s.dashed else ""
    out = [f"<g class='series' data-label='{esc(s.label)}'>"]
    for (x, _), (lo, hi) in zip(s.points, s.spread, strict=True) if s.spread else []:
        if finite(lo, hi) and hi > lo:
            X, a, b = f.px(x), f.py(lo), f.py(hi)
            out.append(
                f"<line class='spread' x1='{X:.1f}' x2='{X:.1f}' y1='{a:.1f}' y2='{b:.1f}' stroke='{color}'/>"
                f"<line x1='{X - 4:.1f}' x2='{X + 4:.1f}' y1='{a:.1f}' y2='{a:.1f}' stroke='{color}'/>"
                f"<line x1='{X - 4:.1f}' x2='{X + 4:.1f}' y1='{b:.1f}' y2='{b:.1f}' stroke='{color}'/>"
            )
    pts = " ".join(f"{f.px(x):.1f},{f.py(y):.1f}" for x, y in s.points)
    out.append(f"<polyline class='line' points='{pts}' fill='none' stroke='{color}' stroke-width='1.6'{dash}/>")
    for i, (x, y) in enumerate(s.points):
        tip = f"{s.label}: x={_tick(x)}, y={y:.4g}"
        if s.spread and finite(*s.spread[i]):
            tip += f" (seeds {s.spread[i][0]:.4g} to {s.spread[i][1]:.4g})"
        out.append(
            f"<circle cx='{f.px(x):.1f}' cy='{f.py(y):.1f}' r='3' fill='{color}'><title>{esc(tip)}</title></circle>"
        )
        if s.marks and s.marks[i]:
            right = f.px(x) > f.left + f.plot_w * 0.7  # near the right edge: the mark runs leftwards
            out.append(
                f"<text class='mark' x='{f.px(x) + (-5 if right else 5):.1f}' y='{f.py(y) - 6:.1f}' font-size='11' "
                f"text-anchor='{'end' if right else 'start'}' fill='#b00000'>{esc(s.marks[i])}</text>"
            )
    out.append("</g>")
    return out


LEGEND_CHAR = 7.0  # px: the widest average character of an 11 px DejaVu Sans label (digits, '=')
LEGEND_SWATCH = 27  # px: the line sample and the gap before its label
LEGEND_GAP = 16  # px between two entries of a row
LEGEND_MARGIN = 8  # px from the chart's left and right edges


def legend_layout(labels: Sequence[str], width: int, cols: int) -> list[tuple[float, int, str]]:
    """(x, row, label shown) of each legend entry under a chart ``width`` px wide: entries follow
    one another in a row, at most ``cols`` a row, and a new row starts where the next entry would
    pass the right edge (labels never overlap); a label longer than a whole row is cut with '…'."""
    room = width - 2 * LEGEND_MARGIN
    most = max(4, int((room - LEGEND_SWATCH) / LEGEND_CHAR))
    out, x, row, in_row = [], float(LEGEND_MARGIN), 0, 0
    for label in labels:
        shown = label if len(label) <= most else label[: most - 1] + "…"
        w = LEGEND_SWATCH + LEGEND_CHAR * len(shown)
        if in_row and (in_row >= cols or x + w > LEGEND_MARGIN + room):
            x, row, in_row = float(LEGEND_MARGIN), row + 1, 0
        out.append((x, row, shown))
        x += w + LEGEND_GAP
        in_row += 1
    return out


def _legend(kept: list[Series], width: int, height: int, cols: int) -> list[str]:
    """The legend under the plot (``legend_layout``); a cut label keeps its whole text as a title."""
    out = []
    for k, (s, (lx, row, shown)) in enumerate(
        zip(kept, legend_layout([s.label for s in kept], width, cols), strict=True)
    ):
        color = s.color or PALETTE[k % len(PALETTE)]
        ly = height + 4 + row * 18
        dash = " stroke-dasharray='6 4'" if s.dashed else ""
        title = f"<title>{esc(s.label)}</title>" if shown != s.label else ""
        out.append(
            f"<line x1='{lx:.1f}' x2='{lx + 22:.1f}' y1='{ly:.1f}' y2='{ly:.1f}' stroke='{color}' "
            f"stroke-width='2'{dash}/><text class='legend' x='{lx + LEGEND_SWATCH:.1f}' y='{ly + 4:.1f}'>"
            f"{title}{esc(shown)}</text>"
        )
    return out


@dataclass(frozen=True)
class Chart:
    """One line chart: its series and how to draw them (the options of ``chart_svg``)."""

    series: tuple[Series, ...]
    title: str
    x_label: str
    y_label: str
    log_x: bool = False
    zero: bool = False
    x_ticks: tuple[tuple[float, str], ...] | None = None
    x_range: tuple[float, float] | None = None
    width: int = 660
    height: int = 320
    rules: tuple[float, ...] = ()  # y values marked by a dotted grey line (a threshold, a level)
    legend_cols: int = 3  # legend entries per row under the plot

    def __post_init__(self) -> None:
        if self.legend_cols < 1:
            raise ValueError(f"legend_cols must be at least 1, got {self.legend_cols}")

    @property
    def total_height(self) -> int:
        """The height with the legend's rows under the plot (``legend_layout``)."""
        layout = legend_layout([s.label for s in self.series], self.width, self.legend_cols)
        return self.height + 18 * (layout[-1][1] + 1 if layout else 0)


def chart_svg(
    series: Sequence[Series],
    *,
    title: str,
    x_label: str,
    y_label: str,
    log_x: bool = False,
    zero: bool = False,
    x_ticks: Sequence[tuple[float, str]] | None = None,
    x_range: tuple[float, float] | None = None,
    width: int = 660,
    height: int = 320,
    rules: Sequence[float] = (),
    legend_cols: int = 3,
    standalone: bool = False,
) -> str:
    """A line chart as inline SVG markup: each series a ``<g class='series' data-label=...>`` holding
    a polyline (its finite points, in order), a circle per point (with a hover title), min-max error
    bars (``<line class='spread'>``) and point marks; ``zero`` draws a line at y = 0 (class ``zero``)
    and ``rules`` a dotted line at each of their y values (class ``rule``, inside the y range);
    at most ``legend_cols`` legend entries share a row, fewer where long labels would overlap.
    With ``log_x`` x is drawn on a log scale (points with x <= 0 are left out). ``x_range`` fixes
    the x axis (default: the points' range, padded); ``standalone`` names the SVG namespace, for a
    chart that is a file or a ``data:`` image of its own. Without a finite point: a note, an SVG
    one when ``standalone``."""
    chart = Chart(
        tuple(series),
        title,
        x_label,
        y_label,
        log_x=log_x,
        zero=zero,
        x_ticks=None if x_ticks is None else tuple(x_ticks),
        x_range=x_range,
        width=width,
        height=height,
        rules=tuple(rules),
        legend_cols=legend_cols,
    )
    svg = _render(chart, SVG_NS if standalone else "")
    if svg is None:
        note = f"{title}: no finite values to draw"
        return _note_svg(note, width, height, SVG_NS) if standalone else f"<p class='note'>{esc(note)}</p>"
    return svg


def _render(c: Chart, place: str) -> str | None:
    """The chart's ``<svg class='chart'{place} ...>`` element (None when it has no finite point)."""
    kept = _drawable(c.series, c.log_x)
    f, yt = _frame(kept, c.log_x, c.zero, c.x_range, (c.width, c.height), c.rules)
    if f is None:
        return None
    width, height, total_h = c.width, c.height, c.total_height
    out = [
        f"<svg class='chart'{place} width='{width}' height='{total_h}' viewBox='0 0 {width} {total_h}' role='img' "
        f"aria-label='{esc(c.title)}' font-family='DejaVu Sans, Arial, sans-serif' font-size='11'>",
        f"<rect width='{width}' height='{total_h}' fill='#ffffff'/>",
        f"<text x='{width / 2:g}' y='16' text-anchor='middle' font-size='13'>{esc(c.title)}</text>",
    ]
    out += _axes(f, yt, c.x_ticks, c.log_x, c.zero, c.rules)
    base = f.top + f.plot_h
    scale = " (log scale)" if c.log_x else ""
    out.append(
        f"<text x='{f.left + f.plot_w / 2:g}' y='{base + 30}' text-anchor='middle'>{esc(c.x_label + scale)}</text>"
    )
    out.append(
        f"<text transform='translate(14 {f.top + f.plot_h / 2:g}) rotate(-90)' "
        f"text-anchor='middle'>{esc(c.y_label)}</text>"
    )
    for k, s in enumerate(kept):
        out += _series_svg(s, s.color or PALETTE[k % len(PALETTE)], f)
    out += _legend(kept, width, height, c.legend_cols)
    out.append("</svg>")
    return "".join(out)


def _note_svg(note: str, width: int, height: int, place: str) -> str:
    """An SVG element of the chart's size that says why there is no chart."""
    return (
        f"<svg class='chart note'{place} width='{width}' height='{height}' viewBox='0 0 {width} {height}' "
        f"role='img' aria-label='{esc(note)}' font-family='DejaVu Sans, Arial, sans-serif' font-size='12'>"
        f"<rect width='{width}' height='{height}' fill='#ffffff'/>"
        f"<text x='{width / 2:g}' y='{height / 2:g}' text-anchor='middle' fill='#555'>{esc(note)}</text></svg>"
    )


def wrap_text(text: str, limit: int) -> list[str]:
    """``text`` in lines of at most ``limit`` characters, each broken after its last space or comma
    (a model name such as ``spa:depth=4,width=64,...`` has no spaces), or at ``limit`` where a line
    has neither; joined, the lines give ``text`` back."""
    lines = []
    while len(text) > limit:
        cut = max(text.rfind(" ", 0, limit), text.rfind(",", 0, limit)) + 1  # just after the space or comma
        cut = cut or limit
        lines.append(text[:cut])
        text = text[cut:]
    return [*lines, text]


def row_svg(charts: Sequence[Chart], *, title: str = "", gap: int = 12, standalone: bool = False) -> str:
    """Charts side by side in one SVG (``<svg class='charts'>``), each its own ``<svg class='chart'>``
    as ``chart_svg`` draws it (a note in its place when it has no finite point), under ``title``
    (wrapped to the row's width, at most 8 px a character at 13 px)."""
    width = sum(c.width for c in charts) + gap * max(len(charts) - 1, 0)
    lines = wrap_text(title, max(20, width // 8)) if title else []
    top = 8 + 17 * len(lines)
    height = top + max((c.total_height for c in charts), default=0)
    out = [
        f"<svg class='charts'{SVG_NS if standalone else ''} width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}' font-family='DejaVu Sans, Arial, sans-serif' font-size='13'>",
        f"<rect width='{width}' height='{height}' fill='#ffffff'/>",
    ]
    out += [
        f"<text class='title' x='{width / 2:g}' y='{17 * (i + 1)}' text-anchor='middle'>{esc(line)}</text>"
        for i, line in enumerate(lines)
    ]
    x = 0
    for c in charts:
        place = f" x='{x}' y='{top}'"
        out.append(_render(c, place) or _note_svg(f"{c.title}: no finite values to draw", c.width, c.height, place))
        x += c.width + gap
    out.append("</svg>")
    return "".join(out)


__all__ = [
    "PALETTE",
    "Chart",
    "Series",
    "budget_text",
    "chart_svg",
    "finite",
    "legend_layout",
    "nice_ticks",
    "row_svg",
    "wrap_text",
]
