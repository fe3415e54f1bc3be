"""The fast path's skipped-block logits from the intact prefix (probes.training.fast_forward.skipped_logits):
the same tensors, bit for bit, as a whole pass with each block skipped, and a known answer (a
zero block changes nothing when skipped)."""

from __future__ import annotations

import pytest
import torch

from depthprobe import probes
from depthprobe.probes.training.fast_forward import fast_logits, skipped_logits

SPEC = "native:layers=3,d_model=32,heads=4,attn_only=false,d_vocab=20,n_ctx=32,seed=5"


@pytest.fixture(scope="module")
def model():
    """A 3-block native model with weights away from their initial scale (so blocks matter)."""
    model = probes.load(SPEC, device="cpu")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.bridge.original_model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    return model


@torch.no_grad()
def test_each_skip_equals_the_whole_pass_bit_for_bit(model):
    tokens = torch.randint(0, 20, (7, 12), generator=torch.Generator().manual_seed(0))
    got = dict(skipped_logits(model, tokens))
    assert list(got) == [None, 0, 1, 2]
    assert torch.equal(got[None], fast_logits(model, tokens))
    for block in range(3):
        assert torch.equal(got[block], fast_logits(model, tokens, skip=(block,)))
        assert not torch.allclose(got[block], got[None])  # every block matters in this model


@torch.no_grad()
def test_skipping_a_zero_block_gives_the_intact_logits():
    zeroed = probes.load(SPEC, device="cpu")
    for p in zeroed.bridge.blocks[1].parameters():
        p.zero_()
    tokens = torch.randint(0, 20, (3, 9), generator=torch.Generator().manual_seed(2))
    got = dict(skipped_logits(zeroed, tokens))
    assert torch.equal(got[1], got[None])
    assert not torch.equal(got[0], got[None])
