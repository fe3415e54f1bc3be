"""Loading: local HF directories, aliases, the offline error, native specs and checkpoints."""
import json

import pytest
import torch

from probes import NativeConfig, ProbeError, load, load_checkpoint, save_checkpoint
from probes.models import resolve_device


def test_local_hf_directories_load_with_real_facts(tiny_bert, tiny_gpt2):
    assert tiny_bert.info.causal is False and tiny_gpt2.info.causal is True
    assert (tiny_bert.info.n_layers, tiny_bert.info.n_heads, tiny_bert.info.d_model) == (2, 4, 32)
    assert tiny_bert.info.max_len == 64
    assert tiny_bert.info.weights.startswith("sha256:")
    assert tiny_bert.sep_id == tiny_bert.tokenizer.sep_token_id and tiny_gpt2.sep_id is None


def test_bridge_attention_equals_hf_eager_attention_with_padding(tiny_bert_dir, tiny_bert):
    from transformers import AutoModel

    from probes.capture import forward, pattern_names

    hf = AutoModel.from_pretrained(tiny_bert_dir, attn_implementation="eager").eval()
    enc = tiny_bert.tokenizer(["the dog ran", "the old man gave the red book to mary"], padding=True,
                              return_tensors="pt")
    with torch.no_grad():
        ref = hf(**enc, output_attentions=True).attentions
    acts = forward(tiny_bert, enc["input_ids"], enc["attention_mask"], pattern_names(2))
    for layer in range(2):
        assert torch.allclose(acts[f"blocks.{layer}.attn.hook_pattern"], ref[layer], atol=1e-6)


def test_uncached_hub_model_fails_fast_with_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ProbeError) as err:
        load("bert-base")
    msg = str(err.value)
    assert "bert-base-cased" in msg and "not in the local cache" in msg and "--model minilm" in msg
    assert "\n" not in msg


def test_alias_typo_suggests_the_alias():
    with pytest.raises(ProbeError, match="did you mean 'gpt2'"):
        load("gtp2")


def test_directory_without_model_files_is_explained(tmp_path):
    with pytest.raises(ProbeError, match="neither config.json"):
        load(str(tmp_path))
    with pytest.raises(ProbeError, match="does not exist"):
        load(str(tmp_path / "missing" / "model"))


@pytest.mark.parametrize("bad", ["gpu", "cuda:7", "tpu"])
def test_bad_devices_are_refused(bad):
    if bad.startswith("cuda") and torch.cuda.device_count() > 7:
        pytest.skip("machine has 8+ GPUs")
    with pytest.raises(ProbeError):
        resolve_device(bad)


def test_native_spec_parsing_and_errors():
    cfg = NativeConfig.parse("native:layers=3,d_model=48,heads=4,attn_only=false,norm=none")
    assert (cfg.layers, cfg.d_model, cfg.heads, cfg.attn_only, cfg.norm, cfg.head_dim) == (3, 48, 4, False, "none", 12)
    with pytest.raises(ProbeError, match="did you mean 'layers'"):
        NativeConfig.parse("native:layer=2")
    with pytest.raises(ProbeError, match="not divisible"):
        NativeConfig.parse("native:d_model=50,heads=4")
    with pytest.raises(ProbeError, match="cannot read"):
        NativeConfig.parse("native:layers=two")


def test_native_model_checkpoint_round_trip_is_bit_identical(tmp_path):
    model = load("native:layers=2,d_model=32,heads=4,d_vocab=50,n_ctx=32,seed=3", device="cpu")
    assert model.tokenizer is None and model.info.n_layers == 2
    out = save_checkpoint(model, tmp_path / "ckpt", extra={"step": 7})
    meta = json.loads((out / "depthprobe.json").read_text())
    assert meta["step"] == 7 and meta["native"]["layers"] == 2
    again = load(str(out), device="cpu")
    a = model.bridge.state_dict()
    b = again.bridge.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert again.info.source == "checkpoint" and again.info.weights.startswith("sha256:")
    x = torch.randint(0, 50, (2, 10))
    with torch.no_grad():
        assert torch.equal(model.bridge(x), again.bridge(x))


def test_different_seeds_give_different_native_weights():
    a = load("native:layers=1,d_model=16,heads=2,seed=0", device="cpu").bridge.state_dict()
    b = load("native:layers=1,d_model=16,heads=2,seed=1", device="cpu").bridge.state_dict()
    assert any(not torch.equal(a[k], b[k]) for k in a if a[k].numel() > 1)


def test_checkpoint_without_weights_is_explained(tmp_path):
    (tmp_path / "depthprobe.json").write_text(json.dumps({"native": {"layers": 1}}))
    with pytest.raises(ProbeError, match="has no model.safetensors"):
        load_checkpoint(tmp_path)
