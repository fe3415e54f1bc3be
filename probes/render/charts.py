"""Charts drawn from numbers: layer x head heatmaps as direct SVG, their colour maps, and the
helpers that turn a matplotlib figure into SVG text (for the plots tasks draw themselves).

Heatmaps need no plotting library: each cell is an SVG rectangle coloured from 33 anchors of
matplotlib's viridis or RdBu_r, with a colour bar and escaped labels. Line charts are in
``probes.render.lines``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from depthprobe.probes.render.html import esc

# ----------------------------------------------------------------------------------------------
# matplotlib figures as SVG text
# ----------------------------------------------------------------------------------------------


def plot_text(text: Any) -> str:
    """Text drawn by matplotlib, shown as written: ``$`` escaped so that no mathtext is parsed
    (model names and labels may hold ``$``, ``\\``, ``{``; mathtext would reject or mangle them)."""
    return str(text).replace("$", r"\$")


def figure_svg(fig: Any, tight: bool = False) -> str:
    """A matplotlib figure as SVG text: no date stamp (reruns are byte-identical), and the figure is
    closed if pyplot holds it. The one SVG writer for the matplotlib plots that tasks draw."""
    import io
    import sys

    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None}, **({"bbox_inches": "tight"} if tight else {}))
    pyplot = sys.modules.get("matplotlib.pyplot")  # figures made with Figure() need no closing
    if pyplot is not None:
        pyplot.close(fig)
    return buf.getvalue()


# ----------------------------------------------------------------------------------------------
# heatmaps as direct SVG (no plotting library)
# ----------------------------------------------------------------------------------------------

# 33 evenly spaced colours of matplotlib's viridis and RdBu_r (x = 0, 1/32, ..., 1); colours in
# between are interpolated linearly in RGB (at most 6/255 from the 256-entry originals per channel).
COLORMAPS = {
    "viridis": (
        "440154 470d60 48186a 482374 472d7b 453781 424086 3e4989 3b528b 375b8d 33638d 2f6b8e "
        "2c728e 297a8e 26828e 23898e 21918c 1f988b 1fa088 22a785 28ae80 32b67a 3fbc73 4ec36b "
        "5ec962 70cf57 84d44b 98d83e addc30 c2df23 d8e219 ece51b fde725"
    ),
    "RdBu_r": (
        "053061 0e4179 175290 1f63a8 2a71b2 3480b9 3f8ec0 529dc8 6bacd1 84bcd9 9bc9e0 aed3e6 "
        "c2ddec d4e6f1 e0ecf3 ecf2f5 f7f6f6 f9eee7 fbe5d8 fddcc9 fbccb4 f8bb9e f5aa89 ee9677 "
        "e48066 db6b55 d05548 c53e3d ba2832 ab162a 930e26 7c0722 67001f"
    ),
}
NAN_FILL = "#e6e6e6"  # cells without a value


@functools.cache
def _anchors(name: str) -> np.ndarray:
    return np.array([[int(h[i : i + 2], 16) for i in (0, 2, 4)] for h in COLORMAPS[name].split()], dtype=np.float64)


def colormap_rgb(values: np.ndarray, name: str, lo: float, hi: float) -> np.ndarray:
    """[..., 3] uint8 colours of ``values`` on the colormap stretched over [lo, hi] (clipped)."""
    table = _anchors(name)
    x = np.clip((np.asarray(values, dtype=np.float64) - lo) / ((hi - lo) or 1.0), 0.0, 1.0)
    x = np.nan_to_num(x, nan=0.0) * (len(table) - 1)
    i = np.minimum(np.floor(x).astype(int), len(table) - 2)
    t = (x - i)[..., None]
    return np.round(table[i] * (1 - t) + table[i + 1] * t).astype(np.uint8)


def _hex(rgb: Sequence[int]) -> str:
    r, g, b = (int(c) for c in rgb)
    return f"#{r:02x}{g:02x}{b:02x}"


def _dark(rgb: Sequence[int]) -> bool:
    r, g, b = (int(c) for c in rgb)
    return 0.299 * r + 0.587 * g + 0.114 * b < 140


def heatmap_range(values: np.ndarray) -> tuple[float, float, str]:
    """Colour range and colormap of a heatmap: viridis over [min, max]; RdBu_r symmetric about 0
    when the values have both signs."""
    finite = values[np.isfinite(values)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    if lo < 0 < hi:
        m = max(-lo, hi)
        return -m, m, "RdBu_r"
    return lo, (hi if hi > lo else lo + 1e-9), "viridis"


def _fmt(v: float, digits: int = 2) -> str:
    return f"{v:.{digits}f}" if abs(v) < 1000 else f"{v:.3g}"


FONT = 11  # px: every label of a heatmap (its axis titles and title 12)
CELL = (36, 26)  # px: an annotated cell (room for "0.00" at 11 px)
WIDE_CELL = 44  # px: an annotated cell with three decimals (a heatmap with a threshold)
LEFT, TOP, GAP, BAR = 58, 10, 14, 14  # px: row labels and their title; top margin; grid to colour bar; bar
CHAR = 7  # px: about the widest character of an 11 px label (digits, "e", "-")
MARK = 176  # px more for the threshold's label (two lines)


@dataclass(frozen=True)
class Grid:
    """Where a heatmap's cells are: the top-left corner of cell (0, 0), a cell's size and the
    counts. The SVG carries it as ``data-grid="left top cell_w cell_h"`` for what is drawn over the
    cells later (:func:`probes.render.laws.predicted_line`)."""

    left: float
    top: float
    cw: float
    ch: float
    n_rows: int
    n_cols: int

    @property
    def right(self) -> float:
        return self.left + self.n_cols * self.cw

    @property
    def bottom(self) -> float:
        return self.top + self.n_rows * self.ch


def heatmap_grid(
    n_rows: int, n_cols: int, *, annotate: bool = True, room: float = 0, top: float = TOP, wide: bool = False
) -> Grid:
    """The cells' layout: annotated cells of :data:`CELL` (:data:`WIDE_CELL` across when ``wide``),
    widened (up to 4x) to fill ``room`` px across; unannotated ones shrink to fit about 480 x 400 px."""
    if annotate:
        cw, ch = (WIDE_CELL if wide else CELL[0]), CELL[1]
        cw = min(4 * cw, max(cw, int(room // max(n_cols, 1))))
    else:
        cw, ch = max(4, min(34, 480 // max(n_cols, 1))), max(4, min(20, 400 // max(n_rows, 1)))
    return Grid(LEFT, top, cw, ch, n_rows, n_cols)


def heatmap_svg(
    values: np.ndarray,
    rows: Sequence[Any],
    cols: Sequence[Any],
    *,
    row_title: str = "layer",
    col_title: str = "head",
    annotate: bool = True,
    scale: tuple[float, float] | None = None,
    threshold: float | None = None,
    title: str = "",
    min_width: int = 0,
) -> str:
    """A [row, col] heatmap (row 0 at the top) with axis titles and a colour bar, as standalone SVG.

    Every label is escaped; cells without a finite value are grey and unlabelled. ``annotate``
    writes each cell's value (two decimals; three with a threshold) in black or white, whichever
    reads on its colour.
    ``scale`` fixes the colours' range (viridis over it; default :func:`heatmap_range`, the
    values' own). ``threshold`` is marked on the colour bar, and cells at or above it are
    outlined (class ``reached``). ``title`` goes above the cells; ``min_width`` widens the cells
    until the figure is at least that wide. Text is at least :data:`FONT` px.
    """
    values = np.asarray(values, dtype=np.float64)
    n_rows, n_cols = values.shape
    lo, hi, cmap = heatmap_range(values) if scale is None else (*scale, "viridis")
    ticks = _tick_width(lo, hi)
    right = GAP + BAR + ticks + (MARK if threshold is not None else 0)  # px right of the cells
    top = TOP + (22 if title else 0)
    g = heatmap_grid(
        n_rows, n_cols, annotate=annotate, room=min_width - LEFT - right, top=top, wide=threshold is not None
    )
    width = max(min_width, int(g.right + right))
    height = int(g.bottom + 44)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="heatmap" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" data-grid="{g.left:g} {g.top:g} {g.cw:g} {g.ch:g}" '
        f'font-family="DejaVu Sans, Arial, sans-serif" font-size="{FONT}">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
    ]
    out += _cells(values, colormap_rgb(values, cmap, lo, hi), g, annotate, threshold)
    if title:
        out.append(
            f'<text class="title" x="{(g.left + g.right) / 2:g}" y="{TOP + 12}" text-anchor="middle" '
            f'font-size="12">{esc(title)}</text>'
        )
    out += _axis_labels(list(rows)[:n_rows], list(cols)[:n_cols], row_title, col_title, g)
    out += _colour_bar(cmap, lo, hi, int(g.right + GAP), int(g.top), int(g.bottom - g.top), BAR, threshold, ticks)
    out.append("</svg>")
    return "".join(out)


def _cells(values: np.ndarray, colours: np.ndarray, g: Grid, annotate: bool, threshold: float | None) -> list[str]:
    """A rectangle per cell (grey without a finite value), its value written on it (``annotate``),
    and an outline on the cells at or above ``threshold``."""
    finite = np.isfinite(values)
    out, reached = [], []
    for i in range(g.n_rows):
        y = g.top + i * g.ch
        for j in range(g.n_cols):
            x = g.left + j * g.cw
            fill = _hex(colours[i, j]) if finite[i, j] else NAN_FILL
            out.append(f'<rect x="{x:g}" y="{y:g}" width="{g.cw:g}" height="{g.ch:g}" fill="{fill}"/>')
            if annotate and finite[i, j]:
                ink = "#ffffff" if _dark(colours[i, j]) else "#000000"
                out.append(
                    f'<text x="{x + g.cw / 2:g}" y="{y + g.ch / 2 + 4:g}" text-anchor="middle" '
                    f'fill="{ink}">{esc(_fmt(values[i, j], 2 if threshold is None else 3))}</text>'
                )
            if threshold is not None and finite[i, j] and values[i, j] >= threshold:
                reached.append(
                    f'<rect class="reached" x="{x + 1.5:g}" y="{y + 1.5:g}" width="{g.cw - 3:g}" '
                    f'height="{g.ch - 3:g}" fill="none" stroke="#000000" stroke-width="2"/>'
                )
    return out + reached


def _axis_labels(rows: Sequence[Any], cols: Sequence[Any], row_title: str, col_title: str, g: Grid) -> list[str]:
    """Row and column labels (at most about 24 of each) and the two axis titles of a heatmap."""
    out = []
    step_r, step_c = max(1, g.n_rows // 24), max(1, g.n_cols // 24)
    for i in range(0, g.n_rows, step_r):
        y = g.top + i * g.ch + g.ch / 2 + 4
        out.append(f'<text x="{g.left - 5:g}" y="{y:g}" text-anchor="end">{esc(rows[i])}</text>')
    for j in range(0, g.n_cols, step_c):
        x = g.left + j * g.cw + g.cw / 2
        out.append(f'<text x="{x:g}" y="{g.bottom + 15:g}" text-anchor="middle">{esc(cols[j])}</text>')
    mid_x, mid_y = (g.left + g.right) / 2, (g.top + g.bottom) / 2
    out.append(
        f'<text class="axis-title" x="{mid_x:g}" y="{g.bottom + 34:g}" text-anchor="middle" '
        f'font-size="12">{esc(col_title)}</text>'
    )
    out.append(
        f'<text class="axis-title" transform="translate(15 {mid_y:g}) rotate(-90)" text-anchor="middle" '
        f'font-size="12">{esc(row_title)}</text>'
    )
    return out


def _tick_labels(lo: float, hi: float) -> list[tuple[float, str]]:
    """The colour bar's labels: (fraction from the top, text) at both ends and the middle."""
    return [(frac, f"{v:.3g}") for frac, v in ((0.0, hi), (0.5, (lo + hi) / 2), (1.0, lo))]


def _tick_width(lo: float, hi: float) -> int:
    """px right of the colour bar that its labels take (the widest label, and a margin)."""
    return 12 + CHAR * max(len(text) for _, text in _tick_labels(lo, hi))


def _colour_bar(
    cmap: str,
    lo: float,
    hi: float,
    bx: int,
    top: int,
    bh: int,
    bar: int,
    threshold: float | None = None,
    ticks: int = 0,
) -> list[str]:
    """A colour bar of 32 bands from hi (top) to lo (bottom), labelled at both ends and the middle;
    ``threshold`` (inside [lo, hi]) is a black line across it, labelled right of the tick labels
    (``ticks`` px wide, :func:`_tick_width`)."""
    out = []
    steps = 32
    band = colormap_rgb(np.linspace(hi, lo, steps), cmap, lo, hi)
    for k in range(steps):
        out.append(
            f'<rect x="{bx}" y="{top + k * bh / steps:.2f}" width="{bar}" height="{bh / steps + 0.5:.2f}" '
            f'fill="{_hex(band[k])}"/>'
        )
    for frac, text in _tick_labels(lo, hi):
        out.append(f'<text x="{bx + bar + 4}" y="{top + frac * bh + 4:.2f}">{esc(text)}</text>')
    if threshold is not None and lo <= threshold <= hi:
        y = top + (hi - threshold) / ((hi - lo) or 1.0) * bh
        out.append(
            f'<line class="threshold" x1="{bx - 4}" x2="{bx + bar + 3}" y1="{y:.2f}" y2="{y:.2f}" '
            f'stroke="#000000" stroke-width="2"><title>threshold {threshold:g}</title></line>'
        )
        x, y = bx + bar + (ticks or _tick_width(lo, hi)), max(y + 4, top + 10)
        out.append(
            f'<text class="threshold" x="{x}" y="{y:.2f}">{esc(f"threshold {threshold:g}")}</text>'
            f'<text x="{x}" y="{y + 14:.2f}" fill="#555555">cells at or above: outlined</text>'
        )
    return out


__all__ = ["Grid", "colormap_rgb", "figure_svg", "heatmap_grid", "heatmap_range", "heatmap_svg", "plot_text"]
