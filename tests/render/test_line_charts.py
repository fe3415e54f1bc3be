"""The one line-chart helper (probes.render.lines) as the tasks use it: standalone SVG files with
known series, values, rules and panels side by side, read back as XML."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest

from depthprobe.probes.render.lines import Chart, Series, chart_svg, row_svg, wrap_text
from depthprobe.tasks.induction.sweep import line_plot
from depthprobe.tasks.kernels.plots import plot_layers
from depthprobe.tasks.kernels.sweep import KernelSweep, SweepOptions

NS = "{http://www.w3.org/2000/svg}"


def series_of(root: ET.Element) -> dict[str, ET.Element]:
    """Series label -> its <g class='series'> (document order)."""
    return {g.get("data-label", ""): g for g in root.iter(f"{NS}g") if g.get("class") == "series"}


def tips(g: ET.Element) -> list[str]:
    """The hover titles of a series' points, in order."""
    return [c.findtext(f"{NS}title") or "" for c in g.iter(f"{NS}circle")]


def texts(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(f"{NS}text")]


def dashed(g: ET.Element) -> bool:
    line = g.find(f"{NS}polyline")
    return line is not None and line.get("stroke-dasharray") is not None


def test_standalone_chart_without_points_is_an_svg_file():
    """A plot file with no finite value was a bare <p> (not an image); now an SVG saying so."""
    svg = chart_svg([Series("a", ((1.0, math.nan),))], title="loss", x_label="x", y_label="y", standalone=True)
    root = ET.fromstring(svg)
    assert root.tag == f"{NS}svg"
    assert texts(root) == ["loss: no finite values to draw"]
    inline = chart_svg([Series("a", ((1.0, math.nan),))], title="loss", x_label="x", y_label="y")
    assert inline == "<p class='note'>loss: no finite values to draw</p>"  # inside a page: unchanged


def test_rules_are_dotted_lines_inside_the_y_range():
    pts = ((0.0, 0.0), (1.0, 0.2))
    root = ET.fromstring(
        chart_svg([Series("a", pts)], title="t", x_label="x", y_label="y", rules=(0.5,), standalone=True)
    )
    (rule,) = [ln for ln in root.iter(f"{NS}line") if ln.get("class") == "rule"]
    assert rule.get("stroke-dasharray") and rule.findtext(f"{NS}title") == "y = 0.5"
    frame = next(r for r in root.iter(f"{NS}rect") if r.get("stroke") == "#888")
    top, bottom = float(frame.get("y")), float(frame.get("y")) + float(frame.get("height"))
    ys = [float(c.get("cy")) for c in root.iter(f"{NS}circle")]
    assert top <= float(rule.get("y1")) < min(ys) <= bottom  # 0.5 is above both points, inside the frame
    assert "0.5" in texts(root)  # the y ticks reach it
    plain = chart_svg([Series("a", pts)], title="t", x_label="x", y_label="y")
    assert "class='rule'" not in plain


def test_row_places_charts_side_by_side_under_a_wrapped_title():
    a = Chart((Series("up", ((0.0, 0.0), (1.0, 1.0))),), "A", "x", "y", width=300, height=200)
    b = Chart(tuple(Series(f"s{k}", ((0.0, k), (1.0, k))) for k in range(4)), "B", "x", "y", width=200, legend_cols=2)
    empty = Chart((Series("none", ((0.0, math.nan),)),), "C", "x", "y", width=100, height=80)
    title = "spa:depth=4,width=64,heads=4,n_ctx=16,d_vocab=64,attention=uniform,skip=false: signal propagation"
    root = ET.fromstring(row_svg([a, b, empty], title=title, standalone=True))
    assert root.tag == f"{NS}svg" and root.get("class") == "charts"
    assert root.get("width") == str(300 + 12 + 200 + 12 + 100)
    lines = [t.text or "" for t in root.iter(f"{NS}text") if t.get("class") == "title"]
    assert "".join(lines) == title and len(lines) > 1 and all(len(s) <= 624 // 8 for s in lines)
    panels = [p for p in root if p.tag == f"{NS}svg"]
    assert [(p.get("class"), p.get("x")) for p in panels] == [("chart", "0"), ("chart", "312"), ("chart note", "524")]
    assert list(series_of(panels[0])) == ["up"] and list(series_of(panels[1])) == ["s0", "s1", "s2", "s3"]
    assert panels[1].get("height") == str(320 + 2 * 18)  # two legend rows of two entries
    legend_x = {t.get("x") for t in panels[1].iter(f"{NS}text") if t.get("class") == "legend"}
    assert len(legend_x) == 2
    assert texts(panels[2]) == ["C: no finite values to draw"]
    with pytest.raises(ValueError, match="legend_cols must be at least 1"):
        Chart((), "D", "x", "y", legend_cols=0)


def test_wrap_text_breaks_after_commas_and_spaces_or_at_the_limit():
    assert wrap_text("spa:depth=4,width=64,heads=4", 12) == ["spa:depth=4,", "width=64,", "heads=4"]
    assert wrap_text("rank collapse vs depth", 12) == ["rank ", "collapse vs ", "depth"]
    assert wrap_text("abcdefghijklmnopqrstuvwxyz", 10) == ["abcdefghij", "klmnopqrst", "uvwxyz"]
    assert wrap_text("short", 10) == ["short"]


def test_induction_line_plot_draws_a_line_per_depth_and_the_threshold():
    table = pd.DataFrame(
        {"depth": [1, 1, 2, 2], "step": [0, 10, 0, 10], "best_induction": [0.1, 0.7, 0.2, 0.4], "loss": [3, 2, 3, 1]}
    )
    root = ET.fromstring(line_plot(table, "best_induction", "best induction", 0.5))
    shown = series_of(root)
    assert list(shown) == ["1 layer", "2 layers"]
    assert tips(shown["1 layer"]) == ["1 layer: x=0, y=0.1", "1 layer: x=10, y=0.7"]
    assert tips(shown["2 layers"]) == ["2 layers: x=0, y=0.2", "2 layers: x=10, y=0.4"]
    assert [ln.findtext(f"{NS}title") for ln in root.iter(f"{NS}line") if ln.get("class") == "rule"] == ["y = 0.5"]
    assert "training step" in texts(root) and "best induction" in texts(root)
    assert "class='rule'" not in line_plot(table, "loss", "loss (nats)")


def test_kernels_sweep_plot_is_cosine_vs_depth_with_theory_dashed():
    table = pd.DataFrame(
        {
            "variant": ["vanilla", "vanilla", "vanilla", "dong"],
            "depth": [1, 2, 8, 8],
            "final_cosine": [0.6, 0.8, 0.99, 1.0],
            "theory_cosine": [0.65, 0.85, 0.995, math.nan],
        }
    )
    root = ET.fromstring(KernelSweep._plot_depth(table, SweepOptions(width=64, seq_len=32)))
    shown = series_of(root)
    assert list(shown) == ["vanilla", "vanilla (theory)", "dong"]  # dong has no theory: no dashed line
    assert [dashed(g) for g in shown.values()] == [False, True, False]
    assert tips(shown["vanilla"]) == ["vanilla: x=1, y=0.6", "vanilla: x=2, y=0.8", "vanilla: x=8, y=0.99"]
    assert tips(shown["vanilla (theory)"])[2] == "vanilla (theory): x=8, y=0.995"
    assert {"1", "2", "8", "depth L (log scale)"} <= set(texts(root))  # ticks at the depths, log axis
    xs = [float(c.get("cx")) for c in shown["vanilla"].iter(f"{NS}circle")]
    assert math.isclose(xs[1] - xs[0], (xs[2] - xs[1]) / 2, rel_tol=1e-2)  # 1 -> 2 is half of 2 -> 8 on log x
    assert [ln.findtext(f"{NS}title") for ln in root.iter(f"{NS}line") if ln.get("class") == "rule"] == ["y = 0.99"]


def test_kernels_layer_plot_has_two_panels_with_the_metrics():
    means = {
        "mean_cosine": np.array([0.0, 0.5]),
        "resid_ratio_fro": np.array([1.0, 0.7]),
        "resid_ratio_l1inf": np.array([1.0, 0.6]),
        "effective_rank_centred": np.array([15.0, 9.0]),
        "effective_rank_uncentred": np.array([16.0, 8.0]),
    }
    theory = {"mean_cosine": np.array([0.0, 0.55]), "resid_ratio_fro": np.array([1.0, 0.75])}
    theory["effective_rank_centred"] = np.array([15.5, 9.5])
    root = ET.fromstring(plot_layers(means, theory, "tiny: signal propagation"))
    left, right = (p for p in root if p.tag == f"{NS}svg")
    assert list(series_of(left)) == ["mean_cosine", "mean_cosine (theory)", "resid_ratio_fro", "resid_ratio_l1inf"]
    assert list(series_of(right)) == [
        "centred X (spread)",
        "centred X (spread) (theory)",
        "uncentred X (1 = collapsed)",
    ]
    assert tips(series_of(left)["mean_cosine (theory)"]) == [
        "mean_cosine (theory): x=0, y=0",
        "mean_cosine (theory): x=1, y=0.55",
    ]
    assert tips(series_of(right)["uncentred X (1 = collapsed)"])[1].endswith("x=1, y=8")
    ticks = [t.text for t in left.iter(f"{NS}text") if t.get("y") == "288"]  # x tick labels: 14 px under the frame
    assert ticks == ["0", "1"]  # whole layers only, even for a one-layer model
    assert [t.text for t in root if t.get("class") == "title"] == ["tiny: signal propagation"]


def test_induction_sweep_draws_its_plots_without_matplotlib(tmp_path):
    """A whole induction sweep (line charts only) in a fresh interpreter never imports matplotlib."""
    code = (
        "import json, sys\n"
        "from depthprobe.probes.api.sweep import sweep\n"
        "res = sweep('induction', [1], steps=2, eval_every=2, n_seqs=2, width=16, heads=2, seq_len=24, vocab=12)\n"
        f"res.save({str(tmp_path / 's')!r})\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib')))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy(), timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
    for name in ("induction_vs_step", "loss_repeated_vs_step"):
        root = ET.parse(tmp_path / "s" / "plots" / f"{name}.svg").getroot()
        assert root.tag == f"{NS}svg" and list(series_of(root)) == ["1 layer"]
