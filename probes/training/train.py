"""Training native models (``TransformerBridge.boot_native``) from scratch on synthetic data: the loop.

The model is built by :func:`probes.models.loading.load` from a :class:`~probes.models.model.NativeConfig`
and trained with AdamW on next-token prediction over every position of the batches that
:func:`probes.data.synthetic.batch_at` yields for ``(seed, step)``, through the fast path of
:mod:`probes.training.fast_forward`; with an output directory, checkpoints are written and resumed
by :mod:`probes.training.checkpoint`, and the settings live in :mod:`probes.training.config`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from depthprobe.probes.base.errors import Diverged, ProbeError
from depthprobe.probes.base.runtime import torch_threads
from depthprobe.probes.data.synthetic import DataConfig
from depthprobe.probes.models.checkpoints import CHECKPOINT_CONFIG
from depthprobe.probes.models.device import check_size, native_bytes, resolve_device
from depthprobe.probes.models.loading import load, load_checkpoint
from depthprobe.probes.models.model import Model, NativeConfig
from depthprobe.probes.training.checkpoint import load_optimizer, read_loss_log, read_training, save
from depthprobe.probes.training.config import TrainConfig, check_shapes
from depthprobe.probes.training.fast_forward import fast_logits
from depthprobe.probes.training.loop import LoopRun, Steps, Window, adamw, train_steps
from depthprobe.probes.training.sources import SyntheticSource


def parameters(model: Model) -> list[torch.nn.Parameter]:
    """Trainable parameters in a fixed order (shared tensors once)."""
    return list(model.bridge.original_model.parameters())


def make_optimizer(model: Model, cfg: TrainConfig) -> torch.optim.AdamW:
    return adamw(parameters(model), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)


@dataclass
class Trained:
    """A finished (or resumed and finished) training run."""

    model: Model
    step: int
    losses: list[dict[str, float]] = field(default_factory=list)
    path: Path | None = None
    seconds: float = 0.0  # training time, callbacks excluded
    callback_seconds: float = 0.0

    def __repr__(self) -> str:
        """One line: the model, the step, the last logged loss and where it was saved (not every loss row)."""
        last = f", loss {self.losses[-1]['loss']:.4f}" if self.losses else ""
        where = f", saved to {self.path}" if self.path is not None else ", in memory"
        return (
            f"Trained({self.model.name!r}, step {self.step}{last}, {len(self.losses)} loss rows, "
            f"{self.seconds:.1f} s{where})"
        )


Callback = Callable[[int, Model], None]


def train(
    native: NativeConfig,
    data: DataConfig,
    cfg: TrainConfig,
    *,
    out: str | Path | None = None,
    resume: bool = False,
    device: str | None = None,
    progress: bool = False,
    every: int | None = None,
    callback: Callback | None = None,
) -> Trained:
    """Train a native model; with ``out``, checkpoint every ``cfg.save_every`` steps and at the end.

    ``callback(step, model)`` runs at step 0 and every ``every`` steps (and at the end), with
    the model in eval mode; it must not change the weights.
    """
    check_shapes(native, data)
    dev = resolve_device(device)
    check_size(
        native.n_params(),
        native_bytes(native, training=True),
        f"native model ({native.layers} layers, d_model {native.d_model})",
        dev,
    )
    path = None if out is None else Path(out)
    start, losses = 0, []
    if resume:
        if path is None or not (path / CHECKPOINT_CONFIG).exists():
            raise ProbeError(f"--resume needs an existing checkpoint directory, {path} has none; drop --resume")
        record = read_training(path)
        model = load_checkpoint(path, device)
        opt = make_optimizer(model, cfg)
        start = load_optimizer(opt, path)
        if start != int(record["step"]):
            raise ProbeError(
                f"{path}: optimizer state (step {start}) and weights (step {record['step']}) "
                "disagree, the last save was interrupted; train afresh with a new --out"
            )
        losses = read_loss_log(path, upto=start)
    else:
        if path is not None and (path / CHECKPOINT_CONFIG).exists():
            raise ProbeError(f"{path} already holds a checkpoint; pass --resume to continue it or choose a new --out")
        model = load(native, device=device)
        opt = make_optimizer(model, cfg)
    if start >= cfg.steps:
        raise ProbeError(f"the checkpoint is already at step {start}; raise --steps above {start} to train further")
    with threads_for(model, cfg.threads):
        return _loop(model, opt, native, data, cfg, start, losses, path, progress, every, callback)


@contextmanager
def threads_for(model: Model, threads: int | None) -> Iterator[None]:
    """Run the block with ``threads`` intra-op CPU threads, restoring the setting after.

    A toy model's step is a few hundred tiny ops: one thread is about as fast as two on an idle
    machine and much faster on a loaded one (OpenMP threads wait for each other at every op), and
    the result then does not depend on the machine's core count.
    """
    with torch_threads(threads if model.device.type == "cpu" else None):
        yield


def _loop(
    model: Model,
    opt: torch.optim.Optimizer,
    native: NativeConfig,
    data: DataConfig,
    cfg: TrainConfig,
    start: int,
    losses: list[dict[str, float]],
    path: Path | None,
    progress: bool,
    every: int | None,
    callback: Callback | None,
) -> Trained:
    bar = _bar(progress, start, cfg.steps)
    elapsed0 = losses[-1]["elapsed_s"] if losses else 0.0
    spent = [0.0]  # seconds inside callbacks
    _maybe_callback(model, start, every, callback, start == 0, spent)

    def on_window(w: Window) -> None:
        losses.append(
            {
                "step": w.step,
                "loss": w.loss,
                "steps_per_s": w.updates / max(w.seconds, 1e-9),
                "elapsed_s": elapsed0 + w.elapsed,
            }
        )
        if bar is not None:
            bar.set_postfix(loss=f"{w.loss:.3f}", steps_s=f"{losses[-1]['steps_per_s']:.1f}")

    def after_step(done: int) -> bool:
        if bar is not None:
            bar.update(1)
        if path is not None and (done % cfg.save_every == 0 or done == cfg.steps):
            _check_weights(model, done)  # never write a non-finite checkpoint
            save(model, opt, path, native, data, cfg, done, losses)
        return _maybe_callback(model, done, every, callback, done == cfg.steps, spent)

    try:
        run = _steps(
            model, opt, SyntheticSource(data, cfg.seed, cfg.batch_size), cfg, start, path, on_window, after_step
        )
    finally:
        if bar is not None:
            bar.close()
    model.bridge.eval()
    return Trained(
        model=model, step=cfg.steps, losses=losses, path=path, seconds=run.seconds, callback_seconds=spent[0]
    )


def _steps(
    model: Model,
    opt: torch.optim.Optimizer,
    source: SyntheticSource,
    cfg: TrainConfig,
    start: int,
    path: Path | None,
    on_window: Callable[[Window], None],
    after_step: Callable[[int], bool],
) -> LoopRun:
    """The loop over ``cfg``'s steps; a loss or weights gone non-finite stop it (:class:`Diverged`)."""
    plan = Steps(cfg.steps, cfg.lr_at, cfg.grad_clip, cfg.log_every, start=start, check_finite=True)
    try:
        return train_steps(
            model.bridge,
            functools.partial(fast_logits, model),
            source,
            opt,
            parameters(model),
            plan,
            device=model.device,
            on_window=on_window,
            after_step=after_step,
        )
    except Diverged as exc:
        raise Diverged(f"{str(exc).split(';')[0]}; {_diverged_fix(cfg, path)}") from None


def _diverged_fix(cfg: TrainConfig, path: Path | None) -> str:
    """What a diverged run says after its step and loss: the rate to lower, the checkpoint kept."""
    fix = f"lower --lr (it was {cfg.lr:g}; try {cfg.lr / 10:g})"
    if path is None or not (path / CHECKPOINT_CONFIG).exists():
        return f"{fix}; no checkpoint was written"
    step = read_training(path)["step"]
    return f"{fix}; {path} keeps the last finite checkpoint (step {step} of {cfg.steps}), not a finished one"


def _check_weights(model: Model, done: int) -> None:
    if not all(bool(torch.isfinite(p).all()) for p in parameters(model)):
        raise Diverged(f"training diverged by step {done} (the weights hold NaN or inf)")


def _maybe_callback(
    model: Model, step: int, every: int | None, callback: Callback | None, force: bool, spent: list[float]
) -> bool:
    """Run the callback when due; spent[0] accumulates its seconds, spent[1] is the last call's."""
    if callback is None or not (force or (every and step % every == 0)):
        return False
    t = time.perf_counter()
    model.bridge.eval()
    with torch.no_grad():
        callback(step, model)
    spent[1:] = [time.perf_counter() - t]
    spent[0] += spent[1]
    return True


def _bar(enabled: bool, start: int, total: int):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=start, unit="step", dynamic_ncols=True, leave=False)
