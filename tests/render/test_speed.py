"""Direct SVG heatmaps, --dtype, the CUDA batch-size chooser and imports that only load what a task needs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from depthprobe.probes.base.batching import auto_batch_size
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.models.device import parse_dtype
from depthprobe.probes.render.charts import colormap_rgb, heatmap_range, heatmap_svg
from depthprobe.probes.render.report import heatmap_svg as report_heatmap
from tests.helpers import run_python

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


def test_auto_batch_size():
    kw = dict(n_layers=12, n_heads=12, d_model=768, max_len=128, value_bytes=4)
    per = 12 * 12 * 128**2 * (4 + 4) + 12 * 128**2 * 8 + 12 * 128 * 768 * 16 * 4  # bytes per example
    assert auto_batch_size(per * 2 * 16, **kw) == 16  # exactly 16 examples in half the memory
    assert auto_batch_size(per * 2 * 16 - 1, **kw) == 8  # one byte short: the next power of two down
    assert auto_batch_size(per * 2 * 100, **kw) == 64
    assert auto_batch_size(0, **kw) == 1  # never less than one
    assert auto_batch_size(10**15, **kw) == 512  # capped
    assert auto_batch_size(10**15, **kw, cap=100) == 64
    # bfloat16 halves the pattern and activation bytes: more examples fit
    assert auto_batch_size(per * 2 * 16, **{**kw, "value_bytes": 2}) == 16
    assert auto_batch_size(per * 2 * 32, **{**kw, "value_bytes": 2}) == 32
    with pytest.raises(ValueError):
        auto_batch_size(10**9, **{**kw, "max_len": 0})


# ------------------------------------------------------------------ dtype


def test_parse_dtype():
    assert parse_dtype(None) is torch.float32
    assert parse_dtype("bfloat16") is torch.bfloat16 and parse_dtype("torch.float16") is torch.float16
    with pytest.raises(
        ProbeError, match=r"unknown --dtype 'bf16'; use one of float32, bfloat16, float16 \(did you mean"
    ):
        parse_dtype("bf16")


def test_bfloat16_attention_stats_agree_with_float32(tiny_bert_dir):
    """bfloat16 keeps 8 significant bits (unit roundoff 2**-8 = 0.0039). The attention fractions
    are sums of softmax weights in [0, 1] whose logits carry a few roundoffs of relative error, so
    they move by at most about 5 roundoffs (0.02); entropy (at most log n, about 3 nats here) by the
    same relative amount, 0.05 nats. The metrics themselves read float32 copies and sum in float64."""
    from depthprobe.probes import run

    r32 = run(str(tiny_bert_dir), "attention-stats", limit=8, device="cpu")
    r16 = run(str(tiny_bert_dir), "attention-stats", limit=8, device="cpu", dtype="bfloat16")
    assert r32.config["dtype"] == "float32" and r16.config["dtype"] == "bfloat16"
    key = ["layer", "head", "metric"]
    a = r32.scores.set_index(key)["value"]
    b = r16.scores.set_index(key)["value"].reindex(a.index)
    diff = (a - b).abs()
    assert diff.notna().all()
    entropy = diff.index.get_level_values("metric") == "entropy"
    assert diff[~entropy].max() <= 0.02 and diff[entropy].max() <= 0.05
    assert diff.max() > 0  # the bfloat16 path really ran in bfloat16


def test_cli_dtype_option(tiny_bert_dir, tmp_path):
    from depthprobe.cli.main import app

    res = CliRunner().invoke(
        app,
        [
            "run",
            "--model",
            str(tiny_bert_dir),
            "--task",
            "attention-stats",
            "--limit",
            "2",
            "--dtype",
            "float16",
            "--device",
            "cpu",
            "--out",
            str(tmp_path / "run"),
        ],
    )
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["config"]["dtype"] == "float16" and manifest["config"]["batch_size"] == 32
    res = CliRunner().invoke(
        app, ["run", "--model", str(tiny_bert_dir), "--dtype", "double", "--out", str(tmp_path / "run2")]
    )
    assert res.exit_code == 2 and "unknown --dtype 'double'" in res.output
    assert not (tmp_path / "run2").exists()


# ------------------------------------------------------------------ imports


def test_attention_stats_run_loads_neither_spacy_nor_matplotlib(tiny_bert_dir, tmp_path):
    """A whole `probe run --task attention-stats` in a fresh interpreter, report included."""
    code = (
        "import json, sys\n"
        "from depthprobe.cli.main import app\n"
        f"app(['run', '--model', {str(tiny_bert_dir)!r}, '--task', 'attention-stats', '--limit', '2',"
        f" '--device', 'cpu', '--out', {str(tmp_path / 'run')!r}], standalone_mode=False)\n"
        "roots = ('spacy', 'matplotlib', 'depthprobe')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in roots)))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy(), timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "depthprobe.probes.render.report" in loaded  # the run really wrote its report
    assert [m for m in loaded if re.match(r"(spacy|matplotlib)(\.|$)", m)] == []
    assert (tmp_path / "run" / "report.html").read_text(encoding="utf-8").count("<figure class='heatmap'>") == 7


def test_viz_dtype_option(tiny_bert_dir, tmp_path):
    from depthprobe.cli.main import app

    res = CliRunner().invoke(
        app,
        [
            "viz",
            "--model",
            str(tiny_bert_dir),
            "--text",
            "the cat sat",
            "--dtype",
            "bfloat16",
            "--device",
            "cpu",
            "--out",
            str(tmp_path / "a.html"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert (tmp_path / "a.html").stat().st_size > 1000
    res = CliRunner().invoke(
        app, ["viz", "--model", str(tiny_bert_dir), "--text", "x", "--dtype", "half", "--out", str(tmp_path / "b.html")]
    )
    assert res.exit_code == 2 and "unknown --dtype 'half'" in res.output and not (tmp_path / "b.html").exists()


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


def test_leave_runs_atexit_handlers_joins_threads_and_flushes():
    proc = run_python(
        "import atexit, threading\n"
        "from depthprobe.cli.main import leave\n"
        "atexit.register(lambda: print('atexit ran', flush=False))\n"
        "done = []\n"
        "work = lambda: [threading.Event().wait(0.2), done.append(1), print('thread', len(done))]\n"
        "t = threading.Thread(target=work)\n"
        "t.start()\n"
        "print('unflushed', end='')\n"
        "leave(3)\n",
        timeout=120,
    )
    assert proc.returncode == 3
    assert proc.stdout == "unflushedthread 1\natexit ran\n"


def test_exit_code_maps_like_the_interpreter():
    from depthprobe.cli.main import exit_code

    assert exit_code(None) == 0
    assert exit_code(2) == 2
    assert exit_code(256 + 130) == 130
    assert exit_code("bad") == 1


def test_console_script_exit_status_and_output(tmp_path):
    probe = os.path.join(os.path.dirname(sys.executable), "probe")
    ok = subprocess.run([probe, "list", "tasks"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0 and "attention-stats" in ok.stdout
    bad = subprocess.run([probe, "run", "--task", "syntx"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "error: unknown task 'syntx' (did you mean 'syntax'?); choose from: "
        "ablation, attention-stats, coref, depth-usage, hop-attention, induction, kernels, syntax"
    ]
