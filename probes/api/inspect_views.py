"""The model view and the neuron view (``probes.view(..., kind="model" | "neuron")``, ``probe viz
--kind``): the model's own activations, captured in one forward pass (or read from a cache),
handed to ``probes.render.inspect`` to draw.

Neuron view values: ``q`` and ``k`` are ``hook_q`` / ``hook_k`` (``hook_rot_q`` / ``hook_rot_k``
where the model rotates them), the scores ``hook_attn_scores`` and the weights ``hook_pattern``,
all of one forward pass; a score the model masked out (-inf, or the dtype's lowest value) is
shown as masked (NaN or +inf are not: the page notes them, drawn as 0). Where the scores are not
q.k / sqrt(d_head) (another scale, ALiBi) the page says so instead of showing numbers that
disagree silently.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from depthprobe.probes.base.errors import ProbeError, unknown
from depthprobe.probes.render.attention import View
from depthprobe.probes.render.inspect import ModelGrid, NeuronData

KINDS = ("layers", "model", "neuron")
MASKED_BELOW = -1e30  # a score at or below this (or -inf) is the model's mask, not a number


def grid_of(views: Sequence[View], notes: Sequence[str] = ()) -> ModelGrid:
    """The layer views of one sequence (``model_views`` / ``pattern_views``: heads labelled 'L-H',
    the same heads in every layer) as one [layer, head, query, key] grid."""
    if not views:
        raise ProbeError("no layer to show; choose layers that the model or the cache has")
    layers = [int(v.heads[0].split("-")[0]) for v in views]
    heads = [int(h.split("-")[1]) for h in views[0].heads]
    pattern = np.stack([v.pattern for v in views])  # [layer, head, query, key]
    causal = all(v.causal for v in views)
    return ModelGrid(list(views[0].tokens), pattern, layers, heads, causal, list(notes))


def qk_names(layer: int, hook_names: Any) -> tuple[str, str]:
    """The q and k hooks whose product gives ``layer``'s scores: the rotated ones where they exist."""
    rot = f"blocks.{layer}.attn.hook_rot_q"
    base = f"blocks.{layer}.attn.hook_"
    return (rot, f"{base}rot_k") if rot in hook_names else (f"{base}q", f"{base}k")


def neuron_names(layers: Sequence[int], hook_names: Any) -> list[str]:
    """Every hook the neuron view reads for ``layers``."""
    out = []
    for layer in layers:
        out += [
            *qk_names(layer, hook_names),
            f"blocks.{layer}.attn.hook_attn_scores",
            f"blocks.{layer}.attn.hook_pattern",
        ]
    return out


def _np(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().to("cpu").double().numpy()
    return np.asarray(x, dtype=np.float64)


def _heads_first(x: np.ndarray, n_heads: int) -> np.ndarray:
    """[pos, head, d_head] (grouped key/value heads repeated) -> [head, pos, d_head]."""
    if x.shape[1] != n_heads:
        x = np.repeat(x, n_heads // x.shape[1], axis=1)
    return x.transpose(1, 0, 2)


def neuron_from(
    tokens: Sequence[str],
    acts: Mapping[str, Any],
    layers: Sequence[int],
    heads: Sequence[int] | None = None,
    query: int | None = None,
) -> NeuronData:
    """The neuron view's arrays from captured activations (a forward pass's or a cache's, first
    example) of ``layers`` and ``heads`` (default all), with query position ``query`` (default the last)."""
    qs, ks, scores, patterns = [], [], [], []
    for layer in layers:
        qn, kn = qk_names(layer, acts)
        missing = [
            n
            for n in (qn, kn, f"blocks.{layer}.attn.hook_attn_scores", f"blocks.{layer}.attn.hook_pattern")
            if n not in acts
        ]
        if missing:
            raise ProbeError(
                f"the neuron view needs {', '.join(missing)}; capture them: "
                "run_with_cache(..., names=['blocks.*.attn.hook_q', 'blocks.*.attn.hook_k', "
                "'blocks.*.attn.hook_attn_scores', 'blocks.*.attn.hook_pattern'])"
            )
        s = _np(acts[f"blocks.{layer}.attn.hook_attn_scores"])[0]  # [head, query, key]
        chosen = list(range(s.shape[0])) if heads is None else list(heads)
        qs.append(_heads_first(_np(acts[qn])[0], s.shape[0])[chosen])  # [head, pos, d_head]
        ks.append(_heads_first(_np(acts[kn])[0], s.shape[0])[chosen])
        scores.append(s[chosen])
        patterns.append(_np(acts[f"blocks.{layer}.attn.hook_pattern"])[0][chosen])
    q, k, score = np.stack(qs), np.stack(ks), np.stack(scores)  # [layer, head, ...]
    n = q.shape[2]
    if n != len(tokens):
        raise ProbeError(f"{len(tokens)} tokens for activations over {n} positions")
    query = n - 1 if query is None else int(query)
    if not 0 <= query < n:
        raise ProbeError(f"query position {query} out of range: the text has {n} tokens (0..{n - 1})")
    masked = np.isneginf(score) | (score <= MASKED_BELOW)  # NaN and +inf are not a mask: the page notes them
    scale = math.sqrt(q.shape[-1])
    notes = _scale_notes(q, k, score, masked, scale, layers)
    chosen = list(range(q.shape[1])) if heads is None else list(heads)
    pattern = np.stack(patterns)
    return NeuronData(
        list(tokens), q, k, np.where(masked, 0.0, score), pattern, masked, list(layers), chosen, scale, query, notes
    )


def _scale_notes(
    q: np.ndarray, k: np.ndarray, score: np.ndarray, masked: np.ndarray, scale: float, layers: Sequence[int]
) -> list[str]:
    """A note for every layer whose scores are not q.k / sqrt(d_head) (+ the mask)."""
    qk = np.einsum("lhqd,lhkd->lhqk", q, k) / scale  # [layer, head, query, key]
    out = []
    for i, layer in enumerate(layers):
        keep = ~masked[i]
        err = np.abs(qk[i][keep] - score[i][keep]).max(initial=0.0)
        if err > 1e-3 * max(1.0, np.abs(score[i][keep]).max(initial=0.0)):
            out.append(
                f"layer {layer}: the model's scores are not q.k / sqrt(d_head) (largest gap {err:.3g}: another "
                "scale, a positional bias or an edit); the products are of its q and k, the scores its own"
            )
    return out


def neuron_data(
    model: Any,
    inp: Any,
    *,
    layers: Sequence[int] | None,
    heads: Sequence[int] | None,
    query: int | None,
) -> NeuronData:
    """The neuron view of ``model`` on one input (``probes.api.viz.Input``: ids, labels, notes): one
    forward pass capturing q, k, scores and pattern of ``layers`` (default all). ``query`` defaults
    to the last position before the model's closing special token (e.g. [SEP]), else the last."""
    import torch

    from depthprobe.probes.hooks.capture import forward

    layers = list(range(model.info.n_layers)) if layers is None else list(layers)
    ids = torch.tensor([inp.ids])  # [1, pos]
    acts = forward(model, ids, torch.ones_like(ids), neuron_names(layers, model.bridge.hook_dict))
    if query is None:
        query = len(inp.ids) - (
            2 if model.sep_id is not None and inp.ids[-1] == model.sep_id and len(inp.ids) > 1 else 1
        )
    data = neuron_from(inp.labels, acts, layers, heads, query)
    data.notes = inp.notes + data.notes
    return data


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise unknown("view kind", kind, KINDS)
    return kind


__all__ = [
    "KINDS",
    "check_kind",
    "grid_of",
    "neuron_data",
    "neuron_from",
    "neuron_names",
    "qk_names",
]
