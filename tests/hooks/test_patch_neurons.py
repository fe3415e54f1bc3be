"""Per-neuron patching (patch(per="neuron", neurons=...)): the packed table equals a hand-written
loop writing one clean neuron into the corrupted run, a neuron the inputs do not move changes
nothing, and bad requests are refused in one line."""

import pytest
import torch
import transformers

from depthprobe.probes import capture, load, run_with_cache
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.hooks import patching
from depthprobe.probes.hooks.attribution import attribute
from depthprobe.probes.hooks.cache import outputs
from depthprobe.probes.hooks.interventions import patch

CLEAN = ["the dog saw the cat", "a man read a book"]
CORRUPT = ["the cat saw the dog", "a book read a man"]


def metric(out):  # one number for the batch, whatever the output's width (x100: effects well over 1e-5)
    return 100 * out[:, -1].float().pow(2).mean()


def ids_of(model):
    (c_ids, _), (x_ids, _) = model.encode(CLEAN), model.encode(CORRUPT)
    return c_ids[:, :4], x_ids[:, :4]


def reference(model, c_ids, x_ids, name, neurons):
    """One corrupted pass per neuron, with that neuron's clean activation (every position) written in."""
    _, cache = run_with_cache(model, c_ids, names=[name])
    values = []
    for i in neurons:

        def write(t, hook, i=i):
            t = t.clone()
            t[:, :, i] = cache[name][:, :, i]
            return t

        with torch.no_grad(), capture(model, {name: write}, store=False):
            values.append(float(metric(outputs(model, x_ids, torch.ones_like(x_ids)))))
    return values


@pytest.mark.parametrize("which", ["tiny_gpt2", "tiny_bert"])
@pytest.mark.parametrize(
    "hook,neurons",
    [("blocks.1.mlp.hook_post", [0, 5, 17, 30]), ("blocks.0.mlp.hook_post", None), ("blocks.1.hook_resid_pre", [3, 1])],
)
def test_the_packed_neuron_table_equals_a_loop_of_one_neuron_patches(request, which, hook, neurons):
    model = request.getfixturevalue(which)
    c_ids, x_ids = ids_of(model)
    table = patch(model, c_ids, x_ids, hooks=hook, metric=metric, per="neuron", neurons=neurons)
    width = run_with_cache(model, c_ids, names=[hook])[1][hook].shape[-1]
    want = sorted(neurons) if neurons is not None else list(range(width))
    assert table["neuron"].tolist() == want and table["position"].isna().all() and table["head"].isna().all()
    ref = torch.tensor(reference(model, c_ids, x_ids, hook, want), dtype=torch.float64)
    got = torch.tensor(table["value"].to_numpy(), dtype=torch.float64)
    assert (got - ref).abs().max() < 1e-5
    if which == "tiny_gpt2":  # some neuron moves the metric 100x the tolerance (the tiny BERT's: ~1e-6)
        assert (got - table.attrs["corrupt"]).abs().max() > 1e-3


@pytest.fixture(scope="module")
def dead_neuron_gpt2(tiny_gpt2_dir, tmp_path_factory):
    """The tiny GPT-2 with neuron 7 of block 0's MLP reading nothing: its input weights zero, so
    its activation is gelu(bias) on every input, clean and corrupted alike."""
    hf = transformers.GPT2LMHeadModel.from_pretrained(tiny_gpt2_dir)
    with torch.no_grad():
        hf.transformer.h[0].mlp.c_fc.weight[:, 7] = 0.0
        hf.transformer.h[0].mlp.c_fc.bias[7] = 0.5
    out = tmp_path_factory.mktemp("dead")
    hf.save_pretrained(out, safe_serialization=True)
    transformers.AutoTokenizer.from_pretrained(tiny_gpt2_dir).save_pretrained(out)
    return load(str(out), device="cpu")


def test_a_neuron_equal_in_both_runs_changes_nothing(dead_neuron_gpt2):
    model = dead_neuron_gpt2
    c_ids, x_ids = ids_of(model)
    hook = "blocks.0.mlp.hook_post"
    acts = [run_with_cache(model, ids, names=[hook])[1][hook] for ids in (c_ids, x_ids)]
    assert torch.equal(acts[0][..., 7], acts[1][..., 7]) and not torch.equal(acts[0], acts[1])
    table = patch(model, c_ids, x_ids, hooks=hook, metric=metric, per="neuron", neurons=[7, 8])
    effect = (table.set_index("neuron")["value"] - table.attrs["corrupt"]).abs()
    assert effect[7] < 1e-6 and effect[8] > 1e-6


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"hooks": "blocks.0.attn.hook_z", "per": "neuron"}, "cannot be patched per='neuron'"),
        ({"hooks": "blocks.0.attn.hook_pattern", "per": "neuron"}, "cannot be patched per='neuron'"),
        ({"hooks": "blocks.0.mlp.hook_post", "per": "neuron", "neurons": [128]}, "neurons must lie in 0..127"),
        ({"hooks": "blocks.0.mlp.hook_post", "per": "neuron", "neurons": []}, "neurons must lie in"),
        ({"hooks": "blocks.0.mlp.hook_post", "per": "neuron", "neurons": ["a"]}, "neurons must be a list"),
        ({"hooks": "blocks.0.mlp.hook_post", "neurons": [1]}, "pass per='neuron'"),
    ],
)
def test_bad_neuron_requests_are_refused_in_one_line(tiny_gpt2, kwargs, message):
    c_ids, x_ids = ids_of(tiny_gpt2)
    with pytest.raises(ProbeError, match=message) as err:
        patch(tiny_gpt2, c_ids, x_ids, metric=metric, **kwargs)
    assert "\n" not in str(err.value)


def test_every_neuron_of_many_hooks_is_refused_past_the_limit(tiny_gpt2, monkeypatch):
    """Two layers x 128 neurons is 256 runs: past a limit of 200 without neurons=, within it with them."""
    c_ids, x_ids = ids_of(tiny_gpt2)
    monkeypatch.setattr(patching, "MAX_NEURONS", 200)
    with pytest.raises(ProbeError, match=r"256 patched runs \(limit 200\); pick some with neurons="):
        patch(tiny_gpt2, c_ids, x_ids, hooks="blocks.*.mlp.hook_post", metric=metric, per="neuron")
    table = patch(tiny_gpt2, c_ids, x_ids, hooks="blocks.*.mlp.hook_post", metric=metric, per="neuron", neurons=[1])
    assert table["layer"].tolist() == [0, 1] and table["neuron"].tolist() == [1, 1]


def test_attribute_per_neuron_spot_checks_equal_the_patched_table(tiny_gpt2):
    """attribute(per="neuron") estimates every neuron; the neurons it ranks first are patched
    through the same runs, and their patched effects are patch's values."""
    c_ids, x_ids = ids_of(tiny_gpt2)
    hooks = "blocks.*.mlp.hook_post"
    est = attribute(tiny_gpt2, c_ids, x_ids, metric, hooks=hooks, per="neuron", check=3)
    picked = attribute(tiny_gpt2, c_ids, x_ids, metric, hooks=hooks, per="neuron", neurons=[5, 2], check=0)
    assert picked["neuron"].tolist() == [2, 5, 2, 5]
    assert len(est) == 2 * 128 and est["neuron"].tolist()[:3] == [0, 1, 2]
    table = patch(tiny_gpt2, c_ids, x_ids, hooks=hooks, metric=metric, per="neuron").set_index(["layer", "neuron"])
    for checked in est.attrs["checked"]:
        layer, neuron = int(checked["hook"].split(".")[1]), int(checked["slot"].split()[-1])
        want = table.loc[(layer, neuron), "value"] - table.attrs["corrupt"]
        assert abs(checked["patched"] - want) < 1e-5
