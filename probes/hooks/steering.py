"""Steering: a direction from contrast pairs, an edit that adds it, and generation with scoped edits.

- :func:`steering_vector`: the mean activation at one hook over ``positive`` inputs minus the mean
  over ``negative`` ones, each taken at the last real token (or at ``position``): [d_model].
- :func:`steer`: the edit that adds ``scale * vector`` at every position (or at ``positions``).
- :func:`generate`: TransformerLens's ``generate`` on the bridge with ``edits`` (hook name ->
  function, as :func:`~.capture.capture` takes them) in force for every step, removed after.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.hooks.capture import HookFn, capture, resolve_names
from depthprobe.probes.hooks.inputs import inputs
from depthprobe.probes.models.model import Model


def _mean_at(model: Model, data: Any, hook: str, position: int | None) -> torch.Tensor:
    ids, mask = model.encode(data) if isinstance(data, list) else inputs(model, data, None)  # lists padded
    with torch.no_grad(), capture(model, hook) as acts:
        model.bridge(ids, attention_mask=mask)
    act = acts[hook]  # [batch, pos, d_model]
    last = mask.sum(1) - 1 if position is None else torch.full((ids.shape[0],), position % ids.shape[1])
    return act[torch.arange(ids.shape[0]), last.to(act.device)].float().mean(0)


def steering_vector(
    model: Model, positive: Any, negative: Any, hook: str = "blocks.0.hook_resid_post", position: int | None = None
) -> torch.Tensor:
    """mean(act | positive) - mean(act | negative) at ``hook`` ([batch, pos, d_model] hooks: residuals,
    ``hook_attn_out``, ``hook_mlp_out``), each input read at its last real token or at ``position``."""
    names = resolve_names(model, hook)
    if len(names) != 1:
        raise ProbeError(f"steering_vector reads one hook, not {hook!r}; e.g. hook='blocks.1.hook_resid_post'")
    return _mean_at(model, positive, names[0], position) - _mean_at(model, negative, names[0], position)


def steer(vector: torch.Tensor, scale: float = 1.0, positions: Sequence[int] | None = None) -> HookFn:
    """An edit adding ``scale * vector`` ([d_model]) to a [batch, pos, d_model] activation."""
    if not isinstance(vector, torch.Tensor) or vector.dim() != 1:
        raise ProbeError("steer needs a vector [d_model], e.g. from probes.steering_vector")

    def add(t: torch.Tensor, hook: Any) -> torch.Tensor:
        if t.shape[-1] != vector.shape[0]:
            raise ProbeError(f"a steering vector of {vector.shape[0]} values for {hook.name} of width {t.shape[-1]}")
        t = t.clone()
        where = slice(None) if positions is None else list(positions)
        t[:, where] += scale * vector.to(t.device, t.dtype)
        return t

    return add


def generate(
    model: Model, prompt: Any, edits: Mapping[str, HookFn] | None = None, max_new_tokens: int = 20, **kwargs: Any
) -> Any:
    """Greedy (by default) generation from ``prompt`` (a text, or token ids [batch, pos]) with
    ``edits`` in force; extra keyword arguments go to TransformerLens's ``generate``."""
    if max_new_tokens < 1:
        raise ProbeError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if edits is not None and not isinstance(edits, Mapping):
        raise ProbeError("edits must be a dict of hook name -> function, e.g. {'blocks.1.hook_resid_post': steer(v)}")
    kwargs.setdefault("do_sample", False)
    kwargs.setdefault("verbose", False)
    if model.tokenizer is None:
        kwargs.setdefault("stop_at_eos", False)  # no end-of-text token to stop at
    if not isinstance(prompt, str):
        prompt = inputs(model, prompt, None)[0]
    scope = capture(model, dict(edits), store=False) if edits else contextlib.nullcontext()
    with torch.no_grad(), scope:
        return model.bridge.generate(prompt, max_new_tokens=max_new_tokens, **kwargs)
