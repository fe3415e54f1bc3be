"""Batched members (probes/training/batched.py) train as the same members trained one by one.

Known answer: three khop members of one shape (different seeds, learning rates, schedules and
task levels) trained as one batched model end with the weights, window losses and validation
losses of the same members trained one by one through the same loop, up to float rounding:
weights within 1e-4, losses within 1e-5 (batched matrix products sum in another order, and Adam
divides by the gradient's own size, so rounding grows where gradients are small; measured on this
CPU after 24 steps: weights within 1.8e-7, 9.5e-7 and 3.3e-5 at peak rates 3e-3, 1e-2 and 5e-2;
window losses within 8.2e-7; validation losses within 4.8e-7). The key biases are left out of the weight
comparison: attention is invariant to them (softmax of a shift), so their gradient is rounding
noise (about 1e-9) that Adam scales to steps of the learning rate, one by one as much as batched;
the function they compute, and so the losses, do not depend on them."""

from __future__ import annotations

import pytest
import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.runtime import torch_threads
from depthprobe.probes.data import khop
from depthprobe.probes.models.loading import load
from depthprobe.probes.models.model import NativeConfig
from depthprobe.probes.training.batched import train_batched
from depthprobe.probes.training.fast_forward import fast_logits
from depthprobe.probes.training.loop import Steps, Window, target_loss, train_steps
from depthprobe.probes.training.schedule import warmup_cosine
from depthprobe.probes.training.sources import KHopSource

LETTERS, LENGTH, MAX_K, STEPS = 3, 12, 2, 24
WEIGHT_TOL, LOSS_TOL = 1e-4, 1e-5


@pytest.fixture(autouse=True)
def one_thread():
    """As law members train on a CPU (and fast on a loaded machine)."""
    with torch_threads(1):
        yield


MEMBERS = [  # (seed, peak lr, warm-up, hop levels)
    (0, 3e-3, 4, (1,)),
    (1, 1e-2, 2, (1, 2)),
    (2, 5e-2, 6, (2,)),  # large enough that clipping acts
]


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, CUDA])]


def _model(seed: int, device: str = "cpu"):
    cfg = NativeConfig(layers=2, d_model=32, heads=2, d_vocab=khop.vocab_size(LETTERS, MAX_K), n_ctx=LENGTH + 1,
                       attn_only=False, seed=seed)  # fmt: skip
    return load(cfg, device=device)


def _source(seed: int, ks: tuple[int, ...]) -> KHopSource:
    return KHopSource(ks, 8, LENGTH, LETTERS, MAX_K, seed)


def _schedule(lr: float, warmup: int):
    return lambda step: warmup_cosine(step, lr, STEPS, warmup, floor=0.1 * lr)


def _plan() -> Steps:
    return Steps(steps=STEPS, lr_at=lambda s: 0.0, grad_clip=1.0, log_every=8, check_finite=True)


def _alone(device, seed, lr, warmup, ks) -> tuple[torch.nn.Module, list[Window]]:
    """The member trained by itself, as a depth-law member trains (AdamW groups, decay on matrices)."""
    model = _model(seed, device)
    net = model.bridge.original_model
    params = [p for p in net.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.01},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]  # fmt: skip
    opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.98))
    windows: list[Window] = []
    plan = Steps(steps=STEPS, lr_at=_schedule(lr, warmup), grad_clip=1.0, log_every=8, check_finite=True)
    train_steps(net, lambda x: fast_logits(model, x), _source(seed, ks), opt, params, plan, device=model.device,
                on_window=windows.append)  # fmt: skip
    return model, windows


def _val_loss(model, seed: int) -> float:
    inputs, targets = khop.eval_batch(MAX_K, 64, LENGTH, LETTERS, MAX_K, seed)
    with torch.no_grad():
        return float(target_loss(fast_logits(model, inputs.to(model.device)), targets.to(model.device)))


@pytest.mark.parametrize("device", DEVICES)
def test_batched_members_equal_members_trained_one_by_one(device):
    alone = [_alone(device, *m) for m in MEMBERS]
    models = [_model(m[0], device) for m in MEMBERS]
    windows: list[Window] = []
    seen: list[float] = []

    def after_step(done: int) -> bool:  # the members' own models hold the current weights mid-training
        if done == STEPS // 2:
            seen.append(_val_loss(models[1], MEMBERS[1][0]))
        return False

    train_batched(models, [_source(m[0], m[3]) for m in MEMBERS], [_schedule(m[1], m[2]) for m in MEMBERS],
                  _plan(), betas=(0.9, 0.98), weight_decay=0.01, on_window=windows.append,
                  after_step=after_step)  # fmt: skip
    for i, (ref, ref_windows) in enumerate(alone):
        refs = dict(ref.bridge.original_model.named_parameters())
        for name, p in models[i].bridge.original_model.named_parameters():
            if not _key_bias(name):
                assert (p - refs[name]).abs().max() < WEIGHT_TOL, name
        assert [w.losses[i] for w in windows] == pytest.approx([w.loss for w in ref_windows], abs=LOSS_TOL)
        assert [w.lrs[i] for w in windows] == [w.lr for w in ref_windows]
        assert _val_loss(models[i], MEMBERS[i][0]) == pytest.approx(_val_loss(ref, MEMBERS[i][0]), abs=LOSS_TOL)
    assert windows[-1].losses[0] < windows[0].losses[0]  # it learned something
    assert len(seen) == 1 and seen[0] != _val_loss(models[1], MEMBERS[1][0])  # mid-training weights differ from final
    storages = {p.untyped_storage().data_ptr() for m in models for p in m.bridge.original_model.parameters()}
    assert len(storages) == len(list(models[0].bridge.original_model.parameters())) * len(models)  # released


def _key_bias(name: str) -> bool:
    return ".attn." in name and ".k." in name and name.endswith("bias")


def test_members_of_different_shapes_are_refused():
    models = [_model(0), load(NativeConfig(layers=1, d_model=32, heads=2, d_vocab=6, n_ctx=13, attn_only=False),
                              device="cpu")]  # fmt: skip
    with pytest.raises(ProbeError, match="member 1's shape differs"):
        train_batched(models, [_source(0, (1,))] * 2, [_schedule(1e-3, 1)] * 2, _plan(), betas=(0.9, 0.98),
                      weight_decay=0.0)  # fmt: skip


def test_a_diverged_member_is_named():
    models = [_model(0), _model(1)]
    sources = [_source(0, (1,)), _source(1, (1,))]
    with pytest.raises(ProbeError, match=r"diverged by step 8: member 1 \(loss nan\)"):
        train_batched(models, sources, [_schedule(1e-3, 1), lambda s: float("nan")], _plan(), betas=(0.9, 0.98),
                      weight_decay=0.0)  # fmt: skip
