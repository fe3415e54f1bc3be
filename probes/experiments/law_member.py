"""One member of a depth-law study, as an independent job.

:func:`measure` builds a native pre-LN GPT decoder (GELU MLPs; ``job.native()``: learned
positions, none for crasp), trains it with the one training loop
(:func:`probes.training.loop.train_steps`, the one optimizer :func:`probes.training.lm.decay_adamw`:
AdamW (0.9, 0.98), weight decay on matrices, linear warm-up then cosine, gradient clipping 1) on
its family's batch source (after each update a :class:`Checking` source checks it: groups' length
curriculum), evaluates it per key (k, T or length range) on the fixed evaluation sets every
``eval_every`` steps (learning curves; the seconds are not training time) and at the end on the
full sets, lets the family probe it (khop: hop attention) and record its training (groups: the
curriculum's moves), and writes its files once:
``member.json`` (the row and the SHA-256 of every other file), ``accuracy.csv``, ``curves.csv``,
``loss.csv``, ``checkpoint/`` and the family's. It is a pure function of its job. The member
pipeline sees a family only as a :class:`LawTask` (its data half).

Members of one shape trained as one batched model (``--batch-members``; :mod:`.batching`):
:func:`run_law_batch` builds each member as it is built alone (its model from its own seed, its
own batch source), trains them together through the one loop
(:func:`probes.training.batched.train_batched`: the same schedule, clipping, AdamW and windows per
member), with each member's own :func:`hands`, then evaluates, probes and writes each member alone
(:func:`finish` in :func:`.folder.measure_member`: its own folder, files and row, ``batch`` saying
how many trained together). The result is each member's result alone up to float rounding
(tests/experiments/test_law_batch.py). A member that diverges stops the batch (its name in the error); the
batch then raises, so the job map retries it and records every member of it failed with that line
(rerun with ``--batch-members off`` to train the others alone). A member whose evaluation, probe or
files fail after training fails alone.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import pandas as pd
import torch

from depthprobe.probes.base.artifacts import write_csv
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.runtime import torch_threads
from depthprobe.probes.engine.processes import one_line
from depthprobe.probes.experiments import member_depth
from depthprobe.probes.experiments.folder import MemberOutput, measure_member
from depthprobe.probes.experiments.law_config import LawJob
from depthprobe.probes.models import families
from depthprobe.probes.models.checkpoints import save_checkpoint
from depthprobe.probes.models.device import resolve_device
from depthprobe.probes.models.loading import load
from depthprobe.probes.models.model import Model
from depthprobe.probes.training.batched import train_batched
from depthprobe.probes.training.fast_forward import fast_logits, skipped_logits
from depthprobe.probes.training.lm import decay_adamw
from depthprobe.probes.training.loop import BatchSource, Steps, Window, train_steps

EVAL_CHUNK = 250  # sequences per forward pass in evaluations
BETAS = (0.9, 0.98)  # AdamW's of every law member, alone or batched


Predict = Callable[..., torch.Tensor]  # predict(inputs, decide=None) -> predictions [n, T] (a member's)


@runtime_checkable
class Checking(Protocol):
    """A batch source that checks the member after its updates (groups' length curriculum:
    :class:`~probes.training.sources.CurriculumSource`); True when it used the model."""

    def check(self, predict: Predict, done: int) -> bool: ...


class LawTask(Protocol):
    """The data half of a law family, all a member's training and evaluation calls: its batch
    source, its evaluation sets and scores (``key``: the sets' key column, ``second``: the second
    accuracy's), the depth-usage probe's inputs and sets, and what it measures and writes besides
    accuracy."""

    name: ClassVar[str]
    key: ClassVar[str]
    second: ClassVar[str]

    def source(self, job: LawJob) -> BatchSource: ...
    def eval_sets(self, job: LawJob, n: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]: ...
    def scores(self, job: LawJob, predict: Predict, sets: dict[int, Any]) -> dict[int, tuple[float, float]]: ...
    def usage(self, job: LawJob, sets: dict[int, Any]) -> tuple[torch.Tensor, dict[int, Any]]: ...
    def probe(self, job: LawJob, model: Model, folder: Path, source: BatchSource) -> None: ...


def member_logits(model: Model, tokens: torch.Tensor, skip: tuple[int, ...] = ()) -> torch.Tensor:
    """Logits [batch, pos, vocab] for the family's evaluations (the fast path) with the blocks
    ``skip`` skipped (each one's output is its input), the same function as the bridge under
    ``probes.skip_layers`` (tests/api/test_depth_usage_members.py)."""
    return fast_logits(model, tokens, skip=skip)


@torch.no_grad()
def predict(
    model: Model,
    inputs: torch.Tensor,
    decide: Callable[[torch.Tensor], torch.Tensor] | None = None,
    skip: tuple[int, ...] = (),
) -> torch.Tensor:
    """Predictions [n, T], in chunks: the argmax of the logits, or ``decide(logits)``, with the
    blocks ``skip`` skipped."""
    decide = decide or (lambda logits: logits.argmax(-1))
    parts = [decide(member_logits(model, chunk.to(model.device), skip)).cpu() for chunk in inputs.split(EVAL_CHUNK)]
    return torch.cat(parts)


def predictor(model: Model, skip: tuple[int, ...] = ()) -> Predict:
    """The ``predict`` a family's ``scores`` evaluates with: ``model``'s, with the blocks ``skip`` skipped."""
    return partial(predict, model, skip=skip)


class SkipPredictions:
    """A member's predictions on the sets ``skipped_accuracy.csv`` reads, intact and with each single
    block skipped, all from one intact pass per chunk (:func:`~probes.training.fast_forward.skipped_logits`:
    the same values as :func:`predict` with ``skip=()`` and ``skip=(s,)``, bit for bit, at about
    half the block passes): the final evaluation's intact predictions on those sets come from the
    same passes. Other inputs are predicted as :func:`predict` does."""

    def __init__(self, model: Model, inputs: list[torch.Tensor]) -> None:
        self.model = model
        self.inputs = inputs  # the sets' inputs, by identity
        self.done: list[tuple[torch.Tensor, Any, dict[int | None, torch.Tensor]]] = []

    def predictor(self, block: int | None = None) -> Predict:
        """The ``predict`` of the member with ``block`` skipped (None: intact)."""
        return partial(self._predict, block)

    def _predict(
        self, block: int | None, inputs: torch.Tensor, decide: Callable[[torch.Tensor], torch.Tensor] | None = None
    ) -> torch.Tensor:
        for known, how, predictions in self.done:
            if known is inputs and how is decide:
                return predictions[block]
        if not any(inputs is x for x in self.inputs):
            return predict(self.model, inputs, decide, () if block is None else (block,))
        predictions = self._all(inputs, decide)
        self.done.append((inputs, decide, predictions))
        return predictions[block]

    @torch.no_grad()
    def _all(
        self, inputs: torch.Tensor, decide: Callable[[torch.Tensor], torch.Tensor] | None
    ) -> dict[int | None, torch.Tensor]:
        decide = decide or (lambda logits: logits.argmax(-1))
        parts: dict[int | None, list[torch.Tensor]] = {}
        for chunk in inputs.split(EVAL_CHUNK):
            for block, logits in skipped_logits(self.model, chunk.to(self.model.device)):
                parts.setdefault(block, []).append(decide(logits).cpu())
        return {block: torch.cat(chunks) for block, chunks in parts.items()}


@dataclass
class Hands:
    """What a member's training hands back to it: its loss log and learning curve, filled by
    ``on_window`` and ``after_step`` (the loop's hands; a batch calls each member's)."""

    log: list[dict[str, Any]]
    curves: list[dict[str, Any]]
    on_window: Callable[[Window], None]
    after_step: Callable[[int], bool]


def hands(exp: LawTask, job: LawJob, model: Model, source: BatchSource) -> Hands:
    """The member's loss log (each window) and learning curve (one row per evaluation and key,
    every ``eval_every`` steps); after each update a :class:`Checking` source checks the model."""
    cfg = job.config
    curve_sets = exp.eval_sets(job, cfg.curve_sequences)
    evals = set(cfg.eval_steps())
    log: list[dict[str, Any]] = []
    curves: list[dict[str, Any]] = []
    check = source.check if isinstance(source, Checking) else None

    def on_window(w: Window) -> None:
        log.append({"step": w.step, "loss": w.loss, "lr": w.lr, "elapsed_s": w.elapsed})

    def after_step(done: int) -> bool:
        used = check is not None and check(predictor(model), done)  # its seconds are not training time
        if done not in evals:
            return used
        for value, (acc, acc_all) in exp.scores(job, predictor(model), curve_sets).items():
            curves.append({"member": job.name, "step": done, exp.key: value, "accuracy": acc, "accuracy_all": acc_all})
        return True

    return Hands(log, curves, on_window, after_step)


def steps_plan(cfg: Any) -> Steps:
    """How a law member steps: the config's schedule, clipping 1, five loss windows per evaluation."""
    return Steps(
        steps=cfg.steps, lr_at=cfg.lr_at, grad_clip=1.0, log_every=max(1, cfg.eval_every // 5), check_finite=True
    )


def depth_files(
    exp: LawTask, job: LawJob, model: Model, usage: tuple[torch.Tensor, dict[int, Any]], skips: SkipPredictions,
    folder: Path,
) -> None:  # fmt: skip
    """``depth_usage.csv`` on the family's depth-usage inputs, and ``skipped_accuracy.csv``: the
    accuracy per key on the final evaluation sets the family chooses (``usage``:
    :meth:`~LawExperiment.usage`), intact and with each single block skipped (``skips``: their
    predictions)."""
    inputs, chosen = usage
    member_depth.write_depth_usage(model, inputs, folder, job.name, max_len=job.context)

    def evaluate(block: int | None) -> dict[int, float]:
        scores = exp.scores(job, skips.predictor(block), chosen)
        return {value: acc for value, (acc, _) in scores.items()}

    member_depth.write_skipped_accuracy(model, evaluate, folder, job.name, key=exp.key)


def measure(exp: LawTask, job: LawJob, folder: Path, row: dict[str, Any]) -> dict[str, Any]:
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
    exp: LawTask,
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
    usage = exp.usage(job, sets) if job.config.depth_usage else None
    skips = SkipPredictions(model, [x for x, *_ in usage[1].values()] if usage else [])
    final = exp.scores(job, skips.predictor(), sets)  # on the skipped-block sets, with their passes
    write_csv(folder / "loss.csv", pd.DataFrame(member.log, columns=["step", "loss", "lr", "elapsed_s"]))
    curves = pd.DataFrame(member.curves)
    write_csv(folder / "curves.csv", curves)
    # accuracy.csv: per key the final accuracies; step_reached: the first curve evaluation at the threshold
    accuracy = pd.DataFrame([{**job.ids(), exp.key: v, "accuracy": a, exp.second: b} for v, (a, b) in final.items()])
    reached = curves[curves["accuracy"] >= job.config.threshold].groupby(exp.key)["step"].min()
    accuracy["step_reached"] = accuracy[exp.key].map(reached).astype("Int64")
    write_csv(folder / "accuracy.csv", accuracy)
    save_checkpoint(model, folder / "checkpoint", {"law_study": {"member": job.name, "family": exp.name}})
    exp.probe(job, model, folder, source)
    if usage is not None:  # after every other measurement: nothing above depends on it
        depth_files(exp, job, model, usage, skips, folder)
    row.update(params=nonembed + embed, params_nonembed=nonembed, train_s=seconds, batch=batch)
    row.update(
        steps_per_s=job.config.steps / seconds if seconds > 0 else None, device=str(resolve_device(job.config.device))
    )
    return {}


def run_law_batch(
    exp: LawTask, jobs: tuple[LawJob, ...], base_row: Callable[[LawJob], dict[str, Any]]
) -> list[tuple[MemberOutput | None, str | None]]:
    """Train ``jobs`` (one shape) together, then finish each in its own folder: per member its
    output, or None and its one-line error."""
    t0 = time.perf_counter()
    device = resolve_device(jobs[0].config.device)
    with torch_threads(1 if device.type == "cpu" else None):
        models = [load(job.native(), device=str(device)) for job in jobs]
        sources = [exp.source(job) for job in jobs]
        own = [hands(exp, job, model, source) for job, model, source in zip(jobs, models, sources, strict=True)]
        seconds = train_together(jobs, models, sources, own)
        outcomes = []
        for job, model, source, h in zip(jobs, models, sources, own, strict=True):
            fill = partial(finish, exp, job, model=model, source=source, member=h, seconds=seconds, batch=len(jobs))
            outcomes.append(_outcome(job, base_row(job), fill, t0))
    return outcomes


def train_together(
    jobs: tuple[LawJob, ...], models: list[Model], sources: list[BatchSource], own: list[Hands]
) -> float:
    """The batch's training seconds; each member's windows and evaluations go to its own hands."""
    cfg = jobs[0].config
    plan = dataclasses.replace(steps_plan(cfg), check_finite=False)  # checked here, naming the members

    def on_window(w: Window) -> None:
        bad = [f"{job.name} (loss {loss})" for job, loss in zip(jobs, w.losses, strict=True) if not math.isfinite(loss)]
        if bad:
            raise ProbeError(
                f"training diverged by step {w.step}: {', '.join(bad)}, in a batch of {len(jobs)} members; "
                "lower --lr, or rerun with --batch-members off to train the others alone"
            )
        for i, member in enumerate(own):
            member.on_window(Window(w.step, (w.losses[i],), (w.lrs[i],), w.updates, w.seconds, w.elapsed))

    def after_step(done: int) -> bool:  # every member's, not only up to the first that used its model
        return any([member.after_step(done) for member in own])

    run = train_batched(
        models,
        sources,
        [cfg.lr_at] * len(jobs),
        plan,
        betas=BETAS,
        weight_decay=cfg.weight_decay,
        on_window=on_window,
        after_step=after_step,
    )
    return run.seconds


def _outcome(job: LawJob, base_row: dict[str, Any], fill: Any, t0: float) -> tuple[MemberOutput | None, str | None]:
    """One member's files and row (:func:`.folder.measure_member` with ``fill``), or its one-line
    error (as the job map records a member's)."""
    try:
        return measure_member(job, base_row, fill, t0), None
    except ProbeError as exc:
        return None, str(exc)
    except Exception as exc:  # one member's failure is data; the others go on
        return None, f"internal error: {one_line(exc)}"


__all__ = [
    "Hands",
    "LawTask",
    "Predict",
    "SkipPredictions",
    "finish",
    "hands",
    "measure",
    "member_logits",
    "predict",
    "predictor",
    "run_law_batch",
    "steps_plan",
    "train_together",
]
