"""Figures and files of the kernels task and sweep: metrics vs layer, kernel heatmaps, and the
``kernels.npz`` encoder. Drawing only; nothing here runs a model.
"""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np

from depthprobe.probes.render.charts import figure_svg, plot_text


def tight_svg(fig: Any) -> str:
    return figure_svg(fig, tight=True)


def pyplot():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def plot_layers(means: dict[str, np.ndarray], theory: dict[str, np.ndarray], title: str) -> str:
    """Mean cosine and residual ratios vs layer (theory dashed), both effective ranks beside."""
    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 3.4))
    layers = np.arange(len(means["mean_cosine"]))
    for name, style in (("mean_cosine", "o-"), ("resid_ratio_fro", "s-"), ("resid_ratio_l1inf", "^-")):
        ax.plot(layers, means[name], style, ms=3, label=name)
    if "mean_cosine" in theory:
        ax.plot(layers, theory["mean_cosine"], "k--", lw=1, label="mean_cosine (theory)")
    ax.set(xlabel="layer (0 = embeddings)", ylabel="value", title=plot_text(title))
    ax.legend(fontsize=7)
    for name, style, label in (
        ("effective_rank_centred", "o-", "centred X (spread)"),
        ("effective_rank_uncentred", "s-", "uncentred X (1 = collapsed)"),
    ):
        bx.plot(layers, means[name], style, ms=3, label=label)
        if name in theory:
            bx.plot(layers, theory[name], "k--", lw=1)
    bx.set(xlabel="layer", ylabel="effective rank", title="effective rank (theory dashed)")
    bx.legend(fontsize=7)
    return tight_svg(fig)


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
