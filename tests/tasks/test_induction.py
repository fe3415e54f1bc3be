"""The induction task: scores on hand-built attention patterns, inputs, and whole runs."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from fractions import Fraction

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from depthprobe.cli.main import app
from depthprobe.probes import NativeConfig, ProbeError, load, run
from depthprobe.probes.api.sweep import sweep
from depthprobe.probes.data import synthetic
from depthprobe.probes.data.synthetic import frame, ordinary_ids, sequences
from depthprobe.tasks.induction.inputs import text_windows
from depthprobe.tasks.induction.metrics import (
    chance_levels,
    copy_losses,
    copying_scores,
    head_score_sums,
    icl_from_losses,
    icl_positions,
    k_composition,
    token_losses,
)
from tests.helpers import probe_cli

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
    from depthprobe.probes.training.fast_forward import inner

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
    assert (
        torch.equal(body[:, :6], body[:, 6:])
        and not torch.isin(body, torch.tensor(sorted(tiny_bert.special_ids))).any()
    )
    assert frame(tiny_gpt2) == ((tiny_gpt2.cls_id,), ())
    assert torch.equal(sequences(tiny_gpt2, 6, 4, seed=1), sequences(tiny_gpt2, 6, 4, seed=1))


def test_run_on_a_causal_hf_model(tiny_gpt2):
    res = run(tiny_gpt2, "induction", repeat_len=8, n_seqs=6, batch_size=4, icl_windows=2)
    s = res.scores
    assert set(s.metric) == {"induction", "previous_token", "duplicate_token"}
    assert len(s) == 3 * 2 * 4 and s.value.between(0, 1).all()
    level = set(res.summary.metric)
    assert {"repeat_copying_score", "loss_repeated", "loss_first_copy", "icl_score"} <= level
    h = res.headline
    assert h["repeat_copying_score"] == pytest.approx(h["loss_repeated"] - h["loss_first_copy"], abs=2e-4)
    assert h["icl_score"] == pytest.approx(h["icl_loss_late"] - h["icl_loss_early"], abs=2e-4)
    assert h["icl_windows"] == 2 and h["icl_context"] == 64 and h["icl_positions"] == [6, 63]
    assert any("Tiny Shakespeare" in n for n in res.notes)
    view = res.views[0]
    assert len(view["tokens"]) == 17 and torch.tensor(view["pattern"]).shape[1:] == (17, 17)


def test_run_on_an_encoder_and_on_a_native_model(tiny_bert, native2, tmp_path):
    res = run(tiny_bert, "induction", repeat_len=8, n_seqs=4)
    level = set(res.summary.metric)
    assert not {"icl_score", "repeat_copying_score"} & level and res.views[0]["causal"] is False
    assert any("an encoder sees both sides" in n for n in res.notes)
    assert res.scores.chance.tolist() == pytest.approx([1 / 18] * len(res.scores))  # [CLS] r r [SEP], |r| = 8
    res = run(native2, "induction", repeat_len=8, n_seqs=4)
    assert {"copying", "k_composition_max", "k_composition_max_init"} <= set(res.scores.metric)
    assert "repeat_copying_score" in set(res.summary.metric) and "icl_score" not in set(res.summary.metric)
    assert any("no tokenizer" in n for n in res.notes)
    assert [h["metric"] for h in res.heatmaps][:3] == ["induction", "duplicate_token", "previous_token"]
    path = res.save(tmp_path / "run")
    comp = pd.read_csv(path / "k_composition.csv")
    assert len(comp) == 2 * 2 and (comp.src_layer < comp.layer).all()


def test_old_icl_name_is_not_the_copying_measure(native2):
    """The repeated-token loss difference is reported as repeat_copying_score only: a native model
    (no tokenizer, so no natural-text ICL score) has no icl_score anywhere."""
    res = run(native2, "induction", repeat_len=8, n_seqs=4)
    h = res.headline
    assert h["repeat_copying_score"] == pytest.approx(h["loss_repeated"] - h["loss_first_copy"], abs=2e-4)
    assert not [k for k in h if k.startswith("icl")] and "icl_score" not in set(res.summary.metric)


# ----------------------------------------------------------------------------- sampling without replacement


def test_repeated_segments_never_repeat_a_token():
    ids = list(range(3, 13))  # 10 ids
    seqs = synthetic.repeated(200, 10, ids, synthetic.generator(0, 10))
    r = seqs[:, 1:11]
    assert (r.sort(dim=1).values == torch.tensor(ids)).all()  # S = all ids: every row is a permutation
    assert torch.equal(seqs[:, 1:11], seqs[:, 11:21])
    short = synthetic.repeated(500, 4, ids, synthetic.generator(1, 4))[:, 1:5]
    assert all(len(set(row)) == 4 for row in short.tolist())
    assert set(short.unique().tolist()) == set(ids)  # every id is drawn somewhere
    assert torch.equal(short, synthetic.repeated(500, 4, ids, synthetic.generator(1, 4))[:, 1:5])
    with pytest.raises(ProbeError, match="use a repeat length of 10 or less"):
        synthetic.repeated(2, 11, ids, synthetic.generator(0, 11))


def test_model_sequences_have_distinct_tokens(tiny_gpt2, tiny_bert):
    for model, body in ((tiny_gpt2, slice(1, 41)), (tiny_bert, slice(1, -1))):
        seqs = sequences(model, 40, 30, seed=0)[:, body]
        first = seqs[:, :40]
        assert all(len(set(row)) == 40 for row in first.tolist())


def test_repeat_len_over_the_vocabulary_is_refused():
    model = load(NativeConfig(layers=1, d_model=8, heads=1, d_vocab=8, n_ctx=32), device="cpu")
    with pytest.raises(ProbeError, match="has 7 ordinary tokens; use --option repeat_len=7 or less"):
        run(model, "induction", repeat_len=10)


# ----------------------------------------------------------------------------- chance levels


def test_chance_levels_of_a_small_case():
    # [BOS] r r, S = 2: second copy at 3, 4 -> (1/4 + 1/5) / 2; previous-token queries 2..4
    got = chance_levels(2, prefix=1, suffix=0, causal=True)
    assert got == {
        "induction": Fraction(9, 40),
        "duplicate_token": Fraction(9, 40),
        "previous_token": Fraction(47, 180),
    }
    assert set(chance_levels(2, 1, 1, causal=False).values()) == {Fraction(1, 6)}  # [CLS] r r [SEP]
    s25 = chance_levels(25)["induction"]
    assert s25 == sum(Fraction(1, k) for k in range(27, 52)) / 25 and round(float(s25), 3) == 0.027


def test_uniform_attention_scores_exactly_chance():
    n = 1 + 2 * S
    causal = torch.tril(torch.ones(n, n, dtype=torch.float64))
    causal = causal / causal.sum(-1, keepdim=True)
    got = head_score_sums(as_batch(causal), S)
    for metric, level in chance_levels(S).items():
        assert got[metric][0, 0].item() == pytest.approx(float(level), abs=1e-12)
    full = torch.full((n + 1, n + 1), 1.0 / (n + 1), dtype=torch.float64)  # encoder with [SEP]
    got = head_score_sums(as_batch(full), S)
    for metric, level in chance_levels(S, 1, 1, causal=False).items():
        assert got[metric][0, 0].item() == pytest.approx(float(level), abs=1e-12)


def test_chance_in_the_table_and_summary(native2):
    res = run(native2, "induction", repeat_len=8, n_seqs=4)
    levels = chance_levels(8)
    for metric, level in levels.items():
        column = res.scores[res.scores.metric == metric].chance.tolist()
        assert column == pytest.approx([float(level)] * 2 * 2, abs=1e-12)
        row = res.summary.set_index("metric").loc[metric]
        assert row["chance"] == pytest.approx(float(level), abs=1e-4)
    assert res.scores[res.scores.metric == "copying"].chance.isna().all()
    assert res.headline["induction_chance"] == pytest.approx(float(levels["induction"]), abs=1e-4)


# ----------------------------------------------------------------------------- K-composition at init


def test_k_composition_at_init_is_the_models_own_initialisation(tmp_path):
    from depthprobe.probes.training.config import build_configs
    from depthprobe.probes.training.train import train

    native, data, cfg = build_configs(
        layers=2,
        d_model=16,
        heads=2,
        vocab=16,
        seq_len=24,
        steps=30,
        batch_size=8,
        lr=1e-2,
        seed=3,
        log_every=10,
        save_every=30,
    )
    train(native, data, cfg, out=tmp_path / "m")
    trained = load(str(tmp_path / "m"), device="cpu")
    res = run(trained, "induction", repeat_len=8, n_seqs=4)
    s = res.scores.set_index(["metric", "layer", "head"]).value
    fresh = k_composition(load(native, device="cpu")).amax(dim=(0, 1))  # the step-0 weights
    now = k_composition(trained).amax(dim=(0, 1))
    for head in range(2):
        assert s[("k_composition_max_init", 1, head)] == pytest.approx(fresh[1, head].item(), abs=1e-6)
        assert s[("k_composition_max", 1, head)] == pytest.approx(now[1, head].item(), abs=1e-6)
    assert not torch.allclose(fresh[1], now[1], atol=1e-4)
    assert any("at initialisation (seed 3)" in n for n in res.notes)


# ----------------------------------------------------------------------------- Olsson's ICL score


@pytest.mark.parametrize(
    "context, expected",
    [(512, (50, 500)), (1024, (50, 500)), (256, (25, 250)), (64, (6, 63)), (100, (10, 98)), (8, (1, 7))],
)
def test_icl_positions_scale_with_the_context(context, expected):
    assert icl_positions(context) == expected


def test_icl_from_a_hand_built_loss_sequence():
    losses = torch.zeros(2, 511)  # entry j: loss predicting position j + 1
    losses[:, 49] = torch.tensor([3.0, 5.0])  # position 50
    losses[:, 499] = torch.tensor([1.0, 2.0])  # position 500
    score, se, early, late = icl_from_losses(losses, 50, 500)
    assert (score, early, late) == (-2.5, 4.0, 1.5)
    assert se == pytest.approx(0.5)  # std of (-2, -3) / sqrt(2)


def test_text_windows_cut_back_to_back_and_spread_evenly():
    ids = list(range(100))
    w = text_windows(ids, 11, bos=999, limit=3)  # 10 text tokens per window, 10 windows, keep 0, 3, 6
    assert w.tolist() == [[999, *list(range(s, s + 10))] for s in (0, 30, 60)]
    assert text_windows(ids, 11, bos=None, limit=50).tolist() == [list(range(s, s + 11)) for s in range(0, 99, 11)]
    assert text_windows(list(range(600)), 1024, bos=None, limit=5).shape == (1, 512)


def test_icl_score_matches_hugging_face_losses(tiny_gpt2, tiny_gpt2_dir, tmp_path):
    from transformers import AutoTokenizer, GPT2LMHeadModel

    text = "".join(f"{w} {i % 7} " for i, w in enumerate(["the cat sat on the mat", "so it goes"] * 200))
    f = tmp_path / "text.txt"
    f.write_text(text, encoding="utf-8")
    res = run(tiny_gpt2, "induction", repeat_len=8, n_seqs=2, icl_text=str(f), icl_windows=3, batch_size=2)
    tok = AutoTokenizer.from_pretrained(tiny_gpt2_dir)
    hf = GPT2LMHeadModel.from_pretrained(tiny_gpt2_dir).eval()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    count = len(ids) // 63  # 64-token windows: BOS + 63 text tokens
    picks = [j * count // 3 for j in range(3)]
    diffs = []
    for j in picks:
        window = torch.tensor([[tok.bos_token_id, *ids[j * 63 : (j + 1) * 63]]])
        with torch.no_grad():
            logp = torch.log_softmax(hf(window).logits[0].double(), -1)

        def loss(k, logp=logp, window=window):  # loss predicting position k
            return -logp[k - 1, window[0, k]].item()

        diffs.append(loss(63) - loss(6))
    assert res.headline["icl_windows"] == 3
    row = res.summary.set_index("metric").loc["icl_score"]
    assert row["mean"] == pytest.approx(sum(diffs) / 3, abs=2e-4)


@pytest.mark.parametrize(
    "content, fragment",
    [(None, "is not a file"), (b"\xff\xfe bad", "is not UTF-8"), (b"too short", "fewer than one 64-token window")],
)
def test_bad_icl_text(tiny_gpt2, tmp_path, content, fragment):
    f = tmp_path / "t.txt"
    if content is not None:
        f.write_bytes(content)
    with pytest.raises(ProbeError, match=fragment):
        run(tiny_gpt2, "induction", repeat_len=4, n_seqs=2, icl_text=str(f))


def test_token_losses_index_positions():
    tokens = torch.tensor([[0, 2, 1]])
    logits = torch.zeros(1, 3, 3)
    logits[0, 0, 2] = 100.0  # position 0 predicts position 1 (token 2) confidently
    got = token_losses(logits, tokens)
    assert got[0, 0].item() == pytest.approx(0.0, abs=1e-6) and got[0, 1].item() == pytest.approx(math.log(3))


@pytest.mark.parametrize(
    "options, fragment",
    [
        (dict(repeat_len=40), "repeat_len=15 or less"),
        (dict(repeat_len=1), "at least 2"),
        (dict(n_seqs=0), "n_seqs must be at least 1"),
        (dict(repeat_lenght=5), "did you mean 'repeat_len'"),
    ],
)
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
    assert "loss_repeated" in t and "repeat_copying_score" in t and "icl_score" not in t
    assert res.summary.depth.tolist() == [1, 2]
    chance = (sum(Fraction(1, k) for k in range(7, 12)) / 5 + sum(Fraction(1, k) for k in range(12, 22)) / 10) / 2
    assert res.headline["induction_chance"] == round(float(chance), 4)  # held-out lengths 5 and 10
    svg = ET.fromstring(res.plots["induction_vs_step"])  # a standalone SVG file: the namespace is named
    assert svg.tag == "{http://www.w3.org/2000/svg}svg"
    shown = {g.get("data-label"): g for g in svg.iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "series"}
    assert list(shown) == ["1 layer", "2 layers"]  # a line per depth, with a point per evaluated step
    for depth, label in ((1, "1 layer"), (2, "2 layers")):
        tips = [
            c.findtext("{http://www.w3.org/2000/svg}title")
            for c in shown[label].iter("{http://www.w3.org/2000/svg}circle")
        ]
        rows = t[t.depth == depth]
        assert tips == [f"{label}: x={s}, y={v:.4g}" for s, v in zip(rows.step, rows.best_induction, strict=True)]
    path = res.save(tmp_path / "sweep")
    assert (path / "plots" / "induction_vs_step.svg").exists() and (path / "train_loss.csv").exists()


def test_sweep_bad_option():
    with pytest.raises(ProbeError, match="no option 'variants'"):
        sweep("induction", [1], variants="a")


def test_cli_run_and_sweep(tmp_path):
    runner = CliRunner()
    res = probe_cli(
        "run",
        "--model",
        "native:layers=2,d_model=16,heads=2,d_vocab=12,n_ctx=32",
        "--task",
        "induction",
        "-O",
        "repeat_len=6",
        "-O",
        "n_seqs=3",
        "--out",
        str(tmp_path / "r"),
    )
    assert res.exit_code == 0, res.output
    assert "top_heads" in res.output
    res = probe_cli(
        "sweep",
        "--task",
        "induction",
        "--layers",
        "1",
        "--steps",
        "4",
        "--width",
        "16",
        "--heads",
        "2",
        "--seq-len",
        "24",
        "-O",
        "eval_every=2",
        "-O",
        "n_seqs=2",
        "--out",
        str(tmp_path / "s"),
    )
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
    assert a.headline["induction_chance"] == round(1 / 42, 4)  # 42 real positions: [CLS] r r [SEP]


def test_cli_bad_icl_text_is_one_line(tiny_gpt2_dir, tmp_path):
    res = probe_cli(
        "run",
        "--model",
        str(tiny_gpt2_dir),
        "--task",
        "induction",
        "-O",
        f"icl_text={tmp_path / 'missing.txt'}",
        "--out",
        str(tmp_path / "r"),
    )
    assert res.exit_code == 2 and "is not a file" in res.output
    assert "Traceback" not in res.output and not (tmp_path / "r").exists()
