"""Depth-law studies (`probe study --family khop|groups`): smoke presets end to end, the law table's
arithmetic on planted accuracies, resume, failed members, and bad options refused before any
folder is written."""

from __future__ import annotations

import json
import math
import re

import pandas as pd
import pytest
from typer.testing import CliRunner

from depthprobe.cli.main import app
from depthprobe.probes.experiments.khop import predicted_depth
from depthprobe.probes.experiments.law_config import control_width
from depthprobe.probes.experiments.laws import ROW_COLUMNS
from depthprobe.probes.experiments.runner import study as law_study
from depthprobe.probes.models.loading import load
from tests.helpers import cli_error, law_table, plan, resolve

ACCURACY_KHOP = ["member", "depth", "d_model", "seed", "control", "k", "accuracy", "accuracy_all", "step_reached",
                 "gain_last", "outcome"]  # fmt: skip
LAW_KHOP = ["d_model", "k", "predicted_depth", "measured_depth", "difference", "budget_limited", "ceil_depth",
            "linear_depth", "authors_4_heads", "authors_8_heads"]  # fmt: skip


@pytest.fixture(scope="module")
def khop_study(tmp_path_factory):
    out = tmp_path_factory.mktemp("laws") / "khop"
    lines: list[str] = []
    study = law_study("khop", "smoke", out=out, echo=lines.append)
    return study, lines


def test_khop_smoke_writes_every_table(khop_study):
    study, lines = khop_study
    out = study.folder
    for name in ("study.json", "members.csv", "accuracy.csv", "law.csv", "curves.csv", "hops.csv",
                 "hop_layers.csv", "report.html"):  # fmt: skip
        assert (out / name).is_file(), name
    members = pd.read_csv(out / "members.csv")
    assert list(members.columns) == ROW_COLUMNS
    # the 2-layer control would be L2-d16-s0 again: left out (tests/experiments/test_runner.py)
    assert list(members.member) == ["L1-d16-s0", "L2-d16-s0"]
    assert (members.status == "ok").all() and len(lines) == 2
    acc = pd.read_csv(out / "accuracy.csv")
    assert list(acc.columns) == ACCURACY_KHOP
    assert sorted(set(acc.k)) == [1, 2] and len(acc) == 2 * 2
    assert acc.accuracy.between(0, 1).all() and acc.accuracy_all.between(0, 1).all()
    law = pd.read_csv(out / "law.csv")
    assert list(law.columns) == LAW_KHOP
    assert list(law.predicted_depth) == [2, 3]  # floor(log2 k) + 2 for k = 1, 2
    assert acc.gain_last.isna().all()  # 40 steps: no evaluation 2,000 steps before the last
    assert set(acc.outcome) <= {"solved", "failed"} and law.budget_limited.isna().all()
    curves = pd.read_csv(out / "curves.csv")
    assert sorted(set(curves.step)) == [20, 40]  # every eval_every and the last step
    hops = pd.read_csv(out / "hops.csv")
    assert list(hops.columns) == ["member", "layer", "head", "hop", "attention", "chance"]
    assert len(hops[hops.member == "L2-d16-s0"]) == 2 * 2 * 2  # layers x heads x hops
    layers = pd.read_csv(out / "hop_layers.csv")
    assert list(layers[layers.member == "L2-d16-s0"].layer) == [0, 1]
    page = (out / "report.html").read_text()
    heatmap = re.search(r'<svg [^>]*class="heatmap".*?</svg>', page, re.S).group(0)  # inline, not an image
    assert 'class="predicted"' in heatmap  # the heatmap carries the predicted line
    assert "Sanford" in page and "floor(log2 k) + 2" in page


def test_member_files_and_params_counted_from_the_model(khop_study):
    study, _ = khop_study
    member = study.folder / "members" / "L2-d16-s0"
    meta = json.loads((member / "member.json").read_text())
    assert {"accuracy.csv", "curves.csv", "loss.csv", "hops.csv"} <= set(meta["files"])
    assert any(name.startswith("runs/hop-attention/") for name in meta["files"])
    assert not any(name.endswith(".html") for name in meta["files"])  # tables only, no per-member report
    model = load(str(member / "checkpoint"))
    assert meta["row"]["params"] == sum(p.numel() for p in model.bridge.original_model.parameters())


@pytest.mark.study
def test_rerun_keeps_finished_members_and_rebuilds_damaged(khop_study):
    study, _ = khop_study
    out = study.folder
    kept = (out / "members" / "L1-d16-s0" / "member.json").stat().st_mtime_ns
    (out / "members" / "L2-d16-s0" / "accuracy.csv").write_text("tampered\n")
    lines: list[str] = []
    law_study("khop", "smoke", out=out, echo=lines.append)
    assert any("L2-d16-s0: damaged" in line for line in lines)
    assert any("1 finished member(s) kept" in line for line in lines)
    assert sum(line.startswith("[") for line in lines) == 1  # only the damaged member ran again
    assert (out / "members" / "L1-d16-s0" / "member.json").stat().st_mtime_ns == kept
    assert len(pd.read_csv(out / "accuracy.csv")) == 4


def test_law_table_on_planted_accuracies():
    rows = []
    # k = 1 solved from depth 2 in both seeds; k = 2 from depth 3 only in seed 0 (seed 1 at depth 4);
    # k = 4 never; the control (2 layers) solves everything and must not count
    solved = {(1, 0): 2, (1, 1): 2, (2, 0): 3, (2, 1): 4, (4, 0): 99, (4, 1): 99}
    for seed in (0, 1):
        for depth in (1, 2, 3, 4):
            for k in (1, 2, 4):
                acc = 0.995 if depth >= solved[(k, seed)] else 0.6
                rows.append({"member": f"L{depth}-s{seed}", "depth": depth, "d_model": 64, "seed": seed,
                             "control": False, "k": k, "accuracy": acc})  # fmt: skip
        for k in (1, 2, 4):
            rows.append({"member": f"c-s{seed}", "depth": 2, "d_model": 104, "seed": seed, "control": True,
                         "k": k, "accuracy": 1.0})  # fmt: skip
    law = law_table(pd.DataFrame(rows), "khop", 0.99, seeds=2)
    assert list(law.k) == [1, 2, 4] and set(law.d_model) == {64}
    assert list(law.predicted_depth) == [2, 3, 4]
    assert law.measured_depth.tolist()[:2] == [2, 4] and pd.isna(law.measured_depth.iloc[2])
    assert law.difference.tolist()[:2] == [0, 1] and pd.isna(law.difference.iloc[2])
    # a seed missing at a depth: that depth does not count
    one_seed = law_table(pd.DataFrame(rows[:1]), "khop", 0.99, seeds=2)
    assert pd.isna(one_seed.measured_depth.iloc[0])
    assert [predicted_depth(k) for k in (1, 2, 3, 4, 8, 16)] == [
        2,
        3,
        3,
        4,
        5,
        6,
    ]  # floor(log2 k) + 2 (Sanford et al.'s construction)


def test_groups_law_table_and_prediction_shape():
    rows = [{"member": f"{g}-L{d}", "group": g, "depth": d, "d_model": 64, "seed": 0, "control": False, "T": t,
             "accuracy": 1.0 if d >= need else 0.3}
            for g, needs in (("s3", {4: 1, 16: 1}), ("a5", {4: 2, 16: 4})) for t, need in needs.items()
            for d in (1, 2, 3, 4)]  # fmt: skip
    law = law_table(pd.DataFrame(rows), "groups", 0.99, seeds=1)
    got = {(r.group, r.T): (r.measured_depth, r.predicted_shape, r.solvable) for r in law.itertuples()}
    assert got[("s3", 4)] == (1, "constant in T", True) and got[("s3", 16)][0] == 1
    assert got[("a5", 4)] == (2, "grows like log T", False) and got[("a5", 16)][0] == 4


@pytest.mark.study
def test_groups_smoke_end_to_end(tmp_path):
    out = tmp_path / "groups"
    result = CliRunner().invoke(app, ["study", "--family", "groups", "--groups", "z2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    acc = pd.read_csv(out / "accuracy.csv")
    assert list(acc.columns) == ["member", "group", "depth", "d_model", "seed", "control", "T", "accuracy",
                                 "accuracy_last", "step_reached"]  # fmt: skip
    assert sorted(set(acc["T"])) == [4, 8] and set(acc.group) == {"z2"}
    law = pd.read_csv(out / "law.csv")
    assert list(law.columns) == ["d_model", "group", "solvable", "T", "log2_T", "measured_depth", "predicted_shape"]
    assert not (out / "hops.csv").exists()
    assert f"wrote {out}" in result.output


@pytest.mark.study
def test_failed_member_is_recorded_with_exit_3(tmp_path):
    out = tmp_path / "diverge"
    result = CliRunner().invoke(app, ["study", "--family", "khop", "--depths", "1", "--lr", "1e12", "--steps", "20",
                                      "--out", str(out)])  # fmt: skip
    assert result.exit_code == 3, result.output
    members = pd.read_csv(out / "members.csv")
    assert (members.status == "failed").all()
    assert members.error.str.contains("diverged").all()
    assert (out / "report.html").is_file()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--corpus", "x.txt"], "--corpus applies to the levine, petty, spa families, not khop"),
        (["--budgets", "5k"], "--budgets applies to the levine, petty families, not khop"),
        (["--groups", "s3"], "--groups applies to the groups family, not khop"),
        (["--ks", "1,x"], "--ks: cannot read '1,x'"),
        (["--ks", "0,1"], "--ks must be distinct hop counts"),
        (["--letters", "1"], "--letters must be at least 2"),
        (["--d-model", "31"], "multiples of the 2 heads"),
        (["--lr", "1e-3,2e-3"], "--lr: cannot read '1e-3,2e-3' as float"),
        (["--preset", "cpux"], "unknown --preset 'cpux'"),
    ],
)
def test_bad_khop_options_refused_before_any_folder(tmp_path, args, fragment):
    out = tmp_path / "never"
    cli_error(["study", "--family", "khop", "--out", out, *args], fragment)
    assert not out.exists()


def test_bad_groups_and_text_family_options_refused(tmp_path):
    out = tmp_path / "never"
    cli_error(["study", "--family", "groups", "--groups", "a6", "--out", out], "a6", "a5")
    cli_error(["study", "--family", "groups", "--ks", "1", "--out", out], "--ks applies to the crasp, khop families")
    cli_error(
        ["study", "--family", "petty", "--steps", "10", "--out", out],
        "--steps applies to the crasp, groups, khop families",
    )
    assert not out.exists()


def test_plan_and_control_width():
    cfg = resolve("khop", "cpu")
    jobs = plan(cfg)
    assert len(jobs) == 2 * (5 + 1) and [j.name for j in jobs[:6]][-1] == "control-L2-d104-s0"
    wide = control_width(cfg, cfg.vocab, 1 + cfg.length)
    deepest, control = jobs[4].native(), jobs[5].native()
    assert control.layers == 2 and control.d_model == wide
    assert control.n_params() >= deepest.n_params()
    narrower = type(control)(**{**control.__dict__, "d_model": wide - cfg.heads})
    assert narrower.n_params() < deepest.n_params()  # the smallest such width
    assert math.isclose(cfg.lr_at(cfg.steps - 1), 0.0, abs_tol=1e-5) and cfg.lr_at(cfg.warmup - 1) == cfg.lr


def test_predicted_line_sits_on_the_predicted_rows():
    import numpy as np

    from depthprobe.probes.render.charts import heatmap_svg
    from depthprobe.probes.render.laws import CELL_H, CELL_W, LEFT, TOP, predicted_line

    depths, ks = [1, 2, 3, 4, 5], [1, 2, 3, 4]
    svg = predicted_line(heatmap_svg(np.full((5, 4), 0.5), depths, ks), depths, [2, 3, 4, 4])
    cells = re.findall(r"<rect x=\"(\d+)\" y=\"(\d+)\" width=\"(\d+)\" height=\"(\d+)\"", svg)  # the cells
    assert (int(cells[0][0]), int(cells[0][1]), int(cells[0][2]), int(cells[0][3])) == (LEFT, TOP, CELL_W, CELL_H)
    path = re.search(r'class="predicted" d="([^"]+)"', svg).group(1)
    ys = [float(p.split(",")[1]) for p in re.findall(r"[\d.]+,[\d.]+", path)]
    assert ys == [TOP + r * CELL_H for r in (1, 1, 2, 2, 3, 3, 3, 3)]  # top edge of depths 2, 3, 4, 4
    beyond = predicted_line(heatmap_svg(np.full((2, 1), 0.5), [1, 2], [8]), [1, 2], [5])
    assert f",{TOP + 2 * CELL_H}" in beyond  # deeper than every row: the bottom edge
    wide = heatmap_svg(np.full((2, 3), 0.5), [1, 2], [16, 32, 64], title="t", min_width=600)
    left, top, cw, ch = (float(v) for v in re.search(r'data-grid="([^"]+)"', wide).group(1).split())
    assert cw > CELL_W and top > TOP  # widened to 600 px, below the title: the line follows the grid it is drawn on
    gap = re.search(r'class="predicted" d="([^"]+)"', predicted_line(wide, [1, 2], [None, 2, 2])).group(1)
    xs = [left + cw, left + 2 * cw, left + 2 * cw, left + 3 * cw]  # no segment over the first column
    assert gap == "M" + " L".join(f"{x:g},{top + ch:g}" for x in xs)


@pytest.mark.study
@pytest.mark.slow
def test_jobs_2_equals_jobs_1(tmp_path):
    one = law_study("khop", "smoke", out=tmp_path / "one", echo=lambda _: None)
    two = law_study("khop", "smoke", out=tmp_path / "two", jobs=2, echo=lambda _: None)
    for name in ("accuracy.csv", "curves.csv", "hops.csv", "law.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(one.folder / name), pd.read_csv(two.folder / name))
