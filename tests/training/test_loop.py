"""The one training loop (probes/training/loop.py) and its sources, on problems with known answers."""

from __future__ import annotations

import math

import pytest
import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.data import synthetic
from depthprobe.probes.data.synthetic import DataConfig
from depthprobe.probes.training.loop import IGNORE, Steps, Window, target_loss, train_steps
from depthprobe.probes.training.sources import CopySource, SyntheticSource


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
