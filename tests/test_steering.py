"""#35.7 (part): a steering vector from contrast pairs, an edit adding it, generation with scoped edits."""

from __future__ import annotations

import pytest
import torch

import depthprobe.probes as probes

SPEC = "native:layers=2,d_model=32,heads=4,d_vocab=20,n_ctx=32"


@pytest.fixture(scope="module")
def model():
    return probes.load(SPEC, device="cpu")


def test_steering_vector_is_the_difference_of_means_at_the_last_real_token(model):
    pos, neg = [[1, 2, 3], [4, 5]], [[6, 7, 8], [9, 10, 11]]
    hook = "blocks.0.hook_resid_post"
    v = probes.steering_vector(model, pos, neg, hook)

    def last(rows):
        acts = [probes.run_with_cache(model, torch.tensor([r]), hook)[1][hook][0, -1] for r in rows]
        return torch.stack(acts).mean(0)

    assert v.shape == (32,) and torch.allclose(v, last(pos) - last(neg), atol=1e-6)
    with pytest.raises(probes.ProbeError, match="reads one hook"):
        probes.steering_vector(model, pos, neg, "blocks.*.hook_resid_post")


def test_generate_with_scoped_edits(model):
    prompt = torch.tensor([[1, 2, 3, 4]])
    plain = probes.generate(model, prompt, max_new_tokens=6)
    assert torch.equal(
        plain, model.bridge.generate(prompt, max_new_tokens=6, do_sample=False, verbose=False, stop_at_eos=False)
    )
    v = probes.steering_vector(model, [[5, 5, 5]], [[1, 2, 3]], "blocks.1.hook_resid_post")
    steered = probes.generate(
        model, prompt, {"blocks.1.hook_resid_post": probes.steer(v, scale=50.0)}, max_new_tokens=6
    )
    assert steered.shape == plain.shape and not torch.equal(steered, plain)
    assert torch.equal(probes.generate(model, prompt, max_new_tokens=6), plain)  # the edit was removed
    with pytest.raises(probes.ProbeError, match="a dict of hook name"):
        probes.generate(model, prompt, [probes.steer(v)])
