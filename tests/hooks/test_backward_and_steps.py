"""#46.4: gradient edits on the backward pass and edits at chosen generation steps. Known answers:
a gradient replaced at ``hook_embed`` reaches the embedding matrix as the sum of its rows per token
(by hand); a gradient zeroed at layer 1's residual input leaves none to the embeddings, and one
scaled by 3 triples it; ``generate(..., edit_steps=)`` equals a hand-written greedy loop that edits
only those steps, on a tiny GPT-2."""

from __future__ import annotations

import pytest
import torch

import depthprobe.probes as probes

SPEC = "native:layers=2,d_model=16,heads=2,d_vocab=20,n_ctx=16,attn_only=false"


@pytest.fixture(scope="module")
def model():
    return probes.load(SPEC, device="cpu")


IDS = torch.tensor([[1, 2, 3, 2, 5], [4, 4, 6, 7, 1]])


def embed_grad(model, names, grad_fn):
    """The gradient of the logits' sum at hook_embed, with ``grad_fn`` editing at ``names``."""
    with torch.enable_grad(), probes.capture(model, "hook_embed", grad=True) as acts:
        with probes.capture(model, names, probes.grad_edit(grad_fn), store=False):
            logits = model.bridge(IDS)
        (g,) = torch.autograd.grad(logits.sum(), [acts["hook_embed"]])
    return g


def test_a_replaced_gradient_reaches_the_embedding_matrix_as_computed_by_hand(model):
    g = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(0))
    w = model.bridge.embed.W_E if hasattr(model.bridge.embed, "W_E") else model.bridge.W_E
    w.grad = None
    with torch.enable_grad(), probes.capture(model, {"hook_embed": probes.grad_edit(lambda grad, hook: g)}):
        model.bridge(IDS).sum().backward()
    by_hand = torch.zeros(20, 16).index_add_(0, IDS.flatten(), g.reshape(-1, 16))  # each token's rows summed
    assert torch.allclose(model.bridge.W_E.grad, by_hand, atol=1e-6)
    w.grad = None


def test_a_forward_edit_and_a_backward_edit_together(model):
    """grad_edit(fn, edit=f): f doubles the activation on the way forward, fn halves its gradient."""
    double = probes.grad_edit(lambda grad, hook: grad / 2, edit=lambda t, hook: 2 * t)
    with torch.no_grad(), probes.capture(model, {"blocks.1.hook_resid_pre": lambda t, hook: 2 * t}, store=False):
        want = model.bridge(IDS)
    with torch.enable_grad(), probes.capture(model, {"blocks.1.hook_resid_pre": double}, store=False):
        assert torch.allclose(model.bridge(IDS), want)
    plain = embed_grad(model, "blocks.1.hook_resid_pre", lambda grad, hook: grad / 2)
    with torch.enable_grad(), probes.capture(model, "hook_embed", grad=True) as acts:
        with probes.capture(model, {"blocks.1.hook_resid_pre": double}, store=False):
            logits = model.bridge(IDS)
        (g,) = torch.autograd.grad(logits.sum(), [acts["hook_embed"]])
    with torch.enable_grad(), probes.capture(model, "hook_embed", grad=True) as acts:
        with probes.capture(model, {"blocks.1.hook_resid_pre": lambda t, hook: 2 * t}, store=False):
            logits = model.bridge(IDS)
        (doubled_only,) = torch.autograd.grad(logits.sum(), [acts["hook_embed"]])
    assert torch.allclose(g, doubled_only / 2, atol=1e-6) and not torch.allclose(g, plain)


def test_zeroed_and_scaled_gradients_at_a_residual_reach_the_embeddings(model):
    plain = embed_grad(model, "hook_embed", lambda grad, hook: None)  # None leaves the gradient
    assert plain.abs().sum() > 0
    zeroed = embed_grad(model, "blocks.1.hook_resid_pre", lambda grad, hook: torch.zeros_like(grad))
    assert torch.equal(zeroed, plain * 0)
    tripled = embed_grad(model, "blocks.1.hook_resid_pre", lambda grad, hook: 3 * grad)
    assert torch.allclose(tripled, 3 * plain, atol=1e-5)  # every path from the embeddings passes layer 1's input


def test_bad_gradient_edits_are_one_line(model):
    with pytest.raises(probes.ProbeError, match=r"grad_edit needs a function grad_fn\(grad, hook\)"):
        probes.grad_edit(3)
    with pytest.raises(probes.ProbeError, match="grad_edit's edit must be a function"):
        probes.grad_edit(lambda g, h: g, edit="x")
    scope = probes.capture(model, "blocks.0.hook_resid_pre", probes.grad_edit(lambda g, h: g), store=False)
    with pytest.raises(probes.ProbeError, match=r"runs under torch\.no_grad"), torch.no_grad(), scope:
        model.bridge(IDS)
    scope = probes.capture(model, "blocks.0.hook_resid_pre", probes.grad_edit(lambda g, h: g[0]), store=False)
    shape = r"must return a gradient of blocks\.0\.hook_\w+'s shape \[2, 5, 16\] \(or None\), got shape \[5, 16\]"
    with pytest.raises(probes.ProbeError, match=shape), torch.enable_grad(), scope:
        model.bridge(IDS).sum().backward()


def greedy(model, prompt, steps, n, edits):
    """A hand-written greedy loop without a KV cache: the edits only at ``steps``."""
    ids = prompt
    for step in range(n):
        scope = probes.capture(model, edits, store=False) if step in steps else None
        with torch.no_grad():
            if scope is None:
                logits = model.bridge(ids)
            else:
                with scope:
                    logits = model.bridge(ids)
        ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], 1)
    return ids


def test_edits_at_chosen_steps_equal_a_manual_loop(tiny_gpt2):
    m = tiny_gpt2
    prompt = m.bridge.to_tokens("the dog saw a")
    v = torch.randn(32, generator=torch.Generator().manual_seed(1)) * 40
    edits = {"blocks.1.hook_resid_post": probes.steer(v)}
    kw = dict(max_new_tokens=6, stop_at_eos=False, use_past_kv_cache=False)
    plain = probes.generate(m, prompt, **kw)
    every = probes.generate(m, prompt, edits, **kw)
    assert not torch.equal(plain, every)  # the edit changes what is generated
    assert torch.equal(greedy(m, prompt, set(range(6)), 6, edits), every)
    for steps in ([2], [0, 4], [5]):
        chosen = probes.generate(m, prompt, edits, edit_steps=steps, **kw)
        assert torch.equal(chosen, greedy(m, prompt, set(steps), 6, edits)), steps
    assert torch.equal(probes.generate(m, prompt, edits, edit_steps=list(range(6)), **kw), every)
    with_cache = probes.generate(m, prompt, edits, edit_steps=[3], max_new_tokens=6, stop_at_eos=False)
    assert torch.equal(with_cache[:, : prompt.shape[1] + 3], plain[:, : prompt.shape[1] + 3])  # steps 0-2 plain
    assert not torch.equal(with_cache, plain)  # step 3 edited


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"edit_steps": [0]}, "give edits= too"),
        ({"edits": "E", "edit_steps": 2}, "edit_steps must be a list of step numbers"),
        ({"edits": "E", "edit_steps": [6]}, "from 0 to max_new_tokens - 1 = 5"),
        ({"edits": "E", "edit_steps": [True]}, "edit_steps must be step numbers"),
    ],
)
def test_bad_edit_steps_are_one_line(tiny_gpt2, kw, says):
    if kw.get("edits") == "E":
        kw["edits"] = {"blocks.1.hook_resid_post": probes.steer(torch.ones(32))}
    with pytest.raises(probes.ProbeError, match=says):
        probes.generate(tiny_gpt2, "the dog", max_new_tokens=6, **kw)
