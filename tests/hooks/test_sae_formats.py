"""#46.5: BatchTopK and gated SAEs in sae-lens's formats, computed as sae-lens computes them
(written out here by hand), and transcoders refused in one line naming the field."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

import depthprobe.probes as probes
from depthprobe.probes.base.errors import ProbeError

SPEC = "native:layers=2,d_model=8,heads=2,d_vocab=20,n_ctx=16,attn_only=false"
HOOK = "blocks.1.hook_resid_pre"
D, N = 8, 12


def tensors(seed: int = 0, gated: bool = False) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    t = {"W_enc": torch.randn(D, N, generator=g), "W_dec": torch.randn(N, D, generator=g)}
    t["b_dec"] = torch.randn(D, generator=g) * 0.1
    if gated:
        return t | {name: torch.randn(N, generator=g) * 0.3 for name in ("b_gate", "r_mag", "b_mag")}
    return t | {"b_enc": torch.randn(N, generator=g) * 0.1}


def folder(tmp_path, cfg, t):
    save_file(t, str(tmp_path / "sae_weights.safetensors"))
    (tmp_path / "cfg.json").write_text(json.dumps({"d_in": D, "d_sae": N, "metadata": {"hook_name": HOOK}} | cfg))
    return tmp_path


X = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(4))


def test_gated_sae_equals_sae_lens_gated_maths(tmp_path):
    t = tensors(gated=True)
    sae = probes.load_sae(folder(tmp_path, {"architecture": "gated"}, t))
    x = X - t["b_dec"]
    gate = (x @ t["W_enc"] + t["b_gate"]) > 0
    magnitude = (x @ (t["W_enc"] * t["r_mag"].exp()) + t["b_mag"]).relu()
    hand = gate * magnitude
    acts, undo = sae.encode(X)
    assert torch.allclose(acts, hand, atol=1e-6) and 0 < int((hand > 0).sum()) < hand.numel()
    assert torch.allclose(sae.decode(acts, undo, X.shape), hand @ t["W_dec"] + t["b_dec"], atol=1e-5)
    assert torch.allclose(sae(X), X, atol=1e-5)  # the error term restores the input
    again = probes.load_sae(probes.save_sae(sae, tmp_path / "again"))
    assert again.cfg == sae.cfg and torch.equal(again.encode(X)[0], acts)


def test_a_gated_sae_without_its_gate_is_one_line(tmp_path):
    t = tensors(gated=True)
    del t["b_gate"]
    with pytest.raises(ProbeError, match=r"the SAE has no 'b_gate' tensor \(a gated SAE needs"):
        probes.load_sae(folder(tmp_path, {"architecture": "gated"}, t))


@pytest.mark.parametrize("rescale", [False, True])
def test_batchtopk_runs_as_a_jumprelu_at_its_trained_threshold(tmp_path, rescale):
    t = tensors() | {"topk_threshold": torch.tensor(0.7, dtype=torch.float64)}
    cfg = {"architecture": "batchtopk", "k": 2.5, "rescale_acts_by_decoder_norm": rescale}
    sae = probes.load_sae(folder(tmp_path, cfg, t))
    norm = t["W_dec"].norm(dim=-1) if rescale else torch.ones(N)
    pre = ((X - t["b_dec"]) @ t["W_enc"] + t["b_enc"]) * norm
    hand = torch.where(pre > 0.7, pre.relu(), 0.0)
    acts, undo = sae.encode(X)
    assert torch.allclose(acts, hand, atol=1e-6) and 0 < int((hand > 0).sum()) < hand.numel()
    assert torch.allclose(sae.decode(acts, undo, X.shape), (hand / norm) @ t["W_dec"] + t["b_dec"], atol=1e-5)
    again = probes.load_sae(probes.save_sae(sae, tmp_path / "again"))  # written with its threshold [d_sae]
    assert again.cfg == sae.cfg and torch.equal(again.encode(X)[0], acts)


def test_a_batchtopk_sae_without_a_threshold_is_one_line(tmp_path):
    with pytest.raises(ProbeError, match="runs as a JumpReLU with its trained 'topk_threshold'"):
        probes.load_sae(folder(tmp_path, {"architecture": "batchtopk", "k": 4}, tensors()))


@pytest.mark.parametrize(
    "cfg",
    [
        {"architecture": "transcoder", "d_out": D, "hook_name_out": "blocks.1.hook_mlp_out"},
        {"hook_name_out": "blocks.1.hook_mlp_out"},
        {"architecture": "jumprelu_transcoder"},
    ],
)
def test_transcoders_are_refused_naming_the_field(tmp_path, cfg):
    with pytest.raises(ProbeError, match=r"the SAE config's '(hook_name_out|d_out)' .* makes it a transcoder") as err:
        probes.load_sae(folder(tmp_path, cfg, tensors()))
    assert "\n" not in str(err.value)


def test_a_gated_sae_attached_leaves_the_logits_and_patches_latents(tmp_path):
    model = probes.load(SPEC, device="cpu")
    sae = probes.load_sae(folder(tmp_path, {"architecture": "gated"}, tensors(gated=True)))
    ids = torch.randint(0, 20, (2, 6), generator=torch.Generator().manual_seed(0))
    plain = model.bridge(ids)
    with probes.attach_sae(model, sae):
        logits, cache = probes.run_with_cache(model, ids, names=f"{HOOK}.hook_sae_acts_post")
    assert (logits - plain).abs().max() < 1e-5
    _, x = probes.run_with_cache(model, ids, names=HOOK)
    assert torch.allclose(cache[f"{HOOK}.hook_sae_acts_post"], sae.encode(x[HOOK])[0], atol=1e-5)
