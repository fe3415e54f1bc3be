"""SPAConfig's ``positional``: none is the network from before the field, learned adds W_P [n_ctx, width]
learned from zeros."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.models import families, variant_net
from depthprobe.probes.models.variants import SPAConfig

SMALL = "depth=2,width=16,heads=2,n_ctx=8,d_vocab=32,dtype=float64,seed=3"
TOKENS = torch.arange(8).reshape(1, 8) * 3 % 32
# the last position's first four logits and the sum of every logit, computed with the code before
# the field existed (commit 91fc3ed) for spa:variant=V,SMALL on TOKENS
BEFORE = {
    "pre-ln": ([0.237322522760553, -2.407906235177795, -0.21119420370937264, -1.186441265974952], -15.330352638085898),
    "e-spa": ([0.415229173780587, 0.6092118410234695, 0.4219448824817291, 0.6279974531613703], 36.646593035585624),
}


def _net(spec: str) -> variant_net.VariantTransformer:
    return variant_net.VariantTransformer(SPAConfig.parse(spec)).eval()


@pytest.mark.parametrize("variant", list(BEFORE))
def test_none_is_the_network_from_before_the_field(variant):
    net = _net(f"spa:variant={variant},{SMALL}")
    assert net.cfg.positional == "none" and "W_P" not in dict(net.named_parameters())
    with torch.no_grad():
        out = net(TOKENS)
    last, total = BEFORE[variant]
    assert out[0, -1, :4].tolist() == pytest.approx(last, rel=1e-12, abs=1e-12)
    assert out.sum().item() == pytest.approx(total, rel=1e-12)


@pytest.mark.parametrize("variant", ["pre-ln", "e-spa", "vanilla"])
def test_learned_adds_n_ctx_by_width_and_keeps_every_other_weight(variant):
    none, learned = _net(f"spa:variant={variant},{SMALL}"), _net(f"spa:variant={variant},{SMALL},positional=learned")
    grow = 8 * 16
    assert learned.cfg.n_params() - none.cfg.n_params() == grow
    assert sum(p.numel() for p in learned.parameters()) == learned.cfg.n_params()
    assert families.count_params(learned)[1] - families.count_params(none)[1] == grow  # counted as embedding
    assert learned.W_P.shape == (8, 16)
    a, b = dict(none.named_parameters()), dict(learned.named_parameters())
    assert set(b) - set(a) == {"W_P"}
    assert all(torch.equal(a[k], b[k]) for k in a)  # W_P draws nothing from the seed
    assert not learned.W_P.any()  # learned from zeros


@pytest.mark.parametrize("variant", list(BEFORE))
def test_learned_starts_as_the_network_without_it(variant):
    """At initialisation W_P is zero, so the logits equal the positional-free network's exactly;
    after one gradient step W_P has moved (it is trained) and the logits differ."""
    none, learned = _net(f"spa:variant={variant},{SMALL}"), _net(f"spa:variant={variant},{SMALL},positional=learned")
    with torch.no_grad():
        assert torch.equal(learned(TOKENS), none(TOKENS))
    loss = learned(TOKENS)[0, :-1].log_softmax(-1).gather(-1, TOKENS[0, 1:, None]).mean()
    loss.backward()
    assert learned.W_P.grad is not None and learned.W_P.grad[:7].abs().sum() > 0
    with torch.no_grad():
        learned.W_P.sub_(learned.W_P.grad)
        assert not torch.equal(learned(TOKENS), none(TOKENS))


def test_spec_names_positional_only_when_learned():
    assert "positional" not in SPAConfig.parse(f"spa:{SMALL}").spec()
    cfg = SPAConfig.parse(f"spa:variant=pre-ln,{SMALL},positional=learned")
    assert cfg.positional == "learned" and cfg.spec().endswith(",positional=learned")
    assert SPAConfig.parse(cfg.spec()) == cfg


def test_unknown_positional_suggests_learned():
    with pytest.raises(ProbeError) as err:
        SPAConfig.parse("spa:positional=learnd")
    assert "did you mean 'learned'" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("positional", "moves"), [("none", False), ("learned", True)])
def test_order_of_earlier_tokens_reaches_the_last_position_only_with_learned(positional, moves):
    """One softmax block: without a position signal the last query attends over a set of keys, so
    swapping two earlier tokens leaves the last position's logits as they were; W_P makes it move."""
    net = _net(f"spa:variant=pre-ln,{SMALL.replace('depth=2', 'depth=1')},attention=softmax,positional={positional}")
    with torch.no_grad():
        net.blocks[0].attn.W_Q.mul_(8.0)  # sharper attention: a clear difference when positions count
        if positional == "learned":  # a trained position table (it starts at zeros)
            net.W_P.copy_(torch.randn(8, 16, generator=torch.Generator().manual_seed(2), dtype=torch.float64))
        swapped = TOKENS[:, [1, 0, *range(2, 8)]]
        diff = (net(TOKENS)[0, -1] - net(swapped)[0, -1]).abs().max().item()
    assert (diff > 1e-3) if moves else (diff < 1e-12), diff


def test_learned_checkpoint_reloads_with_identical_logits(tmp_path):
    model = variant_net.build(f"spa:variant=e-spa,{SMALL},positional=learned", device="cpu")
    with torch.no_grad():
        model.bridge.W_P.add_(torch.randn(8, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64))
        before = model.bridge(TOKENS)
    variant_net.save_checkpoint(model, tmp_path)
    back = variant_net.load_checkpoint(tmp_path, torch.device("cpu"))
    assert back.bridge.cfg.positional == "learned"
    with torch.no_grad():
        assert torch.equal(back.bridge(TOKENS), before)


def test_checkpoint_without_the_field_loads_as_none(tmp_path):
    model = variant_net.build(f"spa:variant=pre-ln,{SMALL}", device="cpu")
    variant_net.save_checkpoint(model, tmp_path)
    meta = json.loads((tmp_path / "depthprobe.json").read_text())
    assert "positional" not in meta["spa"]  # what a checkpoint from before the field holds
    back = variant_net.load_checkpoint(tmp_path, torch.device("cpu"))
    assert back.bridge.cfg == dataclasses.replace(model.bridge.cfg, positional="none")
