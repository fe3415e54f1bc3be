"""run_with_cache keeps the pass's own tensors (no copies) and they hold what the pass computed;
the bridge's normalization shortcut changes no output."""

import pytest
import torch

from depthprobe.probes import capture, load, run_with_cache


@pytest.fixture(scope="module")
def native():
    return load("native:layers=2,d_model=16,heads=2,d_vocab=20,n_ctx=16,seed=1,attn_only=false")


@pytest.mark.parametrize("which", ["tiny_bert", "tiny_gpt2", "native"])
def test_every_cached_tensor_equals_a_copy_taken_as_its_hook_fired(request, which):
    model = request.getfixturevalue(which)
    ids = torch.tensor([[1, 5, 6, 7, 8, 2], [1, 9, 10, 11, 12, 2]])
    _, cache = run_with_cache(model, ids)
    with torch.no_grad(), capture(model, list(cache), clone=True) as copies:
        model.bridge(ids)
    assert len(cache) > 40 and set(cache) == set(copies)
    for name, tensor in cache.items():
        assert torch.equal(tensor, copies[name]), name
    # one hook point under two names is one tensor, not two copies
    assert cache["blocks.0.hook_resid_pre"].data_ptr() == cache["blocks.0.hook_in"].data_ptr()


def test_a_saved_cache_of_shared_tensors_loads_back_exactly(tiny_gpt2, tmp_path):
    ids = torch.tensor([[1, 5, 6, 7, 8]])
    _, cache = run_with_cache(tiny_gpt2, ids)
    back = type(cache).load(cache.save(tmp_path / "c.safetensors"))
    assert list(back) == list(cache)
    assert all(torch.equal(back[k], cache[k]) for k in cache)


@pytest.mark.parametrize("which", ["tiny_bert", "tiny_gpt2"])
def test_a_norm_with_a_hook_on_its_statistics_gives_the_same_output(request, which):
    """With no hook on hook_scale or hook_normalized the bridge's normalization returns the
    wrapped module's output directly; a hook there runs the bridge's own path: same logits."""
    model = request.getfixturevalue(which)
    ids = torch.tensor([[1, 5, 6, 7, 8, 2]])
    norms = [n for n in model.bridge.hook_dict if n.endswith(("hook_scale", "hook_normalized"))]
    assert norms
    with torch.no_grad():
        plain = model.bridge(ids)
        with capture(model, norms) as seen:
            hooked = model.bridge(ids)
    assert torch.equal(plain, hooked)
    assert set(seen) == set(norms)
