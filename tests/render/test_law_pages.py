"""Figures people can read (#49.4), on the report pages of real smoke studies: the law families
khop, crasp and groups, and petty (a text family).

In headless chromium at 1400 x 900 and at a 1280 x 800 laptop's size: the page is no wider than
the window (wide tables scroll in their own box), the title comes first, no rendered text is under
11 px (nor shrunk inside an SVG image), every accuracy heatmap is at least 480 px wide. From the
page's markup: the heatmaps' colours sit on a fixed 0-1 scale with the threshold marked, the
predicted line is law.csv's, and no header shows an absolute path.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from depthprobe.probes.render.charts import colormap_rgb
from tests.render.test_browser import Page, browser  # noqa: F401 (the browser fixture)

FAMILIES = ("khop", "crasp", "groups", "petty")
SIZES = ((1400, 900), (1280, 800))

# what the page looks like to a reader, measured by the browser
MEASURE = r"""(() => {
  const shown = e => e.getClientRects().length > 0 && getComputedStyle(e).visibility !== 'hidden';
  const scale = t => { const s = t.ownerSVGElement; if (!s) return 1;
    const top = s.closest('svg:not(svg svg)') || s;  // nested charts: the outermost svg's scale
    return top.getBoundingClientRect().width / (top.viewBox.baseVal.width || top.getBoundingClientRect().width); };
  const texts = Array.from(document.body.querySelectorAll('*')).filter(e =>
    shown(e) && Array.from(e.childNodes).some(n => n.nodeType === 3 && n.textContent.trim()));
  const small = texts.map(e => [parseFloat(getComputedStyle(e).fontSize) * scale(e), e.tagName,
                                e.textContent.trim().slice(0, 40)]).filter(([px]) => px < 11 - 1e-6);
  const unboxed = Array.from(document.querySelectorAll('table')).filter(t => {
    const box = t.parentElement;
    return !(box.classList.contains('tablewrap') && getComputedStyle(box).overflowX === 'auto'
             && box.getBoundingClientRect().right <= document.documentElement.clientWidth + 0.5);
  }).length;
  return {page: document.documentElement.scrollWidth, window: document.documentElement.clientWidth,
          first: document.body.firstElementChild.tagName, small: small,
          tables: document.querySelectorAll('table').length, unboxed: unboxed,
          heatmaps: Array.from(document.querySelectorAll('svg.heatmap')).map(s => s.getBoundingClientRect().width),
          shrunk: Array.from(document.images).filter(i => i.getBoundingClientRect().width < i.naturalWidth - 0.5)
            .length,
          wider: Array.from(document.querySelectorAll('table')).some(t => t.scrollWidth > t.parentElement.clientWidth)};
})()"""


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """family -> its smoke study folder (report.html, law.csv, accuracy.csv)."""
    from depthprobe.probes.experiments.runner import study

    root = tmp_path_factory.mktemp("pages")
    return {f: study(f, preset="smoke", out=root / f, echo=lambda _: None).folder for f in FAMILIES}


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_smoke_pages_fit_the_window_and_read_at_11_px(browser, folders, size):  # noqa: F811
    """Before: heatmaps were 70-260 px wide with 8 px values, and the members table's integers read 2.0000."""
    width, height = size
    for family, folder in folders.items():
        tab = Page(browser, folder / "report.html", until="true", width=width, height=height)
        try:
            got = tab.eval(MEASURE)
        finally:
            tab.close()
        assert got["page"] <= got["window"] == width, family  # no sideways scroll of the page itself
        assert got["first"] == "H1", family  # nothing above the title
        assert got["small"] == [], family
        assert got["shrunk"] == 0, family  # SVG images (probe curves) at their own size: their 11 px text too
        assert got["tables"] >= 2 and got["unboxed"] == 0, family  # each table in its own scroll box
        law = family != "petty"
        assert len(got["heatmaps"]) >= (1 if law else 0) and min(got["heatmaps"], default=480) >= 480, family
        if family in ("crasp", "khop"):
            assert got["wider"], family  # the members table is wider than its box: it scrolls there


def _heatmaps(folder):
    return re.findall(r'<svg [^>]*class="heatmap".*?</svg>', (folder / "report.html").read_text(), re.S)


def test_heatmaps_colour_on_a_fixed_scale_with_the_threshold_marked(folders):
    """Each cell's colour is viridis at its value on 0-1 (on its table's own min..max, the lowest
    cell would be the darkest colour whatever its accuracy); the colour bar is labelled 0, 0.5, 1
    and carries the threshold; cells at or above it, and only they, are outlined."""
    for family in ("khop", "crasp", "groups"):
        threshold = {"crasp": 0.95}.get(family, 0.99)
        for svg in _heatmaps(folders[family]):
            cell = r'<rect x="[\d.]+" y="[\d.]+" width="[\d.]+" height="[\d.]+" fill="#(\w{6})"/>'
            cells = re.findall(cell + r'<text [^>]*text-anchor="middle" fill="#\w{6}">([\d.]+)</text>', svg)
            assert cells, family
            values = np.array([float(v) for _, v in cells])
            drawn = np.array([[int(f[i : i + 2], 16) for i in (0, 2, 4)] for f, _ in cells])
            want = colormap_rgb(values, "viridis", 0.0, 1.0).astype(int)
            assert np.abs(drawn - want).max() <= 2, family  # the values are shown to 3 decimals
            labels = re.findall(r"<text x=\"[\d.]+\" y=\"[\d.]+\">([^<]+)</text>", svg)
            assert {"1", "0.5", "0"} <= set(labels)
            assert f"threshold {threshold:g}" in svg and 'class="threshold"' in svg
            assert svg.count('class="reached"') == int((values >= threshold).sum())
            assert svg.count('font-size="8"') == svg.count('font-size="10"') == 0


def test_the_predicted_line_is_law_csv(folders):
    """khop: over each k, at the top edge of law.csv's predicted depth (the bottom edge when it is
    deeper than every row); crasp: over the solve-range column of L_k only; groups: no line (its law
    is a shape, not a depth)."""
    for family in ("khop", "crasp"):
        folder = folders[family]
        law = pd.read_csv(folder / "law.csv")
        acc = pd.read_csv(folder / "accuracy.csv")
        depths = sorted(acc.loc[~acc["control"], "depth"].unique())
        (svg,) = _heatmaps(folder)  # one width (and one group): one heatmap
        left, top, cw, ch = (float(v) for v in re.search(r'data-grid="([^"]+)"', svg).group(1).split())
        path = re.search(r'class="predicted" d="([^"]+)"', svg).group(1)
        points = [tuple(float(v) for v in p.split(",")) for p in re.findall(r"[\d.]+,[\d.]+", path)]
        cols = sorted(acc["k" if family == "khop" else "max_length"].unique())
        want = []
        for _, row in law.iterrows():
            j = cols.index(row["k"] if family == "khop" else int(row["solve_range"].split("-")[1]))
            y = top + next((i for i, d in enumerate(depths) if d >= row["predicted_depth"]), len(depths)) * ch
            want += [(left + j * cw, y), (left + (j + 1) * cw, y)]
        assert points == want, family
    assert all('class="predicted"' not in svg for svg in _heatmaps(folders["groups"]))


def test_headers_show_no_absolute_path_and_members_print_whole_numbers(folders):
    for family, folder in folders.items():
        html = (folder / "report.html").read_text()
        header = re.search(r"<h1>.*?</p>", html, re.S).group(0)
        assert str(folder) not in header and not re.search(r"(^|[\s(])(/|~/)[\w.-]+/", header), family
        members = html[html.index("<h2>Members</h2>") :]
        assert "<td>2.0000</td>" not in members and "<td>2</td>" in members, family  # heads, as written


@pytest.mark.study
def test_page_headers_shorten_absolute_paths():
    """A study's corpus and a run's local model and data file: their last part, not the machine's layout."""
    from depthprobe.probes.render.html import no_paths
    from depthprobe.probes.render.report import RunData, render
    from depthprobe.probes.render.study import study_page

    assert no_paths("corpus /home/me/data/wiki.txt, C:\\models\\bert") == "corpus …/data/wiki.txt, …\\models\\bert"
    kept = "sentence-transformers/all-MiniLM-L6-v2 d_ff/d_model 1/2 data/relative.txt"
    assert no_paths(kept) == kept  # hub names, ratios and relative paths stay
    assert no_paths("/tmp/ckpt/run$\\bad{$") == "…/ckpt/run$\\bad{$"  # a POSIX name may hold a backslash
    members = pd.DataFrame([{"member": "m", "status": "ok", "depth": 1, "heads": 2.0}])
    study = study_page("petty", "smoke", members, [], {}, ["corpus /home/me/data/wiki.txt"])
    assert "corpus …/data/wiki.txt" in study and "/home/me" not in study[: study.index("<h2>")]
    manifest = {"model": {"resolved": "/opt/models/my-bert", "causal": False, "n_layers": 2, "n_heads": 2}}
    run = render(
        RunData(
            summary={"task": "t", "model": "/opt/models/my-bert", "summary": []},
            manifest={**manifest, "config": {"data": "/srv/corpora/sentences.txt"}},
        )
    )
    header = run[run.index("<h1>") : run.index("</p>", run.index("<h1>"))]
    assert "<h1>depthprobe: t on …/models/my-bert</h1>" in header and "data …/corpora/sentences.txt" in header
    assert "/opt/" not in header and "/srv/" not in header


def test_the_views_status_line_comes_after_the_title():
    """Before: the "attention views need JavaScript" line was the page's first line, above its title."""
    from depthprobe.probes.render.report import RunData, render

    tokens = ["a", "b", "c"]
    views = [{"title": "v", "tokens": tokens, "pattern": (np.ones((1, 3, 3)) / 3).tolist()}]
    html = render(RunData(summary={"task": "t", "model": "m", "summary": []}, views=views))
    body = html[html.index("<body>") + len("<body>") :].lstrip()
    assert body.startswith("<h1>depthprobe: t on m</h1>")
    assert html.index("<h1>") < html.index("id='dp-status'") < html.index("<section class='attention'>")


@pytest.mark.study
def test_export_figures_writes_each_figure_of_a_study_as_svg(folders, tmp_path):
    """scripts/export_figures.py: the report drawn again from the folder, each figure a file."""
    import subprocess
    import sys
    import xml.etree.ElementTree as ET

    from tests.render.test_browser import REPO

    script = REPO / "scripts" / "export_figures.py"
    cmd = [sys.executable, str(script), str(folders["khop"]), str(tmp_path / "out"), "--prefix", "smoke-khop-"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == [
        "smoke-khop-accuracy-d-model-16.svg",  # the heatmap, law.csv's line on it
        "smoke-khop-accuracy-during-training-k-1.svg",
        "smoke-khop-accuracy-during-training-k-2.svg",
        "smoke-khop-depth-1.svg",  # depth usage: a row of two charts per depth
        "smoke-khop-depth-2.svg",
    ]
    heatmap = (tmp_path / "out" / names[0]).read_text()
    assert ET.fromstring(heatmap).tag == "{http://www.w3.org/2000/svg}svg" and 'class="predicted"' in heatmap
    assert all(ET.fromstring((tmp_path / "out" / n).read_text()).tag.endswith("svg") for n in names)
    bad = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "none"), str(tmp_path / "x")], capture_output=True, text=True
    )
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr
