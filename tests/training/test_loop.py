"""The one training loop (probes/training/loop.py) and its sources, on problems with known answers."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.data import synthetic
from depthprobe.probes.data.synthetic import DataConfig
from depthprobe.probes.models.loading import load
from depthprobe.probes.models.model import NativeConfig
from depthprobe.probes.training import lm
from depthprobe.probes.training.config import TrainConfig
from depthprobe.probes.training.fast_forward import lm_loss
from depthprobe.probes.training.loop import IGNORE, Steps, Window, target_loss, train_steps
from depthprobe.probes.training.sources import CopySource, SyntheticSource
from depthprobe.probes.training.train import make_optimizer, parameters


class Scalar(torch.nn.Module):
    """logits = w (one scalar) at every input; the loss (w - target)^2."""

    def __init__(self, w: float = 0.0) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(w))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.w * torch.ones(inputs.shape, dtype=torch.float32)


class ToOne:
    """Every batch asks for 1.0; loss = mean squared error."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.steps.append(step)
        return torch.zeros(2, 3), torch.ones(2, 3)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return ((logits - targets) ** 2).mean()


def _train(net: Scalar, plan: Steps, source: ToOne | None = None, **hands):
    source = source or ToOne()
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    windows: list[Window] = []
    run = train_steps(net, net, source, opt, net.parameters(), plan, device=torch.device("cpu"),
                      on_window=windows.append, **hands)  # fmt: skip
    return run, windows, source


def test_sgd_steps_and_windows_have_the_known_values():
    # w <- w - lr * 2 (w - 1) from w = 0 at lr 0.1: 0.2, 0.36, 0.488, 0.5904; losses (w - 1)^2 before each update
    net = Scalar()
    run, windows, _ = _train(net, Steps(steps=4, lr_at=lambda s: 0.1, grad_clip=None, log_every=2))
    assert net.w.item() == pytest.approx(0.5904)
    assert [w.step for w in windows] == [2, 4]
    assert [w.updates for w in windows] == [2, 2]
    assert windows[0].loss == pytest.approx((1.0 + 0.64) / 2)
    assert windows[1].loss == pytest.approx((0.64**2 + 0.512**2) / 2)
    assert run.seconds > 0 and not net.training


def test_learning_rate_schedule_clipping_and_extra_log_points():
    net = Scalar()
    # gradient -2 at w = 0 clipped to norm 0.5: the first update is lr * 0.5 = 0.05
    _, windows, _ = _train(net, Steps(steps=1, lr_at=lambda s: 0.1, grad_clip=0.5))
    assert net.w.item() == pytest.approx(0.05)
    net = Scalar()
    _, windows, _ = _train(net, Steps(steps=5, lr_at=lambda s: 0.01 * (s + 1), grad_clip=None, log_every=10,
                                      log_at=frozenset({3})))  # fmt: skip
    assert [(w.step, w.updates) for w in windows] == [(3, 3), (5, 2)]
    assert [w.lr for w in windows] == pytest.approx([0.03, 0.05])


def test_start_resumes_at_the_given_step_and_hands_see_every_step():
    seen: list[int] = []

    def after(done: int) -> bool:
        seen.append(done)
        return done == 4

    net = Scalar()
    _, _, source = _train(net, Steps(steps=6, lr_at=lambda s: 0.1, start=3), after_step=after)
    assert source.steps == [3, 4, 5]
    assert seen == [4, 5, 6]


def test_a_diverging_run_stops_with_one_line_when_asked():
    net = Scalar(w=math.inf)
    with pytest.raises(ProbeError, match="diverged by step 2"):
        _train(net, Steps(steps=4, lr_at=lambda s: 0.1, log_every=2, check_finite=True))
    net = Scalar(w=math.inf)
    _, windows, _ = _train(net, Steps(steps=2, lr_at=lambda s: 0.1, log_every=2))
    assert not math.isfinite(windows[0].loss)


def test_target_loss_ignores_unscored_positions():
    logits = torch.tensor([[[0.0, 10.0], [10.0, 0.0]]])  # position 0 predicts 1, position 1 predicts 0
    right = target_loss(logits, torch.tensor([[1, IGNORE]]))
    wrong = target_loss(logits, torch.tensor([[IGNORE, 1]]))
    assert right.item() == pytest.approx(math.log1p(math.exp(-10)), rel=1e-3)  # float32 softmax
    assert wrong.item() == pytest.approx(10 + math.log1p(math.exp(-10)), rel=1e-6)


def test_synthetic_source_is_probe_trains_data_as_a_pure_function_of_the_step():
    data = DataConfig(vocab=30, seq_len=16)
    source = SyntheticSource(data, seed=3, batch_size=4)
    inputs, targets = source.batch(7)
    assert torch.equal(inputs, synthetic.batch_at(data, 3, 7, 4)) and torch.equal(inputs, targets)
    assert torch.equal(source.batch(7)[0], inputs)


def test_copy_source_scores_only_the_repeated_half():
    source = CopySource(batch_size=2, t=8, d_vocab=5, seed=0)
    ids, targets = source.batch(0)
    assert torch.equal(ids[:, :4], ids[:, 4:])
    logits = torch.full((2, 8, 5), -20.0)
    logits[:, 3:7].scatter_(2, ids[:, 4:].unsqueeze(-1), 20.0)  # right on every repeated position
    assert source.loss(logits, targets).item() < 1e-6
    logits[:, 0] = 0.0  # the first half is not scored
    assert source.loss(logits, targets).item() < 1e-6


def test_a_named_job_prints_its_progress_with_steps_per_second_and_time_left(capsys):
    """Inside a named job (a study or sweep member) the loop says where training stands on stderr:
    a long member was silent for minutes before. Outside one it prints nothing."""
    import re

    from depthprobe.probes.base.progress import job_label

    plan = Steps(steps=6, lr_at=lambda s: 0.0, grad_clip=None, log_every=2)
    _train(Scalar(), plan)
    assert capsys.readouterr().err == ""
    with job_label("levine-b0025k-L01-s0", every_s=0):
        _train(Scalar(), plan)
    lines = capsys.readouterr().err.splitlines()
    name = "  levine-b0025k-L01-s0"
    assert [ln.split(",")[0] for ln in lines] == [f"{name}: step 2/6", f"{name}: step 4/6"]
    line = r"  levine-b0025k-L01-s0: step \d/6, [0-9.]+ steps/s, about \d+ s of training left"
    assert all(re.fullmatch(line, ln) for ln in lines), lines


NATIVE = NativeConfig(layers=2, d_model=32, heads=4, d_mlp=64, d_vocab=64, n_ctx=32, attn_only=False)


STEPS = 12


RTOL, ATOL = 1e-4, 1e-5


class SlicedLoss(SyntheticSource):
    """The synthetic batches, scored the old way: a copy of the logits without the last position."""

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        v = logits.shape[-1]
        return F.cross_entropy(logits[:, :-1].reshape(-1, v), targets[:, 1:].reshape(-1))


def _train_member(source: SyntheticSource, make_opt) -> dict[str, torch.Tensor]:
    """The trained member's parameters by name, and its logits on a held-out batch (as "logits")."""
    model = load(NATIVE, device="cpu")
    cfg = lm.LMConfig(tokens=STEPS * 8 * 32, batch_size=8, context=32)
    params = parameters(model)
    plan = Steps(steps=STEPS, lr_at=cfg.lr_at, grad_clip=cfg.grad_clip, log_every=5)
    with torch.random.fork_rng():
        train_steps(
            model.bridge, lm.native(model).logits, source, make_opt(model, cfg), params, plan, device=model.device
        )
    out = {name: p.detach().clone() for name, p in lm.native(model).module.named_parameters()}
    with torch.no_grad():
        out["logits"] = lm.native(model).logits(source.batch(10**6)[0])
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
    groups = [
        {"params": g["params"], "weight_decay": g["weight_decay"]}
        for g in lm.optimizer(lm.native(model), cfg).param_groups
    ]
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
    opts = [lm.optimizer(lm.native(model), lm.LMConfig(tokens=1)), make_optimizer(model, TrainConfig())]
    assert all(g["fused"] for opt in opts for g in opt.param_groups)
    assert [g["weight_decay"] for g in opts[0].param_groups] == [0.1, 0.0]  # the decay groups stay


def test_member_trained_fast_equals_the_reference_path():
    fast = _train_member(_source(), lambda model, cfg: lm.optimizer(lm.native(model), cfg))
    ref = _train_member(_source(SlicedLoss), _reference_adamw)
    _assert_same(fast, ref)
    moved = _train_member(_source(), lambda model, cfg: torch.optim.SGD(lm.native(model).module.parameters(), lr=0.0))
    assert any(not torch.equal(fast[n], moved[n]) for n in fast)  # training moved the weights


def test_probe_train_optimizer_equals_the_reference_path():
    tc = TrainConfig()

    def reference(model, cfg):
        return torch.optim.AdamW(parameters(model), lr=tc.lr, betas=tc.betas, weight_decay=tc.weight_decay,
                                 foreach=False)  # fmt: skip

    fast = _train_member(_source(), lambda model, cfg: make_optimizer(model, tc))
    ref = _train_member(_source(SlicedLoss), reference)
    _assert_same(fast, ref)
