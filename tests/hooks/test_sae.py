"""SAEs: loaded from a sae-lens folder or a plain safetensors file, attached to a model, their
latents captured, patched and attributed like any hook, against answers computed by hand."""

import json

import pytest
import torch
from safetensors.torch import save_file

import depthprobe.probes as probes
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.hooks.capture import capture
from depthprobe.probes.models.sae import SAE, SAEConfig

SPEC = "native:layers=2,d_model=8,heads=2,d_vocab=20,n_ctx=16,attn_only=false"
HOOK = "blocks.1.hook_resid_pre"
D = 8


@pytest.fixture(scope="module")
def model():
    return probes.load(SPEC)


def identity_sae() -> SAE:
    """Latents [relu(x), relu(-x)], reconstruction relu(x) - relu(-x) = x: no error at all."""
    eye = torch.eye(D)
    tensors = {"W_enc": torch.cat([eye, -eye], 1), "b_enc": torch.zeros(2 * D)}
    tensors |= {"W_dec": torch.cat([eye, -eye], 0), "b_dec": torch.zeros(D)}
    return SAE(SAEConfig(D, 2 * D, HOOK), tensors)


@pytest.fixture(scope="module")
def pair():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 20, (3, 6), generator=g), torch.randint(0, 20, (3, 6), generator=g)


def random_tensors(d_sae: int = 12, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "W_enc": torch.randn(D, d_sae, generator=g),
        "b_enc": torch.randn(d_sae, generator=g) * 0.1,
        "W_dec": torch.randn(d_sae, D, generator=g),
        "b_dec": torch.randn(D, generator=g) * 0.1,
    }


def random_sae(**cfg) -> SAE:
    t = random_tensors()
    return SAE(SAEConfig(D, 12, HOOK, **cfg), t)


def resid(model, ids):
    _, cache = probes.run_with_cache(model, ids, names=HOOK)
    return cache[HOOK]


def test_identity_sae_latents_reconstruction_and_error_are_known(model, pair):
    ids = pair[0]
    x = resid(model, ids)
    with probes.attach_sae(model, identity_sae()):
        _, cache = probes.run_with_cache(model, ids, names=f"{HOOK}.*")
    assert torch.equal(cache[f"{HOOK}.hook_sae_acts_post"], torch.cat([x.relu(), (-x).relu()], -1))
    assert torch.allclose(cache[f"{HOOK}.hook_sae_recons"], x, atol=1e-6)
    assert cache[f"{HOOK}.hook_sae_error"].abs().max() < 1e-6
    assert torch.equal(cache[f"{HOOK}.hook_sae_input"], x)


def test_with_the_error_term_the_logits_are_the_models_and_names_go_on_exit(model, pair):
    ids = pair[0]
    plain = probes.run_with_cache(model, ids, names=HOOK)[0]
    sae = random_sae()
    with probes.attach_sae(model, sae):
        logits, cache = probes.run_with_cache(model, ids, names=[f"{HOOK}.hook_sae_recons", f"{HOOK}.hook_sae_error"])
        assert (cache[f"{HOOK}.hook_sae_error"]).abs().max() > 0.1  # a poor dictionary: the error term matters
    assert (logits - plain).abs().max() < 1e-5
    assert not [n for n in model.bridge.hook_dict if "hook_sae" in n]
    x = resid(model, ids)  # the reconstruction by hand: relu((x - b_dec) W_enc + b_enc) W_dec + b_dec
    t = random_tensors()
    hand = ((x - t["b_dec"]) @ t["W_enc"] + t["b_enc"]).relu() @ t["W_dec"] + t["b_dec"]
    assert torch.allclose(cache[f"{HOOK}.hook_sae_recons"], hand, atol=1e-5)


def test_both_formats_load_the_same_sae(model, pair, tmp_path):
    sae = random_sae()
    folder = probes.save_sae(sae, tmp_path / "folder")
    save_file(random_tensors(), str(tmp_path / "plain.safetensors"))
    raw = json.loads((folder / "cfg.json").read_text())
    assert raw["metadata"]["hook_name"] == HOOK and raw["architecture"] == "standard"  # sae-lens 6's layout
    a = probes.load_sae(folder)
    b = probes.load_sae(tmp_path / "plain.safetensors", hook_name=HOOK)
    assert a.cfg == b.cfg == sae.cfg
    names = f"{HOOK}.hook_sae_acts_post"
    with probes.attach_sae(model, a):
        ca = probes.run_with_cache(model, pair[0], names=names)[1]
    with probes.attach_sae(model, b):
        cb = probes.run_with_cache(model, pair[0], names=names)[1]
    assert torch.equal(ca[names], cb[names])


def test_sae_lens_configs_old_and_new(tmp_path):
    t = random_tensors() | {"threshold": torch.full((12,), 0.5)}
    save_file(t, str(tmp_path / "sae_weights.safetensors"))
    old = {"d_in": D, "d_sae": 12, "hook_point": HOOK, "activation_fn_str": "topk", "activation_fn_kwargs": {"k": 3}}
    (tmp_path / "cfg.json").write_text(json.dumps(old))
    sae = probes.load_sae(tmp_path)
    assert (sae.cfg.architecture, sae.cfg.k, sae.cfg.hook_name) == ("topk", 3, HOOK)
    new = {"d_in": D, "d_sae": 12, "architecture": "jumprelu", "apply_b_dec_to_input": False}
    (tmp_path / "cfg.json").write_text(json.dumps(new | {"metadata": {"hook_name": "blocks.0.hook_resid_post"}}))
    sae = probes.load_sae(tmp_path)
    assert (sae.cfg.architecture, sae.cfg.hook_name, sae.cfg.apply_b_dec_to_input) == (
        "jumprelu",
        "blocks.0.hook_resid_post",
        False,
    )


def test_activations_by_hand():
    """JumpReLU keeps pre where pre > threshold; TopK keeps the k largest; the two normalisations."""
    t = random_tensors() | {"threshold": torch.linspace(-0.5, 0.5, 12)}
    x = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(3))
    pre = (x - t["b_dec"]) @ t["W_enc"] + t["b_enc"]
    jump = SAE(SAEConfig(D, 12, architecture="jumprelu"), t).encode(x)[0]
    assert torch.equal(jump, torch.where(pre > t["threshold"], pre.relu(), 0.0))
    top = SAE(SAEConfig(D, 12, architecture="topk", k=3), t).encode(x)[0]
    kth = pre.topk(3, -1).values[..., -1:]
    assert torch.equal(top, torch.where(pre >= kth, pre.relu(), 0.0))
    rescale = SAE(SAEConfig(D, 12, normalize_activations="constant_norm_rescale"), t)
    s = D**0.5 / x.norm(dim=-1, keepdim=True)
    assert torch.allclose(rescale.encode(x)[0], ((x * s - t["b_dec"]) @ t["W_enc"] + t["b_enc"]).relu(), atol=1e-5)
    assert torch.allclose(rescale(x), x, atol=1e-5)  # with its error term, the identity
    ln = SAE(SAEConfig(D, 12, normalize_activations="layer_norm"), t)
    assert torch.allclose(ln(x), x, atol=1e-5)


def test_hook_z_sae_flattens_heads(model, pair):
    z = "blocks.0.attn.hook_z"  # [batch, pos, head 2, d_head 4]: the SAE reads 8 values per position
    sae = SAE(SAEConfig(D, 12, z, reshape_activations="hook_z"), random_tensors())
    plain, cache = probes.run_with_cache(model, pair[0], names=z)
    with probes.attach_sae(model, sae):
        logits, c = probes.run_with_cache(model, pair[0], names=f"{z}.hook_sae_acts_post")
    t = random_tensors()
    hand = ((cache[z].flatten(-2) - t["b_dec"]) @ t["W_enc"] + t["b_enc"]).relu()
    assert torch.allclose(c[f"{z}.hook_sae_acts_post"], hand, atol=1e-6)
    assert (logits - plain).abs().max() < 1e-5


def logit_diff(logits):
    return logits[:, -1, 3] - logits[:, -1, 5]


def latents(model, ids, sae):
    with probes.attach_sae(model, sae):
        return probes.run_with_cache(model, ids, names=f"{HOOK}.hook_sae_acts_post")[1][f"{HOOK}.hook_sae_acts_post"]


def test_patching_one_latent_equals_writing_its_decoder_row(model, pair):
    """Patching latent i at position p adds (clean - corrupt latent) * W_dec[i] to the residual there."""
    clean, corrupt = pair
    sae = random_sae()
    a_clean, a_corrupt = latents(model, clean, sae), latents(model, corrupt, sae)
    with probes.attach_sae(model, sae):
        df = probes.patch(
            model, clean, corrupt, f"{HOOK}.hook_sae_acts_post", logit_diff, per="latent_position", positions=[4]
        )
    assert len(df) == 12 and list(df["latent"]) == list(range(12)) and set(df["position"]) == {4}
    for i in (0, 5, 11):
        delta = (a_clean[:, 4, i] - a_corrupt[:, 4, i])[:, None] * sae.W_dec[i]  # [batch, d_model]

        def add(t, hook, delta=delta):
            t = t.clone()
            t[:, 4] += delta
            return t

        with torch.no_grad(), capture(model, {HOOK: add}, store=False):
            hand = logit_diff(model.bridge(corrupt)).mean()
        assert abs(df.loc[df["latent"] == i, "value"].item() - float(hand)) < 1e-5


def test_attribution_of_latents_equals_the_gradient_by_hand(model, pair):
    """d metric / d latent i at p = W_dec[i] . d metric / d residual at p (the error term fixed)."""
    clean, corrupt = pair
    sae = random_sae()
    a_clean, a_corrupt = latents(model, clean, sae), latents(model, corrupt, sae)
    with torch.enable_grad(), capture(model, HOOK, grad=True) as acts:
        value = logit_diff(model.bridge(corrupt))
        (g,) = torch.autograd.grad(value.sum(), [acts[HOOK]])  # [batch, pos, d_model]
    hand = value.detach()[:, None, None] + (a_clean - a_corrupt) * (g @ sae.W_dec.T)  # [batch, pos, latent]
    with probes.attach_sae(model, sae):
        df = probes.attribute(
            model, clean, corrupt, logit_diff, f"{HOOK}.hook_sae_acts_post", per="latent_position", check=0
        )
    assert len(df) == 6 * 12
    for row in df.itertuples():
        assert abs(row.value - float(hand[:, row.position, row.latent].mean())) < 1e-5


def test_per_latent_sums_positions(model, pair):
    clean, corrupt = pair
    with probes.attach_sae(model, random_sae()):
        name = f"{HOOK}.hook_sae_acts_post"
        by_latent = probes.attribute(model, clean, corrupt, logit_diff, name, check=0)
        by_both = probes.attribute(model, clean, corrupt, logit_diff, name, per="latent_position", check=0)
    corrupt_value = by_latent.attrs["corrupt"]
    summed = (by_both.assign(change=by_both["value"] - corrupt_value)).groupby("latent")["change"].sum()
    assert torch.allclose(torch.tensor(by_latent["value"].to_numpy() - corrupt_value), torch.tensor(summed.to_numpy()))


def test_errors_are_one_line(model, tmp_path):
    with pytest.raises(ProbeError, match="no SAE weights at"):
        probes.load_sae(tmp_path / "missing.safetensors", hook_name=HOOK)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ProbeError, match=r"has no cfg\.json"):
        probes.load_sae(tmp_path / "empty")
    wide = SAE(SAEConfig(16, 4, HOOK), {k: v for k, v in _sized(16, 4).items()})
    too_wide = r"reads 16 values per position but blocks\.1\.hook_resid_pre .* \(8\)"
    with pytest.raises(ProbeError, match=too_wide), probes.attach_sae(model, wide):
        pass
    suggestion = r"did you mean 'blocks\.1\.hook_resid_pre'"
    with (
        pytest.raises(ProbeError, match=suggestion),
        probes.attach_sae(model, identity_sae(), hook="blocks.1.hook_resid_pr"),
    ):
        pass
    with (
        probes.attach_sae(model, identity_sae()),
        pytest.raises(ProbeError, match="already attached"),
        probes.attach_sae(model, identity_sae()),
    ):
        pass
    with pytest.raises(ProbeError, match="expected \\[8, 12\\]"):
        SAE(SAEConfig(D, 12), random_tensors() | {"W_enc": torch.zeros(8, 3)})
    with pytest.raises(ProbeError, match="normalize_activations='expected_average_only_in' is not supported"):
        SAEConfig(D, 12, normalize_activations="expected_average_only_in")
    with pytest.raises(ProbeError, match="per='head' does not cut"), probes.attach_sae(model, identity_sae()):
        probes.patch(model, [[1, 2]], [[2, 1]], f"{HOOK}.hook_sae_acts_post", logit_diff, per="head")


def _sized(d_in, d_sae):
    return {"W_enc": torch.zeros(d_in, d_sae), "b_enc": torch.zeros(d_sae)} | {
        "W_dec": torch.zeros(d_sae, d_in),
        "b_dec": torch.zeros(d_in),
    }


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_weights_leave_the_model_unchanged(model, pair, tmp_path, dtype):
    """Stored in bf16 or fp16, the SAE computes in the model's precision: the logits stay the model's."""
    plain = probes.run_with_cache(model, pair[0], names=HOOK)[0]
    save_file({k: v.to(dtype) for k, v in random_tensors().items()}, str(tmp_path / "low.safetensors"))
    sae = probes.load_sae(tmp_path / "low.safetensors", hook_name=HOOK)
    assert sae.W_enc.dtype == torch.float32
    with probes.attach_sae(model, sae):
        logits = probes.run_with_cache(model, pair[0], names=HOOK)[0]
    assert (logits - plain).abs().max() < 1e-5


def test_integer_and_non_finite_weights_are_refused_at_load(tmp_path):
    ints = {k: (v * 10).long() for k, v in random_tensors().items()}
    save_file(ints, str(tmp_path / "int.safetensors"))
    with pytest.raises(ProbeError, match=r"W_enc holds int64 values; an SAE's weights are floating point") as err:
        probes.load_sae(tmp_path / "int.safetensors", hook_name=HOOK)
    assert "\n" not in str(err.value)
    for bad in (float("nan"), float("inf")):
        t = random_tensors()
        t["b_dec"][3] = bad
        save_file(t, str(tmp_path / "bad.safetensors"))
        with pytest.raises(ProbeError, match=r"the SAE's b_dec holds NaN or inf") as err:
            probes.load_sae(tmp_path / "bad.safetensors", hook_name=HOOK)
        assert "\n" not in str(err.value)


def _folder(tmp_path, cfg, tensors=None):
    save_file(tensors or random_tensors(), str(tmp_path / "sae_weights.safetensors"))
    (tmp_path / "cfg.json").write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    return tmp_path


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        ("[1, 2]", r"the SAE's config is list \[1, 2\], not a JSON object"),
        ("null", "the SAE's config is NoneType None, not a JSON object"),
        ({"d_in": D, "d_sae": 12, "metadata": [HOOK]}, "the SAE's metadata is list"),
        ({"d_in": D, "d_sae": 12, "metadata": {"hook_name": 5}}, r"'hook_name' is 5, not a hook name"),
        ({"d_in": D, "d_sae": 12, "hook_point": ["x"]}, r"'hook_point' is \['x'\], not a hook name"),
        ({"d_in": D, "d_sae": 12, "apply_b_dec_to_input": "false"}, r"'apply_b_dec_to_input' is 'false', not true"),
        ({"d_in": D, "d_sae": 12, "architecture": 3}, r"'architecture' is 3, not a string"),
        ({"d_in": D, "d_sae": 12, "activation_fn_kwargs": "k=3"}, "activation_fn_kwargs is str"),
        ({"d_in": True, "d_sae": 12}, r"'d_in' is True, not a positive integer"),
        ({"d_in": -8, "d_sae": 12}, r"no positive integer 'd_in'"),
        ("[" * 100_000 + "]" * 100_000, "nests too deeply"),
        ({"d_in": D, "d_sae": 12, "architecture": "jumprelu", "rescale_acts_by_decoder_norm": True}, "topk SAEs only"),
    ],
)
def test_malformed_configs_are_one_line(tmp_path, cfg, match):
    folder = _folder(tmp_path, cfg)
    with pytest.raises(ProbeError, match=match) as err:
        probes.load_sae(folder)
    assert "\n" not in str(err.value) and len(str(err.value)) < 300


def test_a_hook_name_that_is_not_a_string_is_one_line(tmp_path):
    save_file(random_tensors(), str(tmp_path / "plain.safetensors"))
    with pytest.raises(ProbeError, match=r"hook_name must be a hook name, e.g\. 'blocks\.0\.hook_resid_post', got 5"):
        probes.load_sae(tmp_path / "plain.safetensors", hook_name=5)


def test_saes_that_would_fail_mid_pass_are_refused_at_load_or_attach(model, pair, tmp_path):
    scale = random_tensors() | {"finetuning_scaling_factor": torch.full((5,), 2.0)}
    with pytest.raises(ProbeError, match=r"scaling_factor has shape \[5\], expected \[12\]"):
        probes.load_sae(_folder(tmp_path, {"d_in": D, "d_sae": 12, "metadata": {"hook_name": HOOK}}, scale))
    z = SAE(SAEConfig(D, 12, HOOK, reshape_activations="hook_z"), random_tensors())
    hook_z = r"reshape_activations='hook_z'\) but blocks\.1\.hook_resid_pre has \[8\]"
    with pytest.raises(ProbeError, match=hook_z), probes.attach_sae(model, z):
        pass
    one = SAE(SAEConfig(1, 12, "blocks.0.attn.hook_pattern"), _sized(1, 12))
    with pytest.raises(ProbeError, match="holds attention over positions"), probes.attach_sae(model, one):
        pass
    assert not [n for n in model.bridge.hook_dict if "hook_sae" in n]


def test_topk_rescaled_by_decoder_norm_equals_sae_lens_maths(tmp_path):
    """sae-lens's TopKSAE with rescale_acts_by_decoder_norm: pre * |W_dec row| before the top k,
    latents / |W_dec row| before decoding (written out here by hand)."""
    t = random_tensors()
    t["W_dec"] = t["W_dec"] * torch.linspace(0.1, 3.0, 12)[:, None]  # rows of very different norms
    cfg = {"d_in": D, "d_sae": 12, "architecture": "topk", "k": 3, "rescale_acts_by_decoder_norm": True}
    sae = probes.load_sae(_folder(tmp_path, cfg | {"metadata": {"hook_name": HOOK}}, t))
    x = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(4))
    norm = t["W_dec"].norm(dim=-1)
    pre = ((x - t["b_dec"]) @ t["W_enc"] + t["b_enc"]) * norm
    kth = pre.topk(3, -1).values[..., -1:]
    hand = torch.where(pre >= kth, pre.relu(), 0.0)
    acts, undo = sae.encode(x)
    assert torch.allclose(acts, hand, atol=1e-6)
    plain = SAE(SAEConfig(D, 12, architecture="topk", k=3), t).encode(x)[0]
    assert not torch.equal(acts != 0, plain != 0)  # the rescale picks other latents here
    assert torch.allclose(sae.decode(acts, undo, x.shape), (hand / norm) @ t["W_dec"] + t["b_dec"], atol=1e-5)
    assert torch.allclose(sae(x), x, atol=1e-5)
    again = probes.load_sae(probes.save_sae(sae, tmp_path / "again"))
    assert again.cfg == sae.cfg
