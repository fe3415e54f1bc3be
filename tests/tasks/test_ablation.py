"""The ablation task (docs/protocols.md §3.8): found heads, control heads, behaviour with and without."""

import json

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from depthprobe.cli.main import app
from depthprobe.probes import capture, load
from depthprobe.probes.api.run import run
from depthprobe.probes.hooks.interventions import ablate_heads
from depthprobe.tasks.ablation import (
    control_heads,
    masked_losses,
    mean_pooled,
    top_heads,
)

NATIVE = "native:layers=2,d_model=16,heads=4,d_vocab=40,n_ctx=64,seed=3"
runner = CliRunner()


@pytest.fixture(scope="module")
def native():
    return load(NATIVE)


def test_zero_ablation_of_a_whole_layer_equals_zeroing_hook_z_by_hand(native):
    ids = torch.tensor([[0, 5, 9, 3, 5, 9, 3, 7]])

    def zero(z, hook):
        return torch.zeros_like(z)

    with torch.no_grad():
        clean = native.bridge(ids)
        with ablate_heads(native, "1-0,1-1,1-2,1-3", method="zero"):
            ablated = native.bridge(ids)
        with capture(native, {"blocks.1.attn.hook_z": zero}, store=False):
            by_hand = native.bridge(ids)
    assert torch.equal(ablated, by_hand)
    assert (ablated - clean).abs().max() > 1e-4


def test_control_heads_are_disjoint_from_the_found_ones_and_from_the_same_layers():
    found = [(1, 2), (3, 0)]
    for seed in range(20):
        control = control_heads(found, n_heads=4, seed=seed)
        assert len(control) == 2
        assert not set(control) & set(found)
        assert {layer for layer, _ in control} <= {1, 3}
    assert control_heads(found, 4, seed=7) == control_heads(found, 4, seed=7)
    assert len({tuple(control_heads(found, 4, seed=s)) for s in range(20)}) > 1
    assert control_heads([(0, 0), (0, 1)], n_heads=2, seed=0) == []  # the layer is full: no control


def test_top_heads_and_ties():
    score = pd.Series([0.1, 0.9, 0.9, 0.5], index=pd.MultiIndex.from_tuples([(0, 0), (0, 1), (1, 0), (1, 1)]))
    assert top_heads(score, 2) == [(0, 1), (1, 0)]
    assert top_heads(score, 3) == [(0, 1), (1, 0), (1, 1)]


def test_masked_losses_and_pooling_by_hand():
    logits = torch.zeros(1, 3, 4)
    logits[0, 0, 2] = 10.0
    ids, mask = torch.tensor([[1, 2, 0]]), torch.tensor([[1, 1, 0]])
    loss = masked_losses(logits, ids, mask)
    assert loss[0, 0] == pytest.approx(float(-torch.log_softmax(logits[0, 0], -1)[2]))
    assert torch.isnan(loss[0, 1])
    h = torch.tensor([[[1.0, 0.0], [3.0, 2.0], [100.0, 100.0]]])
    assert mean_pooled(h, mask).tolist() == [[2.0, 1.0]]


def test_induction_source_is_seeded_and_reports_every_condition(native):
    a = run(native, "ablation", source="induction", k=2, limit=8, seed=5)
    b = run(native, "ablation", source="induction", k=2, limit=8, seed=5)
    pd.testing.assert_frame_equal(a.scores, b.scores)
    assert set(a.scores["condition"]) == {"clean", "found", "control"}
    assert list(a.scores.columns[:6]) == ["model", "task", "layer", "head", "metric", "value"]
    found = a.headline["found_heads"]
    ind = a.scores[(a.scores.metric == "source_induction") & (a.scores.condition == "clean")]
    best = ind.sort_values("value", ascending=False).head(2)
    assert found == [f"{r.layer}-{r.head}" for r in best.itertuples()]
    assert not set(found) & set(a.headline["control_heads"])
    clean_loss = a.scores[(a.scores.metric == "loss") & (a.scores.condition == "clean")]["value"].item()
    assert a.summary["loss_clean"].tolist() == [round(clean_loss, 4)] * 2


def test_ablating_the_layer_0_heads_changes_the_layer_1_source_scores_only(native):
    """hook_z ablation leaves its own layer's patterns alone; layer 1 patterns read layer 0's output."""
    r = run(native, "ablation", source="induction", heads="0-0,0-1", method="zero", limit=4)
    s = r.scores[r.scores.metric == "source_induction"].set_index(["condition", "layer", "head"])["value"]
    assert s.loc["found"].loc[0].equals(s.loc["clean"].loc[0])
    assert (s.loc["found"].loc[1] - s.loc["clean"].loc[1]).abs().max() > 1e-4


def test_cli_run_on_a_native_model(tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(
        app,
        [
            "run",
            "-m",
            NATIVE,
            "--task",
            "ablation",
            "-O",
            "source=induction",
            "-O",
            "k=1",
            "--limit",
            "4",
            "-o",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["headline"]["source"] == "induction"
    assert len(summary["headline"]["found_heads"]) == 1
    assert (out / "report.html").exists()
    df = pd.read_csv(out / "scores.csv")
    assert {"loss", "loss_task", "source_induction", "ablated"} <= set(df.metric)


def test_cli_run_on_the_tiny_bert_encoder(tiny_bert_dir, tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(
        app,
        [
            "run",
            "-m",
            str(tiny_bert_dir),
            "--task",
            "ablation",
            "-O",
            "source=attention-stats",
            "-O",
            "heads=1-2",
            "-O",
            "method=zero",
            "-o",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    summary = pd.read_csv(out / "summary.csv")
    assert summary["condition"].tolist() == ["found", "control"]
    assert ((summary["cosine"] > -1) & (summary["cosine"] < 1)).all()
    assert summary["heads"].tolist()[0] == "1-2"
    df = pd.read_csv(out / "scores.csv")
    assert "loss" not in set(df.metric) and "source_to_prev" in set(df.metric)


@pytest.mark.parametrize(
    "option, message",
    [
        ("source=indction", "unknown source 'indction' (did you mean 'induction'?)"),
        ("heads=1.2", "write heads as L-H, 0-indexed"),
        ("heads=1-9", "head 1-9 does not exist"),
        ("k=0", "k=0 is out of range"),
        ("method=ones", "use -O method=mean or -O method=zero"),
    ],
)
def test_errors_are_one_line_with_exit_2(option, message):
    res = runner.invoke(app, ["run", "-m", NATIVE, "--task", "ablation", "-O", option])
    assert res.exit_code == 2
    assert message in res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1
