"""Attribution patching: the linear approximation of :func:`~depthprobe.probes.hooks.interventions.patch`.

One clean pass (activations) and one corrupted pass with gradients of the metric replace a pass
per slot: writing the clean slot into the corrupted run changes the metric by about
``(clean - corrupt) . d metric / d activation`` summed over the slot. Each row's ``value`` is the
corrupted metric plus that change, so it reads like ``patch``'s (the metric of the patched run).
Exact for a metric linear in the activation; a first-order guess otherwise (it is poor where
attention saturates).

With ``ig_steps=N`` (N > 1) the gradient is integrated gradients' (EAP-IG, Hanna et al. 2024; per
node as in Marks et al. 2024): the mean of the metric's gradients with the hook's activation moved
along the straight line from corrupted to clean, at ``corrupt + k/N (clean - corrupt)`` for
k = 0..N-1 (a left Riemann sum: ``ig_steps=1`` is plain attribution, as in TransformerLens's
``EdgeAttributionConfig``), the rest of the pass computed by the model. Summed over a hook's slots
the estimate tends to the metric with the whole hook patched (completeness), with an error of order
1/N; each hook costs N - 1 more passes and backward passes."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import pandas as pd
import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.hooks.cache import outputs, run_with_cache
from depthprobe.probes.hooks.capture import capture
from depthprobe.probes.hooks.grains import Per, layout
from depthprobe.probes.hooks.patching import Plan, each_slot, plan, sweep
from depthprobe.probes.hooks.spot_check import spot_check
from depthprobe.probes.hooks.stats import Metrics, Stats, Values, call, measure
from depthprobe.probes.models.model import Model


def attribute(
    model: Model,
    clean: Any,
    corrupt: Any,
    metric: Metrics | None = None,
    hooks: str | Sequence[str] = "blocks.*.hook_resid_pre",
    task: str = "attribution",
    *,
    per: Per | None = None,
    positions: Sequence[int] | None = None,
    neurons: Sequence[int] | None = None,
    per_example: bool = False,
    batch_size: int | None = None,
    progress: bool = False,
    ci: float | None = None,
    n_boot: int = 1000,
    permutation: int = 0,
    seed: int = 0,
    ig_steps: int = 1,
    check: int = 3,
) -> pd.DataFrame:
    """The table :func:`patch` gives (same hooks, ``per``, ``positions``, ``neurons``, metrics, ``per_example``,
    ``batch_size``, ``progress`` and statistics, ``ci``, ``n_boot``, ``permutation``, ``seed``), from
    two passes and a backward pass per metric instead of
    one pass per slot; ``ig_steps`` > 1 integrates the gradient along the path from the corrupted
    to the clean activation (see the module notes). A per-example metric gets per-example estimates.
    ``check`` slots, those with the largest estimated effect, are patched too: an estimate off by
    more than half is one :class:`~.spot_check.AttributionWarning` (``df.attrs["checked"]`` holds
    them; 0 checks none)."""
    for arg, value, low in (("ig_steps", ig_steps, 1), ("check", check, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ProbeError(f"{arg} must be an integer of at least {low}, got {value!r}")
    stats = Stats(ci, n_boot, permutation, seed).check(per_example)
    p = plan(model, clean, corrupt, hooks, metric, per, positions, neurons)
    df = sweep(
        model,
        p,
        task,
        metric,
        partial(_attribute_batch, model, p, ig_steps),
        per_example=per_example,
        batch_size=batch_size,
        progress=progress,
        label="attribution batches",
        stats=stats,
    )
    if check:
        df.attrs["checked"] = spot_check(model, p, df, metric, check, batch_size)
    return df


def _gradients(
    name: str, fn: Any, logits: torch.Tensor, acts: dict[str, torch.Tensor], names: list[str], part: slice
) -> Any:
    out = call(fn, logits, part)
    if not isinstance(out, torch.Tensor) or not out.requires_grad or out.numel() not in (1, logits.shape[0]):
        raise ProbeError(
            f"attribute needs metric {name!r} to return a one-element tensor (or one per example) computed from "
            "the logits (no .item() or float()), so that it can be differentiated"
        )
    grads = torch.autograd.grad(out.sum(), [acts[n] for n in names], allow_unused=True, retain_graph=True)
    return measure(name, lambda _: out, logits), grads


def _attribute_batch(model: Model, p: Plan, steps: int, part: slice, got: Values, order: dict[Any, None]) -> None:
    """One batch: the clean activations, the corrupted pass, and each metric's estimates."""
    (c_ids, c_mask), (x_ids, x_mask) = ((ids[part], mask[part]) for ids, mask in (p.clean, p.corrupt))
    names = list(p.grains)
    clean_logits, cache = run_with_cache(model, c_ids, names=names, attention_mask=c_mask)
    got.add("clean", clean_logits, part)
    values, grads = {}, {}
    with torch.enable_grad(), capture(model, names, grad=True) as acts:
        logits = outputs(model, x_ids, x_mask)
        for metric, fn in got.fns.items():
            values[metric], got_grads = _gradients(metric, fn, logits, acts, names, part)
            got.put("corrupt", metric, values[metric])
            grads[metric] = dict(zip(names, got_grads, strict=True))
    for name in names:
        corrupt_act = acts[name].detach()
        diff = cache[name].to(corrupt_act.dtype) - corrupt_act
        diff = diff.masked_fill(cache[name] == corrupt_act, 0.0)  # masked scores: -inf - -inf is no change
        first = {m: torch.zeros_like(corrupt_act) if g[name] is None else g[name] for m, g in grads.items()}
        mean = _path_gradients(model, (x_ids, x_mask), name, corrupt_act, diff, steps, got, part, first)
        for metric, g in mean.items():
            change = diff * g
            for slot in each_slot(p, name, corrupt_act, model.info.causal):
                order[(name, slot)] = None
                got.put((name, slot), metric, _estimate(values[metric], change[slot.index(layout(name))]))


def _path_gradients(
    model: Model,
    x: tuple[torch.Tensor, torch.Tensor],
    name: str,
    start: torch.Tensor,
    diff: torch.Tensor,
    steps: int,
    got: Values,
    part: slice,
    first: dict[str, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """Each metric's gradient at ``name`` averaged over the hook holding ``start + k/steps * diff``,
    k = 0..steps-1 (``first``: the gradient at k = 0, the corrupted pass's)."""
    total = {m: g.clone() for m, g in first.items()}
    for k in range(1, steps):
        point = (start + (k / steps) * diff).detach()

        def hold(t: torch.Tensor, hook: Any, point: torch.Tensor = point) -> torch.Tensor:
            return point.clone().requires_grad_(True)  # a leaf the gradient is taken at

        with torch.enable_grad(), capture(model, {name: hold}, grad=True) as acts:
            logits = outputs(model, *x)
            for metric, fn in got.fns.items():
                _, (g,) = _gradients(metric, fn, logits, acts, [name], part)
                if g is not None:
                    total[metric] += g
    return {m: t / steps for m, t in total.items()}


def _estimate(corrupt_value: torch.Tensor, change: torch.Tensor) -> torch.Tensor:
    """The corrupted metric plus the change summed over the slot (per example for per-example metrics)."""
    if corrupt_value.dim() == 0:
        return torch.tensor(float(corrupt_value) + float(change.sum()), dtype=torch.float64)
    return corrupt_value + change.reshape(change.shape[0], -1).sum(1).to(torch.float64).cpu()
