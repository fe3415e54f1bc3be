"""Law members of one shape trained as one batched model (``--batch-members``; :mod:`.batching`).

:func:`run_law_batch` builds each member as :mod:`.law_member` builds it alone (its model from its
own seed, its own batch source), trains them together through the one loop
(:func:`probes.training.batched.train_batched`: the same schedule, clipping, AdamW and windows per
member), with each member's own hands (:func:`.law_member.hands`: its loss log, its learning-curve
evaluations, its family's check after each update: a length curriculum moves on per member), then
evaluates, probes and writes each member alone (:func:`.law_member.finish` in
:func:`.folder.measure_member`, as a member alone ends: its own folder, files
and row, ``batch`` saying how many trained together). The result is each member's result alone up
to float rounding (tests/experiments/test_law_batch.py).

Failures: a member that diverges stops the batch (its name in the error); the batch then raises,
so the job map retries it and records every member of it failed with that line (rerun with
``--batch-members off`` to train the others alone). A member whose evaluation, probe or files fail
after training fails alone.
"""

from __future__ import annotations

import dataclasses
import math
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.runtime import torch_threads
from depthprobe.probes.engine.processes import one_line
from depthprobe.probes.experiments.folder import measure_member
from depthprobe.probes.experiments.law_member import BETAS, Hands, finish, hands, steps_plan
from depthprobe.probes.models.device import resolve_device
from depthprobe.probes.models.loading import load
from depthprobe.probes.training.batched import train_batched
from depthprobe.probes.training.loop import Window

if TYPE_CHECKING:
    from depthprobe.probes.experiments.laws import LawExperiment, LawJob
    from depthprobe.probes.models.model import Model
    from depthprobe.probes.training.loop import BatchSource


def run_law_batch(exp: LawExperiment, jobs: tuple[LawJob, ...]) -> list[tuple[Any, str | None]]:
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
            outcomes.append(_outcome(exp, job, fill, t0))
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

    def after_step(done: int) -> bool:
        used = [member.after_step(done) for member in own]  # every member's, not the first that used its model
        return any(used)

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


def _outcome(exp: LawExperiment, job: LawJob, fill: Any, t0: float) -> tuple[Any, str | None]:
    """One member's files and row (:func:`.folder.measure_member` with ``fill``), or its one-line
    error (as the job map records a member's)."""
    try:
        return measure_member(exp, job, fill, t0), None
    except ProbeError as exc:
        return None, str(exc)
    except Exception as exc:  # one member's failure is data; the others go on
        return None, f"internal error: {one_line(exc)}"


__all__ = ["run_law_batch", "train_together"]
