"""Report layout: legend entries never overlap (compare and study charts, measured in
headless chromium from the glyphs drawn), wide tables scroll inside their own box so a page is no
wider than a 1400 px window, and a law page says why a measured depth is blank."""

from __future__ import annotations

import pandas as pd
import pytest

from depthprobe.probes.render.laws import blank_reason, law_table
from depthprobe.probes.render.lines import Chart, Series, chart_svg, legend_layout, row_svg
from tests.render.test_browser import Page, _write, browser  # noqa: F401 (the browser fixture)

LONG = [
    "native:heads=4,d_vocab=64,n_ctx=64 (L=4, d=32)",
    "native:heads=4,d_vocab=64,n_ctx=64 (L=4, d=32), head mean",
    "spa:depth=4,width=64,variant=e-spa,seed=0",
    "pre-ln",
    "e-spa depth 8 seed 1",
    "x" * 200,
    "u-spa",
]

OVERLAPS = r"""(() => {
  const out = [];
  document.querySelectorAll('svg.chart').forEach(svg => {
    const w = svg.viewBox.baseVal.width;
    const boxes = Array.from(svg.querySelectorAll('text.legend')).map(t => [t.textContent, t.getBBox()]);
    boxes.forEach(([n, b], i) => {
      if (b.x < 0 || b.x + b.width > w + 0.5) out.push('outside: ' + n);
      boxes.slice(i + 1).forEach(([m, c]) => {
        if (b.x < c.x + c.width && c.x < b.x + b.width && b.y < c.y + c.height && c.y < b.y + b.height)
          out.push(n + ' over ' + m);
      });
    });
  });
  return out;
})()"""


def _series(labels):
    return [Series(label, tuple((x, x * i) for x in range(4))) for i, label in enumerate(labels)]


def test_legend_layout_flows_and_cuts():
    rows = legend_layout(["a", "b", "c", "d"], 660, 3)
    assert [r for _, r, _ in rows] == [0, 0, 0, 1]  # at most 3 a row
    assert rows[0][0] < rows[1][0] < rows[2][0] and rows[3][0] == rows[0][0]
    rows = legend_layout(LONG[:3], 420, 2)
    assert [r for _, r, _ in rows] == [0, 1, 2]  # each long label on a row of its own
    (_, _, shown), *_ = legend_layout(["y" * 300], 420, 3)
    assert shown.endswith("…") and len(shown) < 60
    svg = chart_svg(_series(["y" * 300]), title="t", x_label="x", y_label="y")
    assert f"<title>{'y' * 300}</title>" in svg  # the whole label on hover


def test_legend_entries_do_not_overlap_in_chromium(browser, tmp_path):  # noqa: F811
    """Before: entries sat in fixed columns (660/3 px), so a label longer than its column ran under
    the next one (a compare page's model names, a study's member names)."""
    from depthprobe.probes.render.compare import plot_svg

    rows = [
        {"label": label, "relative_depth": d, "best_value": v, "head_mean": v / 2, "heads": 4, "metric": "m"}
        for label in LONG[:3] + LONG[4:6]
        for d, v in ((0.25, 0.1), (0.75, 0.4))
    ]
    compare_svg = plot_svg(pd.DataFrame(rows).assign(better="higher"), "m")  # a standalone file
    inline = chart_svg(_series(LONG), title="t", x_label="x", y_label="y") + row_svg(
        [Chart(tuple(_series(LONG)), "a", "x", "y", width=420, height=240, legend_cols=2)] * 2, title="row"
    )
    pages = [
        _write(tmp_path, "compare.svg", compare_svg.replace("<svg class='chart'", "<svg class='chart'", 1)),
        _write(tmp_path, "charts.html", f"<!doctype html><html><body>{inline}</body></html>"),
    ]
    for path in pages:
        tab = Page(browser, path, until="true", width=1400)
        try:
            assert tab.eval("document.querySelectorAll('text.legend').length") >= 7
            assert tab.eval(OVERLAPS) == []
        finally:
            tab.close()


WIDTH = (
    "[document.documentElement.scrollWidth, Math.max(...Array.from(document.querySelectorAll('table.data'))"
    ".map(t => t.scrollWidth))]"
)


def test_wide_tables_scroll_in_their_own_box_at_1400_px(browser, tmp_path):  # noqa: F811
    """A study's members table (every column), a run's wide summary (as the ablation task's) and
    the compare page: the page stays within 1400 px while the tables themselves are wider."""
    from depthprobe.probes.experiments.report import render_folder
    from depthprobe.probes.render.report import RunData, render
    from tests.render.test_study_report import COLUMNS, write_study

    filled = {c: 123456.789 for c in COLUMNS if c not in ("family", "status", "error", "device")}
    rows = [
        {**filled, "member": f"spa-d64-L{d}-{v}-s{s}-lr0.003", "variant": v, "depth": d, "d_model": 64, "seed": s}
        for d in (4, 8)
        for v in ("pre-ln", "e-spa", "u-spa")
        for s in (0, 1)
    ]
    study = render_folder(write_study(tmp_path / "spa", "spa", rows, {"depths": [4, 8], "d_model": 64}))
    summary = [{f"column {i} with a long name": f"value {'x' * 30} {i}" for i in range(24)} for _ in range(3)]
    scores = pd.DataFrame([{"model": "m", "task": "ablation", "layer": 0, "head": 0, "metric": "loss", "value": 1.0}])
    run = render(
        RunData(
            summary={"task": "ablation", "model": "m", "summary": summary},
            scores=scores,
            views=[],
            plots={},
            manifest={"model": {"resolved": "m", "causal": True, "n_layers": 1, "n_heads": 1}},
            files=[],
        )
    )
    for name, html in (("study.html", study), ("run.html", run)):
        tab = Page(browser, _write(tmp_path, name, html), until="true", width=1400)
        try:
            page_width, table_width = tab.eval(WIDTH)
            assert page_width <= 1400 and table_width > 1400, name  # the table scrolls, the page does not
        finally:
            tab.close()


def test_a_blank_measured_depth_says_why():
    acc = pd.DataFrame(
        [
            {"depth": d, "seed": s, "k": k, "d_model": 16, "control": False, "accuracy": a}
            for (d, k), accs in {
                (1, 1): [0.5, 0.6],
                (2, 1): [0.98, 0.995],
                (1, 2): [1.0, 1.0],
                (2, 2): [1.0, 1.0],
                (1, 3): [0.2, 0.3],
            }.items()
            for s, a in enumerate(accs)
        ]
        + [{"depth": 2, "seed": 0, "k": 1, "d_model": 40, "control": True, "accuracy": 1.0}]  # a control: left out
    )
    k1 = acc[(acc["k"] == 1) & ~acc["control"]]
    assert blank_reason(k1, 0.99, 2) == (
        "no depth reached 0.99 in every seed "
        "(best: depth 2, accuracy 0.980 to 0.995 over 2 seeds, 1 of 2 at the threshold)"
    )
    assert blank_reason(acc[(acc["k"] == 2) & (acc["seed"] == 0)], 0.99, 2) == (
        "depth 1 reached 0.99 in its 1 finished seed(s) of 2"
    )
    assert blank_reason(acc.iloc[:0], 0.99, 2) == "no member at this setting finished"
    law = pd.DataFrame({"d_model": [16, 16, 16], "k": [1, 2, 3], "predicted_depth": [2, 3, 3]})
    law["measured_depth"] = pd.array([None, 1, None], dtype="Int64")
    html = law_table(law, acc, 0.99)
    assert html.count("<td>no depth reached 0.99 in every seed (best: depth ") == 2
    assert "best: depth 1, accuracy 0.200 to 0.300" in html and "why no measured depth" in html
    full = law.assign(measured_depth=pd.array([2, 1, 1], dtype="Int64"))
    assert "why no measured depth" not in law_table(full, acc, 0.99)


@pytest.mark.study
def test_law_pages_of_the_smoke_studies_say_why(tmp_path):
    """khop's smoke preset reaches no depth at 40 steps: its page gives each blank cell a reason."""
    from depthprobe.probes.experiments.runner import study

    out = study("khop", preset="smoke", out=tmp_path / "khop")
    html = (out.folder / "report.html").read_text()
    law = pd.read_csv(out.folder / "law.csv")
    blank = int(law["measured_depth"].isna().sum())
    assert blank and html.count("no depth reached 0.99 in every seed (best: depth ") == blank


@pytest.mark.parametrize("n", [1, 5])
def test_legend_height_counts_the_rows(n):
    chart = Chart(tuple(_series(LONG[:n])), "t", "x", "y", width=420, height=240, legend_cols=3)
    rows = {r for _, r, _ in legend_layout(LONG[:n], 420, 3)}
    assert chart.total_height == 240 + 18 * len(rows)
