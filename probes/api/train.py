"""``probes.train(...)``: `probe train` from Python, with the same settings by the same names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.models.device import size_limit
from depthprobe.probes.training.checkpoint import resume_configs
from depthprobe.probes.training.config import build_configs
from depthprobe.probes.training.train import Callback, Trained
from depthprobe.probes.training.train import train as run_training


def train(
    out: str | Path | None = None,
    *,
    resume: bool = False,
    device: str | None = None,
    progress: bool = False,
    max_params: int | None = None,
    every: int | None = None,
    callback: Callback | None = None,
    **settings: Any,
) -> Trained:
    """Train a native model as ``probe train`` does; returns the :class:`Trained` run (``.model``,
    ``.step``, ``.losses``, ``.path``).

    ``settings`` are `probe train`'s options by their Python names: ``layers``, ``d_model``,
    ``heads``, ``attn_only``, ``norm``, ``positional``, ``data``, ``vocab``, ``seq_len``, ``steps``,
    ``batch_size``, ``lr``, ``weight_decay``, ``warmup``, ``grad_clip``, ``seed``, ``save_every``,
    ``log_every``, ``threads`` (an unknown one is refused, naming the known ones). With ``out`` the
    checkpoint is written there (``resume=True`` continues it; only ``steps``, ``save_every``,
    ``log_every`` and ``threads`` may change); without, the model stays in memory.
    ``callback(step, model)`` runs at step 0, every ``every`` steps and at the end.
    """
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        raise ProbeError(f"out={out} is a file; give a directory")
    if resume and out is None:
        raise ProbeError("resume=True needs out= pointing at the checkpoint directory to continue")
    with size_limit(max_params):
        native, data, cfg = resume_configs(out, **settings) if resume and out is not None else build_configs(**settings)
        return run_training(
            native, data, cfg, out=out, resume=resume, device=device, progress=progress, every=every, callback=callback
        )
