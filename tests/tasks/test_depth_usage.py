"""depth-usage (docs/protocols.md §3.10): against an independent plain-Hugging-Face implementation on tiny
local BERT and GPT-2 models, with known answers (a zero block adds nothing and skipping it
changes nothing), the skip edit as a scoped context, refusals, the CLI and minilm (slow)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from depthprobe import probes
from depthprobe.probes.base.errors import ProbeError
from tests.helpers import cli_error
from tests.reference.depth_usage import depth_usage as reference

TEXTS = [
    "the dog saw the cat .",
    "a man ran to the river and the child walked to the house",
    "she read the old book on monday",
    "john gave mary a red car",
]
PER_BLOCK = ("relative_contribution", "cosine", "skip_output", "skip_kl", "skip_top1")
SUBLAYER_METRICS = ("attn_relative_contribution", "attn_cosine", "mlp_relative_contribution", "mlp_cosine")


def _ids(model_dir: Path, causal: bool) -> list[list[int]]:
    """Each text tokenized alone with its special tokens ([CLS] .. [SEP]; BOS first for GPT-2)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    return [([tok.bos_token_id] if causal else []) + tok(t)["input_ids"] for t in TEXTS]


def _hf(model_dir: Path, causal: bool):
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    cls = AutoModelForCausalLM if causal else AutoModelForMaskedLM
    return cls.from_pretrained(model_dir, attn_implementation="eager").eval()


def _values(scores, metric: str) -> torch.Tensor:
    rows = scores[scores.metric == metric].sort_values("layer")
    return torch.tensor(rows["value"].to_numpy(dtype=float))


def _later(scores, n_layers: int) -> torch.Tensor:
    m = torch.zeros(n_layers, n_layers, dtype=torch.float64)
    for r in scores[scores.metric == "skip_later"].itertuples():
        m[int(r.skipped), int(r.later)] = r.value
    return m


def _sharp_copy(model_dir: Path, out: Path, causal: bool) -> Path:
    """The tiny model with weights that matter: at the usual initialisation a BERT block barely
    changes the stream and the logits are nearly flat (every KL about 1e-4), so the KL and top-1
    checks could not fail. GPT-2: its final norm's gain x 30; BERT: weights drawn with std 0.3."""
    if causal:
        hf = _hf(model_dir, causal)
        with torch.no_grad():
            hf.transformer.ln_f.weight.mul_(30.0)
    else:
        from transformers import BertConfig, BertForMaskedLM

        cfg = BertConfig.from_pretrained(model_dir)
        cfg.initializer_range = 0.3
        torch.manual_seed(2)
        hf = BertForMaskedLM(cfg)
    hf.save_pretrained(out, safe_serialization=True)
    for f in model_dir.iterdir():
        if "token" in f.name or f.name in ("vocab.json", "merges.txt", "vocab.txt"):
            shutil.copy(f, out / f.name)
    return out


@pytest.fixture(scope="module")
def sharp_dirs(tiny_bert_dir, tiny_gpt2_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sharp")
    return {
        "bert": _sharp_copy(tiny_bert_dir, root / "bert", causal=False),
        "gpt2": _sharp_copy(tiny_gpt2_dir, root / "gpt2", causal=True),
    }


def _check_against_reference(model_dir: Path, causal: bool) -> None:
    model = probes.load(str(model_dir), device="cpu")
    ref = reference(_hf(model_dir, causal), _ids(model_dir, causal), lm_head=True)
    assert ref["skip_kl"].max() > 0.01 and ref["lens_kl"][0] > 0.1 and ref["skip_top1"].min() < 1  # not flat
    for batch_size in (1, 3):  # a batch of one, and padded batches
        res = probes.run(model, "depth-usage", data=TEXTS, batch_size=batch_size)
        for metric in (*PER_BLOCK, "lens_kl", "lens_top1", *(SUBLAYER_METRICS if causal else ())):
            torch.testing.assert_close(_values(res.scores, metric), ref[metric], atol=1e-4, rtol=0, msg=metric)
        L = len(ref["cosine"])
        torch.testing.assert_close(_later(res.scores, L), ref["skip_later"], atol=1e-4, rtol=0)
        assert res.headline["n_texts"] == len(TEXTS)


def test_bert_equals_plain_hugging_face(sharp_dirs):
    _check_against_reference(sharp_dirs["bert"], causal=False)


def test_gpt2_equals_plain_hugging_face(sharp_dirs):
    _check_against_reference(sharp_dirs["gpt2"], causal=True)


@pytest.fixture(scope="module")
def zero_block_gpt2(tiny_gpt2_dir, tmp_path_factory) -> Path:
    """A 3-block GPT-2 whose block 1 has every weight zero (so it adds exactly 0 to the stream)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config.from_pretrained(tiny_gpt2_dir)
    cfg.n_layer = 3
    torch.manual_seed(1)
    hf = GPT2LMHeadModel(cfg)
    with torch.no_grad():
        for p in hf.transformer.h[1].parameters():
            p.zero_()
    out = tmp_path_factory.mktemp("models") / "zero-block-gpt2"
    hf.save_pretrained(out, safe_serialization=True)
    for f in tiny_gpt2_dir.iterdir():
        if "token" in f.name or f.name in ("vocab.json", "merges.txt"):
            shutil.copy(f, out / f.name)
    return out


def test_zero_block_contributes_nothing_and_skipping_it_changes_nothing(zero_block_gpt2):
    res = probes.run(str(zero_block_gpt2), "depth-usage", data=TEXTS, device="cpu", batch_size=2)
    s = res.scores
    assert _values(s, "relative_contribution")[1] == 0.0
    assert _values(s, "cosine")[1] == 0.0
    assert _values(s, "attn_relative_contribution")[1] == 0.0 and _values(s, "mlp_relative_contribution")[1] == 0.0
    assert _values(s, "skip_output")[1] == pytest.approx(0.0, abs=1e-7)
    assert _values(s, "skip_kl")[1] == pytest.approx(0.0, abs=1e-7)
    assert _values(s, "skip_top1")[1] == 1.0
    later = _later(s, 3)
    assert later[1, 2] == pytest.approx(0.0, abs=1e-6)  # block 2 sees the same input without block 1
    assert later[0, 2] > 0.01  # skipping a real block moves later contributions
    assert _values(s, "skip_kl")[0] > 0
    assert res.headline["least_needed"] == 1
    ref = reference(_hf(zero_block_gpt2, True), _ids(zero_block_gpt2, True), lm_head=True)
    torch.testing.assert_close(_later(s, 3), ref["skip_later"], atol=1e-4, rtol=0)


def test_sublayers_add_up_to_the_block(tiny_gpt2):
    """Pre-LN: c_l = attention output + MLP output, so the sublayer rows are parts of the block's."""
    from depthprobe.probes.hooks.capture import forward

    ids, mask = tiny_gpt2.encode(TEXTS[:2])
    names = ["blocks.0.hook_resid_pre", "blocks.0.hook_resid_post", "blocks.0.hook_attn_out", "blocks.0.hook_mlp_out"]
    a = forward(tiny_gpt2, ids, mask, names)
    c = a[names[1]] - a[names[0]]
    torch.testing.assert_close(c, a[names[2]] + a[names[3]], atol=1e-5, rtol=1e-5)
    res = probes.run(tiny_gpt2, "depth-usage", data=TEXTS, skips=False, lens=False)
    assert {"attn_relative_contribution", "mlp_cosine"} <= set(res.scores.metric)
    assert not any(res.scores.metric.str.startswith("skip_") | res.scores.metric.str.startswith("lens_"))


def test_post_ln_bert_has_no_sublayer_rows(tiny_bert):
    res = probes.run(tiny_bert, "depth-usage", data=TEXTS, skips=False)
    assert "attn_relative_contribution" not in set(res.scores.metric)
    assert any("LayerNorm included" in n for n in res.notes)
    assert set(res.plots) == {"contribution", "lens"}


def test_skip_layers_is_scoped_and_equals_a_manual_skip(tiny_gpt2, tiny_gpt2_dir):
    ids = torch.tensor(_ids(tiny_gpt2_dir, True)[:1])
    hf = _hf(tiny_gpt2_dir, True)
    handle = hf.transformer.h[0].register_forward_hook(
        lambda m, a, k, o: (a[0], *o[1:]) if isinstance(o, tuple) else a[0], with_kwargs=True
    )
    with torch.no_grad():
        want = hf(ids).logits
    handle.remove()
    with torch.no_grad():
        plain = tiny_gpt2.bridge(ids, return_type="logits")
        with probes.skip_layers(tiny_gpt2, [0]) as layers:
            skipped = tiny_gpt2.bridge(ids, return_type="logits")
        after = tiny_gpt2.bridge(ids, return_type="logits")
    assert layers == [0]
    torch.testing.assert_close(skipped, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(after, plain)
    assert not torch.allclose(skipped, plain)


def test_skip_layers_refuses_bad_blocks(tiny_gpt2):
    with pytest.raises(ProbeError, match="block 5 does not exist"), probes.skip_layers(tiny_gpt2, [5]):
        pass
    with pytest.raises(ProbeError, match="block indices"), probes.skip_layers(tiny_gpt2, ["0"]):  # type: ignore[list-item]
        pass


def test_read_only_family_refuses_skips_in_one_line(tiny_family_dir):
    model = probes.load(str(tiny_family_dir("distilbert")), device="cpu")
    with pytest.raises(ProbeError, match="read-only") as err, probes.skip_layers(model, [0]):
        pass
    assert "\n" not in str(err.value)
    with pytest.raises(ProbeError, match="skips=false"):
        probes.run(model, "depth-usage", data=TEXTS)
    res = probes.run(model, "depth-usage", data=TEXTS, skips=False)
    assert len(_values(res.scores, "relative_contribution")) == model.info.n_layers


def test_native_model_with_token_ids():
    model = probes.load("native:layers=3,d_model=32,heads=4,attn_only=false,d_vocab=50", device="cpu")
    ids = torch.randint(0, 50, (5, 12), generator=torch.Generator().manual_seed(0))
    res = probes.run(model, "depth-usage", data=ids)
    s = res.scores
    assert len(_values(s, "skip_kl")) == 3 and len(_values(s, "lens_kl")) == 4
    assert _values(s, "lens_kl")[-1] == pytest.approx(0.0, abs=1e-6)  # the last residual is the output
    assert _values(s, "lens_top1")[-1] == 1.0
    with pytest.raises(ProbeError, match="token ids"):
        probes.run(model, "depth-usage")


def test_cli_run_with_data_file(tiny_bert_dir, tmp_path):
    from typer.testing import CliRunner

    from depthprobe.cli.main import app

    data = tmp_path / "texts.txt"
    data.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "run"
    args = ["run", "--model", str(tiny_bert_dir), "--task", "depth-usage", "--data", str(data), "--out", str(out)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    import pandas as pd

    scores = pd.read_csv(out / "scores.csv")
    assert {"layer", "skipped", "later", "metric", "value"} <= set(scores.columns)
    assert {"relative_contribution", "cosine", "skip_later", "skip_output"} <= set(scores.metric)
    assert (out / "plots" / "skip_later.svg").exists() and (out / "report.html").exists()
    cli_error(["run", "--model", str(tiny_bert_dir), "--task", "depth-usage", "-O", "skip=no"], "skips")


@pytest.mark.slow
def test_minilm_on_held_out_text(minilm, tmp_path):
    """minilm (no trained unembedding): 1 - cos of the final residual, against plain Hugging Face."""
    from transformers import AutoTokenizer, BertModel

    text = Path(__file__).parents[1] / "fixtures" / "depth_usage_heldout.txt"
    lines = [ln for ln in text.read_text().splitlines() if ln.strip()]
    res = probes.run(minilm, "depth-usage", data=str(text), batch_size=4)
    folder = minilm.bridge.original_model.config.name_or_path
    hf = BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(folder)
    ref = _bert_reference(hf, [tok(t)["input_ids"] for t in lines])
    for metric in ("relative_contribution", "cosine", "skip_output"):
        torch.testing.assert_close(_values(res.scores, metric), ref[metric], atol=1e-4, rtol=0, msg=metric)
    torch.testing.assert_close(_later(res.scores, 6), ref["skip_later"], atol=1e-4, rtol=0)
    assert "skip_kl" not in set(res.scores.metric)


def _bert_reference(bert, rows):
    """The reference on a bare BertModel (no MLM head): wrapped so that ``hf.bert`` finds it."""

    class Wrap(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, output_hidden_states=True):
            return self.bert(input_ids=input_ids, output_hidden_states=output_hidden_states)

    return reference(Wrap(), rows, lm_head=False)


def test_sharded_halves_merge_to_the_whole_run(tiny_gpt2, tmp_path):
    """Two halves of the batches, each state pickled as a worker's is, merged: the whole run's output."""
    from tests.engine.test_distributed import assert_same_output, whole_and_merged

    data = tmp_path / "texts.txt"
    data.write_text("\n".join(TEXTS) + "\n")
    whole, merged, n = whole_and_merged(tiny_gpt2, "depth-usage", data, batch_size=1)
    assert n == len(TEXTS)
    assert_same_output(whole, merged)
