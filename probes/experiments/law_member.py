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
from dataclasses import dataclass
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
BETAS = (0.9, 0.98)  # AdamW's of every law member, alone or batched


_SKIP: dict[str, tuple[int, ...]] = {"blocks": ()}  # inside skipping(): the blocks evaluations skip


@contextmanager
def skipping(block: int | None) -> Iterator[None]:
    """Within the block, :func:`member_logits` skips ``block`` (its output is its input; ``None``:
    none), the same function as the bridge under ``probes.skip_layers``
    (tests/api/test_depth_usage_members.py)."""
    before = _SKIP["blocks"]
    _SKIP["blocks"] = () if block is None else (block,)
    try:
        yield
    finally:
        _SKIP["blocks"] = before


def member_logits(model: Model, tokens: torch.Tensor) -> torch.Tensor:
    """Logits [batch, pos, vocab] for the family's evaluations (the fast path), with the blocks of
    :func:`skipping` skipped."""
    return fast_logits(model, tokens, skip=_SKIP["blocks"])


@torch.no_grad()
def predict(
    model: Model, inputs: torch.Tensor, decide: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> torch.Tensor:
    """Predictions [n, T], in chunks: the argmax of the logits, or ``decide(logits)``."""
    decide = decide or (lambda logits: logits.argmax(-1))
    parts = [decide(member_logits(model, chunk.to(model.device))).cpu() for chunk in inputs.split(EVAL_CHUNK)]
    return torch.cat(parts)


@dataclass
class Hands:
    """What a member's training hands back to it: its loss log and learning curve, filled by
    ``on_window`` and ``after_step`` (the loop's hands; a batch calls each member's)."""

    log: list[dict[str, Any]]
    curves: list[dict[str, Any]]
    on_window: Callable[[Window], None]
    after_step: Callable[[int], bool]


def hands(exp: LawExperiment, job: LawJob, model: Model, source: BatchSource) -> Hands:
    """The member's loss log (each window) and learning curve (one row per evaluation and key,
    every ``eval_every`` steps); after each update the family may check the model (a curriculum)."""
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

    return Hands(log, curves, on_window, after_step)


def steps_plan(cfg: Any) -> Steps:
    """How a law member steps: the config's schedule, clipping 1, five loss windows per evaluation."""
    return Steps(
        steps=cfg.steps, lr_at=cfg.lr_at, grad_clip=1.0, log_every=max(1, cfg.eval_every // 5), check_finite=True
    )


def depth_files(exp: LawExperiment, job: LawJob, model: Model, sets: dict[int, Any], folder: Path) -> None:
    """``depth_usage.csv`` on the family's depth-usage inputs, and ``skipped_accuracy.csv``: the
    accuracy per key on the final evaluation sets of :meth:`~LawExperiment.usage_keys`, intact and
    with each single block skipped."""
    member_depth.write_depth_usage(model, exp.usage_inputs(job), folder, job.name, max_len=job.context)
    keys = exp.usage_keys(job)
    chosen = sets if keys is None else {key: s for key, s in sets.items() if key in keys}

    def evaluate(block: int | None) -> dict[int, float]:
        with skipping(block):
            return {value: acc for value, (acc, _) in exp.scores(job, model, chosen).items()}

    member_depth.write_skipped_accuracy(model, evaluate, folder, job.name, key=exp.key)


def measure(exp: LawExperiment, job: LawJob, folder: Path, row: dict[str, Any]) -> dict[str, Any]:
    """Train one member in place on its source (training seconds: evaluations and the family's
    checks excluded), then evaluate and probe it into ``folder``; fills its row."""
    cfg = job.config
    device = resolve_device(cfg.device)
    with torch_threads(1 if device.type == "cpu" else None):
        model = load(job.native(), device=str(device))
        source = exp.source(job)
        member = hands(exp, job, model, source)
        net = model.bridge.original_model
        params = [p for p in net.parameters() if p.requires_grad]
        optimizer = decay_adamw(net, lr=cfg.lr, betas=BETAS, weight_decay=cfg.weight_decay)
        run = train_steps(
            net,
            lambda x: fast_logits(model, x),
            source,
            optimizer,
            params,
            steps_plan(cfg),
            device=model.device,
            on_window=member.on_window,
            after_step=member.after_step,
        )
        return finish(exp, job, folder, row, model, source, member, run.seconds)


def finish(
    exp: LawExperiment,
    job: LawJob,
    folder: Path,
    row: dict[str, Any],
    model: Model,
    source: BatchSource,
    member: Hands,
    seconds: float,
    batch: int = 1,
) -> dict[str, Any]:
    """Evaluate, probe and write a trained member into ``folder`` and fill its ``row``
    (``member``: its loss log and curve; ``seconds``: its training seconds; ``batch``: members it
    trained with, itself included); no extra ``member.json`` entries."""
    nonembed, embed = families.count_params(model)
    sets = exp.eval_sets(job, job.config.eval_sequences)
    final = exp.scores(job, model, sets)
    write_csv(folder / "loss.csv", pd.DataFrame(member.log, columns=["step", "loss", "lr", "elapsed_s"]))
    curves = pd.DataFrame(member.curves)
    write_csv(folder / "curves.csv", curves)
    # accuracy.csv: per key the final accuracies; step_reached: the first curve evaluation at the threshold
    accuracy = pd.DataFrame([{**job.ids(), exp.key: v, "accuracy": a, exp.second: b} for v, (a, b) in final.items()])
    reached = curves[curves["accuracy"] >= job.config.threshold].groupby(exp.key)["step"].min()
    accuracy["step_reached"] = accuracy[exp.key].map(reached).astype("Int64")
    write_csv(folder / "accuracy.csv", accuracy)
    save_checkpoint(model, folder / "checkpoint", {"law_study": {"member": job.name, "family": exp.name}})
    exp.probe(job, model, folder)
    exp.training_files(job, source, folder)
    if member_depth.enabled(job.config):  # after every other measurement: nothing above depends on it
        depth_files(exp, job, model, sets, folder)
    row.update(params=nonembed + embed, params_nonembed=nonembed, train_s=seconds, batch=batch)
    row.update(
        steps_per_s=job.config.steps / seconds if seconds > 0 else None, device=str(resolve_device(job.config.device))
    )
    return {}


__all__ = [
    "Hands",
    "finish",
    "hands",
    "measure",
    "member_logits",
    "predict",
    "skipping",
    "steps_plan",
]
