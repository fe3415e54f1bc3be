"""One member of a depth-law study, as an independent job.

:func:`measure` builds a native pre-LN GPT decoder (GELU MLPs; ``job.native()``: learned
positions, none for crasp), trains it with the one training loop
(:func:`probes.training.loop.train_steps`, the one optimizer :func:`probes.training.lm.decay_adamw`:
AdamW (0.9, 0.98), weight decay on matrices, linear warm-up then cosine, gradient clipping 1) on
its family's batch source (after each update the family may check it: groups' length
curriculum), evaluates it per key (k, T or length range) on the fixed evaluation sets every
``eval_every`` steps (learning curves; the seconds are not training time) and at the end on the
full sets, lets the family probe it (khop: hop attention) and record its training (groups: the
curriculum's moves), and writes its files once:
``member.json`` (the row and the SHA-256 of every other file), ``accuracy.csv``, ``curves.csv``,
``loss.csv``, ``checkpoint/`` and the family's. It is a pure function of its job.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from depthprobe.probes.base.artifacts import write_csv
from depthprobe.probes.base.runtime import torch_threads
from depthprobe.probes.experiments import member_depth
from depthprobe.probes.models import families
from depthprobe.probes.models.checkpoints import save_checkpoint
from depthprobe.probes.models.device import resolve_device
from depthprobe.probes.models.loading import load
from depthprobe.probes.models.model import Model
from depthprobe.probes.training.fast_forward import fast_logits
from depthprobe.probes.training.lm import decay_adamw
from depthprobe.probes.training.loop import BatchSource, Steps, Window, train_steps

if TYPE_CHECKING:
    from depthprobe.probes.experiments.laws import LawExperiment, LawJob

EVAL_CHUNK = 250  # sequences per forward pass in evaluations


_HOOKED: dict[str, bool] = {"on": False}  # inside through_hooks(): evaluations run the bridge, hooks and all


@contextmanager
def through_hooks() -> Iterator[None]:
    """Within the block, :func:`member_logits` runs ``model.bridge`` (through its hook points, so
    that skipped blocks are skipped) instead of the training fast path (the same function)."""
    before = _HOOKED["on"]
    _HOOKED["on"] = True
    try:
        yield
    finally:
        _HOOKED["on"] = before


def member_logits(model: Model, tokens: torch.Tensor) -> torch.Tensor:
    """Logits [batch, pos, vocab] for the family's evaluations: the fast path, or the bridge inside
    :func:`through_hooks`."""
    return model.bridge(tokens) if _HOOKED["on"] else fast_logits(model, tokens)


@torch.no_grad()
def predict(
    model: Model, inputs: torch.Tensor, decide: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> torch.Tensor:
    """Predictions [n, T], in chunks: the argmax of the logits, or ``decide(logits)``."""
    decide = decide or (lambda logits: logits.argmax(-1))
    parts = [decide(member_logits(model, chunk.to(model.device))).cpu() for chunk in inputs.split(EVAL_CHUNK)]
    return torch.cat(parts)


def train(
    exp: LawExperiment, job: LawJob, model: Model, source: BatchSource
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], float]:
    """Train the member in place on ``source``: its loss log, its learning curve (one row per
    evaluation and key) and its training seconds (evaluations and the family's checks excluded)."""
    cfg = job.config
    curve_sets = exp.eval_sets(job, cfg.curve_sequences)
    evals = set(cfg.eval_steps())
    log: list[dict[str, Any]] = []
    curves: list[dict[str, Any]] = []

    def on_window(w: Window) -> None:
        log.append({"step": w.step, "loss": w.loss, "lr": w.lr, "elapsed_s": w.elapsed})

    def after_step(done: int) -> bool:
        used = exp.after_update(job, source, model, done)  # a length curriculum's check
        if done not in evals:
            return used
        for value, (acc, acc_all) in exp.scores(job, model, curve_sets).items():
            curves.append({"member": job.name, "step": done, exp.key: value, "accuracy": acc, "accuracy_all": acc_all})
        return True

    net = model.bridge.original_model
    plan = Steps(
        steps=cfg.steps, lr_at=cfg.lr_at, grad_clip=1.0, log_every=max(1, cfg.eval_every // 5), check_finite=True
    )
    params = [p for p in net.parameters() if p.requires_grad]
    optimizer = decay_adamw(net, lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay)
    run = train_steps(
        net,
        lambda x: fast_logits(model, x),
        source,
        optimizer,
        params,
        plan,
        device=model.device,
        on_window=on_window,
        after_step=after_step,
    )
    return log, curves, run.seconds


def accuracy_rows(
    exp: LawExperiment, job: LawJob, final: dict[int, tuple[float, float]], curves: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """accuracy.csv's rows of this member; ``step_reached``: the first curve evaluation whose
    accuracy is >= the threshold (None if never)."""
    rows = []
    for value, (acc, acc_all) in final.items():
        reached = [c["step"] for c in curves if c[exp.key] == value and c["accuracy"] >= job.config.threshold]
        row = {**job.ids(), exp.key: value, "accuracy": acc, exp.second: acc_all}
        row["step_reached"] = min(reached) if reached else None
        rows.append(row)
    return rows


def depth_files(exp: LawExperiment, job: LawJob, model: Model, sets: dict[int, Any], folder: Path) -> None:
    """``depth_usage.csv`` on the family's depth-usage inputs, and ``skipped_accuracy.csv``: the
    accuracy per key on the final evaluation sets, intact and with each single block skipped,
    evaluated through the model's hooks."""
    member_depth.write_depth_usage(model, exp.usage_inputs(job), folder, job.name, max_len=job.context)

    def evaluate() -> dict[int, float]:
        with through_hooks():
            return {value: acc for value, (acc, _) in exp.scores(job, model, sets).items()}

    member_depth.write_skipped_accuracy(model, evaluate, folder, job.name, key=exp.key)


def measure(exp: LawExperiment, job: LawJob, folder: Path, row: dict[str, Any]) -> dict[str, Any]:
    """Train, evaluate and probe one member into ``folder``; fills its row."""
    device = resolve_device(job.config.device)
    with torch_threads(1 if device.type == "cpu" else None):
        model = load(job.native(), device=str(device))
        nonembed, embed = families.count_params(model)
        source = exp.source(job)
        log, curves, seconds = train(exp, job, model, source)
        sets = exp.eval_sets(job, job.config.eval_sequences)
        final = exp.scores(job, model, sets)
        write_csv(folder / "loss.csv", pd.DataFrame(log, columns=["step", "loss", "lr", "elapsed_s"]))
        write_csv(folder / "curves.csv", pd.DataFrame(curves))
        accuracy = pd.DataFrame(accuracy_rows(exp, job, final, curves)).astype({"step_reached": "Int64"})
        write_csv(folder / "accuracy.csv", accuracy)
        save_checkpoint(model, folder / "checkpoint", {"law_study": {"member": job.name, "family": exp.name}})
        exp.probe(job, model, folder)
        exp.training_files(job, source, folder)
        if member_depth.enabled(job.config):  # after every other measurement: nothing above depends on it
            depth_files(exp, job, model, sets, folder)
    row.update(params=nonembed + embed, params_nonembed=nonembed, train_s=seconds, device=str(device))
    row["steps_per_s"] = job.config.steps / seconds if seconds > 0 else None
    return {}


__all__ = ["accuracy_rows", "measure", "member_logits", "predict", "through_hooks"]
