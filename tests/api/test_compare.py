"""probe compare: run folders of one task on one relative-depth axis (hand-built runs with known
answers, real runs of tiny models, and the CLI's one-line errors)."""

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from depthprobe.cli.main import app
from depthprobe.probes import ProbeError, compare
from depthprobe.probes.api.compare import peaks, save
from depthprobe.probes.render.html import esc
from tests.helpers import cli_error, one_line_error

runner = CliRunner()


def write_run(path, task, model, n_layers, d_model, rows, n_heads=2, summary=None, files=None):
    """A run folder as probe run writes it: manifest.json, scores.csv, summary.json (+ files)."""
    path.mkdir(parents=True)
    (path / "manifest.json").write_text(
        json.dumps(
            {
                "tool": "depthprobe",
                "config": {"task": task, "model": model},
                "model": {
                    "name": model,
                    "source": "native",
                    "n_layers": n_layers,
                    "n_heads": n_heads,
                    "d_model": d_model,
                },
            }
        )
    )
    df = pd.DataFrame(rows)
    df.insert(0, "model", model)
    df.insert(1, "task", task)
    df.to_csv(path / "scores.csv", index=False)
    (path / "summary.json").write_text(json.dumps({"task": task, "model": model, "summary": summary or []}))
    for name, text in (files or {}).items():
        (path / name).write_text(text)
    return path


def head_rows(metric, grid):
    """grid[layer][head] -> tidy rows."""
    return [
        {"layer": layer_idx, "head": h, "metric": metric, "value": v}
        for layer_idx, row in enumerate(grid)
        for h, v in enumerate(row)
    ]


@pytest.fixture
def two_depths(tmp_path):
    """A: 2 layers x 2 heads; B: 4 layers x 2 heads (attention-stats-like metrics)."""
    a = write_run(
        tmp_path / "a",
        "attention-stats",
        "model-a",
        2,
        8,
        head_rows("to_sep", [[0.1, 0.3], [0.7, 0.5]]) + head_rows("entropy", [[2.0, 1.0], [0.5, 3.0]]),
    )
    b = write_run(
        tmp_path / "b",
        "attention-stats",
        "model-b",
        4,
        16,
        head_rows("to_sep", [[0.2, 0.0], [0.1, 0.9], [0.4, 0.4], [0.1, 0.05]])
        + head_rows("entropy", [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0], [4.0, 4.0]]),
    )
    return a, b


def test_relative_depth_best_head_and_mean(two_depths):
    t = compare(two_depths)
    assert set(t.label) == {"model-a (L=2, d=8)", "model-b (L=4, d=16)"}
    a = t[(t.model == "model-a") & (t.metric == "to_sep")].set_index("layer")
    assert list(a.relative_depth) == [0.25, 0.75]
    assert list(a.best_value) == [0.3, 0.7] and list(a.best_head) == [1, 0]
    assert a.head_mean.tolist() == pytest.approx([0.2, 0.6])
    b = t[(t.model == "model-b") & (t.metric == "to_sep")].set_index("layer")
    assert list(b.relative_depth) == [0.125, 0.375, 0.625, 0.875]
    assert list(b.best_value) == [0.2, 0.9, 0.4, 0.1]
    assert b.best_head.tolist() == [0, 1, 0, 0]  # layer 2: a tie goes to the lowest head
    assert (t.n_layers.where(t.model == "model-b", 4) == 4).all() and set(t.d_model) == {8, 16}
    assert t.baseline.isna().all() and t.margin.isna().all()  # attention-stats has no baseline


def test_peaks_and_which_way_is_better(two_depths):
    p = peaks(compare(two_depths)).set_index(["label", "metric"])
    a = p.loc[("model-a (L=2, d=8)", "to_sep")]
    assert (a.peak_layer, a.peak_relative_depth, a.peak_value) == (1, 0.75, 0.7)
    assert a.layer_mean == pytest.approx(0.5) and a.sharpness == pytest.approx(0.2)
    b = p.loc[("model-b (L=4, d=16)", "to_sep")]
    assert (b.peak_layer, b.peak_relative_depth, b.peak_head) == (1, 0.375, 1)
    assert b.layer_mean == pytest.approx(0.4) and b.sharpness == pytest.approx(0.5)
    # entropy: smaller is better, both for the best head and for the peak layer
    e = p.loc[("model-a (L=2, d=8)", "entropy")]
    assert e.better == "lower" and (e.peak_layer, e.peak_value, e.peak_head) == (1, 0.5, 0)
    assert e.layer_mean == pytest.approx(0.75) and e.sharpness == pytest.approx(0.25)
    eb = p.loc[("model-b (L=4, d=16)", "entropy")]
    assert (eb.peak_layer, eb.peak_relative_depth, eb.peak_value) == (0, 0.125, 1.0)


def test_metric_filter_and_unknown_metric(two_depths):
    t = compare(two_depths, metrics=["to_sep"])
    assert set(t.metric) == {"to_sep"}
    with pytest.raises(ProbeError, match=r"unknown metric 'to_sp' \(did you mean 'to_sep'"):
        compare(two_depths, metrics=["to_sp"])


def test_residual_positions_sit_between_blocks(tmp_path):
    """Kernels rows are hooks resid_pre/resid_post: embeddings at 0, the last block's output at 1."""
    rows = [
        {"layer": layer_idx, "metric": "mean_cosine", "value": v, "hook": h, "theory": float("nan")}
        for layer_idx, (v, h) in enumerate(
            [(0.0, "blocks.0.hook_resid_pre"), (0.5, "blocks.0.hook_resid_post"), (0.9, "blocks.1.hook_resid_post")]
        )
    ]
    run = write_run(tmp_path / "k", "kernels", "spa:variant=vanilla,depth=2,width=8", 2, 8, rows)
    t = compare([run])
    assert t.relative_depth.tolist() == [0.0, 0.5, 1.0]
    assert t.best_value.tolist() == [0.0, 0.5, 0.9] and t.best_head.isna().all() and (t.heads == 0).all()
    assert t.label.iloc[0] == "spa:variant=vanilla (L=2, d=8)"
    p = peaks(t).iloc[0]
    assert (p.peak_layer, p.peak_relative_depth, p.first_value, p.last_value) == (2, 1.0, 0.0, 0.9)


def test_syntax_selectors_baseline_and_margin(tmp_path):
    rows = []
    for rel, grid in (("det", [[0.6, 0.8]]), ("nsubj", [[0.4, 0.2]])):
        for d in ("dependent->head", "head->dependent"):
            rows += [
                {**r, "relation": rel, "direction": d, "count": 10}
                for r in head_rows("accuracy", [[v / (2 if d[0] == "h" else 1) for v in grid[0]]])
            ]
    offsets = [-3, -2, -1, 0, 1, 2]
    base = {"det": [0.1, 0.2, 0.5, 0.0, 0.5, 0.3], "nsubj": [0.1, 0.1, 0.1, 0.1, 0.1, 0.25]}
    csv = "relation,offset,count,accuracy\n" + "".join(
        f"{rel},{o},10,{a}\n" for rel, accs in base.items() for o, a in zip(offsets, accs, strict=True)
    )
    run = write_run(tmp_path / "s", "syntax", "m", 1, 8, rows, files={"baselines.csv": csv})
    t = compare([run]).set_index("metric")
    assert {
        "accuracy/det/dependent->head",
        "accuracy/det/head->dependent",
        "accuracy/nsubj/dependent->head",
        "accuracy/nsubj/head->dependent",
    } == set(t.index)
    det = t.loc["accuracy/det/dependent->head"]
    # offsets -1 and +1 tie at 0.5: nearest 0, then the leftward one
    assert (det.relation, det.direction, det.better) == ("det", "dependent->head", "higher")
    assert (det.best_value, det.baseline, det.baseline_name) == (0.8, 0.5, "offset -1")
    assert det.margin == pytest.approx(0.3)
    nsubj = t.loc["accuracy/nsubj/head->dependent"]
    assert (nsubj.baseline, nsubj.baseline_name) == (0.25, "offset +2") and nsubj.margin == pytest.approx(-0.05)
    assert "count" not in t.columns
    assert len(compare([run], metrics=["accuracy/det"])) == 2


def test_coref_margin_over_the_strongest_baseline(tmp_path):
    rows = [
        {**r, "type": ty, "n": 5, "clark_head": f"1-{r['head'] + 1}"}
        for ty, g in (("all", [[0.4, 0.8]]), ("pronoun", [[0.9, 0.1]]))
        for r in head_rows("accuracy", g)
    ]
    summary = [
        {"method": "mentions evaluated", "all": 10, "pronoun": 5},
        {"method": "best head", "all": 80.0, "pronoun": 90.0},
        {"method": "nearest", "all": 27.0, "pronoun": 95.0},
        {"method": "head match", "all": 52.0, "pronoun": 47.0},
        {"method": "rule-based", "all": 69.0, "pronoun": 70.0},
    ]
    run = write_run(tmp_path / "c", "coref", "m", 1, 8, rows, summary=summary)
    t = compare([run]).set_index("metric")
    assert set(t.index) == {"accuracy/all", "accuracy/pronoun"}  # clark_head follows the head: no selector
    assert (t.loc["accuracy/all", "baseline_name"], t.loc["accuracy/all", "baseline"]) == ("rule-based", 0.69)
    assert t.loc["accuracy/all", "margin"] == pytest.approx(0.11)
    assert t.loc["accuracy/pronoun", "baseline_name"] == "nearest"
    assert t.loc["accuracy/pronoun", "margin"] == pytest.approx(-0.05)


def test_study_folder_means_its_members(two_depths, tmp_path):
    a, b = two_depths
    study = tmp_path / "study"
    for name, src in (("L2", a), ("L4", b)):
        dst = study / "members" / name / "runs" / "attention-stats"
        dst.parent.mkdir(parents=True)
        src.rename(dst)
    (study / "members" / "L2" / "checkpoint").mkdir()  # no run here
    write_run(
        study / "members" / "L4" / ".x.partial",
        "kernels",
        "half-written",
        4,
        16,
        [{"layer": 0, "metric": "mean_cosine", "value": 0.0}],
    )  # hidden: skipped
    (study / "members.csv").write_text("member\nL2\nL4\n")
    t = compare(study)
    assert set(t.model) == {"model-a", "model-b"}
    write_run(
        study / "members" / "L4" / "runs" / "kernels",
        "kernels",
        "model-b",
        4,
        16,
        [{"layer": 0, "metric": "mean_cosine", "value": 0.0}],
    )
    with pytest.raises(ProbeError, match=r"runs of different tasks: attention-stats \(2 runs\), kernels \(1 run\)"):
        compare(study)
    assert set(compare(study, task="kernels").model) == {"model-b"}


def test_save_writes_csvs_and_an_escaped_report(two_depths, tmp_path):
    a, _ = two_depths
    evil = write_run(
        tmp_path / "evil",
        "attention-stats",
        "<img src=x onerror=alert(1)>&m",
        3,
        8,
        head_rows("to_sep", [[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]]),
    )
    t = compare([a, evil])
    out = save(t, tmp_path / "cmp")
    assert sorted(p.name for p in out.iterdir()) == ["compare.csv", "compare.json", "peaks.csv", "report.html"]
    back = pd.read_csv(out / "compare.csv")
    assert len(back) == len(t) == 2 * 2 + 3 * 1  # (model, layer, metric) rows
    html = (out / "report.html").read_text()
    assert "<img src=x" not in html and esc("<img src=x onerror=alert(1)>&m (L=3, d=8)") in html
    assert esc("model-a (L=2, d=8)") in html and html.count("data:image/svg+xml") == 2  # one plot per metric
    assert "http://" not in html.replace("http://www.w3.org", "") and "https://" not in html
    with pytest.raises(ProbeError, match="already exists"):
        save(t, out)


def test_duplicate_models_are_told_apart_by_run_folder(two_depths, tmp_path):
    a, _ = two_depths
    again = tmp_path / "a-again"
    again.mkdir()
    for f in a.iterdir():
        (again / f.name).write_bytes(f.read_bytes())
    assert set(compare([a, again]).label) == {"model-a (L=2, d=8) [a]", "model-a (L=2, d=8) [a-again]"}


def test_bad_manifest_fails_clearly(tmp_path):
    run = write_run(tmp_path / "r", "induction", "m", 2, 8, head_rows("induction", [[0.1], [0.2]]))
    m = json.loads((run / "manifest.json").read_text())
    del m["model"]["d_model"]
    (run / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ProbeError, match="has no model d_model"):
        compare([run])


# ---------------------------------------------------------------- real runs of tiny models


def test_real_runs_of_two_depths(tmp_path):
    """Induction on native models of depth 1 and 3: relative depths and peaks from their scores.csv."""
    from depthprobe.probes import run

    dirs = [
        run(f"native:layers={n},d_model=16,heads=2", "induction", limit=4, device="cpu").save(tmp_path / f"L{n}")
        for n in (1, 3)
    ]
    t = compare(dirs, metrics=["induction", "previous_token"])
    p = peaks(t).set_index(["n_layers", "metric"])
    for d, n in zip(dirs, (1, 3), strict=True):
        rows = t[t.n_layers == n]
        assert sorted(set(rows.relative_depth)) == pytest.approx([(k + 0.5) / n for k in range(n)])
        scores = pd.read_csv(d / "scores.csv")
        for metric in ("induction", "previous_token"):
            per_layer = {}
            for r in scores[scores.metric == metric].itertuples():
                per_layer[r.layer] = max(per_layer.get(r.layer, -math.inf), r.value)
            top = max(per_layer, key=lambda k: (per_layer[k], -k))
            peak = p.loc[(n, metric)]
            assert peak.peak_layer == top and peak.peak_value == pytest.approx(per_layer[top])
            assert peak.peak_relative_depth == pytest.approx((top + 0.5) / n)
            assert peak.layer_mean == pytest.approx(sum(per_layer.values()) / n)


def test_real_syntax_and_coref_runs_agree_with_their_summaries(tiny_bert, tmp_path):
    """Best head over layers and directions, and the baseline, match the task's own summary."""
    from depthprobe.probes import run

    syn = run(tiny_bert, "syntax", limit=12, device="cpu").save(tmp_path / "syntax")
    t = compare(syn)
    summary = pd.read_csv(syn / "summary.csv")
    assert len(summary) > 5
    for r in summary.itertuples():
        g = t[t.relation == r.relation]
        assert set(g.direction) == {"dependent->head", "head->dependent"} and set(g.better) == {"higher"}
        assert 100 * g.best_value.max() == pytest.approx(r.accuracy, abs=0.006)
        assert 100 * g.baseline.iloc[0] == pytest.approx(r.baseline, abs=0.006)
        assert g.baseline_name.iloc[0] == f"offset {r.offset:+d}"
    ref = run(tiny_bert, "coref", device="cpu").save(tmp_path / "coref")
    t = compare(ref).set_index(["metric", "layer"])
    rows = pd.read_csv(ref / "summary.csv").set_index("method")
    strongest = rows.loc[["nearest", "head match", "rule-based"], "all"].max()
    assert t.loc[("accuracy/all", 0), "baseline"] == pytest.approx(strongest / 100)
    best = rows.loc["best head"]
    layer, head = map(int, best["head"].split("-"))
    assert t.loc[("accuracy/all", layer), "best_value"] == pytest.approx(best["all"] / 100, abs=1e-4)
    assert t.loc[("accuracy/all", layer), "best_head"] == head
    assert 100 * t.xs("accuracy/all").best_value.max() == pytest.approx(best["all"], abs=0.006)


# ---------------------------------------------------------------- the CLI


def test_cli_compare_writes_report(two_depths, tmp_path):
    out = tmp_path / "cmp"
    res = runner.invoke(app, ["compare", *map(str, two_depths), "--metric", "to_sep", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "model-b (L=4, d=16)" in res.output and f"wrote {out}" in res.output
    html = (out / "report.html").read_text()
    assert "model-a (L=2, d=8)" in html and "model-b (L=4, d=16)" in html
    assert set(pd.read_csv(out / "compare.csv").metric) == {"to_sep"}


def test_cli_one_line_errors(two_depths, tmp_path):
    a, _ = two_depths
    other = write_run(tmp_path / "k", "kernels", "m", 2, 8, [{"layer": 0, "metric": "mean_cosine", "value": 0.1}])
    out = tmp_path / "cmp"
    one_line_error(
        runner.invoke(app, ["compare", str(a), str(other), "--out", str(out)]),
        "runs of different tasks",
        "attention-stats",
        "kernels",
    )
    one_line_error(runner.invoke(app, ["compare", "--out", str(out)]), "no run folders given")
    one_line_error(runner.invoke(app, ["compare", str(a), str(tmp_path / "nope")]), "nope does not exist")
    (tmp_path / "empty").mkdir()
    one_line_error(runner.invoke(app, ["compare", str(tmp_path / "empty")]), "holds no run folders")
    one_line_error(runner.invoke(app, ["compare", str(a), "--metric", "to_sp"]), "did you mean 'to_sep'")
    assert not out.exists()


def test_selector_named_like_a_table_column_is_kept_apart(tmp_path):
    rows = [{**r, "label": lab} for lab, g in (("x", [[0.1, 0.2]]), ("y", [[0.4, 0.3]])) for r in head_rows("acc", g)]
    t = compare([write_run(tmp_path / "r", "custom", "m", 1, 8, rows)]).set_index("metric")
    assert t.loc["acc/y", "scores_label"] == "y" and t.loc["acc/y", "label"] == "m (L=1, d=8)"
    assert t.loc["acc/y", "best_value"] == 0.4 and t.loc["acc/x", "best_head"] == 1


def test_study_member_checkpoints_are_labelled_by_member_name():
    from depthprobe.probes.api.compare import _short

    assert _short("artifacts/studies/s/members/petty-d_ff-b0200k-L04-s0/checkpoint") == "petty-d_ff-b0200k-L04-s0"
    assert _short("artifacts/models/induction-2l") == "induction-2l"
    assert _short("checkpoint") == "checkpoint"


def _run_folder(path: Path, n_layers: int, rows: str) -> Path:
    path.mkdir(parents=True)
    manifest = {
        "config": {"task": "induction"},
        "model": {"name": path.name, "n_layers": n_layers, "d_model": 32, "n_heads": 2},
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    (path / "scores.csv").write_text("model,task,layer,head,metric,value\n" + rows)
    return path


def test_compare_refuses_a_run_with_a_header_only_scores_csv(tmp_path):
    rows = "".join(f"m,induction,{la},{h},prefix_score,{0.1 * la + h}\n" for la in range(2) for h in range(2))
    _run_folder(tmp_path / "study" / "a", 2, rows)
    empty = _run_folder(tmp_path / "study" / "b", 4, "")
    line = cli_error(["compare", tmp_path / "study", "--out", tmp_path / "c"], "scores.csv", "no rows")
    assert str(empty / "scores.csv") in line, line
    assert not (tmp_path / "c").exists()
