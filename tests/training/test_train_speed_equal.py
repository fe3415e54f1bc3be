"""The training speed-ups (issue #23) change no result beyond float rounding.

The reference is the path as it was before them, rebuilt here: the next-token loss computed on
sliced logits (``logits[:, :-1]``, a copy) and AdamW's default per-parameter loop on CPU
(``foreach=False``). The fast path is the code as shipped: :func:`probes.training.fast_forward.lm_loss`
(shifted targets, the last position ignored) and the optimisers of ``probe study``
(:func:`probes.training.lm.optimizer`) and ``probe train`` (:func:`probes.training.train.make_optimizer`).
Both train the same freshly built member the same steps through the one loop, then must agree within
``rtol=1e-4, atol=1e-5``: the logits of a held-out batch, and every parameter but the attention key
biases (measured: at most 1e-6 apart). A key bias adds the same amount to every score of a query,
which the softmax removes, so its gradient is zero up to rounding (about 1e-9) and Adam, which divides
by the gradient's own scale, turns that rounding noise into steps of about the learning rate, in
either path: the key biases drift apart (by about 7e-4 after 12 steps) without changing any logit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from depthprobe.probes.data.synthetic import DataConfig
from depthprobe.probes.models.loading import load
from depthprobe.probes.models.model import NativeConfig
from depthprobe.probes.training import lm
from depthprobe.probes.training.config import TrainConfig
from depthprobe.probes.training.fast_forward import lm_loss
from depthprobe.probes.training.loop import Steps, train_steps
from depthprobe.probes.training.sources import SyntheticSource
from depthprobe.probes.training.train import make_optimizer, parameters

NATIVE = NativeConfig(layers=2, d_model=32, heads=4, d_mlp=64, d_vocab=64, n_ctx=32, attn_only=False)
STEPS = 12
RTOL, ATOL = 1e-4, 1e-5


class SlicedLoss(SyntheticSource):
    """The synthetic batches, scored the old way: a copy of the logits without the last position."""

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        v = logits.shape[-1]
        return F.cross_entropy(logits[:, :-1].reshape(-1, v), targets[:, 1:].reshape(-1))


def _train(source: SyntheticSource, make_opt) -> dict[str, torch.Tensor]:
    """The trained member's parameters by name, and its logits on a held-out batch (as "logits")."""
    model = load(NATIVE, device="cpu")
    cfg = lm.LMConfig(tokens=STEPS * 8 * 32, batch_size=8, context=32)
    params = parameters(model)
    plan = Steps(steps=STEPS, lr_at=cfg.lr_at, grad_clip=cfg.grad_clip, log_every=5)
    with torch.random.fork_rng():
        train_steps(model.bridge, lm.logits_fn(model), source, make_opt(model, cfg), params, plan, device=model.device)
    out = {name: p.detach().clone() for name, p in lm.module(model).named_parameters()}
    with torch.no_grad():
        out["logits"] = lm.logits_fn(model)(source.batch(10**6)[0])
    return out


def _assert_same(fast: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> None:
    assert fast.keys() == ref.keys()
    key_biases = [n for n in ref if n.endswith("k._original_component.bias")]
    assert key_biases  # the exemption names real parameters
    for name in sorted(set(ref) - set(key_biases)):
        torch.testing.assert_close(fast[name], ref[name], rtol=RTOL, atol=ATOL, msg=lambda m, n=name: f"{n}: {m}")


def _source(cls=SyntheticSource) -> SyntheticSource:
    return cls(DataConfig(seq_len=32, vocab=NATIVE.d_vocab), seed=0, batch_size=8)


def _reference_adamw(model, cfg: lm.LMConfig) -> torch.optim.AdamW:
    """lm.optimizer's decay groups, stepped by AdamW's plain per-parameter loop."""
    groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in lm.optimizer(model, cfg).param_groups]
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, foreach=False)
    assert not any(g["fused"] for g in opt.param_groups)
    return opt


def test_lm_loss_equals_the_sliced_loss():
    torch.manual_seed(0)
    logits = torch.randn(3, 7, 11, requires_grad=True)
    tokens = torch.randint(0, 11, (3, 7))
    sliced = F.cross_entropy(logits[:, :-1].reshape(-1, 11), tokens[:, 1:].reshape(-1))
    fast = lm_loss(logits, tokens)
    torch.testing.assert_close(fast, sliced, rtol=1e-6, atol=1e-6)
    (g_fast,) = torch.autograd.grad(fast, logits)
    (g_sliced,) = torch.autograd.grad(sliced, logits)
    torch.testing.assert_close(g_fast, g_sliced, rtol=1e-6, atol=1e-7)
    assert torch.all(g_fast[:, -1] == 0)  # the last position has no next token


def test_the_optimisers_are_fused_on_cpu():
    model = load(NATIVE, device="cpu")
    opts = [lm.optimizer(model, lm.LMConfig(tokens=1)), make_optimizer(model, TrainConfig())]
    assert all(g["fused"] for opt in opts for g in opt.param_groups)
    assert [g["weight_decay"] for g in opts[0].param_groups] == [0.1, 0.0]  # the decay groups stay


def test_member_trained_fast_equals_the_reference_path():
    fast = _train(_source(), lm.optimizer)
    ref = _train(_source(SlicedLoss), _reference_adamw)
    _assert_same(fast, ref)
    moved = _train(_source(), lambda model, cfg: torch.optim.SGD(lm.module(model).parameters(), lr=0.0))
    assert any(not torch.equal(fast[n], moved[n]) for n in fast)  # training moved the weights


def test_probe_train_optimizer_equals_the_reference_path():
    tc = TrainConfig()

    def reference(model, cfg):
        return torch.optim.AdamW(parameters(model), lr=tc.lr, betas=tc.betas, weight_decay=tc.weight_decay,
                                 foreach=False)  # fmt: skip

    fast = _train(_source(), lambda model, cfg: make_optimizer(model, tc))
    ref = _train(_source(SlicedLoss), reference)
    _assert_same(fast, ref)
