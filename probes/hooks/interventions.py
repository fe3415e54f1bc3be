"""Interventions: head ablation and activation patching (DESIGN §3.8).

Heads are labelled ``L-H``, 0-indexed (``1-2`` is layer 1, head 2). Ablation replaces a head's
output ``hook_z`` [batch, pos, head, d_head] by zero or by its mean over a data set (the default:
zero shifts activations off-distribution). Patching follows TransformerLens: run the corrupted
input with one clean activation written in, and record a metric of the logits.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pandas as pd
import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.hooks.cache import _inputs, outputs
from depthprobe.probes.hooks.capture import capture, forward
from depthprobe.probes.models.model import Model

Head = tuple[int, int]
_LABEL = re.compile(r"^(\d+)-(\d+)$")


def head_label(layer: int, head: int) -> str:
    return f"{layer}-{head}"


def parse_heads(model: Model, heads: str | Head | Sequence[str | Head]) -> list[Head]:
    """``"1-2,0-3"``, ``"1-2"``, ``(1, 2)`` or a list of those -> [(1, 2), (0, 3)], checked against the model."""
    items: list[Any] = (
        heads.split(",") if isinstance(heads, str) else ([heads] if isinstance(heads, tuple) else list(heads))
    )
    out: list[Head] = []
    for item in items:
        if isinstance(item, str):
            m = _LABEL.match(item.strip())
            if m is None:
                raise ProbeError(
                    f"bad head {item.strip()!r}: write heads as L-H, 0-indexed (e.g. 1-2 is layer 1, head 2)"
                )
            layer, head = int(m.group(1)), int(m.group(2))
        else:
            layer, head = (int(x) for x in item)
        if not (0 <= layer < model.info.n_layers and 0 <= head < model.info.n_heads):
            raise ProbeError(
                f"head {layer}-{head} does not exist: {model.name} has layers 0-{model.info.n_layers - 1} "
                f"and heads 0-{model.info.n_heads - 1}"
            )
        if (layer, head) not in out:
            out.append((layer, head))
    if not out:
        raise ProbeError("no heads given; write heads as L-H, e.g. 1-2,0-3")
    return out


def mean_z(
    model: Model, data: Any, layers: Sequence[int], attention_mask: torch.Tensor | None = None, batch_size: int = 32
) -> dict[int, torch.Tensor]:
    """Mean of ``hook_z`` over every real (unpadded) token of ``data``: layer -> [head, d_head]."""
    ids, mask = _inputs(model, data, attention_mask)
    names = [f"blocks.{layer}.attn.hook_z" for layer in layers]
    sums: dict[int, torch.Tensor | float] = {layer: 0.0 for layer in layers}
    n = 0.0
    for start in range(0, ids.shape[0], batch_size):
        m = mask[start : start + batch_size]
        acts = forward(model, ids[start : start + batch_size], m, names)
        w = m.to(torch.float32)[..., None, None]  # [b, pos, 1, 1]
        for layer, name in zip(layers, names, strict=True):
            sums[layer] = sums[layer] + (acts[name].float() * w).sum((0, 1))
        n += float(m.sum())
    return {layer: torch.as_tensor(s) / n for layer, s in sums.items()}


@contextmanager
def ablate_heads(
    model: Model,
    heads: str | Head | Sequence[str | Head],
    method: str = "mean",
    data: Any = None,
    attention_mask: torch.Tensor | None = None,
) -> Iterator[list[Head]]:
    """Within the block, every forward pass of ``model`` runs with ``heads`` ablated.

    ``method="mean"`` (default) writes each head's mean output over ``data`` (texts or token ids);
    ``method="zero"`` writes zeros. Yields the parsed heads."""
    parsed = parse_heads(model, heads)
    if method not in ("mean", "zero"):
        raise ProbeError(f"unknown ablation method {method!r}; use mean or zero")
    if method == "mean" and data is None:
        raise ProbeError(
            "mean ablation needs data= (texts or token ids to average each head's output over), or use method='zero'"
        )
    by_layer: dict[int, list[int]] = {}
    for layer, head in parsed:
        by_layer.setdefault(layer, []).append(head)
    means = mean_z(model, data, sorted(by_layer), attention_mask) if method == "mean" else {}

    def make(layer: int) -> Callable[[torch.Tensor, Any], torch.Tensor]:
        idx = by_layer[layer]

        def fn(z: torch.Tensor, hook: Any) -> torch.Tensor:  # z [batch, pos, head, d_head]
            z = z.clone()
            z[:, :, idx] = 0.0 if method == "zero" else means[layer][idx].to(z.dtype)
            return z

        return fn

    with capture(model, {f"blocks.{layer}.attn.hook_z": make(layer) for layer in by_layer}, store=False):
        yield parsed


def _metric_value(metric: Callable[[torch.Tensor], Any], logits: torch.Tensor) -> float:
    value = metric(logits)
    return float(value.item() if isinstance(value, torch.Tensor) else value)


def _write_clean(clean_act: torch.Tensor, slot: int, per_head: bool) -> Callable[[torch.Tensor, Any], torch.Tensor]:
    """A hook that writes the clean activation of one head (``hook_z``) or one position into the pass."""

    def write(t: torch.Tensor, hook: Any) -> torch.Tensor:
        t = t.clone()
        if per_head:
            t[:, :, slot] = clean_act[:, :, slot]
        else:
            t[:, slot] = clean_act[:, slot]
        return t

    return write


def patch(
    model: Model,
    clean: Any,
    corrupt: Any,
    hooks: str = "blocks.*.hook_resid_pre",
    metric: Callable[[torch.Tensor], Any] | None = None,
    task: str = "patching",
) -> pd.DataFrame:
    """Activation patching: the corrupted input, with one clean activation written in.

    ``hooks`` is ``blocks.*.hook_resid_pre`` (or another residual hook: one row per layer x position)
    or ``blocks.*.attn.hook_z`` (one row per head, all positions). ``metric(logits) -> float`` (logits as
    :func:`run_with_cache` gives them: final hidden states for encoders without an LM head).
    Returns a tidy table: model, task, layer, head, position, metric, value (head or position is
    empty where it does not apply); the clean and corrupted values are in ``df.attrs``."""
    if metric is None:
        raise ProbeError("patch needs metric=, a function of the logits [batch, pos, vocab] giving a number")
    c_ids, c_mask = _inputs(model, clean, None)
    x_ids, x_mask = _inputs(model, corrupt, None)
    if c_ids.shape != x_ids.shape:
        raise ProbeError(
            f"clean and corrupted inputs must have the same shape in tokens, got {list(c_ids.shape)} and "
            f"{list(x_ids.shape)}; pick corruptions that keep the token count"
        )
    per_head = hooks.endswith("attn.hook_z")
    from depthprobe.probes.hooks.cache import run_with_cache

    logits, cache = run_with_cache(model, c_ids, names=hooks, attention_mask=c_mask)
    with torch.no_grad():
        corrupt_logits = outputs(model, x_ids, x_mask)
    name_metric = getattr(metric, "__name__", "metric")
    rows = []
    for name in sorted(cache, key=lambda n: int(n.split(".")[1])):
        layer = int(name.split(".")[1])
        slots = range(model.info.n_heads) if per_head else range(c_ids.shape[1])
        for slot in slots:
            write = _write_clean(cache[name], slot, per_head)
            with torch.no_grad(), capture(model, {name: write}, store=False):
                out = outputs(model, x_ids, x_mask)
            rows.append(
                {
                    "model": model.name,
                    "task": task,
                    "layer": layer,
                    "head": slot if per_head else pd.NA,
                    "position": pd.NA if per_head else slot,
                    "metric": name_metric,
                    "value": _metric_value(metric, out),
                }
            )
    df = pd.DataFrame(rows, columns=["model", "task", "layer", "head", "position", "metric", "value"])
    df.attrs.update(clean=_metric_value(metric, logits), corrupt=_metric_value(metric, corrupt_logits))
    return df
