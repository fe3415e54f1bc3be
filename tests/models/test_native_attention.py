"""Native attention fires every hook where its tensor is used (probes/models/native_attention.py).

Known answers: with no edit the logits are bit-identical to TransformerLens's own native bridge;
the captured scores are the masked pre-softmax scores (softmax gives the pattern exactly); zeroing
the scores makes the pattern uniform over every key (TransformerLens's HookedTransformer: the edit
comes after the causal mask); and over every hook of native models, an edit that zeroes it changes
the logits or is refused before the pass.
"""

from __future__ import annotations

import pytest
import torch

import depthprobe.probes as probes
from depthprobe.probes import ProbeError, capture
from depthprobe.probes.hooks.cache import _every_hook
from depthprobe.probes.models.model import NativeConfig

SPECS = [
    "native:layers=2,d_model=32,heads=4,d_vocab=20,n_ctx=16,attn_only=false",
    "native:layers=2,d_model=32,heads=4,d_vocab=20,n_ctx=16,norm=none,positional=rotary",
]
SWITCHES = ("use_split_qkv_input", "use_attn_result", "use_hook_mlp_in", "use_attn_in")


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 20, (3, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding: queries that see no key
    mask[1, 6:] = 0  # right padding
    return ids, mask


@pytest.fixture(scope="module", params=SPECS)
def native(request):
    return probes.load(request.param, device="cpu")


def test_unedited_logits_equal_transformer_lens_bit_for_bit(native):
    from transformer_lens.model_bridge import TransformerBridge

    ref = TransformerBridge.boot_native(NativeConfig.parse(native.name).to_tl(), device="cpu")
    ref.eval()
    ref.load_state_dict(native.bridge.state_dict())
    ids, mask = _inputs()
    with torch.no_grad():
        assert torch.equal(native.bridge(ids, attention_mask=mask), ref(ids, attention_mask=mask))


def test_scores_are_the_pre_softmax_scores_and_their_edit_takes_effect(native):
    ids, _ = _inputs()
    scores, pattern = "blocks.1.attn.hook_attn_scores", "blocks.1.attn.hook_pattern"
    with torch.no_grad(), capture(native, [scores, pattern]) as acts:
        clean = native.bridge(ids)
    s = acts[scores]
    assert torch.equal(torch.softmax(s, -1), acts[pattern])
    assert torch.isinf(s[:, :, 0, 1:]).all() and torch.isfinite(s.tril()).all()  # causal mask: -inf above
    with torch.no_grad(), capture(native, scores, lambda t, h: torch.zeros_like(t)), capture(native, pattern) as acts:
        zeroed = native.bridge(ids)
    assert torch.allclose(acts[pattern], torch.full_like(acts[pattern], 1 / ids.shape[1]))
    assert (zeroed - clean).abs().max() > 1e-3

    def boost(t, hook):  # +3 on key 0 for head 2 == writing that pattern in
        t = t.clone()
        t[:, 2, :, 0] += 3.0
        return t

    with torch.no_grad(), capture(native, scores, boost), capture(native, pattern) as acts:
        boosted = native.bridge(ids)
    wanted = acts[pattern]
    with torch.no_grad(), capture(native, pattern, lambda t, h: wanted):
        written = native.bridge(ids)
    assert (boosted - clean).abs().max() > 1e-4
    assert torch.allclose(boosted, written, atol=1e-6)


def test_patching_scores_is_not_the_corrupted_metric(native):
    """#38.3: every value equalled the corrupted metric, the edit being thrown away."""
    clean, corrupt = _inputs()[0][:1], _inputs()[0][1:2]
    df = probes.patch(
        native, clean, corrupt, hooks="blocks.1.attn.hook_attn_scores", per="head_position",
        metric=lambda logits: logits[0, -1, 3],
    )  # fmt: skip
    assert (df["value"] - df.attrs["corrupt"]).abs().max() > 1e-4


@pytest.mark.parametrize("spec", SPECS)
def test_every_hook_edit_changes_the_output_or_is_refused(spec):
    ids, _ = _inputs()
    for switches in ((), ("use_split_qkv_input", "use_attn_result", "use_hook_mlp_in"), ("use_attn_in",)):
        model = probes.load(spec, device="cpu")
        for switch in switches:
            getattr(model.bridge, f"set_{switch}")(True)
        with torch.no_grad():
            base = model.bridge(ids)
        for name in _every_hook(model):
            try:
                with torch.no_grad(), capture(model, name, lambda t, h: torch.zeros_like(t)):
                    out = model.bridge(ids)
            except ProbeError as e:
                assert "would change nothing" in str(e) and "instead" in str(e)
                continue
            assert not torch.equal(out, base), f"an edit of {name} was discarded"


def test_switches_keep_the_function(native):
    """Split-QKV inputs and per-head results recompute the same logits (float rounding apart)."""
    ids, mask = _inputs()
    with torch.no_grad():
        base = native.bridge(ids, attention_mask=mask)
        for switch in SWITCHES:
            getattr(native.bridge, f"set_{switch}")(True)
            assert torch.allclose(native.bridge(ids, attention_mask=mask), base, atol=1e-5)
            getattr(native.bridge, f"set_{switch}")(False)


def test_attribution_of_scores_is_finite(native):
    """Masked scores are -inf in both runs: no change there, not NaN."""
    ids = _inputs()[0]
    df = probes.attribute(
        native, ids[:1], ids[1:2], lambda logits: logits[0, -1, 3], hooks="blocks.*.attn.hook_attn_scores",
        per="head",
    )  # fmt: skip
    assert len(df) == 8 and df["value"].notna().all()


@pytest.mark.parametrize("component", ["q", "k", "v"])
def test_transformer_lens_path_patching_runs_and_equals_the_edge_by_hand(native, component):
    """#35.1: TL's get_act_patch_direct_path needs hook_{q,k,v}_input (refused on native models
    before). The edge by hand: head (0, 1)'s clean-minus-corrupted write added to the residual
    stream that only head (1, h)'s {q,k,v} reads, through ln1 and that head's own weights."""
    from transformer_lens.patching import get_act_patch_direct_path

    from depthprobe.probes.training.fast_forward import inner

    clean, corrupt = torch.tensor([[1, 5, 7, 2, 9, 3]]), torch.tensor([[4, 5, 8, 2, 11, 3]])
    b = native.bridge
    _, clean_cache = b.run_with_cache(clean)
    _, corrupt_cache = b.run_with_cache(corrupt)

    def metric(logits):
        return logits[0, -1, 3] - logits[0, -1, 4]

    theirs = get_act_patch_direct_path(b, corrupt, clean_cache, corrupt_cache, metric, 0, 1, component, verbose=False)
    z = "blocks.0.attn.hook_z"
    delta = (clean_cache[z][:, :, 1] - corrupt_cache[z][:, :, 1]) @ b.blocks[0].attn.W_O[1]  # [batch, pos, d_model]
    W, bias = getattr(b, f"W_{component.upper()}")[1], getattr(b, f"b_{component.upper()}")[1]
    ln1 = inner(b.blocks[1].ln1)
    seen: dict[str, torch.Tensor] = {}
    for head in range(4):

        def keep(t, hook):
            seen["resid"] = t

        def edit(t, hook, head=head):
            t = t.clone()
            t[:, :, head] = ln1(seen["resid"] + delta) @ W[head] + bias[head]
            return t

        with (
            torch.no_grad(),
            capture(native, {"blocks.1.hook_resid_pre": keep, f"blocks.1.attn.hook_{component}": edit}),
        ):
            ours = metric(b(corrupt))
        assert abs(float(ours) - float(theirs[1, head])) < 1e-5
    with torch.no_grad():
        assert (theirs[1] - metric(b(corrupt))).abs().max() > 1e-5  # the edges matter
    assert not b.cfg.use_split_qkv_input  # TL restores the switch


def test_transformer_lens_edge_attribution_runs_and_equals_the_edge_gradient_by_hand():
    """#35.1: TL's edge attribution patching (attribution_patch at edge granularity) needs the split
    inputs, per-head results and hook_mlp_in; on a native model with MLPs each edge score equals
    (clean - corrupted head output) . d metric / d (reader's own input), computed with capture."""
    from transformer_lens.tools.analysis.attribution_patching import EdgeAttributionConfig, attribution_patch

    model = probes.load(SPECS[0], device="cpu")
    clean, corrupt = torch.tensor([[1, 5, 7, 2, 9, 3]]), torch.tensor([[4, 5, 8, 2, 11, 3]])

    def metric(logits):
        return logits[0, -1, 3] - logits[0, -1, 4]

    got = attribution_patch(model.bridge, clean, corrupt, metric, EdgeAttributionConfig(granularity="edge"))
    for switch in ("use_split_qkv_input", "use_attn_result"):
        getattr(model.bridge, f"set_{switch}")(True)
    out = "blocks.0.attn.hook_result"
    readers = [f"blocks.1.attn.hook_{c}_input" for c in "qkv"]
    _, cache = probes.run_with_cache(model, clean, out)
    with capture(model, [out, *readers], grad=True) as acts:
        grads = torch.autograd.grad(metric(model.bridge(corrupt)), [acts[r] for r in readers])
    delta = cache[out] - acts[out].detach()  # [batch, pos, head, d_model]
    checked = 0
    for (src, dst), score in got.edge_scores.items():
        if src.kind == "attn_head_out" and src.layer == 0 and dst.kind in ("q_input", "k_input", "v_input"):
            g = grads["qkv".index(dst.kind[0])]
            by_hand = float((delta[0, src.position, src.head] * g[0, dst.position, dst.head]).sum())
            assert abs(score - by_hand) < 1e-5, (src, dst)
            checked += 1
    assert checked == 6 * 4 * 3 * 4  # positions x source heads x q, k, v x destination heads
