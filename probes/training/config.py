"""The settings of a native training run (``probe train`` and the induction sweep).

:class:`TrainConfig` holds the optimiser and checkpoint settings; the flat settings (``DEFAULTS``,
one key per command-line option) turn into the three frozen configs (:class:`NativeConfig`,
:class:`DataConfig`, :class:`TrainConfig`) through :func:`build_configs` and back through
:func:`flat_settings`; :func:`configs_from` reads them from a checkpoint's training record.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.options import check_seed
from depthprobe.probes.data.synthetic import DataConfig
from depthprobe.probes.models.device import check_size, native_bytes
from depthprobe.probes.models.model import NativeConfig


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
        if not (self.weight_decay >= 0 and math.isfinite(self.weight_decay)):
            raise ProbeError(f"--weight-decay must be a finite number >= 0, got {self.weight_decay}")
        if self.warmup < 0:
            raise ProbeError(f"--warmup must be >= 0, got {self.warmup}")
        if self.threads is not None and self.threads < 1:
            raise ProbeError(f"--threads must be at least 1, got {self.threads}")
        if self.grad_clip is not None and not (self.grad_clip > 0 and math.isfinite(self.grad_clip)):
            raise ProbeError(f"--grad-clip must be positive (or omitted), got {self.grad_clip}")
        check_seed(self.seed)

    def lr_at(self, step: int) -> float:
        """Learning rate for the update that takes the model from ``step`` to ``step + 1``."""
        return self.lr * min(1.0, (step + 1) / self.warmup) if self.warmup else self.lr


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
