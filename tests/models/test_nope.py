"""Native models without positional encoding (``positional=none``, NoPE): no position parameter,
and outputs that depend on positions only as the theory allows (a causal mask and the tokens)."""

from __future__ import annotations

import torch

from depthprobe.probes.models.checkpoints import save_checkpoint
from depthprobe.probes.models.loading import load
from depthprobe.probes.models.model import NativeConfig
from depthprobe.probes.training.fast_forward import fast_logits

SPEC = "native:layers={layers},d_model=32,heads=4,d_vocab=6,n_ctx=32,attn_only=false,positional={pos},seed=1"


def model(layers: int, pos: str = "none"):
    return load(SPEC.format(layers=layers, pos=pos), device="cpu")


def logits(m, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return m.bridge(torch.tensor([ids]))[0]  # [pos, vocab]


def test_no_position_parameter_and_exact_count():
    m = model(2)
    names = [n for n, _ in m.bridge.original_model.named_parameters()]
    assert not any("pos" in n for n in names)
    assert NativeConfig.parse(SPEC.format(layers=2, pos="none")).n_params() == sum(
        p.numel() for p in m.bridge.original_model.parameters()
    )
    assert model(2, "learned").bridge.original_model.pos is not None  # the control has one


def test_identical_tokens_give_identical_outputs_at_every_position():
    """Every position of a constant input sees the same multiset of identical tokens, so at any
    depth every position computes the same thing; learned positions break that."""
    for layers in (1, 3):
        out = logits(model(layers), [2] * 12)
        assert torch.allclose(out, out[:1].expand_as(out), atol=1e-5)
    learned = logits(model(1, "learned"), [2] * 12)
    assert not torch.allclose(learned, learned[:1].expand_as(learned), atol=1e-3)


def test_depth_one_sees_counts_not_order():
    """One layer: the output at t depends on x_t and the multiset of the prefix only."""
    one = model(1)
    a, b = logits(one, [5, 0, 1, 1, 0, 0, 1]), logits(one, [5, 1, 0, 0, 1, 0, 1])
    assert torch.allclose(a[-1], b[-1], atol=1e-5)
    a, b = logits(model(1, "learned"), [5, 0, 1, 1, 0, 0, 1]), logits(model(1, "learned"), [5, 1, 0, 0, 1, 0, 1])
    assert not torch.allclose(a[-1], b[-1], atol=1e-3)  # learned positions see the order
    two = model(2)  # two layers: earlier positions' outputs differ, so the order shows
    a, b = logits(two, [5, 0, 1, 1, 0, 0, 1]), logits(two, [5, 1, 0, 0, 1, 0, 1])
    assert not torch.allclose(a[-1], b[-1], atol=1e-4)


def test_fast_path_and_checkpoint_round_trip(tmp_path):
    m = model(2)
    x = torch.randint(0, 6, (3, 9))
    with torch.no_grad():
        assert torch.allclose(fast_logits(m, x), m.bridge(x), atol=1e-5)
    again = load(str(save_checkpoint(m, tmp_path / "ckpt")), device="cpu")
    assert again.info.native is not None and again.info.native["positional"] == "none"
    with torch.no_grad():
        assert torch.equal(m.bridge(x), again.bridge(x))
