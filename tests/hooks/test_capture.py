"""The scoped capture primitive: names, globs, custom hooks, cleanup on error, early stop."""

import pytest
import torch

from depthprobe.probes import ProbeError, capture
from depthprobe.probes.hooks import guard
from depthprobe.probes.hooks.capture import forward, resolve_names


def _n_hooks(model):
    return sum(len(hp._forward_hooks) for hp in model.bridge.hook_dict.values())


def test_globs_expand_and_unknown_names_suggest(tiny_bert):
    names = resolve_names(tiny_bert, ["blocks.*.attn.hook_pattern"])
    assert names == ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    with pytest.raises(ProbeError, match=r"did you mean 'blocks\.0\.attn\.hook_pattern'"):
        resolve_names(tiny_bert, ["blocks.0.attn.hook_patern"])
    with pytest.raises(ProbeError, match="matches no hook"):
        resolve_names(tiny_bert, ["blocks.*.nothing_*"])


def test_hooks_are_removed_even_when_the_body_raises(tiny_bert):
    before = _n_hooks(tiny_bert)
    with pytest.raises(RuntimeError), capture(tiny_bert, ["blocks.*.hook_resid_post"]):
        assert _n_hooks(tiny_bert) > before
        raise RuntimeError("boom")
    assert _n_hooks(tiny_bert) == before


def test_custom_hook_can_edit_activations(tiny_gpt2):
    ids = torch.tensor([[0, 5, 6, 7, 8]])
    with torch.no_grad():
        clean = tiny_gpt2.bridge(ids)

        def zero_resid(t, hook):
            return torch.zeros_like(t)

        with capture(tiny_gpt2, ["blocks.1.hook_resid_post"], zero_resid) as acts:
            edited = tiny_gpt2.bridge(ids)
    assert torch.count_nonzero(acts["blocks.1.hook_resid_post"]) == 0
    assert not torch.allclose(clean, edited)
    # with every position's final residual zeroed, the logits no longer depend on the position
    assert torch.allclose(edited[0, 0], edited[0, -1], atol=1e-5)


def test_early_stop_returns_the_same_activations_as_a_full_pass(tiny_bert):
    before = _n_hooks(tiny_bert)
    ids = torch.tensor([[2, 60, 61, 62, 3]])
    full = {}
    with torch.no_grad(), capture(tiny_bert, ["blocks.0.attn.hook_pattern"]) as acts:
        tiny_bert.bridge(ids)
        full.update(acts)
    early = forward(tiny_bert, ids, torch.ones_like(ids), ["blocks.0.attn.hook_pattern"])
    assert torch.equal(early["blocks.0.attn.hook_pattern"], full["blocks.0.attn.hook_pattern"])
    assert _n_hooks(tiny_bert) == before


def test_forward_can_return_logits(tiny_gpt2):
    ids = torch.tensor([[0, 5, 6]])
    acts = forward(tiny_gpt2, ids, None, ["blocks.0.hook_resid_pre"], logits=True)
    assert acts["logits"].shape[:2] == (1, 3)


def test_a_dict_gives_each_hook_its_own_function(tiny_gpt2):
    ids = torch.tensor([[0, 5, 6, 7, 8]])

    def zero_head_1(t, hook):
        t = t.clone()
        t[:, :, 1] = 0
        return t

    with (
        torch.no_grad(),
        capture(
            tiny_gpt2, {"blocks.0.attn.hook_z": zero_head_1, "blocks.*.hook_resid_post": lambda t, h: t * 0}
        ) as acts,
    ):
        tiny_gpt2.bridge(ids)
    z = acts["blocks.0.attn.hook_z"]  # [batch, pos, head, d_head]
    assert torch.count_nonzero(z[:, :, 1]) == 0 and torch.count_nonzero(z[:, :, 0]) > 0
    assert torch.count_nonzero(acts["blocks.0.hook_resid_post"]) == 0
    assert torch.count_nonzero(acts["blocks.1.hook_resid_post"]) == 0
    with (
        pytest.raises(ProbeError, match="not both"),
        capture(tiny_gpt2, {"blocks.0.attn.hook_z": zero_head_1}, zero_head_1),
    ):
        pass
    with pytest.raises(ProbeError, match="must be a function"), capture(tiny_gpt2, {"blocks.0.attn.hook_z": 0}):
        pass


def test_grad_keeps_the_graph_for_attribution(tiny_gpt2):
    """The gradient through a kept activation equals the gradient through an added zero tensor."""
    ids = torch.tensor([[0, 5, 6, 7, 8]])
    name = "blocks.0.hook_resid_post"
    acts = forward(tiny_gpt2, ids, None, name, logits=True, grad=True)
    assert acts[name].requires_grad
    (g_act,) = torch.autograd.grad(acts["logits"][0, -1].logsumexp(-1), acts[name])
    delta = torch.zeros(1, 5, tiny_gpt2.info.d_model, requires_grad=True)
    with capture(tiny_gpt2, name, lambda t, h: t + delta):
        out = tiny_gpt2.bridge(ids)
    (g_delta,) = torch.autograd.grad(out[0, -1].logsumexp(-1), delta)
    assert g_act.abs().max() > 0
    assert torch.allclose(g_act, g_delta, atol=1e-7)
    assert not forward(tiny_gpt2, ids, None, name)[name].requires_grad


def test_a_nested_forward_does_not_blind_the_outer_capture(tiny_gpt2):
    ids = torch.tensor([[0, 5, 6, 7, 8]])
    last = "blocks.1.hook_resid_post"
    with torch.no_grad(), capture(tiny_gpt2, last) as outer:
        inner = forward(tiny_gpt2, ids, None, "blocks.0.attn.hook_pattern")
    assert "blocks.0.attn.hook_pattern" in inner
    with torch.no_grad(), capture(tiny_gpt2, last) as plain:
        tiny_gpt2.bridge(ids)
    assert torch.equal(outer[last], plain[last])
    assert guard.open_count(tiny_gpt2.bridge) == 0


def test_the_early_stop_never_escapes(tiny_gpt2):
    ids = torch.tensor([[0, 5, 6, 7, 8]])
    after = []
    with torch.no_grad(), capture(tiny_gpt2, "blocks.0.hook_resid_pre", stop_early=True) as acts:
        tiny_gpt2.bridge(ids)
        after.append("not reached: the pass stopped at the hook and the block ended there")
    assert acts["blocks.0.hook_resid_pre"].shape == (1, 5, tiny_gpt2.info.d_model)
    assert after == []


def test_reduce_keeps_its_value_as_the_hook_fires_and_leaves_other_hooks_whole(tiny_bert):
    """``reduce(name, tensor)``: what the capture keeps is its return value (here a sum, known
    from a plain capture of the same pass); a hook it returns unchanged is kept whole."""
    ids = torch.tensor([[2, 60, 61, 62, 3], [2, 70, 71, 3, 0]])
    mask = (ids != 0).long()
    names = ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    plain = forward(tiny_bert, ids, mask, names)
    seen = []

    def reduce(name, t):
        seen.append(name)
        return t.sum((-1, -2)) if name == names[0] else t

    reduced = forward(tiny_bert, ids, mask, names, reduce=reduce)
    assert seen == names  # in the order the hooks fire, once each
    assert reduced[names[0]].shape == (2, tiny_bert.info.n_heads)
    assert torch.equal(reduced[names[0]], plain[names[0]].sum((-1, -2)))
    assert torch.equal(reduced[names[1]], plain[names[1]])
