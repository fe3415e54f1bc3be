"""Checkpoints of a training run: saving, and reading back what a resumed run needs.

Checkpoints (never pickled), written by :func:`probes.models.checkpoints.save_checkpoint` as a whole: a
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
from pathlib import Path
from typing import Any

import torch

from depthprobe.probes.base.artifacts import replace_file
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.data import synthetic
from depthprobe.probes.data.synthetic import DataConfig
from depthprobe.probes.models.checkpoints import CHECKPOINT_CONFIG, checkpoint_files, save_checkpoint, save_safetensors
from depthprobe.probes.models.model import Model, NativeConfig
from depthprobe.probes.training.config import RESUMABLE, TrainConfig, build_configs, configs_from, flat_settings

OPTIMIZER_WEIGHTS = "optimizer.safetensors"
OPTIMIZER_STATE = "optimizer.json"
LOSS_LOG = "loss.csv"
LOSS_COLUMNS = ["step", "loss", "steps_per_s", "elapsed_s"]


# ----------------------------------------------------------------------------- optimizer I/O


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


# ----------------------------------------------------------------------------- saving and resuming


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
    (see :func:`probes.models.checkpoints.save_checkpoint`); then the readable copy ``OUT/loss.csv``."""

    def write_more(folder: Path) -> None:
        save_optimizer(opt, folder, step)
        write_loss_log(folder, losses)

    last = losses[-1]["loss"] if losses else None
    save_checkpoint(model, directory, training_meta(native, data, cfg, step, last), write_more)
    write_loss_log(directory, losses)


def read_training(directory: Path) -> dict[str, Any]:
    """The ``training`` record of a checkpoint written by :func:`save`."""
    if not (directory / CHECKPOINT_CONFIG).exists():
        partial = sorted(directory.glob(".ckpt-*.tmp")) if directory.is_dir() else []
        why = f"its first save was interrupted ({partial[0].name} is partial)" if partial else "nothing was saved there"
        raise ProbeError(
            f"{directory} holds no checkpoint ({CHECKPOINT_CONFIG} is missing: {why}); drop --resume to train afresh"
        )
    try:
        meta = json.loads((directory / CHECKPOINT_CONFIG).read_text())
        return meta["training"]
    except (OSError, ValueError, KeyError):
        raise ProbeError(
            f"{directory} is not a training checkpoint written by probe train "
            f"(no training record in {CHECKPOINT_CONFIG}); drop --resume or pick that --out"
        ) from None


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
