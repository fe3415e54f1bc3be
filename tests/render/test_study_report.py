"""The study report (report.html of a probe study folder), on hand-built study folders with known
numbers and real probe run folders of tiny native models."""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from depthprobe.probes import ProbeError
from depthprobe.probes.experiments.report import render_folder as render_study
from depthprobe.probes.render.study_data import StudyData, levine_differences

COLUMNS = (
    "family member variant depth d_model d_ff n_heads d_head budget params_nonembed params_embed tokens flops "
    "seed lr val_loss val_bpb induction_best induction_chance kernel_cos_last kernel_cos_last_init entropy_mean "
    "icl_score tokens_per_s wall_s device status error"
).split()


def write_study(folder: Path, family: str, rows: list[dict], config: dict | None = None, preset="smoke") -> Path:
    """A study folder as probe study writes it: study.json and study.csv (every column)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "study.json").write_text(json.dumps({"family": family, "preset": preset, "config": config or {}}))
    base = {c: None for c in COLUMNS}
    table = pd.DataFrame([{**base, "family": family, "status": "ok", "device": "cpu", **r} for r in rows])
    table[COLUMNS].to_csv(folder / "members.csv", index=False)
    return folder


def read_study(folder: Path) -> StudyData:
    meta = json.loads((folder / "study.json").read_text())
    return StudyData(folder, meta["family"], meta["preset"], meta["config"], pd.read_csv(folder / "members.csv"))


def charts(html: str) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """chart title -> series label -> its polyline's points (inline SVG of the page)."""
    out = {}
    for title, body in re.findall(r"<svg class='chart'[^>]*aria-label='([^']*)'[^>]*>(.*?)</svg>", html, re.S):
        series = {}
        for label, inner in re.findall(r"<g class='series' data-label='([^']*)'>(.*?)</g>", body, re.S):
            pts = re.search(r"points='([^']*)'", inner).group(1).split()
            series[label] = [tuple(float(v) for v in p.split(",")) for p in pts]
        out[title] = series
    return out


def series_body(html: str, title: str, label: str) -> str:
    chart = re.search(rf"<svg class='chart'[^>]*aria-label='{re.escape(title)}'[^>]*>(.*?)</svg>", html, re.S)
    return re.search(rf"<g class='series' data-label='{re.escape(label)}'>(.*?)</g>", chart.group(1), re.S).group(1)


def table_rows(fragment: str) -> list[list[str]]:
    return [re.findall(r"<td>(.*?)</td>", tr) for tr in re.findall(r"<tr>(.*?)</tr>", fragment, re.S)[1:]]


def assert_offline(html: str) -> None:
    assert "http://" not in html and "https://" not in html
    assert "<script" not in html
    assert all(
        src.startswith("data:") for src in re.findall(r"src='([^']*)'", html) + re.findall(r'src="([^"]*)"', html)
    )


def embedded_svgs(html: str) -> list[str]:
    return [base64.b64decode(d).decode() for d in re.findall(r"data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)", html)]


# ---------------------------------------------------------------- real probe runs of tiny models


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory):
    """Run folders of kernels and induction on native models of depth 1 and 2 (keyed by depth)."""
    from depthprobe.probes import run

    root = tmp_path_factory.mktemp("runs")
    out = {}
    for n in (1, 2):
        spec = f"native:layers={n},d_model=16,heads=2"
        out[n] = {
            "kernels": run(spec, "kernels", device="cpu", n_random=2, seq_len=8).save(root / f"k{n}"),
            "induction": run(spec, "induction", device="cpu", n_seqs=4, repeat_len=4, icl_windows=0).save(
                root / f"i{n}"
            ),
        }
    return out


def add_runs(folder: Path, member: str, runs: dict[str, Path]) -> None:
    for task, src in runs.items():
        shutil.copytree(src, folder / "members" / member / "runs" / task)


def add_attention_stats(folder: Path, member: str, n_layers: int, entropy: list[list[float]]) -> None:
    """An attention-stats run folder (manifest.json, scores.csv) with known per-head entropies."""
    path = folder / "members" / member / "runs" / "attention-stats"
    path.mkdir(parents=True)
    model = f"study-{member}"
    info = {"name": model, "source": "native", "n_layers": n_layers, "n_heads": 2, "d_model": 16}
    (path / "manifest.json").write_text(json.dumps({"config": {"task": "attention-stats"}, "model": info}))
    rows = [
        {"model": model, "task": "attention-stats", "layer": lyr, "head": h, "metric": "entropy", "value": v}
        for lyr, heads in enumerate(entropy)
        for h, v in enumerate(heads)
    ]
    pd.DataFrame(rows).to_csv(path / "scores.csv", index=False)


# ---------------------------------------------------------------- levine


def levine_loss(depth: int, budget: int, seed: int) -> float:
    """Known validation losses: deeper is better by more at larger budgets; seeds differ a little."""
    k = {50_000: 0, 200_000: 1, 800_000: 2}[budget]
    return round(4.0 - 0.3 * k - 0.04 * k * np.log2(depth) + 0.013 * seed + 0.002 * depth * seed, 6)


@pytest.fixture
def levine(tmp_path, real_runs):
    rows = []
    for budget in (50_000, 200_000, 800_000):
        for depth in (2, 4, 8):
            for seed in (0, 1):
                member = f"levine-b{budget // 1000:03d}k-L{depth}-s{seed}"
                row = {
                    "member": member,
                    "depth": depth,
                    "d_model": 64,
                    "d_ff": 256,
                    "budget": budget,
                    "params_nonembed": budget + 37,
                    "params_embed": 70_000,
                    "tokens": 1_000_000,
                    "flops": 1.2345e12,
                    "seed": seed,
                    "lr": 0.003,
                    "val_loss": levine_loss(depth, budget, seed),
                    "kernel_cos_last": 0.5 + 0.01 * depth,
                    "kernel_cos_last_init": 0.9,
                }
                if depth == 8 and budget == 800_000:  # both seeds of this configuration fail
                    row.update(status="failed", error="CUDA out of memory <b>; use --device cpu", val_loss=99.0)
                rows.append(row)
    folder = write_study(tmp_path / "levine", "levine", rows, {"pairs": [[2, 4], [4, 8]], "corpus": "shakes.txt"})
    add_runs(folder, "levine-b050k-L2-s0", real_runs[1])
    add_runs(folder, "levine-b050k-L4-s0", real_runs[2])
    add_runs(folder, "levine-b050k-L2-s1", real_runs[2])  # a second seed: not drawn
    add_runs(folder, "levine-b800k-L8-s0", real_runs[2])  # a failed member: not drawn
    add_attention_stats(folder, "levine-b050k-L2-s0", 2, [[1.0, 2.0], [0.5, 3.0]])
    add_attention_stats(folder, "levine-b050k-L4-s0", 4, [[1.0, 1.5], [2.0, 2.5], [0.3, 3.0], [1.0, 1.0]])
    return folder


def test_levine_differences_are_the_known_ones(levine):
    d = levine_differences(read_study(levine)).set_index(["shallow", "deep", "budget"])
    assert len(d) == 3 + 2  # (4, 8) has no 800K: both seeds of L=8 failed
    for (a, b, budget), row in d.iterrows():
        per = {s: levine_loss(b, int(budget), s) - levine_loss(a, int(budget), s) for s in (0, 1)}
        assert row["per_seed"] == pytest.approx(per)
        assert row["mean"] == pytest.approx(np.mean(list(per.values())))
        assert (row["lo"], row["hi"], row["n"]) == (
            pytest.approx(min(per.values())),
            pytest.approx(max(per.values())),
            2,
        )


@pytest.mark.study
def test_levine_page(levine):
    html = render_study(levine)
    assert_offline(html)
    assert "family levine" in html and "preset smoke" in html and "corpus shakes.txt" in html
    assert "members 16 ok, 2 failed" in html and "device cpu" in html
    c = charts(html)
    # loss vs budget: a line per depth, a point per budget where the depth finished
    lines = c["validation loss vs budget"]
    assert {k: len(v) for k, v in lines.items()} == {"L=2": 3, "L=4": 3, "L=8": 2}
    # x is log budget: the three budgets are equally spaced (factor 4 apart)
    xs = [x for x, _ in lines["L=2"]]
    assert xs[1] - xs[0] == pytest.approx(xs[2] - xs[1], abs=0.15)
    diff_chart = c["deep minus shallow validation loss"]
    assert {k: len(v) for k, v in diff_chart.items()} == {"L=2 vs L=4": 3, "L=4 vs L=8": 2}
    assert "class='zero'" in html
    assert (
        len(re.findall(r"class='spread'", series_body(html, "deep minus shallow validation loss", "L=2 vs L=4"))) == 3
    )
    # the numbers shown are the known differences
    rows = table_rows(html.split("<div class='differences'>")[1].split("</div>")[0])
    shown = {(r[0], r[1]): r for r in rows}
    for (a, b), budgets in (((2, 4), (50_000, 200_000, 800_000)), ((4, 8), (50_000, 200_000))):
        for budget in budgets:
            per = [levine_loss(b, budget, s) - levine_loss(a, budget, s) for s in (0, 1)]
            r = shown[(f"({a}, {b})", f"{budget // 1000}K")]
            assert r[2:6] == [f"{np.mean(per):+.4f}", f"{min(per):+.4f}", f"{max(per):+.4f}", "2"]
    assert "crossover budget grows with the pair&#x27;s depth" in html
    assert "does not test the expectation" in html
    # deep minus shallow at 50K is 0 for seed 0: not every seed below zero there
    assert "pair (2, 4): every seed below zero from 200K up" in html
    # failed members: in the table and the list with their (escaped) error, in no plot
    assert html.count("CUDA out of memory &lt;b&gt;; use --device cpu") == 4
    assert "levine-b800k-L8-s0" in html.split("<h2>Members</h2>")[1].split("</table>")[0]
    assert "y=99" not in "".join(re.findall(r"<svg class='chart'.*?</svg>", html, re.S))


def test_levine_probe_curves_across_depth(levine):
    html = render_study(levine)
    section = html.split("Per-layer probe curves across depth")[1]
    for task in ("induction", "kernels", "attention-stats"):
        assert f"<h3>{task}</h3>" in section
    svgs = embedded_svgs(section)
    assert len(svgs) == 2 + 1 + 1  # induction and previous_token, mean_cosine, entropy
    for svg in svgs:
        assert "levine-b050k-L2-s0" in svg and "levine-b050k-L4-s0" in svg
        assert "levine-b050k-L2-s1" not in svg and "levine-b800k-L8-s0" not in svg
    # the drawn peaks come from the runs' own scores (attention-stats: smallest head entropy per layer)
    peak_rows = {tuple(r[:2]): r for r in table_rows(section.split("<h3>attention-stats</h3>")[1])}
    assert peak_rows[("entropy", "levine-b050k-L2-s0")][2:5] == ["1", "0.7500", "0.5000"]
    assert peak_rows[("entropy", "levine-b050k-L4-s0")][2:5] == ["2", "0.6250", "0.3000"]
    # kernel collapse at init vs trained, per member
    kc = charts(html)["last-layer kernel cosine vs depth"]
    assert len(kc["budget 50K, trained"]) == 3 and len(kc["budget 800K, init"]) == 2
    assert "<td>levine-b050k-L4-s0</td><td>4</td><td>0.9000</td><td>0.5400</td><td>-0.3600</td>" in html


def test_member_table_formats_numbers(levine):
    html = render_study(levine)
    table = html.split("<h2>Members</h2>")[1].split("</table>")[0]
    header = re.findall(r"<th>(.*?)</th>", table)
    assert {"variant", "n_heads", "d_head", "val_bpb", "icl_score"}.isdisjoint(header)  # empty in every row
    assert header[:2] == ["family", "member"] and header[-2:] == ["status", "error"]
    row = next(r for r in table_rows(table) if r[1] == "levine-b200k-L4-s1")
    cell = dict(zip(header, row, strict=True))
    assert cell["params_nonembed"] == "200,037" and cell["flops"] == "1.23e+12" and cell["seed"] == "1"
    assert cell["val_loss"] == f"{levine_loss(4, 200_000, 1):.4f}" and cell["status"] == "ok" and cell["error"] == ""


@pytest.fixture
def petty(tmp_path):
    d_ff = {1: 768, 2: 352, 4: 160, 8: 48}
    rows = [
        {
            "member": f"petty-L{depth}-s{seed}",
            "variant": "d_ff",
            "depth": depth,
            "d_model": 64,
            "d_ff": d_ff[depth],
            "budget": 200_000,
            "seed": seed,
            "val_loss": 3.0 - 0.1 * min(depth, 4) + 0.05 * seed,
        }
        for depth in (1, 2, 4, 8)
        for seed in (0, 1)
    ]
    rows.append({"member": "petty-L6-s0", "variant": "d_ff", "depth": 6, "status": "failed", "error": "diverged"})
    return write_study(tmp_path / "petty", "petty", rows, {"shrink": "d_ff"})


def test_petty_page(petty):
    html = render_study(petty)
    assert_offline(html)
    c = charts(html)
    loss = c["validation loss vs depth"]["budget 200K, shrink d_ff"]
    assert len(loss) == 4  # depth 6 failed: not drawn
    body = series_body(html, "validation loss vs depth", "budget 200K, shrink d_ff")
    tips = re.findall(r"<title>(.*?)</title>", body)
    assert tips[1] == "budget 200K, shrink d_ff: x=2, y=2.825 (seeds 2.8 to 2.85)"
    assert len(re.findall("class='spread'", body)) == 4
    widths = c["d_ff vs depth"]
    assert len(widths["d_ff, budget 200K, shrink d_ff"]) == 4 and len(widths["d_model, budget 200K, shrink d_ff"]) == 4
    marks = re.findall(
        r"class='mark'[^>]*>([^<]*)<", series_body(html, "d_ff vs depth", "d_ff, budget 200K, shrink d_ff")
    )
    assert marks == ["d_ff &lt; d_model"]
    assert "d_ff below d_model at: L=8 (budget 200K, shrink d_ff)" in html
    assert "<b>petty-L6-s0</b>: diverged" in html
    assert "no probe runs under members/*/runs" in html


def test_family_of_only_failed_members_shows_a_note(tmp_path):
    rows = [{"member": f"petty-L{d}-s0", "depth": d, "status": "failed", "error": f"boom {d}"} for d in (1, 2)]
    html = render_study(write_study(tmp_path / "p", "petty", rows))
    assert "no member of this petty study finished (2 failed); there is nothing to plot" in html
    assert "<svg" not in html and "<img" not in html
    assert "<b>petty-L1-s0</b>: boom 1" in html and "members 0 ok, 2 failed" in html


# ---------------------------------------------------------------- spa


@pytest.fixture
def spa(tmp_path):
    rows = []
    for variant in ("standard", "vanilla", "e-spa"):
        for depth in (8, 16):
            member = f"spa-{variant}-L{depth}-s0"
            rows.append({"member": member, "variant": variant, "depth": depth, "d_model": 32, "seed": 0,
                         "val_loss": 3.0 + depth / 100 + (0.5 if variant == "vanilla" else 0)})  # fmt: skip
            steps = np.arange(0, 100, 10)
            loss = 7.0 - steps / {"standard": 40, "vanilla": 200, "e-spa": 50}[variant]
            if (variant, depth) == ("vanilla", 16):
                loss[5:] = np.nan  # diverged
            val = ["" if s % 50 else 7.0 for s in steps]
            folder = tmp_path / "spa" / "members" / member
            folder.mkdir(parents=True)
            pd.DataFrame({"step": steps, "loss": loss, "val_loss": val, "lr": 1e-3, "tokens": steps * 64,
                          "elapsed_s": steps / 10}).to_csv(folder / "loss.csv", index=False)  # fmt: skip
    rows.append({"member": "spa-u-spa-L16-s0", "variant": "u-spa", "depth": 16, "status": "failed", "error": "x"})
    return write_study(tmp_path / "spa", "spa", rows)


def test_spa_page(spa):
    html = render_study(spa)
    assert_offline(html)
    c = charts(html)
    for depth in (8, 16):
        curves = c[f"training loss, depth {depth}"]
        assert set(curves) == {"standard", "vanilla", "e-spa"}  # u-spa failed
        assert len(curves["standard"]) == 10
    assert len(c["training loss, depth 16"]["vanilla"]) == 5
    last = {v: c["training loss, depth 8"][v][-1][1] for v in ("standard", "e-spa", "vanilla")}
    assert last["standard"] > last["e-spa"] > last["vanilla"]  # lower loss, lower on the page (larger SVG y)
    assert "spa-vanilla-L16-s0: loss not finite from step 50 (5 steps left out)" in html
    assert "Kernel collapse" not in html  # no kernel_cos_last values in this study
    final = c["validation loss vs depth"]
    assert {k: len(v) for k, v in final.items()} == {"standard": 2, "vanilla": 2, "e-spa": 2}
    # vanilla is 0.5 worse at both depths: its points sit higher (smaller SVG y) by the same amount
    dy = [v[1] - s[1] for v, s in zip(final["vanilla"], final["standard"], strict=True)]
    assert dy[0] < 0 and dy[0] == pytest.approx(dy[1], abs=0.11)


# ---------------------------------------------------------------- bad folders


def test_bad_folders_fail_in_one_line(tmp_path):
    with pytest.raises(ProbeError, match=r"has no readable study.json; pass a study folder written by probe study"):
        render_study(tmp_path)
    write_study(tmp_path / "a", "levin", [{"member": "m", "depth": 1}])
    with pytest.raises(ProbeError, match=r"unknown study family 'levin'.*did you mean 'levine'"):
        render_study(tmp_path / "a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "members.csv").write_text("member,depth\nm,1\n")
    with pytest.raises(ProbeError, match=r"has no readable study\.json"):
        render_study(tmp_path / "b")
