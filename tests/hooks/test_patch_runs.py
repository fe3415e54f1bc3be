"""Patched runs packed many to a pass equal the same runs one by one (the table patch gave before
packing: a pass per (hook, slot), the corrupted input with one clean slot written in)."""

import pandas as pd
import pytest
import torch
import transformers

from depthprobe.probes import capture, load, run_with_cache
from depthprobe.probes.hooks.cache import outputs
from depthprobe.probes.hooks.grains import layout
from depthprobe.probes.hooks.interventions import patch
from depthprobe.probes.hooks.patch_runs import copies_per_pass

CLEAN = ["the dog saw the cat", "a man read a book"]
CORRUPT = ["the cat saw the dog", "a book read a man"]


def one_by_one(model, clean, corrupt, table, metric):
    """Each row's patched run on its own: the corrupted pass with the row's clean slot written in."""
    c_ids, c_mask = clean
    x_ids, x_mask = corrupt
    names = list(dict.fromkeys(_name(r) for r in table.itertuples()))
    _, cache = run_with_cache(model, c_ids, names=names, attention_mask=c_mask)
    values = []
    for r in table.itertuples():
        name = _name(r)
        index = _slot(r, layout(name))

        def write(t, hook, name=name, index=index):
            t = t.clone()
            t[index] = cache[name][index]
            return t

        with torch.no_grad(), capture(model, {name: write}, store=False):
            values.append(float(metric(outputs(model, x_ids, x_mask))))
    return torch.tensor(values, dtype=torch.float64)


def _name(r):
    return r.hook if pd.isna(r.layer) else f"blocks.{r.layer}.{r.hook}"


def _slot(r, kind):
    every = slice(None)
    head = every if pd.isna(r.head) else int(r.head)
    pos = every if pd.isna(r.position) else int(r.position)
    if kind == "heads":
        return (every, pos, head)
    if kind == "maps":
        return (every, head, pos)
    return (every, pos)


def metric(out):  # one number for the batch, whatever the output's width
    return out[:, -1].float().pow(2).mean()


@pytest.fixture(scope="module")
def native():
    return load("native:layers=3,d_model=16,heads=2,d_vocab=20,n_ctx=16,seed=5")


@pytest.fixture(scope="module")
def bert_body(tiny_bert_dir, tmp_path_factory):
    """An encoder without a head over the vocabulary (its logits: the final hidden states)."""
    body = tmp_path_factory.mktemp("body")
    transformers.BertModel.from_pretrained(tiny_bert_dir).save_pretrained(body, safe_serialization=True)
    transformers.AutoTokenizer.from_pretrained(tiny_bert_dir).save_pretrained(body)
    return load(str(body), device="cpu")


@pytest.mark.parametrize("which", ["tiny_bert", "tiny_gpt2", "bert_body"])
@pytest.mark.parametrize(
    "hooks,per",
    [
        ("blocks.*.attn.hook_z", "head"),
        ("blocks.*.hook_resid_pre", "position"),  # the hook a pass repeats the batch at, patched too
        (["hook_embed", "blocks.1.hook_attn_out"], "position"),  # before the first block: copies of the input
        ("blocks.*.attn.hook_pattern", "head_position"),
    ],
)
def test_packed_runs_equal_one_by_one_runs(request, which, hooks, per):
    model = request.getfixturevalue(which)
    if "hook_embed" in hooks and "hook_embed" not in model.bridge.hook_dict:
        pytest.skip(f"{which} has no hook_embed")
    (c_ids, _), (x_ids, _) = model.encode(CLEAN), model.encode(CORRUPT)
    c_ids, x_ids = c_ids[:, :4], x_ids[:, :4]  # unpadded: the passes share the blocks before the patched one
    table = patch(model, c_ids, x_ids, hooks=hooks, metric=metric, per=per)
    ones = torch.ones_like(c_ids)
    ref = one_by_one(model, (c_ids, ones), (x_ids, ones), table, metric)
    got = torch.tensor(table["value"].to_numpy(), dtype=torch.float64)
    assert len(table) > 4 and (got - ref).abs().max() < 1e-5


def test_padded_inputs_equal_one_by_one_runs(tiny_gpt2):
    """Padding (its mask cannot be shared): every copy repeats the input, mask and all."""
    clean, corrupt = tiny_gpt2.encode(CLEAN), tiny_gpt2.encode(CORRUPT)
    assert clean[0].shape == corrupt[0].shape and not bool(corrupt[1].all())
    table = patch(tiny_gpt2, CLEAN, CORRUPT, hooks="blocks.*.attn.hook_z", metric=metric)
    ref = one_by_one(tiny_gpt2, clean, corrupt, table, metric)
    got = torch.tensor(table["value"].to_numpy(), dtype=torch.float64)
    assert (got - ref).abs().max() < 1e-5


def test_the_native_attention_only_model_and_the_row_order(native):
    ids = torch.tensor([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]])
    x_ids = torch.tensor([[1, 2, 3, 9, 5, 6], [7, 8, 3, 10, 11, 12]])
    hooks = ["blocks.*.hook_resid_pre", "blocks.*.attn.hook_z"]
    table = patch(native, ids, x_ids, hooks=hooks, metric=metric)
    ones = torch.ones_like(ids)
    ref = one_by_one(native, (ids, ones), (x_ids, ones), table, metric)
    got = torch.tensor(table["value"].to_numpy(), dtype=torch.float64)
    assert (got - ref).abs().max() < 1e-5
    # rows in sweep order: every residual slot layer by layer, then every head layer by layer
    assert table["hook"].tolist() == ["hook_resid_pre"] * 18 + ["attn.hook_z"] * 6
    assert table["layer"].tolist()[:18] == [0] * 6 + [1] * 6 + [2] * 6
    assert table["position"].tolist()[:6] == list(range(6))


def test_a_pass_holds_as_many_copies_as_its_memory_allows(tiny_gpt2):
    """Wider inputs, fewer copies a pass; never none, never more than the runs."""
    few = copies_per_pass(tiny_gpt2, (8, 12), runs=1000)
    many = copies_per_pass(tiny_gpt2, (1, 4), runs=1000)
    assert 1 <= few < many <= 1000
    assert copies_per_pass(tiny_gpt2, (1, 4), runs=3) == 3
    assert copies_per_pass(tiny_gpt2, (10**6, 60), runs=5) == 1


@pytest.mark.parametrize("which", ["tiny_bert", "tiny_gpt2", "bert_body", "native"])
def test_unpadded_passes_share_the_blocks_before_the_patched_one(request, which):
    """A pass of layer L's runs goes through the blocks before L with the batch itself (one copy)
    and leaves the last block with a copy per run: the clean and corrupted passes (2 rows), then a
    pass per layer (2 rows x its heads, from its block on)."""
    model = request.getfixturevalue(which)
    ids = model.encode(CLEAN)[0][:, :4] if model.tokenizer is not None else torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    entering, leaving = [], []
    last = f"blocks.{model.info.n_layers - 1}.hook_resid_post"

    def seen(into):
        return lambda t, hook: into.append(t.shape[0])

    with capture(model, {"blocks.0.hook_resid_pre": seen(entering), last: seen(leaving)}, store=False):
        table = patch(model, ids, ids.flip(0), hooks="blocks.*.attn.hook_z", metric=metric)
    heads = model.info.n_heads
    assert len(table) == model.info.n_layers * heads
    assert entering == [2, 2, 2 * heads] + [2] * (model.info.n_layers - 1)
    assert leaving == [2, 2] + [2 * heads] * model.info.n_layers
