"""Charts drawn directly as SVG (probes/render/charts.py): colours, heatmaps with their values and
colour bar, escaped labels, the report's heatmap of a grid, and the mean grid."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd

from depthprobe.probes.render.charts import colormap_rgb, heatmap_range, heatmap_svg
from depthprobe.probes.render.report import heatmap_svg as report_heatmap

SVG = "{http://www.w3.org/2000/svg}"


def _cells(svg: str, n: int) -> list[str]:
    """Fill colours of the first n rects after the background, in row-major order."""
    root = ET.fromstring(svg)
    rects = root.findall(f"{SVG}rect")
    return [r.get("fill") for r in rects[1 : 1 + n]]


# ------------------------------------------------------------------ colours


def test_colormap_known_colours():
    # matplotlib's viridis at 0, 1/2 and 1, and RdBu_r at its ends and centre
    np.testing.assert_array_equal(
        colormap_rgb(np.array([0.0, 0.5, 1.0]), "viridis", 0, 1),
        [[0x44, 0x01, 0x54], [0x21, 0x91, 0x8C], [0xFD, 0xE7, 0x25]],
    )
    np.testing.assert_array_equal(
        colormap_rgb(np.array([-2.0, 0.0, 2.0]), "RdBu_r", -2, 2),
        [[0x05, 0x30, 0x61], [0xF7, 0xF6, 0xF6], [0x67, 0x00, 0x1F]],
    )
    # halfway between two anchors: the mean of their colours; outside the range: clipped
    mid = colormap_rgb(np.array([0.5 / 32]), "viridis", 0, 1)[0]
    np.testing.assert_array_equal(mid, np.round((np.array([0x44, 0x01, 0x54]) + np.array([0x47, 0x0D, 0x60])) / 2))
    np.testing.assert_array_equal(
        colormap_rgb(np.array([-5.0, 9.0]), "viridis", 0, 1), [[0x44, 0x01, 0x54], [0xFD, 0xE7, 0x25]]
    )


def test_heatmap_range():
    assert heatmap_range(np.array([[1.0, 3.0]])) == (1.0, 3.0, "viridis")
    assert heatmap_range(np.array([[-1.0, 3.0, np.nan]])) == (-3.0, 3.0, "RdBu_r")
    lo, hi, _ = heatmap_range(np.array([[2.0, 2.0]]))
    assert lo == 2.0 and hi > lo
    assert heatmap_range(np.array([[np.nan]])) == (0.0, 1.0, "viridis")


def test_heatmap_svg_cells_values_and_colour_bar():
    values = np.array([[0.0, 0.5], [1.0, np.nan]])
    svg = heatmap_svg(values, [0, 1], [0, 1])
    assert _cells(svg, 3) == ["#440154", "#21918c", "#fde725"]
    root = ET.fromstring(svg)
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert texts[:3] == ["0.00", "0.50", "1.00"]  # the NaN cell is grey and unlabelled
    assert "#e6e6e6" in [r.get("fill") for r in root.findall(f"{SVG}rect")]
    inks = [t.get("fill") for t in root.iter(f"{SVG}text")][:3]
    assert inks == ["#ffffff", "#ffffff", "#000000"]  # white on dark purple and teal, black on yellow
    assert {"layer", "head", "1", "0.5", "0"} <= set(texts)  # axis titles, ticks, colour bar labels
    assert len([r for r in root.findall(f"{SVG}rect")]) == 1 + 4 + 32  # background, cells, colour bar


def test_heatmap_svg_escapes_every_label():
    evil = "</text><script>alert(1)</script>&\u202e"
    svg = heatmap_svg(np.array([[1.0, 2.0]]), [evil], ["a&b", "<c>"], row_title=evil, col_title='"q"')
    root = ET.fromstring(svg)  # well-formed XML: nothing broke out of a text element
    assert not root.findall(f".//{SVG}script") and "<script" not in svg
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "</text><script>alert(1)</script>&<U+202E>" in texts  # shown as written, bidi override visible
    assert {"a&b", "<c>", '"q"'} <= set(texts)


def test_report_heatmap_from_grid_and_large_grids_unannotated():
    grid = pd.DataFrame([[0.0, 1.0], [-1.0, 0.0]], index=[0, 1], columns=[0, 1])
    svg = report_heatmap(grid)
    assert _cells(svg, 4) == ["#f7f6f6", "#67001f", "#053061", "#f7f6f6"]  # diverging, symmetric about 0
    big = pd.DataFrame(np.arange(24 * 32, dtype=float).reshape(24, 32))
    root = ET.fromstring(report_heatmap(big))
    assert len(root.findall(f"{SVG}rect")) == 1 + 24 * 32 + 32
    assert "0.00" not in [t.text for t in root.iter(f"{SVG}text")]  # too many cells to write values


# ------------------------------------------------------------------ batch size


# ------------------------------------------------------------------ dtype


# ------------------------------------------------------------------ imports


def test_mean_grid_matches_pivot_table():
    from depthprobe.probes.render.report import _mean_grid

    layers, heads = np.array([0, 0, 0, 2, 2, 2]), np.array([1, 1, 0, 0, 1, 1])
    values = np.array([1.0, 3.0, 5.0, np.nan, 4.0, np.nan])
    grid = _mean_grid(layers, heads, values)
    assert list(grid.index) == [0, 2] and list(grid.columns) == [0, 1]
    np.testing.assert_array_equal(grid.to_numpy(), [[5.0, 2.0], [np.nan, 4.0]])  # NaN: no finite value
    df = pd.DataFrame({"layer": layers, "head": heads, "value": values})
    want = df.pivot_table(index="layer", columns="head", values="value", aggfunc="mean", dropna=False)
    np.testing.assert_array_equal(grid.to_numpy(), want.to_numpy())


# ------------------------------------------------------------------ leaving without teardown
