"""Training native models (``TransformerBridge.boot_native``) from scratch on synthetic data.

The model is built by :func:`probes.models.loading.load` from a :class:`~probes.models.loading.NativeConfig`
and trained with AdamW on next-token prediction over every position of the batches that
:func:`probes.data.synthetic.batch_at` yields for ``(seed, step)``.

Speed: the bridge wraps every submodule of TransformerLens's ``NativeModel`` in a Python
component with a dozen hook points, and its LayerNorm is re-implemented in Python; at toy
sizes that overhead dominates a training step. :func:`fast_logits` computes the same
function directly from the innermost ``nn.Module``s (the very same parameter tensors), with
fused LayerNorm and ``scaled_dot_product_attention``. Nothing is copied: after training,
the bridge (hooks and all) computes this function, which ``tests/test_train.py`` checks.

Checkpoints (never pickled), written by :func:`probes.models.loading.save_checkpoint` as a whole: a
folder ``ckpt-<step>-<id>/`` with ``model.safetensors``, ``depthprobe.json`` (the training state
under the key ``training``), ``optimizer.safetensors`` (AdamW tensors), ``optimizer.json`` (scalar
state) and ``loss.csv``; then ``OUT/depthprobe.json``, naming that folder, is replaced in one
atomic rename. An interrupt at any moment leaves the previous checkpoint whole and resumable.
``OUT/loss.csv`` is a copy of the log for reading. A resumed run continues from the saved step
with bit-identical weights.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from depthprobe.probes.base.artifacts import replace_file
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.options import check_seed
from depthprobe.probes.base.runtime import check_interrupt, torch_threads
from depthprobe.probes.data import synthetic
from depthprobe.probes.data.synthetic import DataConfig
from depthprobe.probes.models.loading import (
    CHECKPOINT_CONFIG,
    Model,
    NativeConfig,
    check_size,
    checkpoint_files,
    load,
    load_checkpoint,
    native_bytes,
    resolve_device,
    save_checkpoint,
    save_safetensors,
)

OPTIMIZER_WEIGHTS = "optimizer.safetensors"
OPTIMIZER_STATE = "optimizer.json"
LOSS_LOG = "loss.csv"
LOSS_COLUMNS = ["step", "loss", "steps_per_s", "elapsed_s"]


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 3000  # total optimiser steps (a resumed run stops here too)
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    warmup: int = 100  # linear warm-up steps, then constant
    grad_clip: float | None = 1.0  # max global grad norm; None: no clipping
    seed: int = 0  # data stream (and, through NativeConfig.seed, the init)
    save_every: int = 500  # checkpoint period in steps (only with an output directory)
    log_every: int = 50  # loss.csv row period in steps
    threads: int | None = 1  # CPU threads while training (None: torch's setting); see threads_for

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "save_every", "log_every"):
            if getattr(self, name) < 1:
                raise ProbeError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ProbeError(f"--lr must be a positive number, got {self.lr}")
        if self.weight_decay < 0:
            raise ProbeError(f"--weight-decay must be >= 0, got {self.weight_decay}")
        if self.warmup < 0:
            raise ProbeError(f"--warmup must be >= 0, got {self.warmup}")
        if self.threads is not None and self.threads < 1:
            raise ProbeError(f"--threads must be at least 1, got {self.threads}")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ProbeError(f"--grad-clip must be positive (or omitted), got {self.grad_clip}")
        check_seed(self.seed)

    def lr_at(self, step: int) -> float:
        """Learning rate for the update that takes the model from ``step`` to ``step + 1``."""
        return self.lr * min(1.0, (step + 1) / self.warmup) if self.warmup else self.lr


# ----------------------------------------------------------------------------- fast forward


def inner(module: Any) -> Any:
    """The innermost original module under TransformerLens bridge wrappers (duck-typed: the
    modules' attributes are TransformerLens internals)."""
    while "_original_component" in module._modules:
        module = module._modules["_original_component"]
    return module


def _attention(attn: Any, x: torch.Tensor) -> torch.Tensor:
    """NativeAttention's function without its pattern output. x: [batch, pos, d_model]."""
    b, t, _ = x.shape
    h, dh = attn.n_heads, attn.d_head
    if attn.kv_repeats != 1:
        raise ProbeError("grouped-query attention is not supported by the training fast path")
    q = inner(attn.q)(x).view(b, t, h, dh).transpose(1, 2)  # [b, h, t, dh]
    k = inner(attn.k)(x).view(b, t, h, dh).transpose(1, 2)
    v = inner(attn.v)(x).view(b, t, h, dh).transpose(1, 2)
    if attn.rotary is not None:
        q, k = attn.rotary.apply_rope(q, k)
    z = F.scaled_dot_product_attention(q, k, v, is_causal=attn.causal, scale=1.0 / attn.scale)
    return inner(attn.o)(z.transpose(1, 2).reshape(b, t, h * dh))  # [b, t, h*dh] -> [b, t, d]


def fast_logits(model: Model, tokens: torch.Tensor) -> torch.Tensor:
    """Logits [batch, pos, vocab] of a native model, computed from its own parameters.

    Same function as ``model.bridge(tokens)`` (checked in tests) at a fraction of the
    Python overhead; used for training only, never for probing.
    """
    native = model.bridge.original_model
    if float(getattr(native, "output_logits_soft_cap", -1.0)) > 0:
        raise ProbeError("logit soft-capping is not supported by the training fast path")
    t = tokens.shape[1]
    h = inner(native.tok_embed)(tokens)  # [b, t, d]
    if native.pos is not None:
        h = h + inner(native.pos).weight[:t]
    for wrapped in native.layers:
        block = inner(wrapped)
        h = h + _attention(inner(block.attn), inner(block.ln1)(h))
        if not block.cfg.attn_only:
            mlp = inner(block.mlp)
            mid = mlp.act(inner(mlp.fc_in)(inner(block.ln2)(h)))
            if mlp.ln is not None:
                mid = mlp.ln(mid)
            h = h + inner(mlp.fc_out)(mid)
    return inner(native.head)(inner(native.ln_out)(h))


def lm_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over every position. logits [b, t, v], tokens [b, t]."""
    v = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, v), tokens[:, 1:].reshape(-1))


# ----------------------------------------------------------------------------- optimizer I/O


def parameters(model: Model) -> list[torch.nn.Parameter]:
    """Trainable parameters in a fixed order (shared tensors once)."""
    return list(model.bridge.original_model.parameters())


def make_optimizer(model: Model, cfg: TrainConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW(parameters(model), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)


def save_optimizer(opt: torch.optim.Optimizer, directory: Path, step: int) -> None:
    """AdamW tensors -> safetensors; hyper-parameters and scalars -> JSON. Atomic per file."""
    from safetensors.torch import save_file

    sd = opt.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, st in sd["state"].items():
        for key, value in st.items():
            if torch.is_tensor(value):
                tensors[f"state.{idx}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(idx), {})[key] = value
    replace_file(directory / OPTIMIZER_WEIGHTS, lambda p: save_safetensors(save_file, tensors, p))
    meta = {"format": "depthprobe-adamw/1", "step": step, "param_groups": sd["param_groups"], "scalars": scalars}
    replace_file(directory / OPTIMIZER_STATE, lambda p: p.write_text(json.dumps(meta, indent=2)))


def load_optimizer(opt: torch.optim.Optimizer, directory: Path) -> int:
    """Restore what :func:`save_optimizer` wrote (in the checkpoint's folder); returns its step."""
    from safetensors.torch import load_file

    directory = checkpoint_files(directory)
    try:
        meta = json.loads((directory / OPTIMIZER_STATE).read_text())
        tensors = load_file(str(directory / OPTIMIZER_WEIGHTS))
    except Exception as exc:  # SafetensorError is not an OSError
        raise ProbeError(
            f"cannot resume from {directory}: optimizer state unreadable ({exc}); train afresh with a new --out"
        ) from None
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        _, idx, key = name.split(".", 2)
        state.setdefault(int(idx), {})[key] = value
    for idx, extra in meta.get("scalars", {}).items():
        state.setdefault(int(idx), {}).update(extra)
    groups = [{**g, "betas": tuple(g["betas"])} if "betas" in g else g for g in meta["param_groups"]]
    opt.load_state_dict({"state": state, "param_groups": groups})
    return int(meta["step"])


# ----------------------------------------------------------------------------- loss log


def read_loss_log(directory: Path, upto: int | None = None) -> list[dict[str, float]]:
    path = (checkpoint_files(directory) if (directory / CHECKPOINT_CONFIG).exists() else directory) / LOSS_LOG
    if not path.exists():
        return []
    with path.open(newline="") as fh:
        rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(fh)]
    return [r for r in rows if upto is None or r["step"] <= upto]


def write_loss_log(directory: Path, rows: list[dict[str, float]]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=LOSS_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({"step": int(r["step"]), **{k: f"{r[k]:.6g}" for k in LOSS_COLUMNS[1:]}})
    replace_file(directory / LOSS_LOG, lambda p: p.write_text(buf.getvalue()))


# ----------------------------------------------------------------------------- the loop


@dataclass
class Trained:
    """A finished (or resumed and finished) training run."""

    model: Model
    step: int
    losses: list[dict[str, float]] = field(default_factory=list)
    path: Path | None = None
    seconds: float = 0.0  # training time, callbacks excluded
    callback_seconds: float = 0.0


Callback = Callable[[int, Model], None]


def training_meta(
    native: NativeConfig, data: DataConfig, cfg: TrainConfig, step: int, loss: float | None
) -> dict[str, Any]:
    return {
        "training": {
            "step": step,
            "loss": loss,
            "bos": synthetic.BOS,
            "objective": "next-token",
            "train": dataclasses.asdict(cfg),
            "data": dataclasses.asdict(data),
            "native": dataclasses.asdict(native),
        }
    }


def save(
    model: Model,
    opt: torch.optim.Optimizer,
    directory: Path,
    native: NativeConfig,
    data: DataConfig,
    cfg: TrainConfig,
    step: int,
    losses: list[dict[str, float]],
) -> None:
    """Weights, optimizer state, loss log and config into one new folder, then one atomic switch
    (see :func:`probes.models.loading.save_checkpoint`); then the readable copy ``OUT/loss.csv``."""

    def write_more(folder: Path) -> None:
        save_optimizer(opt, folder, step)
        write_loss_log(folder, losses)

    last = losses[-1]["loss"] if losses else None
    save_checkpoint(model, directory, training_meta(native, data, cfg, step, last), write_more)
    write_loss_log(directory, losses)


def read_training(directory: Path) -> dict[str, Any]:
    """The ``training`` record of a checkpoint written by :func:`save`."""
    try:
        meta = json.loads((directory / CHECKPOINT_CONFIG).read_text())
        return meta["training"]
    except (OSError, ValueError, KeyError):
        raise ProbeError(
            f"{directory} is not a training checkpoint written by probe train "
            f"(no training record in {CHECKPOINT_CONFIG}); drop --resume or pick that --out"
        ) from None


def configs_from(record: dict[str, Any]) -> tuple[NativeConfig, DataConfig, TrainConfig]:
    data = dict(record["data"], held_out=tuple(record["data"]["held_out"]))
    train = dict(record["train"], betas=tuple(record["train"]["betas"]))
    return NativeConfig(**record["native"]), DataConfig(**data), TrainConfig(**train)


def check_shapes(native: NativeConfig, data: DataConfig) -> None:
    if data.vocab != native.d_vocab:
        raise ProbeError(
            f"data vocab {data.vocab} differs from the model's d_vocab {native.d_vocab}; "
            "set both to the same value (--vocab sets both)"
        )
    if data.seq_len > native.n_ctx:
        raise ProbeError(f"--seq-len {data.seq_len} exceeds the model context n_ctx={native.n_ctx}")


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
    params = parameters(model)
    bar = _bar(progress, start, cfg.steps)
    t0 = time.perf_counter()
    elapsed0 = losses[-1]["elapsed_s"] if losses else 0.0
    window, window_n, window_t = torch.zeros((), device=model.device), 0, t0
    spent = [0.0]  # seconds inside callbacks
    _maybe_callback(model, start, every, callback, start == 0, spent)
    model.bridge.train()
    for step in range(start, cfg.steps):
        check_interrupt()  # a signal whose exception a finalizer dropped still stops the run
        tokens = synthetic.batch_at(data, cfg.seed, step, cfg.batch_size).to(model.device)
        for group in opt.param_groups:
            group["lr"] = cfg.lr_at(step)
        loss = lm_loss(fast_logits(model, tokens), tokens)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        window += loss.detach()
        window_n += 1
        done = step + 1
        if done % cfg.log_every == 0 or done == cfg.steps:
            now = time.perf_counter()
            mean = float(window) / window_n
            losses.append(
                {
                    "step": done,
                    "loss": mean,
                    "steps_per_s": window_n / max(now - window_t, 1e-9),
                    "elapsed_s": elapsed0 + now - t0 - spent[0],
                }
            )
            if bar is not None:
                bar.set_postfix(loss=f"{mean:.3f}", steps_s=f"{losses[-1]['steps_per_s']:.1f}")
            window.zero_()
            window_n, window_t = 0, now
        if bar is not None:
            bar.update(1)
        if path is not None and (done % cfg.save_every == 0 or done == cfg.steps):
            save(model, opt, path, native, data, cfg, done, losses)
        if _maybe_callback(model, done, every, callback, done == cfg.steps, spent):
            model.bridge.train()
            window_t += spent[1]
    if bar is not None:
        bar.close()
    model.bridge.eval()
    return Trained(
        model=model,
        step=cfg.steps,
        losses=losses,
        path=path,
        seconds=time.perf_counter() - t0 - spent[0],
        callback_seconds=spent[0],
    )


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


# ----------------------------------------------------------------------------- flat settings

# The flat settings of `probe train` (and the induction sweep), with their defaults.
DEFAULTS: dict[str, Any] = {
    "layers": 2,
    "d_model": 64,
    "heads": 4,
    "attn_only": True,
    "norm": "ln",
    "positional": "learned",
    "vocab": 64,
    "seq_len": 64,
    "data": "induction",
    "steps": 3000,
    "batch_size": 32,
    "lr": 1e-3,
    "weight_decay": 0.01,
    "warmup": 100,
    "grad_clip": 1.0,
    "seed": 0,
    "save_every": 500,
    "log_every": 50,
    "threads": 1,
}
# settings a resumed run may change: they do not alter the computation of any step
RESUMABLE = ("steps", "save_every", "log_every", "threads")


def build_configs(**settings: Any) -> tuple[NativeConfig, DataConfig, TrainConfig]:
    """Flat settings (see DEFAULTS; unknown keys refused) -> the three frozen configs."""
    unknown_keys = set(settings) - set(DEFAULTS)
    if unknown_keys:
        raise ProbeError(f"unknown training setting(s) {sorted(unknown_keys)}; known: {', '.join(DEFAULTS)}")
    s = {**DEFAULTS, **settings}
    check_seed(s["seed"])
    native = NativeConfig(
        layers=s["layers"],
        d_model=s["d_model"],
        heads=s["heads"],
        d_vocab=s["vocab"],
        n_ctx=s["seq_len"],
        attn_only=s["attn_only"],
        norm=s["norm"],
        positional=s["positional"],
        seed=s["seed"],
    )
    data = DataConfig(kind=s["data"], seq_len=s["seq_len"], vocab=s["vocab"])
    cfg = TrainConfig(
        steps=s["steps"],
        batch_size=s["batch_size"],
        lr=s["lr"],
        weight_decay=s["weight_decay"],
        warmup=s["warmup"],
        grad_clip=s["grad_clip"],
        seed=s["seed"],
        save_every=s["save_every"],
        log_every=s["log_every"],
        threads=s["threads"],
    )
    check_size(
        native.n_params(),
        native_bytes(native, training=True),
        f"native model ({native.layers} layers, d_model {native.d_model})",
    )
    return native, data, cfg


def flat_settings(native: NativeConfig, data: DataConfig, cfg: TrainConfig) -> dict[str, Any]:
    """The inverse of :func:`build_configs`."""
    return {
        "layers": native.layers,
        "d_model": native.d_model,
        "heads": native.heads,
        "attn_only": native.attn_only,
        "norm": native.norm,
        "positional": native.positional,
        "vocab": data.vocab,
        "seq_len": data.seq_len,
        "data": data.kind,
        "steps": cfg.steps,
        "batch_size": cfg.batch_size,
        "lr": cfg.lr,
        "weight_decay": cfg.weight_decay,
        "warmup": cfg.warmup,
        "grad_clip": cfg.grad_clip,
        "seed": cfg.seed,
        "save_every": cfg.save_every,
        "log_every": cfg.log_every,
        "threads": cfg.threads,
    }


def resume_configs(directory: str | Path, **given: Any) -> tuple[NativeConfig, DataConfig, TrainConfig]:
    """The saved run's configs; explicitly given settings may only change RESUMABLE ones."""
    saved = flat_settings(*configs_from(read_training(Path(directory))))
    clash = {k: (saved[k], v) for k, v in given.items() if k not in RESUMABLE and saved.get(k) != v}
    if clash:
        what = ", ".join(f"--{k.replace('_', '-')} {new} (saved: {old})" for k, (old, new) in clash.items())
        raise ProbeError(
            f"--resume continues the saved run, but {what} differ; drop those options or train afresh with a new --out"
        )
    return build_configs(**{**saved, **{k: v for k, v in given.items() if k in RESUMABLE}})
