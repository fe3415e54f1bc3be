"""What :func:`~depthprobe.probes.hooks.interventions.patch` and
:func:`~depthprobe.probes.hooks.attribution.attribute` share: the checked plan (inputs, hooks and
their grains, positions), made before any forward pass, and the tidy table they both return:
``model, task, layer, head, position, hook, metric, value`` (layer, head or position empty where
they do not apply; ``hook`` is the hook name without its ``blocks.{i}.`` prefix)."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.hooks import eager_attention
from depthprobe.probes.hooks.capture import resolve_names
from depthprobe.probes.hooks.grains import (
    MAX_NEURONS,
    Per,
    Slot,
    check_neurons,
    check_positions,
    grain,
    index_list,
    layer_and_hook,
    layout,
    slots,
)
from depthprobe.probes.hooks.inputs import inputs
from depthprobe.probes.hooks.stats import Metrics, Stats, Values, bar, chunks, metric_fns
from depthprobe.probes.models.model import Model

COLUMNS = ["model", "task", "layer", "head", "position", "hook", "metric", "value"]
Metric = Callable[[torch.Tensor], Any]
_INTS = ("layer", "head", "position", "key", "latent", "neuron", "example", "n")  # integer columns


@dataclass(frozen=True)
class Plan:
    clean: tuple[torch.Tensor, torch.Tensor]  # ids, mask
    corrupt: tuple[torch.Tensor, torch.Tensor]
    grains: dict[str, Per]  # hook name -> grain, in the order asked
    positions: list[int]
    neurons: list[int] | None = None  # per="neuron": the neurons asked (None: all)


def plan(
    model: Model,
    clean: Any,
    corrupt: Any,
    hooks: str | Sequence[str],
    metric: Metrics | None,
    per: Per | None,
    positions: Sequence[int] | None,
    neurons: Sequence[int] | None = None,
) -> Plan:
    """Check everything a patching run needs, before any forward pass (the neurons' range, which
    needs the hooks' widths, is checked on the first batch's clean run, before any patched run)."""
    metric_fns(metric)
    names = resolve_names(model, hooks)
    grains = {name: grain(name, per) for name in names}
    picked = index_list(neurons, "neurons")
    if picked is not None and per != "neuron":
        raise ProbeError(f"neurons= picks the neurons of per='neuron'; pass per='neuron' (got per={per!r})")
    c_ids, c_mask = inputs(model, clean, None)
    x_ids, x_mask = inputs(model, corrupt, None)
    if c_ids.shape != x_ids.shape:
        raise ProbeError(
            f"clean and corrupted inputs must have the same shape in tokens, got {list(c_ids.shape)} and "
            f"{list(x_ids.shape)}; pick corruptions that keep the token count"
        )
    eager_attention.check_editable(model.bridge, names)  # pattern edits that would be ignored
    return Plan((c_ids, c_mask), (x_ids, x_mask), grains, check_positions(positions, c_ids.shape[1]), picked)


def head_count(name: str, act: torch.Tensor) -> int:
    kind = layout(name)
    if kind == "positions":
        if act.dim() < 2:
            raise ProbeError(f"{name} has no position axis [batch, pos, ...]; patch a per-position hook")
        return 0
    if kind == "latents":
        return act.shape[-1]  # the SAE's latents, cut as heads are
    return act.shape[2] if kind == "heads" else act.shape[1]


def each_slot(p: Plan, name: str, act: torch.Tensor, causal: bool = True) -> list[Slot]:
    if p.grains[name] == "neuron":
        return slots("neuron", 0, p.positions, neurons=check_neurons(p.neurons, name, act))
    return slots(p.grains[name], head_count(name, act), p.positions, act.shape[-1], causal)


def every_slot(
    p: Plan, acts: dict[str, torch.Tensor], causal: bool = True, only: set[Any] | None = None
) -> list[tuple[str, Slot]]:
    """(hook, slot) of every patched run (or of those in ``only``), in sweep order; all neurons
    of wide hooks (more than :data:`MAX_NEURONS` runs without ``neurons=``) refused."""
    runs = [(name, slot) for name in p.grains for slot in each_slot(p, name, acts[name], causal)]
    runs = runs if only is None else [run for run in runs if run in only]
    n = sum(slot.neuron is not None for _, slot in runs)
    if p.neurons is None and n > MAX_NEURONS:
        raise ProbeError(
            f"per='neuron' over every neuron of these hooks is {n} patched runs (limit {MAX_NEURONS}); "
            "pick some with neurons=[...] or patch fewer hooks"
        )
    return runs


def value(metric: Metric, logits: torch.Tensor) -> float:
    """``metric(logits)`` as a float: a number or a one-element tensor, anything else refused."""
    out = metric(logits)
    if isinstance(out, torch.Tensor) and out.numel() == 1:
        return float(out.item())
    if isinstance(out, numbers.Real):
        return float(out)
    what = f"a tensor of shape {list(out.shape)}" if isinstance(out, torch.Tensor) else f"a {type(out).__name__}"
    raise ProbeError(
        f"metric must return a number or a one-element tensor; it returned {what} (reduce it, e.g. logits[0, -1, t])"
    )


def where(model: Model, task: str, name: str, slot: Slot) -> dict[str, Any]:
    """A row's columns before ``metric`` and ``value``."""
    layer, hook = layer_and_hook(name)
    return {
        "model": model.name,
        "task": task,
        "layer": pd.NA if layer is None else layer,
        "head": pd.NA if slot.head is None else slot.head,
        "position": pd.NA if slot.position is None else slot.position,
        "hook": hook,
        **({} if slot.key is None else {"key": slot.key}),
        **({} if slot.latent is None else {"latent": slot.latent}),
        **({} if slot.neuron is None else {"neuron": slot.neuron}),
    }


def row(model: Model, task: str, metric: Metric, name: str, slot: Slot, v: float) -> dict[str, Any]:
    return {**where(model, task, name, slot), "metric": getattr(metric, "__name__", "metric"), "value": v}


def table(rows: list[dict[str, Any]], clean: Any, corrupt: Any) -> pd.DataFrame:
    """The tidy table; per-example metrics add ``se`` and ``n`` (or ``example``) columns."""
    optional = ("key", "latent", "neuron", "example", "se", "n", "ci_low", "ci_high", "p")
    extra = [c for c in optional if any(c in r for r in rows)]
    df = pd.DataFrame(rows, columns=COLUMNS + extra)
    for col in (c for c in ("layer", "head", "position", *extra) if c in _INTS):
        df[col] = df[col].astype("Int64")
    df.attrs.update(clean=clean, corrupt=corrupt)
    return df


Batch = Callable[[slice, Values, dict[Any, None]], None]


def sweep(
    model: Model,
    p: Plan,
    task: str,
    metric: Metrics | None,
    run_batch: Batch,
    *,
    per_example: bool,
    batch_size: int | None,
    progress: bool,
    label: str,
    stats: Stats | None = None,
) -> pd.DataFrame:
    """Run ``run_batch(part, values, order)`` over the plan's examples in batches (a bar with
    ``progress``) and return the tidy table of every (hook, slot) in the order run: the one loop
    of patching and attribution."""
    got = Values(metric_fns(metric), batch_size is not None, stats)
    order: dict[Any, None] = {}  # (hook, slot) in the order run
    parts = chunks(p.clean[0].shape[0], batch_size)
    shown = bar(progress, len(parts), label)
    for part in parts:
        run_batch(part, got, order)
        if shown is not None:
            shown.update(1)
    if shown is not None:
        shown.close()
    rows = [r for name, slot in order for r in got.rows((name, slot), where(model, task, name, slot), per_example)]
    return table(rows, got.attrs("clean"), got.attrs("corrupt"))
