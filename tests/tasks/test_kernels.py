"""Signal-propagation kernels: metrics on matrices with known kernels, the E-SPA/U-SPA
construction, the infinite-width recursion against finite-width Monte Carlo, the SPA model
family, the kernels task (tiny models, SPA models, minilm) and the sweep, and CLI bad inputs."""

import io
import math

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from depthprobe.probes.api.run import run
from depthprobe.probes.api.sweep import sweep
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.hooks.capture import forward
from depthprobe.probes.measures import kernels
from depthprobe.probes.models import variant_net, variants
from depthprobe.probes.training.copy_task import train_copy
from tests.helpers import cli_error, probe_cli
from tests.reference.kernels import uniform_recursion

runner = CliRunner()


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These tensors are small: one thread is as fast, and far faster when the cores are shared."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ----------------------------------------------------------------------------- metrics


def test_identical_tokens_collapse_completely():
    x = torch.randn(1, 32).repeat(10, 1)  # [T=10, d=32], every row the same
    assert kernels.mean_offdiag_cosine(x) == pytest.approx(1.0, abs=1e-12)
    assert kernels.residual_ratio(x, norm="fro") == 0.0
    assert kernels.residual_ratio(x, norm="l1inf") == 0.0
    assert kernels.effective_rank(x) == 0.0
    assert kernels.effective_rank_uncentred(x) == pytest.approx(1.0, abs=1e-12)  # rank one: exactly 1
    c = kernels.normalised(kernels.kernel(x))
    assert torch.allclose(c, torch.ones(10, 10, dtype=torch.float64))


def test_orthogonal_tokens_have_zero_cosine_and_full_rank():
    t, d = 12, 20
    x = math.sqrt(d) * torch.eye(d)[:t]  # orthogonal rows, each of squared norm d
    assert torch.allclose(kernels.kernel(x), torch.eye(t, dtype=torch.float64))
    assert kernels.mean_offdiag_cosine(x) == pytest.approx(0.0, abs=1e-12)
    # centring removes one direction: full rank of the centred X is T - 1, all singular values equal
    assert kernels.effective_rank(x) == pytest.approx(t - 1, abs=1e-9)
    assert kernels.effective_rank_uncentred(x) == pytest.approx(t, abs=1e-9)  # T equal singular values
    assert kernels.residual_ratio(x) == pytest.approx(math.sqrt((t - 1) / t), abs=1e-12)


def test_uncentred_effective_rank_detects_collapse_that_the_centred_one_misses():
    """A common token plus an isotropic spread eps its size: the centred rank stays near full at
    every eps, the uncentred one falls to 1 as eps -> 0."""
    gen = torch.Generator().manual_seed(0)
    t, d = 16, 64
    common = torch.randn(1, d, generator=gen, dtype=torch.float64)
    noise = torch.randn(t, d, generator=gen, dtype=torch.float64)
    un = []
    for eps in (1e-1, 1e-3, 1e-5):
        x = common + eps * noise
        assert kernels.effective_rank(x) > 10
        un.append(float(kernels.effective_rank_uncentred(x)))
    assert un[0] > un[1] > un[2] and un[1] < 1.05 and un[2] == pytest.approx(1.0, abs=1e-3)
    # two orthogonal directions with singular values 3 and 1: exp(entropy of (3/4, 1/4))
    y = torch.tensor([[3.0, 0.0], [0.0, 1.0]])
    p = torch.tensor([0.75, 0.25], dtype=torch.float64)
    assert kernels.effective_rank_uncentred(y) == pytest.approx(float(torch.exp(-(p * p.log()).sum())), abs=1e-9)


def test_contraction_exponents_of_geometric_and_cubic_sequences():
    geo = 0.5 ** np.arange(6, dtype=float)  # r_l = 2^-l: exponent l / (l - 1), layer 0 and 1 undefined
    e = kernels.contraction_exponents(geo)
    assert np.isnan(e[0]) and np.isnan(e[1])  # log r_0 = 0
    assert e[2:] == pytest.approx([2 / 1, 3 / 2, 4 / 3, 5 / 4])
    cubic = 0.5 ** (3.0 ** np.arange(5))  # r_l = r_{l-1}^3
    assert kernels.contraction_exponents(cubic)[1:] == pytest.approx([3.0] * 4)
    assert np.isnan(kernels.contraction_exponents([0.5, 0.0, 0.1])[1:]).all()  # log 0 undefined


def test_effective_rank_of_known_spectrum():
    a, b = 3.0, 1.0  # centred X with singular values sqrt(2) a and sqrt(2) b
    x = torch.tensor([[a, 0.0], [-a, 0.0], [0.0, b], [0.0, -b]])
    p = torch.tensor([a, b], dtype=torch.float64) / (a + b)
    assert kernels.effective_rank(x) == pytest.approx(float(torch.exp(-(p * p.log()).sum())), abs=1e-9)


def test_composite_norm_is_max_column_sum_times_max_row_sum():
    m = torch.tensor([[1.0, -2.0], [3.0, 4.0]])  # column sums 4, 6; row sums 3, 7
    assert kernels.composite_norm(m) == pytest.approx(math.sqrt(6 * 7))


def test_masked_rows_do_not_count():
    x = torch.randn(2, 6, 16)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    stats, c = kernels.sequence_stats(x, mask)
    alone, _ = kernels.sequence_stats(x[:1, :4], None)
    for name in stats:
        assert stats[name][0] == pytest.approx(float(alone[name][0]), abs=1e-9), name
    assert torch.all(c[0, 4:] == 0) and torch.all(c[0, :, 4:] == 0)
    assert kernels.mean_offdiag_cosine(x[0, :1]) != kernels.mean_offdiag_cosine(x[0, :1])  # one token: NaN


def test_batched_equals_single():
    x = torch.randn(3, 7, 9)
    for b in range(3):
        assert kernels.effective_rank(x)[b] == pytest.approx(float(kernels.effective_rank(x[b])), abs=1e-9)
        assert kernels.residual_ratio(x, norm="l1inf")[b] == pytest.approx(
            float(kernels.residual_ratio(x[b], norm="l1inf"))
        )


def test_centred_gram_equals_gram_of_centred_rows():
    x = torch.randn(2, 7, 5, dtype=torch.float64)
    m = torch.tensor([[1, 1, 1, 1, 1, 0, 0], [1] * 7], dtype=torch.bool)
    xm = x * m[..., None]
    explicit = kernels.centred(xm, m) @ kernels.centred(xm, m).transpose(-1, -2)
    assert torch.allclose(kernels.centred_gram(xm @ xm.transpose(-1, -2), m), explicit, atol=1e-12)


def test_kernel_stats_match_measurement_of_the_same_matrix():
    x = torch.randn(10, 40, dtype=torch.float64)
    th = kernels.kernel_stats(kernels.kernel(x))
    assert th["mean_cosine"] == pytest.approx(float(kernels.mean_offdiag_cosine(x)), abs=1e-12)
    assert th["resid_ratio_fro"] == pytest.approx(float(kernels.residual_ratio(x)), abs=1e-12)
    assert th["effective_rank_centred"] == pytest.approx(float(kernels.effective_rank(x)), abs=1e-9)
    assert th["effective_rank_uncentred"] == pytest.approx(float(kernels.effective_rank_uncentred(x)), abs=1e-9)


def test_bad_metric_inputs():
    with pytest.raises(ValueError, match="norm"):
        kernels.residual_ratio(torch.randn(3, 4), norm="l2")
    with pytest.raises(ValueError, match=r"\[T, d\]"):
        kernels.mean_offdiag_cosine(torch.randn(4))


# ----------------------------------------------------------------------------- theory


def test_uniform_causal_reference_values():
    s = uniform_recursion(128, 8)
    got = [float(kernels.mean_offdiag(kernels.normalised(s[layer_idx]))) for layer_idx in (1, 2, 4, 8)]
    assert got == pytest.approx([0.67, 0.90, 0.975, 0.9985], abs=0.005)
    assert got == sorted(got)


def test_bidirectional_uniform_collapses_in_one_layer_and_skip_by_hand():
    s = uniform_recursion(5, 1, causal=False)
    assert torch.allclose(kernels.normalised(s[1]), torch.ones(5, 5, dtype=torch.float64))
    a = kernels.uniform_attention(2)  # [[1, 0], [.5, .5]]
    got = kernels.attention_step(torch.eye(2, dtype=torch.float64), a, skip=True, alpha=1.0)
    assert torch.allclose(got, torch.tensor([[2.0, 0.5], [0.5, 1.5]], dtype=torch.float64))


def test_relu_map_preserves_norms_and_maps_orthogonal_to_one_over_pi():
    out = kernels.relu_step(torch.eye(3, dtype=torch.float64) * 2.0)
    assert torch.allclose(torch.diagonal(out), torch.full((3,), 2.0, dtype=torch.float64))
    assert float(out[0, 1]) == pytest.approx(2.0 / math.pi)


@pytest.mark.parametrize("kind", ["e-spa", "u-spa"])
@pytest.mark.parametrize("depth", [1, 8, 64])
def test_spa_construction_hits_every_target(kind, depth):
    t = 48
    targets = kernels.target_kernels(kind, t, depth)  # [L+1, T, T]
    attn = kernels.spa_attentions(kind, t, depth)  # [L, T, T]
    assert torch.equal(targets[0], torch.eye(t, dtype=torch.float64))
    rebuilt = attn @ targets[:-1] @ attn.transpose(-1, -2)  # A_l Sigma_{l-1} A_l^T for every l
    assert float((rebuilt - targets[1:]).abs().max()) < 1e-6
    assert torch.all(torch.triu(attn, 1) == 0)  # causal
    assert float(attn.min()) >= -1e-12  # realisable by a softmax
    if kind == "e-spa":
        assert float(targets[-1][0, 1]) == pytest.approx(math.exp(-0.005))
    else:
        assert float(targets[-1][0, 1]) == pytest.approx(0.8)


def test_espa_schedule_formula():
    for layer_idx in (1, 5, 16):
        g = kernels.espa_gamma(layer_idx, 16, 0.005)
        assert 1 - math.exp(-2 * g) == pytest.approx((1 - math.exp(-0.01)) ** (layer_idx / 16))
    assert math.isinf(kernels.espa_gamma(0, 16)) and kernels.espa_gamma(16, 16) == pytest.approx(0.005)
    assert kernels.uspa_rho(0, 8) == 0.0 and kernels.uspa_rho(8, 8) == pytest.approx(0.8)


def test_softmax_realisation_reproduces_attention_without_nan():
    a = kernels.spa_attentions("e-spa", 128, 64)[0]  # first layer: entries down to ~1e-75
    bias, d = kernels.softmax_realisation(a)
    assert float(bias.min()) >= -80.0 and torch.isfinite(bias).all()
    causal = torch.tril(torch.ones(128, 128, dtype=torch.bool))
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-5)):
        p = bias.to(dtype).masked_fill(~causal, float("-inf")).softmax(-1)
        rebuilt = d.to(dtype)[:, None] * p
        assert torch.isfinite(rebuilt).all()
        assert torch.allclose(rebuilt.double(), a, atol=tol, rtol=0)
    with pytest.raises(ProbeError, match="negative"):
        kernels.softmax_realisation(torch.tensor([[1.0, 0.0], [-0.5, 1.0]]))


def test_recursion_matches_finite_width_monte_carlo():
    """X <- A X W with fan-in Gaussian W: the kernel follows A S A^T (no skip) and
    S + A S A^T (skip) up to O(1/sqrt(width)) fluctuations, averaged over draws."""
    gen = torch.Generator().manual_seed(0)
    t, d, depth, draws = 10, 256, 3, 40
    a = kernels.uniform_attention(t)
    for skip in (False, True):
        theory = uniform_recursion(t, depth, skip=skip)[-1]
        est = torch.zeros(t, t, dtype=torch.float64)
        for _ in range(draws):
            x = torch.randn(t, d, generator=gen, dtype=torch.float64)
            for _ in range(depth):
                w = torch.randn(d, d, generator=gen, dtype=torch.float64) / math.sqrt(d)
                y = a @ x @ w
                x = x + y if skip else y
            est += kernels.kernel(x) / draws
        c_est, c_th = kernels.normalised(est), kernels.normalised(theory)
        assert float((c_est - c_th).abs().max()) < 0.06
        assert abs(float(kernels.mean_offdiag(c_est) - kernels.mean_offdiag(c_th))) < 0.02
        other = kernels.normalised(uniform_recursion(t, depth, skip=not skip)[-1])  # the wrong theory is far off
        assert abs(float(kernels.mean_offdiag(c_est) - kernels.mean_offdiag(other))) > 0.2


# ----------------------------------------------------------------------------- the model family


def tiny(variant="vanilla", depth=3, **kw):
    fields = {"width": 64, "heads": 4, "n_ctx": 16, "d_vocab": 64, **variants.variant_config(variant, depth), **kw}
    return variant_net.build(variants.SPAConfig(**fields), device="cpu")


def test_hook_points_and_shapes():
    m = tiny("vanilla", 2, mlp=True, norm="pre", skip=True)
    hooks = set(m.bridge.hook_dict)
    for name in (
        "hook_embed",
        "blocks.0.hook_resid_pre",
        "blocks.1.hook_resid_post",
        "blocks.0.attn.hook_pattern",
        "blocks.0.hook_attn_out",
        "blocks.0.hook_mlp_out",
        "blocks.0.hook_resid_mid",
        "blocks.0.ln1.hook_normalized",
        "blocks.1.attn.hook_z",
    ):
        assert name in hooks, name
    ids = variant_net.random_tokens(2, 10, 64)
    acts = forward(m, ids, torch.ones_like(ids), ["blocks.*.attn.hook_pattern", "blocks.1.hook_resid_post"])
    assert acts["blocks.0.attn.hook_pattern"].shape == (2, 4, 10, 10)
    assert acts["blocks.1.hook_resid_post"].shape == (2, 10, 64)


def test_attention_variants_at_init():
    ids = variant_net.random_tokens(1, 8, 64)
    names = ["blocks.0.attn.hook_pattern"]
    uni = forward(tiny("vanilla"), ids, None, names)[names[0]][0, 0].double()
    assert torch.allclose(uni, kernels.uniform_attention(8), atol=1e-6)
    vsi = forward(tiny("value-skipinit"), ids, None, names)[names[0]][0, 0]
    assert torch.allclose(vsi, torch.eye(8), atol=1e-7)
    soft = forward(tiny("vanilla", attention="softmax"), ids, None, names)[names[0]][0, 0]
    assert not torch.allclose(soft.double(), kernels.uniform_attention(8), atol=1e-3)
    m = tiny("e-spa", 4)
    p = forward(m, ids, None, names)[names[0]][0, 0].double()
    mix = m.bridge.blocks[0].attn.spa_scale[:8, None].double() * p  # D * softmax = A_1
    assert torch.allclose(mix, kernels.spa_attentions("e-spa", 16, 4)[0][:8, :8], atol=1e-5)


def test_orthogonal_layers_follow_the_recursion_exactly_from_the_measured_input():
    """With orthogonal W_V W_O and a fixed attention matrix, Sigma_l = A_l Sigma_{l-1} A_l^T holds
    at any width, so theory started from the measured Sigma_0 matches to float32 precision."""
    m = tiny("e-spa", 4)
    ids = variant_net.random_tokens(1, 16, 64)
    names = ["blocks.0.hook_resid_pre", "blocks.3.hook_resid_post"]
    acts = forward(m, ids, None, names)
    s0 = kernels.kernel(acts[names[0]][0])
    theory = variant_net.theory_kernels(m.bridge.cfg, 16, sigma0=s0)[-1]
    assert torch.allclose(kernels.kernel(acts[names[1]][0]), theory, atol=1e-4 * float(theory.abs().max()))


def test_padding_does_not_change_real_tokens():
    for variant, causal in (("vanilla", True), ("vanilla", False), ("e-spa", True)):
        m = tiny(variant, 2, causal=causal, attention="softmax") if variant == "vanilla" else tiny(variant, 2)
        ids = variant_net.random_tokens(1, 10, 64)
        padded = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], 1)
        mask = torch.cat([torch.ones(1, 10), torch.zeros(1, 4)], 1).long()
        name = "blocks.1.hook_resid_post"
        a = forward(m, ids, None, [name])[name]
        b = forward(m, padded, mask, [name])[name][:, :10]
        assert torch.isfinite(b).all() and torch.allclose(a, b, atol=1e-5), variant


def test_spec_parsing_and_bad_specs():
    cfg = variants.SPAConfig.parse("spa:variant=skip-scaled,depth=16,width=32,heads=2")
    assert cfg.skip and cfg.scale == pytest.approx(0.25) and cfg.width == 32
    assert variants.SPAConfig.parse(cfg.spec()) == cfg
    auto = variants.SPAConfig.parse("spa:skip=true,branch_scale=none,depth=9")
    assert auto.scale == pytest.approx(1 / 3) and variants.SPAConfig.parse(auto.spec()) == auto
    with pytest.raises(ProbeError, match="did you mean 'e-spa'"):
        variants.SPAConfig.parse("spa:variant=e-sap")
    with pytest.raises(ProbeError, match="unknown key 'widht'"):
        variants.SPAConfig.parse("spa:widht=3")
    with pytest.raises(ProbeError, match="causal"):
        variants.SPAConfig(attention="e-spa", causal=False)
    with pytest.raises(ProbeError, match="divisible"):
        variants.SPAConfig(width=10, heads=3)
    m = tiny()
    with pytest.raises(ProbeError, match="n_ctx"):
        m.bridge(torch.zeros(1, 17, dtype=torch.long))
    out = m.bridge(torch.randn(1, 5, 64), return_type="residual")  # embeddings fed directly
    assert out.shape == (1, 5, 64)


def test_training_changes_weights_and_reduces_loss():
    m = tiny("pre-ln", 2, attention="softmax", d_vocab=8, width=32)
    before = m.bridge.blocks[0].attn.W_K.detach().clone()
    losses = train_copy(m.bridge, 40, 12, batch=16, lr=3e-3)
    assert not torch.equal(before, m.bridge.blocks[0].attn.W_K)
    assert np.mean(losses[-10:]) < np.mean(losses[:5])


# ----------------------------------------------------------------------------- the task


def test_task_on_spa_model_reports_theory_and_files():
    m = tiny("vanilla", 4)
    res = run(m, "kernels", n_random=6, seq_len=16, batch_size=4)
    s = res.scores
    cos = s[s.metric == "mean_cosine"].sort_values("layer")
    assert list(cos.layer) == [0, 1, 2, 3, 4]
    assert cos.theory.notna().all()
    assert (cos.value.diff().dropna() > 0).all()  # uniform attention without skips: collapse grows
    assert abs(cos.value - cos.theory).max() < 0.1  # width 64: finite-width fluctuations only
    npz = np.load(io.BytesIO(res.files["kernels.npz"]))
    assert set(npz.files) >= {"layer_0", "layer_4", "pairs", "layers"}
    assert npz["layer_4"].shape == (16, 16) and np.allclose(np.diag(npz["layer_4"]), 1.0, atol=1e-5)
    assert res.plots["kernels_heatmaps"].lstrip().startswith("<?xml") and "<svg" in res.plots["kernels_vs_layer"]
    assert any("L_th" in n for n in res.notes)


def test_task_excludes_specials_by_default_for_encoders(tiny_bert):
    on = run(tiny_bert, "kernels", limit=6)
    off = run(tiny_bert, "kernels", limit=6, exclude_special=False)
    assert any("[CLS]/[SEP] excluded" in n for n in on.notes) and any("included" in n for n in off.notes)
    assert on.headline["n_tokens"] + 12 == off.headline["n_tokens"]  # [CLS] and [SEP] of 6 lines


def _reference_stats(model, lines, drop_first):
    """Per-layer metrics averaged over lines, computed here from one forward pass per line."""
    from depthprobe.tasks.kernels.accumulator import resid_names

    names = resid_names(model.info.n_layers)
    out = {}
    for line in lines:
        ids = torch.tensor([[model.cls_id, *model.tokenizer(line, add_special_tokens=False)["input_ids"]]])
        acts = forward(model, ids, torch.ones_like(ids), names)
        for layer_idx, name in enumerate(names):
            x = acts[name][0, 1:] if drop_first else acts[name][0]
            stats, _ = kernels.sequence_stats(x[None])
            for m, v in stats.items():
                out.setdefault((layer_idx, m), []).append(float(v[0]))
    return {k: np.mean(v) for k, v in out.items()}


def test_decoder_bos_is_left_out_of_the_kernel_unless_asked(tiny_gpt2):
    from depthprobe.probes.data.text import read_lines
    from depthprobe.tasks.attention_stats import SAMPLE

    lines = read_lines(SAMPLE)[:6]
    dec = run(tiny_gpt2, "kernels", limit=6)
    kept = run(tiny_gpt2, "kernels", limit=6, include_bos=True)
    assert any("BOS excluded from the kernel (6 positions" in n and "include_bos=true" in n for n in dec.notes)
    assert any("BOS included" in n for n in kept.notes)
    assert dec.headline["n_tokens"] + 6 == kept.headline["n_tokens"]
    assert dec.scores.theory.isna().all()
    for res, drop in ((dec, True), (kept, False)):
        ref = _reference_stats(tiny_gpt2, lines, drop_first=drop)
        got = res.scores.set_index(["layer", "metric"]).value
        for (layer_idx, m), v in ref.items():
            assert got[layer_idx, m] == pytest.approx(v, abs=1e-6), (drop, layer_idx, m)
    a = dec.scores.set_index(["layer", "metric"]).value
    b = kept.scores.set_index(["layer", "metric"]).value
    assert float((a - b).abs().max()) > 0.1  # BOS changes the kernel metrics
    with pytest.raises(ProbeError, match="include_bos=true"):
        run(tiny_gpt2, "kernels", limit=2, exclude_special=True)


def test_task_is_padding_invariant(tiny_bert):
    one = run(tiny_bert, "kernels", limit=8, batch_size=1).scores.set_index(["layer", "metric"]).value
    many = run(tiny_bert, "kernels", limit=8, batch_size=8).scores.set_index(["layer", "metric"]).value
    assert np.allclose(one.sort_index(), many.sort_index(), atol=1e-5, equal_nan=True)


def test_task_bad_options(tiny_bert):
    with pytest.raises(ProbeError, match="out of range"):
        run(tiny_bert, "kernels", layers="0,9")
    with pytest.raises(ProbeError, match="no tokenizer"):
        run(tiny(), "kernels", data=__file__)
    with pytest.raises(ProbeError, match="seq_len"):
        run(tiny(), "kernels", seq_len=99)
    with pytest.raises(ProbeError, match="exclude_special=false"):
        run(tiny_bert, "kernels", include_bos=True)


@pytest.mark.slow
def test_task_on_minilm(minilm):
    res = run(minilm, "kernels")
    m = res.summary.set_index("layer")
    assert list(m.index) == list(range(7))
    assert ((m.mean_cosine > -1) & (m.mean_cosine < 1)).all()
    # golden values on the built-in sample (30 lines, [CLS]/[SEP] excluded), measured once
    assert m.mean_cosine.round(3).tolist() == pytest.approx([0.070, 0.176, 0.230, 0.275, 0.302, 0.317, 0.400], abs=2e-3)
    assert m.effective_rank_centred[0] == pytest.approx(11.47, abs=0.05)
    assert res.headline["n_sequences"] == 30


# ----------------------------------------------------------------------------- the sweep


def test_sweep_table_plots_and_claims(tmp_path):
    res = sweep(
        "kernels", (1, 2, 8), variants=("vanilla", "skip", "skip-scaled", "e-spa"), width=64, seq_len=32, samples=4
    )
    s = res.scores
    assert list(s.columns[:7]) == ["task", "variant", "depth", "layer", "metric", "value", "theory"]
    assert len(s[(s.variant == "vanilla") & (s.depth == 8) & (s.metric == "mean_cosine")]) == 9
    final = res.summary.set_index(["variant", "depth"]).final_cosine
    assert final["vanilla", 8] > final["skip", 8] > final["skip-scaled", 8]
    assert final["vanilla", 1] < final["vanilla", 2] < final["vanilla", 8]
    assert (res.summary.L_th == round(math.log(64, 3), 2)).all()
    # random-init families: L_th as a number, no regime label anywhere
    assert "regime" not in res.summary.columns and "depth_efficiency" not in res.headline
    assert not any("efficient" in n or "widen" in n.replace("not advice to widen", "") for n in res.notes)
    espa = s[(s.variant == "e-spa") & (s.metric == "target_max_abs") & (s.layer == s.depth)]
    assert len(espa) == 3 and espa.value.max() < 0.1  # width 64, 4 samples: finite-width noise only
    assert set(res.plots) == {"kernels_final_cosine_vs_depth", "kernels_heatmaps"}
    out = res.save(tmp_path / "sweep")
    assert (out / "plots" / "kernels_heatmaps.svg").exists() and (out / "kernels.npz").exists()
    assert {"e-spa/depth8", "e-spa/depth8/layer2", "vanilla/depth1"} <= set(np.load(out / "kernels.npz").files)


def test_sweep_bad_inputs_fail_before_work():
    assert "did you mean 'vanilla'" in cli_error(
        ["sweep", "--task", "kernels", "--depths", "1,2", "--variants", "vanila"]
    )
    assert "divisible" in cli_error(["sweep", "--task", "kernels", "--depths", "1", "--width", "10", "--heads", "3"])
    assert "uniform or softmax" in cli_error(["sweep", "--task", "kernels", "--depths", "1", "-O", "attention=relu"])
    assert "heatmap_depths" in cli_error(["sweep", "--task", "kernels", "--depths", "1,2", "-O", "heatmap_depths=4"])
    assert "threads" in cli_error(["sweep", "--task", "kernels", "--depths", "1", "-O", "threads=0"])
    assert "positive" in cli_error(["sweep", "--task", "kernels", "--depths", "0,1"])
    assert "causal" in cli_error(
        ["sweep", "--task", "kernels", "--depths", "1", "--variants", "e-spa", "-O", "causal=false"]
    )


def test_cli_run_bad_inputs():
    assert "did you mean" in cli_error(["run", "--model", "spa:variant=vanila", "--task", "kernels"])
    assert "out of range" in cli_error(
        ["run", "--model", "spa:depth=2,width=16,heads=2,n_ctx=8", "--task", "kernels", "-O", "layers=5"]
    )
    assert "did you mean 'exclude_special'" in cli_error(
        ["run", "--model", "spa:depth=1,width=16,heads=2", "--task", "kernels", "-O", "exclude=true"]
    )


# ----------------------------------------------------------------------------- dtype, the dong preset, refusals


def test_float64_model_runs_in_float64_with_the_same_weights():
    m32, m64 = tiny("e-spa", 3), tiny("e-spa", 3, dtype="float64")
    assert all(p.dtype == torch.float64 for p in m64.bridge.parameters())
    assert m64.bridge.blocks[0].attn.spa_bias.dtype == torch.float64
    assert torch.equal(m32.bridge.W_E.double(), m64.bridge.W_E)  # Gaussian draws: the float32 ones, cast
    w = m64.bridge.blocks[0].attn.W_V
    assert float((w @ w.T - torch.eye(64, dtype=torch.float64)).abs().max().detach()) < 1e-12  # orthogonal in float64
    ids = variant_net.random_tokens(2, 16, 64)
    name = "blocks.2.hook_resid_post"
    a32, a64 = (forward(m, ids, None, [name])[name] for m in (m32, m64))
    assert a64.dtype == torch.float64 and torch.allclose(a32.double(), a64, atol=1e-4)
    with pytest.raises(ProbeError, match="float32 or float64"):
        variants.SPAConfig(dtype="float16")


def test_dong_preset_collapses_doubly_exponentially_in_float64(tmp_path):
    """Non-causal softmax, no skip, no MLP: the residual ratio falls faster than any fixed rate;
    float64 follows it to ~1e-10, where float32 has hit its floor."""
    res = sweep("kernels", (5,), variants=("dong",), width=64, seq_len=32, samples=4, dtype="float64")
    s = res.scores.set_index(["layer", "metric"]).value
    r = [s[layer_idx, "resid_ratio_fro"] for layer_idx in range(6)]
    e = [s[layer_idx, "contraction_exponent"] for layer_idx in range(6)]
    assert np.isnan(e[0]) and all(x > 2 for x in e[1:4]), e
    assert r[3] < 1e-5 and r[2] ** 2 > r[3]  # faster than squaring by layer 3
    assert s[3, "effective_rank_uncentred"] == pytest.approx(1.0, abs=1e-3)
    assert any("dong, depth 5, float64: contraction exponent" in n for n in res.notes)
    f32 = sweep("kernels", (5,), variants=("dong",), width=64, seq_len=32, samples=4)
    r32 = f32.scores.set_index(["layer", "metric"]).value
    assert r32[1, "resid_ratio_fro"] == pytest.approx(r[1], rel=1e-4)  # the same model
    cfg = variants.SPAConfig(**variants.variant_config("dong", 4))
    assert (cfg.attention, cfg.causal, cfg.skip, cfg.mlp) == ("softmax", False, False, False)


def test_uniform_causal_collapse_is_plain_exponential():
    """Default causal uniform attention: r roughly halves per layer, exponents tend to 1."""
    r = [kernels.kernel_stats(s)["resid_ratio_fro"] for s in uniform_recursion(128, 24)]
    assert r[24] / r[16] == pytest.approx(0.5**8, rel=0.5)
    e = kernels.contraction_exponents(r)
    assert 1.0 < e[24] < 1.1


@pytest.mark.parametrize("attention", ["e-spa", "u-spa", "value-skipinit"])
def test_kernel_controlled_attention_with_mlp_is_refused(attention):
    with pytest.raises(ProbeError, match="TAT-style leaky-ReLU"):
        variants.SPAConfig(attention=attention, mlp=True)
    assert variants.SPAConfig(attention="softmax", mlp=True).mlp  # baselines keep their MLPs


def test_cli_dtype_dong_and_refusals(tmp_path):
    res = probe_cli(
        "sweep",
        "--task",
        "kernels",
        "--depths",
        "3",
        "--variants",
        "dong",
        "--width",
        "32",
        "--seq-len",
        "16",
        "--dtype",
        "float64",
        "--out",
        str(tmp_path / "d"),
    )
    assert res.exit_code == 0, res.output
    assert "contraction exponent" in res.output
    assert "float32 or float64" in cli_error(["sweep", "--task", "kernels", "--depths", "1", "--dtype", "float16"])
    line = cli_error(["sweep", "--task", "kernels", "--depths", "1", "--variants", "e-spa", "--mlp"])
    assert "TAT-style leaky-ReLU" in line and "--attn-only" in line
    assert "TAT-style" in cli_error(["run", "--model", "spa:variant=u-spa,mlp=true", "--task", "kernels"])


def test_the_sweeps_variants_are_the_literal_choices_and_others_are_one_line():
    """The sweep's ``variants`` hold ``VariantName``s: the Literal names every preset, in order, and
    a name outside it is refused before any model is built."""
    from typing import get_args

    from depthprobe.tasks.kernels.sweep import SweepOptions, sweep_configs

    assert get_args(variants.VariantName) == tuple(variants.VARIANTS)
    with pytest.raises(
        ProbeError, match=r"unknown variant 'e-sap' \(did you mean 'e-spa'.*; choose from vanilla, skip"
    ):
        sweep_configs((2,), SweepOptions(variants=("e-sap",)), seed=0)  # type: ignore[arg-type]
