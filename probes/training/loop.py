"""The one training loop: every model depthprobe trains (``probe train``, study members, the
depth-law families, the kernels sweep's trained networks) takes its optimiser steps here.

What differs between them is data, not the step: a :class:`BatchSource` gives the batch of a step
(a pure function of the step for every built-in source, so a resumed run sees the batches it would
have seen) and scores logits against it. The loop sets the learning rate of each update, clips the
gradient norm, averages the loss over log windows without a device sync per step, and hands the
caller each window (:class:`Window`) and each finished step (``after_step``: checkpoints,
evaluations, callbacks); the seconds spent in those hands are not training time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from depthprobe.probes.base.errors import Diverged
from depthprobe.probes.base.progress import TrainingProgress
from depthprobe.probes.base.signals import check_interrupt

IGNORE = -100  # a target position that is not scored


class BatchSource(Protocol):
    """Where a training run's batches come from."""

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The inputs [batch, pos] and targets of the update from ``step`` to ``step + 1``."""
        ...

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean loss of ``logits`` [batch, pos, vocab] against ``targets``."""
        ...


def target_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy at every position whose target is not :data:`IGNORE`."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)


FUSED_DEVICES = ("cpu", "cuda")  # where torch's fused AdamW kernel runs


def adamw(
    params: list[torch.nn.Parameter] | list[dict[str, Any]], *, lr: float, betas: tuple[float, float],
    weight_decay: float = 0.0,
) -> torch.optim.AdamW:  # fmt: skip
    """AdamW as every trainer here builds it (``params``: tensors or parameter groups): torch's fused
    kernel where the device has one. Fused, a step is one kernel over all tensors instead of about ten
    small ones per tensor: on one CPU thread 0.5 ms instead of 6 ms for a 4-layer width-64 member
    (``bench/bench_flops.py``); the update is the same within float rounding
    (``tests/training/test_loop.py``)."""
    tensors = [p for g in params for p in g["params"]] if params and isinstance(params[0], dict) else params
    fused = bool(tensors) and all(p.device.type in FUSED_DEVICES for p in tensors)  # type: ignore[union-attr]
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=fused or None)


@dataclass(frozen=True)
class Steps:
    """How a run steps: ``steps`` updates from ``start``, the learning rate of each update, gradient
    clipping (None: none), a log window every ``log_every`` updates and at ``log_at`` (and at the end)."""

    steps: int
    lr_at: Callable[[int], float | tuple[float, ...]]  # a tuple: one rate per member (batched members)
    grad_clip: float | None = 1.0
    log_every: int = 10
    log_at: frozenset[int] = frozenset()
    start: int = 0
    check_finite: bool = False  # a non-finite window mean stops the run with a one-line error

    def logs(self, done: int) -> bool:
        return done % self.log_every == 0 or done == self.steps or done in self.log_at


@dataclass(frozen=True)
class Window:
    """The updates since the last window: each member's mean loss and last learning rate (one
    member unless batched: :mod:`probes.training.batched`), how many updates and their training
    seconds, and the run's training seconds so far (this call's)."""

    step: int
    losses: tuple[float, ...]
    lrs: tuple[float, ...]
    updates: int
    seconds: float
    elapsed: float

    @property
    def loss(self) -> float:
        """The mean loss of a run of one member."""
        return _single(self.losses, "loss", "losses")

    @property
    def lr(self) -> float:
        """The last learning rate of a run of one member."""
        return _single(self.lrs, "lr", "lrs")


def _single(values: tuple[float, ...], name: str, plural: str) -> float:
    if len(values) != 1:
        raise ValueError(f"Window.{name}: this run trains {len(values)} members; read Window.{plural}")
    return values[0]


@dataclass(frozen=True)
class LoopRun:
    """Training seconds (the caller's hands excluded) and the seconds spent in those hands."""

    seconds: float
    hands_seconds: float


Clip = Callable[[list[torch.nn.Parameter], float], object]  # (params, max_norm): scales the gradients in place


def train_steps(
    net: torch.nn.Module,
    forward: Callable[[torch.Tensor], torch.Tensor],
    source: BatchSource,
    opt: torch.optim.Optimizer,
    params: Iterable[torch.nn.Parameter],
    plan: Steps,
    *,
    device: torch.device,
    on_window: Callable[[Window], None] | None = None,
    after_step: Callable[[int], bool] | None = None,
    clip: Clip = torch.nn.utils.clip_grad_norm_,
) -> LoopRun:
    """Train ``net`` (whose parameters ``opt`` updates; ``forward`` maps inputs to logits) from
    ``plan.start`` to ``plan.steps``. ``on_window`` sees each log window; ``after_step(done)`` runs
    after every update and returns True when it used the model (the loop then puts ``net`` back in
    training mode). The net is left in eval mode. Inside a named job (a study or sweep member) a
    progress line goes to stderr every half minute (:mod:`depthprobe.probes.base.progress`).

    Batched members (:mod:`probes.training.batched`) train here too: one loss per member (the loop
    backpropagates their sum; members share no parameters), one rate per member, ``clip`` per member."""
    params = list(params)
    progress = TrainingProgress(plan.start, plan.steps)
    window = torch.zeros((), dtype=torch.float64, device=device)
    count, elapsed, hands = 0, 0.0, 0.0
    net.train()
    t0 = time.perf_counter()
    lrs: tuple[float, ...] = ()
    for step in range(plan.start, plan.steps):
        check_interrupt()  # a signal whose exception a finalizer dropped still stops the run
        lr = plan.lr_at(step)
        lrs = lr if isinstance(lr, tuple) else (lr,)
        window = window + _update(forward, source, opt, params, step, lr, plan.grad_clip, device, clip)
        count += 1
        done = step + 1
        if plan.logs(done):
            now = time.perf_counter()
            means = tuple(window.div(count).reshape(-1).tolist())
            _check(plan, done, means)
            elapsed += now - t0
            progress(done, elapsed)
            if on_window is not None:
                on_window(Window(done, means, lrs, count, now - t0, elapsed))
                net.train()
            window.zero_()
            count = 0
            t1 = time.perf_counter()
            hands += t1 - now
            t0 = t1
        if after_step is not None:
            t1 = time.perf_counter()
            if after_step(done):
                net.train()
                t2 = time.perf_counter()
                hands += t2 - t1
                t0 += t2 - t1
    elapsed += time.perf_counter() - t0
    net.eval()
    return LoopRun(seconds=elapsed, hands_seconds=hands)


def _check(plan: Steps, done: int, means: tuple[float, ...]) -> None:
    """With ``plan.check_finite``, a non-finite window mean stops the run (naming the members of a batch)."""
    if not plan.check_finite or all(math.isfinite(m) for m in means):
        return
    if len(means) == 1:
        raise Diverged(f"training diverged by step {done} (loss {means[0]}); lower --lr or pick another variant")
    bad = ", ".join(f"member {i} (loss {m})" for i, m in enumerate(means) if not math.isfinite(m))
    raise Diverged(f"training diverged by step {done}: {bad}; lower --lr or train those members alone")


def _update(
    forward: Callable[[torch.Tensor], torch.Tensor],
    source: BatchSource,
    opt: torch.optim.Optimizer,
    params: list[torch.nn.Parameter],
    step: int,
    lr: float | tuple[float, ...],
    grad_clip: float | None,
    device: torch.device,
    clip: Clip,
) -> torch.Tensor:
    """One optimiser update from ``step`` to ``step + 1`` at ``lr``; its loss (detached, no sync):
    a scalar, or one per member of a batch."""
    inputs, targets = source.batch(step)
    inputs = inputs.to(device, non_blocking=True)
    targets = targets.to(device, non_blocking=True)
    for group in opt.param_groups:
        group["lr"] = lr
    loss = source.loss(forward(inputs), targets)
    opt.zero_grad(set_to_none=True)
    (loss.sum() if loss.dim() else loss).backward()
    if grad_clip is not None:
        clip(params, grad_clip)
    opt.step()
    return loss.detach()
