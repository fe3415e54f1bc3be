"""depth-usage's skip passes from the intact prefix: the pass with block s skipped reruns only
blocks s+1..L-1 from the intact residual entering block s. Checked against the whole passes it
replaces (a reference computed here: every skip pass from the embeddings, block s's output
replaced by its input) to 1e-6, on tiny GPT-2 (logits), tiny BERT, a native model and minilm."""

from __future__ import annotations

import pytest
import torch

from depthprobe import probes
from depthprobe.probes.hooks.capture import forward
from depthprobe.probes.hooks.depth import readout, resid_names, skip_edits
from depthprobe.probes.measures import depth
from depthprobe.tasks.depth_usage.task import Options, State, _skip_sums

TEXTS = ["the dog saw the cat .", "a man ran to the river and the child walked to the house", "john gave mary a car"]


def _batch(model, texts_or_ids):
    from depthprobe.probes.base.batching import Batch

    if isinstance(texts_or_ids, torch.Tensor):
        ids = texts_or_ids
        return Batch(input_ids=ids, attention_mask=torch.ones_like(ids), items=[])
    enc = model.tokenizer(texts_or_ids, padding=True, return_tensors="pt")
    return Batch(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], items=[])


def _intact(model, batch):
    names = resid_names(model.info.n_layers)
    logits = readout(model) is not None
    acts = forward(model, batch.input_ids, batch.attention_mask, names, logits=logits)
    return [acts[n] for n in names], acts.get("logits")


def _whole_passes(model, batch, h, logits):
    """The reference: one whole pass per skipped block (as before the prefix was reused)."""
    L = model.info.n_layers
    names = resid_names(L)
    mask = batch.attention_mask
    later = torch.zeros(L, L, dtype=torch.float64)
    out = torch.zeros(L, 3, dtype=torch.float64)
    for s in range(L):
        edits = {**dict.fromkeys(names, lambda t, hook: None), **skip_edits(model, [s])}
        acts = forward(model, batch.input_ids, mask, edits, logits=logits is not None)
        h2 = [acts[n].float() for n in names]
        for j in range(s + 1, L):
            later[s, j] = depth.relative_change_sum(h2[j + 1] - h2[j], h[j + 1] - h[j], mask)
        out[s, 0] = depth.cosine_distance_sum(h2[-1], h[-1], mask)
        if logits is not None:
            out[s, 1], out[s, 2] = depth.kl_top1_sums(logits, acts["logits"].float(), mask)
    return later, out


def _check(model, data) -> bool:
    batch = _batch(model, data)
    h, logits = _intact(model, batch)
    state = State(model=model, options=Options(), checked=True)  # the lens checked the readout
    runs: list[int] = []
    hooks = [b.register_forward_hook(lambda *a: runs.append(1)) for b in model.bridge.blocks]
    try:
        got = _skip_sums(state, batch, h, logits, batch.attention_mask)
    finally:
        for hook in hooks:
            hook.remove()
    L = model.info.n_layers
    whole = L if logits is not None else L - 1  # without logits the pass ends inside the last block's hook
    assert len(runs) == whole + sum(L - 1 - s for s in range(1, L))  # a whole pass for s = 0, then the suffixes
    later, out = _whole_passes(model, batch, h, logits)
    torch.testing.assert_close(got["skip_later"], later, atol=1e-6, rtol=0)
    torch.testing.assert_close(got["skip_output"], out[:, 0], atol=1e-6, rtol=0)
    if logits is not None:
        torch.testing.assert_close(got["skip_kl"], out[:, 1], atol=1e-6, rtol=0)
        torch.testing.assert_close(got["skip_top1"], out[:, 2], atol=1e-6, rtol=0)
    assert later[0, 1:].abs().sum() > 0  # skipping block 0 changes later blocks: the check can fail
    return logits is not None


def test_gpt2_prefix_passes_equal_whole_passes(tiny_gpt2):
    assert _check(tiny_gpt2, TEXTS)  # with logits: KL and top-1 through the readout


def test_bert_prefix_passes_equal_whole_passes(tiny_bert):
    _check(tiny_bert, TEXTS)


def test_native_prefix_passes_equal_whole_passes():
    model = probes.load("native:layers=3,d_model=32,heads=4,attn_only=false,d_vocab=50", device="cpu")
    ids = torch.randint(0, 50, (4, 12), generator=torch.Generator().manual_seed(0))
    assert _check(model, ids)


@pytest.mark.slow
def test_minilm_prefix_passes_equal_whole_passes(minilm):
    _check(minilm, TEXTS)
