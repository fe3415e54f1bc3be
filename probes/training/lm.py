"""Training decoder language models on text (the members of a depth study, docs/protocols.md §3.7).

Every member of a study trains the same way: next-token cross-entropy on windows of the corpus's
training split (``BOS`` then ``context - 1`` tokens; BOS is never a target), the batches a pure
function of ``(seed, step)`` (:func:`depthprobe.probes.data.corpus.train_batch`), so members with
the same seed see the same tokens in the same order. AdamW (weight decay on matrices only, not on
biases, norm gains or the SPA skip gains) with a linear warm-up and cosine decay to
``min_lr_ratio`` of the peak, gradient clipping at norm 1.

The loop trains a :class:`Trainable`, which the member's job supplies (experiments/text_member.py):
a native TransformerBridge decoder through the fast path of
:func:`depthprobe.probes.training.fast_forward.fast_logits` (:func:`native`: the bridge's own
parameters, without its per-hook Python overhead), or a network that is its own module, such as
:class:`~depthprobe.probes.models.variant_net.VariantTransformer` (:func:`direct`: called directly).
A loss that is not finite stops the run with a one-line error: the member is recorded as failed
(deep skipless networks can diverge) while the others go on.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.runtime import torch_threads
from depthprobe.probes.data import corpus as corpora
from depthprobe.probes.models.model import Model
from depthprobe.probes.training.fast_forward import fast_logits
from depthprobe.probes.training.loop import Steps, Window, adamw, train_steps
from depthprobe.probes.training.schedule import warmup_cosine
from depthprobe.probes.training.sources import CorpusSource

LOG_COLUMNS = ["step", "loss", "val_loss", "lr", "tokens", "elapsed_s"]


@dataclass(frozen=True)
class LMConfig:
    """How one member trains. ``tokens`` is the training budget in tokens (batch * context per step)."""

    tokens: int
    batch_size: int = 32
    context: int = 128
    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # cosine decay ends at this fraction of lr
    warmup_frac: float = 0.05  # linear warm-up over this fraction of the steps (at least 1 step)
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    seed: int = 0  # data order
    evals: int = 4  # validation losses logged during training (besides the final one)
    eval_windows: int = 32  # validation windows for those (the final evaluation uses every window)
    log_every: int = 10
    threads: int | None = 1  # CPU intra-op threads while training (None: torch's setting)

    def __post_init__(self) -> None:
        for name in ("tokens", "batch_size", "log_every", "eval_windows"):
            if getattr(self, name) < 1:
                raise ProbeError(f"training: {name} must be at least 1, got {getattr(self, name)}")
        if self.context < 2:
            raise ProbeError(f"training: context must be at least 2, got {self.context}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ProbeError(f"--lr must be a positive number, got {self.lr}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ProbeError(f"training: min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if not 0 <= self.warmup_frac < 1:
            raise ProbeError(f"training: warmup_frac must be in [0, 1), got {self.warmup_frac}")
        if self.evals < 0:
            raise ProbeError(f"training: evals must be 0 or more, got {self.evals}")

    @property
    def steps(self) -> int:
        return max(1, math.ceil(self.tokens / (self.batch_size * self.context)))

    @property
    def warmup(self) -> int:
        return max(1, round(self.warmup_frac * self.steps))

    def lr_at(self, step: int) -> float:
        """Learning rate of the update from ``step`` to ``step + 1``: linear warm-up, then cosine."""
        return warmup_cosine(step, self.lr, self.steps, self.warmup, floor=self.lr * self.min_lr_ratio)


@dataclass
class LMRun:
    """A finished training run: the log rows (LOG_COLUMNS), final validation and throughput."""

    log: list[dict[str, Any]] = field(default_factory=list)
    val: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0  # training steps only (evaluations excluded)
    tokens: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else math.nan


@dataclass(frozen=True)
class Trainable:
    """A model as the loop trains it: ``module`` holds the trainable parameters and ``logits`` maps
    tokens [batch, pos] to logits [batch, pos, vocab] (:func:`native` or :func:`direct`)."""

    model: Model
    module: torch.nn.Module
    logits: Callable[[torch.Tensor], torch.Tensor]


def native(model: Model) -> Trainable:
    """A native decoder, through the fast path over the bridge's own parameters."""
    if model.info.native is None:
        raise ProbeError(f"model {model.name!r} is not a native model; train a network of its own with lm.direct")
    return Trainable(model, model.bridge.original_model, partial(fast_logits, model))


def direct(model: Model) -> Trainable:
    """A network that is its own module (``model.bridge``, e.g. the depth-study network), called directly."""
    return Trainable(model, model.bridge, partial(model.bridge, return_type="logits"))


def optimizer(net: Trainable, cfg: LMConfig) -> torch.optim.AdamW:
    return decay_adamw(net.module, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)


def decay_adamw(
    net: torch.nn.Module, *, lr: float, betas: tuple[float, float], weight_decay: float
) -> torch.optim.AdamW:
    """The one optimizer of study members (every family): AdamW (fused where the device has it,
    :func:`~.loop.adamw`) with weight decay on matrices (dim >= 2) only, shared tensors once."""
    seen: set[int] = set()
    decay: list[torch.nn.Parameter] = []
    plain: list[torch.nn.Parameter] = []
    for p in net.parameters():
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else plain).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]
    return adamw(groups, lr=lr, betas=betas)


def evaluate(net: Trainable, corpus: corpora.Corpus, cfg: LMConfig, limit: int | None = None) -> dict[str, float]:
    """Validation loss (nats per token) and bits per byte over ``limit`` windows (None: all)."""
    was_training = net.module.training
    net.module.eval()
    try:
        return corpora.evaluate(
            net.logits, corpus, cfg.context, batch=cfg.batch_size, limit=limit, device=net.model.device
        )
    finally:
        net.module.train(was_training)


def train_lm(
    net: Trainable, corpus: corpora.Corpus, cfg: LMConfig, progress: Callable[[int, int], None] | None = None
) -> LMRun:
    """Train ``net`` in place for ``cfg.steps`` steps; returns the log and the final validation.

    ``progress(done, total)`` is called after every step (for a progress bar)."""
    model = net.model
    if cfg.context > model.info.max_len:
        raise ProbeError(f"--context {cfg.context} exceeds the model's context {model.info.max_len}")
    with torch_threads(cfg.threads if model.device.type == "cpu" else None):
        return _loop(net, corpus, cfg, progress)


def _eval_steps(cfg: LMConfig) -> set[int]:
    return {round(cfg.steps * (i + 1) / (cfg.evals + 1)) for i in range(cfg.evals)} - {0, cfg.steps}


def _loop(net: Trainable, corpus: corpora.Corpus, cfg: LMConfig, progress: Callable[[int, int], None] | None) -> LMRun:
    run = LMRun()
    evals = _eval_steps(cfg)
    per_step = cfg.batch_size * cfg.context

    def on_window(w: Window) -> None:
        val = evaluate(net, corpus, cfg, cfg.eval_windows)["val_loss"] if w.step in evals else math.nan
        run.log.append(
            {
                "step": w.step,
                "loss": w.loss,
                "val_loss": val,
                "lr": w.lr,
                "tokens": w.step * per_step,
                "elapsed_s": w.elapsed,
            }
        )

    def after_step(done: int) -> bool:
        if progress is not None:
            progress(done, cfg.steps)
        return False

    plan = Steps(
        steps=cfg.steps,
        lr_at=cfg.lr_at,
        grad_clip=cfg.grad_clip,
        log_every=cfg.log_every,
        log_at=frozenset(evals),
        check_finite=True,
    )
    source = CorpusSource(corpus, cfg.seed, cfg.batch_size, cfg.context)
    params = [p for p in net.module.parameters() if p.requires_grad]
    loop = train_steps(
        net.module,
        net.logits,
        source,
        optimizer(net, cfg),
        params,
        plan,
        device=net.model.device,
        on_window=on_window,
        after_step=after_step,
    )
    run.seconds = loop.seconds
    run.tokens = cfg.steps * per_step
    run.val = evaluate(net, corpus, cfg)
    run.log[-1]["val_loss"] = run.val["val_loss"]
    return run
