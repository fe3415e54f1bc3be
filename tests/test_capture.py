"""The scoped capture primitive: names, globs, custom hooks, cleanup on error, early stop."""

import pytest
import torch

from depthprobe.probes import ProbeError, capture
from depthprobe.probes.capture import forward, resolve_names


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
