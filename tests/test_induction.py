"""The induction task: scores on hand-built attention patterns, inputs, and whole runs."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from cli.main import app
from probes import NativeConfig, ProbeError, load, run
from probes.sweep import sweep
from tasks.induction import (copy_losses, copying_scores, frame, head_score_sums, k_composition,
                             ordinary_ids, sequences)

S = 5  # repeat length of the hand-built patterns


def pattern(target, n: int) -> torch.Tensor:
    """[n, n] attention: row i puts all its weight on target(i) (clipped to 0..i), i.e. causal."""
    a = torch.zeros(n, n)
    for i in range(n):
        a[i, min(max(target(i), 0), i)] = 1.0
    return a


def as_batch(*heads: torch.Tensor) -> torch.Tensor:
    return torch.stack(heads)[None, None]  # [head, q, k] -> [batch 1, layer 1, head, q, k]


def test_perfect_induction_pattern_scores_one_and_previous_token_zero():
    n = 1 + 2 * S  # [BOS] r r
    induction = pattern(lambda i: i - S + 1 if i >= 1 + S else 0, n)
    previous = pattern(lambda i: i - 1, n)
    duplicate = pattern(lambda i: i - S if i >= 1 + S else 0, n)
    got = head_score_sums(as_batch(induction, previous, duplicate), S)
    assert got["induction"][0].tolist() == [1.0, 0.0, 0.0]
    assert got["previous_token"][0].tolist() == [0.0, 1.0, 0.0]
    assert got["duplicate_token"][0].tolist() == [0.0, 0.0, 1.0]


def test_previous_token_excludes_the_bos_target_and_covers_both_copies():
    n = 1 + 2 * S
    # attends to the previous token only in the first copy: 1..S; i=1 targets BOS and is excluded
    half = pattern(lambda i: i - 1 if 2 <= i <= S else 0, n)
    got = head_score_sums(as_batch(half), S)
    assert got["previous_token"][0, 0].item() == pytest.approx((S - 1) / (2 * S - 1))


def test_encoder_frame_with_sep_and_batch_sums():
    n = 1 + 2 * S + 1  # [CLS] r r [SEP]; bidirectional pattern pointing forward is fine too
    induction = pattern(lambda i: i - S + 1 if 1 + S <= i <= 2 * S else 0, n)
    uniform = torch.full((n, n), 1.0 / n)
    got = head_score_sums(torch.stack([as_batch(induction, uniform)[0]] * 3), S)
    assert got["induction"][0].tolist() == pytest.approx([3.0, 3.0 / n])  # sums over 3 sequences


def test_copy_losses_separate_first_and_second_copy():
    v = 7
    tokens = torch.tensor([[0, 3, 4, 5, 3, 4, 5]])  # [BOS] r r with r = 3 4 5
    logits = torch.zeros(1, 7, v)
    for t in range(6):  # confident and right only where the second copy is predicted (positions 4, 5)
        if t in (4, 5):
            logits[0, t, tokens[0, t + 1]] = 50.0
    first, second = copy_losses(logits, tokens, repeat_len=3)
    assert first.item() == pytest.approx(math.log(v))
    assert second.item() == pytest.approx(0.0, abs=1e-6)


@pytest.fixture(scope="module")
def native2():
    return load(NativeConfig(layers=2, d_model=32, heads=2, d_vocab=16, n_ctx=32), device="cpu")


def test_copying_score_matches_the_full_vocabulary_eigenvalues(native2):
    b = native2.bridge
    got = copying_scores(native2)
    for layer in range(2):
        for head in range(2):
            full = (b.W_E @ b.W_V[layer, head] @ b.W_O[layer, head] @ b.W_U).double()  # [V, V]
            eig = torch.linalg.eigvals(full)
            assert got[layer, head].item() == pytest.approx((eig.sum().real / eig.abs().sum()).item(), abs=1e-6)
    assert (got.abs() <= 1 + 1e-9).all()


def test_copying_score_of_an_identity_ov_circuit_is_one():
    model = load(NativeConfig(layers=1, d_model=8, heads=1, d_vocab=8, n_ctx=8), device="cpu")
    from probes.train import inner

    native = model.bridge.original_model
    attn = inner(inner(native.layers[0]).attn)
    with torch.no_grad():
        for lin in (inner(native.tok_embed), inner(attn.v), inner(attn.o), inner(native.head)):
            lin.weight.copy_(torch.eye(8))
    assert copying_scores(model)[0, 0].item() == pytest.approx(1.0)


def test_k_composition_is_only_from_earlier_layers(native2):
    comp = k_composition(native2)
    assert comp.shape == (2, 2, 2, 2)
    assert (comp[1, :, 1, :] == 0).all() and (comp[1, :, 0, :] == 0).all() and (comp[0, :, 0, :] == 0).all()
    b = native2.bridge
    ov = b.W_V[0, 1] @ b.W_O[0, 1]  # earlier head 0.1, [d, d]
    qk_t = b.W_K[1, 0] @ b.W_Q[1, 0].T  # later head 1.0, (W_Q W_K^T)^T
    expected = (ov @ qk_t).norm() / (ov.norm() * qk_t.norm())
    assert comp[0, 1, 1, 0].item() == pytest.approx(expected.item(), rel=1e-4)


def test_inputs_use_ordinary_tokens_and_the_right_frame(tiny_bert, tiny_gpt2, native2):
    assert frame(native2) == ((0,), ())
    assert ordinary_ids(native2).tolist() == list(range(1, 16))
    cls, sep = tiny_bert.tokenizer.cls_token_id, tiny_bert.tokenizer.sep_token_id
    assert frame(tiny_bert) == ((cls,), (sep,))
    seqs = sequences(tiny_bert, 6, 20, seed=0)
    body = seqs[:, 1:-1]
    assert (seqs[:, 0] == cls).all() and (seqs[:, -1] == sep).all()
    assert torch.equal(body[:, :6], body[:, 6:]) and not torch.isin(body, torch.tensor(sorted(tiny_bert.special_ids))).any()
    assert frame(tiny_gpt2) == ((tiny_gpt2.cls_id,), ())
    assert torch.equal(sequences(tiny_gpt2, 6, 4, seed=1), sequences(tiny_gpt2, 6, 4, seed=1))


def test_run_on_a_causal_hf_model(tiny_gpt2):
    res = run(tiny_gpt2, "induction", repeat_len=8, n_seqs=6, batch_size=4)
    s = res.scores
    assert set(s.metric) == {"induction", "previous_token", "duplicate_token"}
    assert len(s) == 3 * 2 * 4 and s.value.between(0, 1).all()
    assert {"icl_score", "loss_repeated", "loss_first_copy"} <= set(res.summary.metric)
    assert res.headline["icl_score"] == pytest.approx(res.headline["loss_repeated"] - res.headline["loss_first_copy"], abs=2e-4)
    view = res.views[0]
    assert len(view["tokens"]) == 17 and torch.tensor(view["pattern"]).shape[1:] == (17, 17)


def test_run_on_an_encoder_and_on_a_native_model(tiny_bert, native2, tmp_path):
    res = run(tiny_bert, "induction", repeat_len=8, n_seqs=4)
    assert "icl_score" not in set(res.summary.metric) and res.views[0]["causal"] is False
    res = run(native2, "induction", repeat_len=8, n_seqs=4)
    assert {"copying", "k_composition_max"} <= set(res.scores.metric)
    assert [h["metric"] for h in res.heatmaps][:3] == ["induction", "duplicate_token", "previous_token"]
    path = res.save(tmp_path / "run")
    comp = pd.read_csv(path / "k_composition.csv")
    assert len(comp) == 2 * 2 and (comp.src_layer < comp.layer).all()


@pytest.mark.parametrize("options, fragment", [
    (dict(repeat_len=40), "repeat_len=15 or less"),
    (dict(repeat_len=1), "at least 2"),
    (dict(n_seqs=0), "n_seqs must be at least 1"),
    (dict(repeat_lenght=5), "did you mean 'repeat_len'"),
])
def test_bad_options_fail_before_any_forward_pass(native2, options, fragment):
    with pytest.raises(ProbeError, match=fragment):
        run(native2, "induction", **options)


def test_data_is_refused(native2, tmp_path):
    f = tmp_path / "x.txt"
    f.write_text("hello\n")
    with pytest.raises(ProbeError, match="drop --data"):
        run(native2, "induction", data=f)


def test_sweep_table_and_plot(tmp_path):
    res = sweep("induction", [1, 2], steps=6, eval_every=3, n_seqs=2, width=16, heads=2, seq_len=24, vocab=12)
    t = res.scores
    assert list(t.columns[:4]) == ["depth", "step", "best_induction", "best_head"]
    assert t.groupby("depth").step.apply(list).tolist() == [[0, 3, 6], [0, 3, 6]]
    assert "loss_repeated" in t and res.summary.depth.tolist() == [1, 2]
    assert res.plots["induction_vs_step"].lstrip().startswith("<?xml") and "<svg" in res.plots["induction_vs_step"]
    path = res.save(tmp_path / "sweep")
    assert (path / "plots" / "induction_vs_step.svg").exists() and (path / "train_loss.csv").exists()


def test_sweep_bad_option():
    with pytest.raises(ProbeError, match="no option 'variants'"):
        sweep("induction", [1], variants="a")


def test_cli_run_and_sweep(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["run", "--model", "native:layers=2,d_model=16,heads=2,d_vocab=12,n_ctx=32",
                              "--task", "induction", "-O", "repeat_len=6", "-O", "n_seqs=3",
                              "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert "top_heads" in res.output
    res = runner.invoke(app, ["sweep", "--task", "induction", "--layers", "1", "--steps", "4", "--width", "16",
                              "--heads", "2", "--seq-len", "24", "-O", "eval_every=2", "-O", "n_seqs=2",
                              "--out", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "s" / "plots" / "induction_vs_step.svg").exists()
    res = runner.invoke(app, ["run", "--model", "native:layers=1,n_ctx=32", "--task", "induction"])
    assert res.exit_code == 2 and "repeat_len=15 or less" in res.output


@pytest.mark.slow
def test_minilm_encoder_run_is_seeded(minilm):
    a = run(minilm, "induction", repeat_len=20, n_seqs=8, seed=3)
    b = run(minilm, "induction", repeat_len=20, n_seqs=8, seed=3)
    assert len(a.scores) == 3 * 6 * 12 and a.scores.value.between(0, 1).all()
    pd.testing.assert_frame_equal(a.scores, b.scores)
    assert "icl_score" not in a.headline and a.views[0]["tokens"][0] == "[CLS]"
