"""The streaming loop every task runs through: batches -> captured hooks -> running sums -> output.

Core code (no task knowledge): the API layer's :func:`depthprobe.probes.api.run` and tasks that run
another task under an intervention (``ablation``) both call :func:`execute`; a sharded run
(:mod:`depthprobe.probes.engine.distributed`) runs :func:`accumulate` over one contiguous run of
the batches per worker and merges the states.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from depthprobe.probes.base.batching import Batch
from depthprobe.probes.base.signals import check_interrupt
from depthprobe.probes.engine.task import Context, Examples, Output, Task
from depthprobe.probes.hooks.capture import Captured, HookFn, Names, Reduce, forward
from depthprobe.probes.models.model import Model


def accumulate(
    task: Task,
    model: Model,
    ctx: Context,
    examples: Examples,
    on_batch: Callable[[int], None] | None = None,
    batches: range | None = None,
    extra: Mapping[str, HookFn] | None = None,
    observe: Callable[[Batch, Captured], None] | None = None,
) -> tuple[Any, int]:
    """A state started over ``examples`` that has accumulated the task's batches (only those whose
    index is in ``batches``, when given); returns it and the number of batches run. Only the hooks
    the task names are captured; each batch's activations are freed before the next forward pass,
    so memory stays flat as the data grows; a task's :meth:`~Task.reducer` reduces each one as its
    hook fires, so not even one batch's activations are held together.

    ``extra`` (hook name -> function) joins the same pass: edits (an ablation) and further
    captures, which ``observe(batch, acts)`` reads before they are freed; with ``observe`` the
    logits are kept too on causal models. One capture holds them all, so the pass still stops
    after the last hook it needs."""
    names: Names = task.hook_names(model, ctx)
    if extra:
        names = {**dict.fromkeys(names, _keep), **extra}
    logits = task.wants_logits(model) or (observe is not None and model.info.causal)
    state = task.start(model, ctx, examples)
    n_batches = 0
    for i, batch in enumerate(task.batches(model, examples, ctx)):
        check_interrupt()
        if batches is not None and i not in batches:
            if i >= batches.stop:
                break
            continue
        reduce = task.reducer(state, batch)
        reduce = None if reduce is None else _float32(reduce)
        acts = forward(model, batch.input_ids, batch.attention_mask, names, logits=logits, reduce=reduce)
        for k, v in list(acts.items()):  # half-precision patterns: float32 copies for the metrics
            if isinstance(v, torch.Tensor) and v.dtype in (torch.bfloat16, torch.float16):
                acts[k] = v.float()
        task.accumulate(state, batch, acts)
        if observe is not None:
            observe(batch, acts)
        del acts  # free this batch's patterns before the next forward pass allocates its own
        n_batches += 1
        if on_batch is not None:
            on_batch(len(batch.items))
    return state, n_batches


def _float32(reduce: Reduce) -> Reduce:
    """The task's reducer, fed float32 copies of half-precision activations (as ``accumulate`` is)."""

    def fed(name: str, t: torch.Tensor) -> Any:
        return reduce(name, t.float() if t.dtype in (torch.bfloat16, torch.float16) else t)

    return fed


def _keep(t: torch.Tensor, hook: Any) -> None:
    """Capture only (no edit): the task's own hooks beside ``extra`` ones."""
    return None


def execute(
    task: Task, model: Model, ctx: Context, examples: Examples, on_batch: Callable[[int], None] | None = None
) -> tuple[Output, int]:
    """Run ``task`` over ``examples`` in the task's batches; returns its output and the batch count."""
    state, n_batches = accumulate(task, model, ctx, examples, on_batch)
    return task.finalize(state, ctx), n_batches


def batch_costs(batches: list[Batch]) -> list[int]:
    """Padded positions per batch (batch x length): what a sharded run balances across workers."""
    return [int(b.input_ids.numel()) for b in batches]
