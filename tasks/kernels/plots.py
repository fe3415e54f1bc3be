"""Figures and files of the kernels task and sweep: metrics vs layer (line charts of
``probes.render.lines``), kernel heatmaps (matplotlib), and the ``kernels.npz`` encoder. Drawing
only; nothing here runs a model.
"""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np

from depthprobe.probes.render.charts import figure_svg, plot_text
from depthprobe.probes.render.lines import PALETTE, Chart, Series, nice_ticks, row_svg


def tight_svg(fig: Any) -> str:
    return figure_svg(fig, tight=True)


def pyplot():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def plot_layers(means: dict[str, np.ndarray], theory: dict[str, np.ndarray], title: str) -> str:
    """Standalone SVG text: mean cosine and residual ratios vs layer, both effective ranks in a
    chart beside; theory dashed in its metric's colour, under ``title``."""
    last = len(means["mean_cosine"]) - 1
    ticks = tuple((t, f"{t:g}") for t in nice_ticks(0, max(last, 1)) if t == int(t) and t <= last)
    left = _layer_lines(
        means,
        theory,
        (
            ("mean_cosine", "mean_cosine", True),
            ("resid_ratio_fro", "resid_ratio_fro", False),
            ("resid_ratio_l1inf", "resid_ratio_l1inf", False),
        ),
    )
    right = _layer_lines(
        means,
        theory,
        (
            ("effective_rank_centred", "centred X (spread)", True),
            ("effective_rank_uncentred", "uncentred X (1 = collapsed)", True),
        ),
    )
    x_label = "layer (0 = embeddings)"
    return row_svg(
        [
            Chart(left, "mean cosine and residual ratios", x_label, "value", x_ticks=ticks, width=440, legend_cols=2),
            Chart(right, "effective rank", x_label, "effective rank", x_ticks=ticks, width=440, legend_cols=1),
        ],
        title=title,
        standalone=True,
    )


def _layer_lines(
    means: dict[str, np.ndarray], theory: dict[str, np.ndarray], names: tuple[tuple[str, str, bool], ...]
) -> tuple[Series, ...]:
    """A solid line per (metric, label, with theory) and a dashed one of the same colour for its
    theory where asked for and known."""
    lines = []
    for k, (name, label, with_theory) in enumerate(names):
        color = PALETTE[k]
        lines.append(Series(label, _by_layer(means[name]), color=color))
        if with_theory and name in theory:
            lines.append(Series(f"{label} (theory)", _by_layer(theory[name]), dashed=True, color=color))
    return tuple(lines)


def _by_layer(values: np.ndarray) -> tuple[tuple[float, float], ...]:
    return tuple((float(i), float(v)) for i, v in enumerate(np.asarray(values, dtype=np.float64)))


def plot_heatmaps(panels: list[tuple[str, np.ndarray]], ncols: int, title: str) -> str:
    """Normalised kernels as heatmaps (He et al. 2023, Figure 1 style), one panel each."""
    plt = pyplot()
    nrows = max(1, math.ceil(len(panels) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.6 * ncols, 2.5 * nrows), squeeze=False, layout="constrained")
    lo = min([0.0] + [float(np.nanmin(c)) for _, c in panels if np.isfinite(c).any()])
    im = None
    for ax, (label, c) in zip(axes.flat, panels, strict=False):
        im = ax.imshow(c, vmin=lo, vmax=1.0, cmap="viridis", interpolation="nearest")
        ax.set_title(plot_text(label), fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    if im is not None:
        fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label="cosine")
    fig.suptitle(plot_text(title), fontsize=9)
    return tight_svg(fig)


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as allow_pickle
    return buf.getvalue()
