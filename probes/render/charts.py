"""Charts drawn from numbers: layer x head heatmaps as direct SVG, their colour maps, and the
helpers that turn a matplotlib figure into SVG text (for the plots tasks draw themselves).

Heatmaps need no plotting library: each cell is an SVG rectangle coloured from 33 anchors of
matplotlib's viridis or RdBu_r, with a colour bar and escaped labels. Line charts are in
``probes.render.lines``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
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


def _fmt(v: float) -> str:
    return f"{v:.2f}" if abs(v) < 1000 else f"{v:.3g}"


def heatmap_svg(
    values: np.ndarray,
    rows: Sequence[Any],
    cols: Sequence[Any],
    *,
    row_title: str = "layer",
    col_title: str = "head",
    annotate: bool = True,
) -> str:
    """A [row, col] heatmap (row 0 at the top) with a colour bar, as standalone SVG text.

    Every label is escaped; cells without a finite value are grey and unlabelled. ``annotate``
    writes each cell's value (two decimals) in black or white, whichever reads on its colour.
    """
    values = np.asarray(values, dtype=np.float64)
    n_rows, n_cols = values.shape
    lo, hi, cmap = heatmap_range(values)
    cw, ch = (34, 20) if annotate else (max(4, min(34, 480 // max(n_cols, 1))), max(4, min(20, 400 // max(n_rows, 1))))
    left, top, gap, bar = 46, 10, 14, 14
    width, height = left + n_cols * cw + gap + bar + 52, top + n_rows * ch + 40
    colours = colormap_rgb(values, cmap, lo, hi)
    finite = np.isfinite(values)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Arial, sans-serif" font-size="10">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
    ]
    for i in range(n_rows):
        y = top + i * ch
        for j in range(n_cols):
            x = left + j * cw
            fill = _hex(colours[i, j]) if finite[i, j] else NAN_FILL
            out.append(f'<rect x="{x}" y="{y}" width="{cw}" height="{ch}" fill="{fill}"/>')
            if annotate and finite[i, j]:
                ink = "#ffffff" if _dark(colours[i, j]) else "#000000"
                out.append(
                    f'<text x="{x + cw / 2:g}" y="{y + ch / 2 + 3:g}" text-anchor="middle" font-size="8" '
                    f'fill="{ink}">{esc(_fmt(values[i, j]))}</text>'
                )
    out += _axis_labels(list(rows)[:n_rows], list(cols)[:n_cols], row_title, col_title, (left, top, cw, ch))
    # colour bar: 32 bands from hi (top) to lo (bottom), labelled at both ends and the middle
    out += _colour_bar(cmap, lo, hi, left + n_cols * cw + gap, top, n_rows * ch, bar)
    out.append("</svg>")
    return "".join(out)


def _axis_labels(
    rows: Sequence[Any], cols: Sequence[Any], row_title: str, col_title: str, grid: tuple[int, int, int, int]
) -> list[str]:
    """Row and column labels (at most about 24 of each) and the two axis titles of a heatmap."""
    left, top, cw, ch = grid
    n_rows, n_cols = len(rows), len(cols)
    out = []
    step_r, step_c = max(1, n_rows // 24), max(1, n_cols // 24)
    for i in range(0, n_rows, step_r):
        out.append(f'<text x="{left - 4}" y="{top + i * ch + ch / 2 + 3:g}" text-anchor="end">{esc(rows[i])}</text>')
    base = top + n_rows * ch
    for j in range(0, n_cols, step_c):
        out.append(f'<text x="{left + j * cw + cw / 2:g}" y="{base + 12}" text-anchor="middle">{esc(cols[j])}</text>')
    out.append(f'<text x="{left + n_cols * cw / 2:g}" y="{base + 28}" text-anchor="middle">{esc(col_title)}</text>')
    out.append(
        f'<text transform="translate(12 {top + n_rows * ch / 2:g}) rotate(-90)" '
        f'text-anchor="middle">{esc(row_title)}</text>'
    )
    return out


def _colour_bar(cmap: str, lo: float, hi: float, bx: int, top: int, bh: int, bar: int) -> list[str]:
    """A colour bar of 32 bands from hi (top) to lo (bottom), labelled at both ends and the middle."""
    out = []
    steps = 32
    band = colormap_rgb(np.linspace(hi, lo, steps), cmap, lo, hi)
    for k in range(steps):
        out.append(
            f'<rect x="{bx}" y="{top + k * bh / steps:.2f}" width="{bar}" height="{bh / steps + 0.5:.2f}" '
            f'fill="{_hex(band[k])}"/>'
        )
    for frac, v in ((0.0, hi), (0.5, (lo + hi) / 2), (1.0, lo)):
        out.append(f'<text x="{bx + bar + 3}" y="{top + frac * bh + 3:.2f}">{esc(f"{v:.3g}")}</text>')
    return out


__all__ = ["colormap_rgb", "figure_svg", "heatmap_range", "heatmap_svg", "plot_text"]
