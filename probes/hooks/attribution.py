"""Attribution patching: the linear approximation of :func:`~depthprobe.probes.hooks.interventions.patch`.

One clean pass (activations) and one corrupted pass with gradients of the metric replace a pass
per slot: writing the clean slot into the corrupted run changes the metric by about
``(clean - corrupt) . d metric / d activation`` summed over the slot. Each row's ``value`` is the
corrupted metric plus that change, so it reads like ``patch``'s (the metric of the patched run).
Exact for a metric linear in the activation; a first-order guess otherwise (it is poor where
attention saturates)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.hooks.cache import outputs, run_with_cache
from depthprobe.probes.hooks.capture import capture
from depthprobe.probes.hooks.grains import Per, layout
from depthprobe.probes.hooks.patching import each_slot, plan, row, table, value
from depthprobe.probes.models.model import Model


def attribute(
    model: Model,
    clean: Any,
    corrupt: Any,
    metric: Callable[[torch.Tensor], Any] | None = None,
    hooks: str | Sequence[str] = "blocks.*.hook_resid_pre",
    task: str = "attribution",
    *,
    per: Per | None = None,
    positions: Sequence[int] | None = None,
) -> pd.DataFrame:
    """The table :func:`patch` gives (same hooks, ``per`` and ``positions``), from two passes and a
    backward pass instead of one pass per slot; see the module notes."""
    p = plan(model, clean, corrupt, hooks, metric, per, positions)
    assert metric is not None
    (c_ids, c_mask), (x_ids, x_mask) = p.clean, p.corrupt
    names = list(p.grains)
    clean_logits, cache = run_with_cache(model, c_ids, names=names, attention_mask=c_mask)
    with torch.enable_grad(), capture(model, names, grad=True) as acts:
        out = metric(outputs(model, x_ids, x_mask))
        if not isinstance(out, torch.Tensor) or out.numel() != 1 or not out.requires_grad:
            raise ProbeError(
                "attribute needs metric to return a one-element tensor computed from the logits "
                "(no .item() or float()), so that it can be differentiated"
            )
        grads = torch.autograd.grad(out, [acts[n] for n in names], allow_unused=True)
    corrupt_value = float(out.detach())
    rows = []
    for name, g in zip(names, grads, strict=True):
        corrupt_act = acts[name].detach()
        diff = cache[name].to(corrupt_act.dtype) - corrupt_act
        diff = diff.masked_fill(cache[name] == corrupt_act, 0.0)  # masked scores: -inf - -inf is no change
        change = diff * (torch.zeros_like(corrupt_act) if g is None else g)
        for slot in each_slot(p, name, corrupt_act):
            delta = float(change[slot.index(layout(name))].sum())
            rows.append(row(model, task, metric, name, slot, corrupt_value + delta))
    return table(rows, value(metric, clean_logits), corrupt_value)
