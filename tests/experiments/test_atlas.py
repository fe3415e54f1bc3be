"""`probe atlas`: the verdicts on planted tables with known answers, its refusals, and the whole
atlas end to end at the smoke scale (the tests' scale: seconds of compute; it shows no finding)."""

from __future__ import annotations

import re

import pandas as pd
import pytest
from typer.testing import CliRunner

from depthprobe.cli.main import app
from depthprobe.probes.experiments import atlas_findings as af
from tests.helpers import cli_error, law_table
from tests.render.test_browser import browser  # noqa: F401 (the browser fixture)

FINDING = {"finding": "khop", "paper": "Sanford et al."}
# what in a page could make a request: an absolute or protocol-relative URL, a src or url() that is not data:
NETWORK = re.compile(r"(?:https?:)?//|\bsrc=['\"](?!data:)|@import|url\((?!['\"]?data:)", re.I)


def planted_accuracy() -> pd.DataFrame:
    """khop accuracies, depth x k x seed: k = 1 first solved at depth 2 in both seeds; k = 2 at depth
    3 in seed 0 and never in seed 1 (0.98 at depth 3); a control that solves everything (left out)."""
    acc = {
        (1, 1): (0.5, 0.6),
        (2, 1): (1.0, 0.995),
        (3, 1): (1.0, 1.0),
        (1, 2): (0.3, 0.3),
        (2, 2): (0.9, 0.9),
        (3, 2): (0.999, 0.98),
    }
    rows = [
        {"member": f"L{d}-s{s}", "depth": d, "d_model": 16, "seed": s, "control": False, "k": k, "accuracy": a[s]}
        for (d, k), a in acc.items()
        for s in (0, 1)
    ]
    rows += [
        {"member": f"c-s{s}", "depth": 1, "d_model": 32, "seed": s, "control": True, "k": k, "accuracy": 1.0}
        for k in (1, 2)
        for s in (0, 1)
    ]
    return pd.DataFrame(rows)


def test_law_verdict_known_answers():
    assert af.law_verdict(3, [3, 3]) == "as predicted in 2 of 2 seeds"
    assert af.law_verdict(3, [3, 4]) == "differs: at the prediction in 1 of 2 seeds"
    assert af.law_verdict(3, [2, 2]) == "differs: at the prediction in 0 of 2 seeds"
    assert (
        af.law_verdict(3, [3, None])
        == "differs: at the prediction in 1 of 2 seeds; 1 never solved it at the depths run"
    )
    assert af.law_verdict(2, []).startswith("not measured")


def test_first_depths_and_law_rows_on_planted_tables():
    acc = planted_accuracy()
    firsts = af.first_depths(acc, "k", 0.99)
    got = {
        (int(r.k), int(r.seed)): (None if pd.isna(r.first_depth) else int(r.first_depth)) for r in firsts.itertuples()
    }
    assert got == {(1, 0): 2, (1, 1): 2, (2, 0): 3, (2, 1): None}  # the control's 1.0 at depth 1 is left out
    law = law_table(acc, "khop", 0.99, 2)  # the family's own law.csv: predicted floor(log2 k) + 2
    rows = af.law_rows(FINDING, law, firsts)
    assert [r["level"] for r in rows] == ["k = 1", "k = 2"]
    assert [r["prediction"] for r in rows] == [2, 3]
    assert [r["measured"] for r in rows] == [2, ""]  # k = 2: no depth solved it in every seed
    assert [r["seeds"] for r in rows] == ["seed 0: 2; seed 1: 2", "seed 0: 3; seed 1: none"]
    assert rows[0]["verdict"] == "as predicted in 2 of 2 seeds"
    assert rows[1]["verdict"].startswith("differs: at the prediction in 1 of 2 seeds")


def test_induction_kernel_and_usage_rows_on_planted_tables():
    summary = pd.DataFrame({"depth": [2, 1], "best_induction": [0.8, 0.03]})
    rows = af.induction_rows(FINDING, summary, 0.05, 0.5)
    assert [(r["level"], r["verdict"]) for r in rows] == [("depth 1", "as predicted"), ("depth 2", "as predicted")]
    rows = af.induction_rows(FINDING, pd.DataFrame({"depth": [1, 2], "best_induction": [0.6, 0.1]}), 0.05, 0.5)
    assert [r["verdict"] for r in rows] == ["differs", "differs"]  # one layer above, two below the threshold

    kernels = pd.DataFrame(
        {
            "variant": ["vanilla", "e-spa"],
            "depth": [16, 16],
            "final_cosine": [0.9999, 0.70],
            "theory_cosine": [1.0, 0.815],
        }
    )
    rows = af.kernel_rows(FINDING, kernels)
    assert [r["level"] for r in rows] == ["vanilla, depth 16", "e-spa, depth 16"]
    assert rows[0]["measured"] == "1.000 (collapsed)" and rows[0]["verdict"].startswith("as predicted")
    assert rows[1]["measured"] == "0.700 (not collapsed)" and rows[1]["verdict"] == "differs by 0.115"

    usage = pd.DataFrame({"layer": [0, 1, 2, 3], "skip_output": [0.3, 0.05, 0.2, 0.4]})
    rows = af.usage_rows(FINDING, usage)
    assert [r["verdict"] for r in rows[:4]] == ["needed", "can be spared (< 0.1)", "needed", "needed"]
    assert rows[4]["measured"] == "mean 0.300 against 0.175"  # later half (0.2, 0.4) against earlier (0.3, 0.05)
    assert rows[4]["verdict"] == "differs: the later half matters more"
    rows = af.usage_rows(FINDING, usage.assign(skip_output=[0.4, 0.3, 0.05, 0.1]))
    assert rows[4]["verdict"] == "as predicted"


def test_bad_input_is_refused_before_anything_runs(tmp_path):
    cli_error(["atlas", "--jobs", "0", "--out", tmp_path / "a"], "--jobs must be at least 1")
    cli_error(["atlas", "--scale", "huge", "--out", tmp_path / "a"], "--scale must be one of demo, smoke")
    (tmp_path / "file").write_text("x")
    cli_error(["atlas", "--out", tmp_path / "file"], "is a file")
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    cli_error(["atlas", "--out", other], "not an atlas folder")
    cli_error(["atlas", "--device", "nonsense", "--out", tmp_path / "b"], "nonsense")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]


@pytest.mark.study
@pytest.mark.slow
def test_atlas_end_to_end_at_smoke_scale_resumes(tmp_path, browser):  # noqa: F811
    """Every finding runs (minilm included), atlas.csv has its columns and rows, the page its
    sections and no network reference; deleting the page and rerunning keeps every finished run."""
    out = tmp_path / "atlas"
    res = CliRunner().invoke(app, ["atlas", "--scale", "smoke", "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = pd.read_csv(out / "atlas.csv")
    assert list(rows.columns) == ["finding", "paper", "level", "prediction", "measured", "seeds", "verdict", "command"]
    counts = rows["finding"].value_counts().to_dict()
    assert counts == {"kernels": 4, "depth-usage": 7, "induction": 2, "khop": 2, "crasp": 1}
    assert list(rows[rows.finding == "khop"]["level"]) == ["k = 1", "k = 2"]
    assert list(rows[rows.finding == "khop"]["prediction"]) == ["2", "3"]
    page = (out / "atlas.html").read_text(encoding="utf-8")
    for slug in ("kernels", "depth-usage", "induction", "khop", "crasp"):
        assert f"<section id='{slug}'>" in page and (out / slug / "report.html").is_file()
        assert f"href='{slug}/report.html'" in page
    assert "do not show any finding" in page  # the smoke scale says what it is
    assert not NETWORK.findall(page)
    assert page.count("<img ") >= 7  # khop and crasp two figures each, the other three one

    from tests.render.test_browser import Page

    tab = Page(browser, out / "atlas.html", until="true", width=1280, height=800)
    try:  # the real page on a 1280 x 800 laptop: no overflow, every figure drawn, nothing fetched
        assert tab.eval("document.documentElement.scrollWidth") <= 1280
        assert tab.eval("Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")
        assert tab.network_requests() == [] and tab.problems() == []
    finally:
        tab.close()

    (out / "atlas.html").unlink()
    again = CliRunner().invoke(app, ["atlas", "--scale", "smoke", "--out", str(out)])
    assert again.exit_code == 0, again.output
    assert again.output.count("was finished before") == 3  # the run and sweep folders
    assert "finished member(s) kept" in again.output  # the studies continue themselves
    assert (out / "atlas.html").read_text(encoding="utf-8") == page
    pd.testing.assert_frame_equal(pd.read_csv(out / "atlas.csv"), rows)
    cli_error(["atlas", "--out", out], "holds an atlas at scale 'smoke', not 'demo'")


def test_demo_presets_plan_the_laws_small_and_list_their_costs():
    """khop: k = 1, 2 at depths 1-3, two seeds, no control; crasp: L_3 and L_4 at depths 1-2, two
    seeds, with L_4's control (depth 1 at twice the width; L_3 has none: k - 3 = 0)."""
    from tests.helpers import plan, resolve

    khop = plan(resolve("khop", "demo"))
    assert sorted((j.depth, j.seed) for j in khop) == [(d, s) for d in (1, 2, 3) for s in (0, 1)]
    assert resolve("khop", "demo").ks == (1, 2) and not any(j.control for j in khop)
    crasp = plan(resolve("crasp", "demo"))
    assert sorted(j.name for j in crasp if not j.control) == sorted(
        f"k{k}-L{d}-d64-s{s}" for k in (3, 4) for d in (1, 2) for s in (0, 1)
    )
    assert sorted(j.name for j in crasp if j.control) == ["k4-control-L1-d128-s0", "k4-control-L1-d128-s1"]
    listed = CliRunner().invoke(app, ["list", "families"]).output
    assert listed.count("--preset demo: ") == 2


def planted_sections() -> list:
    """Two sections as the atlas draws them: a law's (two figures, a long command) and a sweep's."""
    from depthprobe.probes.render.atlas import Section, accuracy_heatmap, block_chart, first_depth_chart

    rows = af.law_rows(
        FINDING, law_table(planted_accuracy(), "khop", 0.99, 2), af.first_depths(planted_accuracy(), "k", 0.99)
    )
    mean = planted_accuracy().query("not control").groupby(["depth", "k"])["accuracy"].mean().unstack("k")
    figures = [
        first_depth_chart({1: 2, 2: 3}, {0: {1: 2, 2: 3}, 1: {1: 2, 2: None}}, 3),
        accuracy_heatmap(mean.to_numpy(), list(mean.index), list(mean.columns), 0.99),
    ]
    common = {"paper": "a paper", "prediction": "p", "shows": "s", "not_shows": "n", "full_cost": "c"}
    return [
        Section(
            slug="khop",
            title="k-hop",
            rows=[{k: r[k] for k in ("level", "prediction", "measured", "seeds", "verdict")} for r in rows],
            figures=figures,
            command="probe study --family khop --preset demo --jobs 2 --out " + "x" * 400,
            full_command="probe study --family khop --preset cpu --jobs 2",
            link="khop/report.html",
            **common,
        ),
        Section(
            slug="depth-usage",
            title="usage",
            rows=[],
            figures=[block_chart([0.3, 0.05, 0.2], 0.1)],
            command="probe run",
            full_command="probe run",
            link="depth-usage/report.html",
            **common,
        ),
    ]


@pytest.mark.parametrize("size", [(1400, 900), (1280, 800)])
def test_atlas_page_fits_and_stays_offline_in_chromium(browser, tmp_path, size):  # noqa: F811
    """The page is no wider than the window (a long command wraps), every figure is drawn, and it
    makes no request and raises no error, at 1400 px and on a 1280 x 800 laptop."""
    from depthprobe.probes.render.atlas import atlas_page
    from tests.render.test_browser import Page, _write

    html = atlas_page(planted_sections())
    assert not NETWORK.findall(html)
    tab = Page(browser, _write(tmp_path, "atlas.html", html), until="true", width=size[0], height=size[1])
    try:
        width = tab.eval("document.documentElement.scrollWidth")
        images = tab.eval(
            "Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.getBoundingClientRect().right])"
        )
        assert width <= size[0], width
        assert len(images) == 3 and all(done and w > 0 and right <= size[0] for done, w, right in images), images
        assert tab.network_requests() == [] and tab.problems() == []
    finally:
        tab.close()
