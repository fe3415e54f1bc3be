"""Interventions: head ablation and activation patching (docs/protocols.md §3.8).

Heads are labelled ``L-H``, 0-indexed (``1-2`` is layer 1, head 2). Ablation replaces a head's
output ``hook_z`` [batch, pos, head, d_head] by zero or by its mean over a data set (the default:
zero shifts activations off-distribution). Patching follows TransformerLens: run the corrupted
input with one clean activation written in, and record a metric of the logits
(:mod:`.grains` says which slots, :mod:`.patching` the table; :mod:`.patch_runs` packs the
patched runs many to a forward pass).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pandas as pd
import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.hooks.capture import HookFn, capture, forward
from depthprobe.probes.hooks.grains import Per
from depthprobe.probes.hooks.inputs import inputs
from depthprobe.probes.hooks.patch_runs import patch_batch
from depthprobe.probes.hooks.patching import plan, sweep
from depthprobe.probes.hooks.stats import Metrics, Stats, Values
from depthprobe.probes.models.model import Model

Head = tuple[int, int]
_LABEL = re.compile(r"^(\d+)-(\d+)$")


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
        elif isinstance(item, Sequence) and len(item) == 2 and all(hasattr(x, "__index__") for x in item):
            layer, head = (int(x) for x in item)
        else:
            raise ProbeError(
                f"bad head {item!r}: a head is (layer, head) or 'L-H'; give several as a list, e.g. [(0, 1), (1, 2)]"
            )
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
    ids, mask = inputs(model, data, attention_mask)
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
    layers = sorted({layer for layer, _ in parsed})
    means = mean_z(model, data, layers, attention_mask) if method == "mean" else {}
    with capture(model, head_edits(parsed, method, means), store=False):
        yield parsed


def head_edits(heads: Sequence[Head], method: str, means: dict[int, torch.Tensor]) -> dict[str, HookFn]:
    """The ``hook_z`` edits that ablate ``heads``: each head's output replaced by zero
    (``method="zero"``) or by its mean output ``means[layer][head]`` ([head, d_head] per layer)."""
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)

    def make(layer: int) -> HookFn:
        idx = by_layer[layer]

        def fn(z: torch.Tensor, hook: Any) -> torch.Tensor:  # z [batch, pos, head, d_head]
            z = z.clone()
            z[:, :, idx] = 0.0 if method == "zero" else means[layer][idx].to(z.dtype)
            return z

        return fn

    return {f"blocks.{layer}.attn.hook_z": make(layer) for layer in by_layer}


def patch(
    model: Model,
    clean: Any,
    corrupt: Any,
    hooks: str | Sequence[str] = "blocks.*.hook_resid_pre",
    metric: Metrics | None = None,
    task: str = "patching",
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
) -> pd.DataFrame:
    """Activation patching: the corrupted input, with one slot of one clean activation written in.

    ``hooks``: one hook name or a list (globs allowed): residuals, ``hook_attn_out``, per-head
    ``attn.hook_z`` / ``hook_q/k/v``, ``attn.hook_pattern`` / ``hook_attn_scores``...
    ``per``: ``"position"``, ``"head"`` or ``"head_position"`` (default: ``head`` for per-head hooks,
    ``position`` otherwise; see :mod:`.grains`); ``positions`` limits the positions patched.
    ``per="neuron"`` patches one hidden unit of a [batch, pos, d] hook at every position (e.g.
    ``blocks.0.mlp.hook_post`` [.., d_mlp], or a residual's d_model); ``neurons`` picks them as
    ``positions`` picks positions: a list of indices (or one int) into the hook's last axis, the
    same for every hook, all by default (at most :data:`~.grains.MAX_NEURONS` runs in all
    without it). The table then has a ``neuron`` column.
    ``metric(logits)`` (logits as :func:`run_with_cache` gives them: final hidden states for
    encoders without an LM head) gives a number, or one per example (then the table has the mean,
    ``se`` and ``n``, or with ``per_example`` a row per example); a dict of them measures each
    (see :mod:`.stats`; ``ci``, ``n_boot``, ``permutation`` and ``seed`` add bootstrap intervals and
    permutation p-values, :class:`~.stats.Stats`). ``batch_size`` runs the examples in batches,
    ``progress`` shows a bar.
    Returns the tidy table of :mod:`.patching` (one row per hook x slot x metric, the metric of the
    patched run); the clean and corrupted values are in ``df.attrs``."""
    stats = Stats(ci, n_boot, permutation, seed).check(per_example)
    p = plan(model, clean, corrupt, hooks, metric, per, positions, neurons)

    def run_batch(part: slice, got: Values, order: dict[Any, None]) -> None:
        with torch.no_grad():
            patch_batch(model, p, part, got, order)

    return sweep(
        model,
        p,
        task,
        metric,
        run_batch,
        per_example=per_example,
        batch_size=batch_size,
        progress=progress,
        label="patching batches",
        stats=stats,
    )
