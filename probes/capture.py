"""The one capture primitive: a scoped context manager over TransformerLens hook names.

Hook names (TransformerLens conventions, 0-indexed layers):

- ``blocks.{i}.attn.hook_pattern``  attention weights [batch, head, query, key]
- ``blocks.{i}.attn.hook_attn_scores``  pre-softmax scores [batch, head, query, key]
- ``blocks.{i}.hook_resid_pre`` / ``hook_resid_mid`` / ``hook_resid_post``  residual [batch, pos, d_model]
- ``blocks.{i}.attn.hook_z``  per-head values mixed by attention [batch, pos, head, d_head]
- ``hook_embed`` / ``hook_pos_embed``  embeddings

Patterns with ``*`` (``blocks.*.attn.hook_pattern``) expand to every matching name.
Hooks are always removed on exit, even when the body raises.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from depthprobe.probes.errors import ProbeError, suggest
from depthprobe.probes.models import Model

HookFn = Callable[[torch.Tensor, Any], torch.Tensor | None]


def pattern_names(n_layers: int) -> list[str]:
    return [f"blocks.{i}.attn.hook_pattern" for i in range(n_layers)]


def resolve_names(model: Model, names: str | Sequence[str]) -> list[str]:
    """Expand globs and check every name exists, before any forward pass. A single name (a
    string) is one name, not a sequence of characters."""
    if isinstance(names, str):
        names = [names]
    available = list(model.bridge.hook_dict)
    out: list[str] = []
    for name in names:
        if any(ch in name for ch in "*?["):
            matches = [n for n in available if fnmatch.fnmatchcase(n, name)]
            if not matches:
                raise ProbeError(f"hook pattern {name!r} matches no hook of {model.name}{suggest(name, available)}")
        elif name in available:
            matches = [name]
        else:
            raise ProbeError(
                f"unknown hook {name!r}{suggest(name, available)}; "
                "hook names follow TransformerLens, e.g. blocks.0.attn.hook_pattern"
            )
        out.extend(m for m in matches if m not in out)
    return out


class Captured(dict):
    """hook name -> tensor from the last forward pass inside the capture."""

    def stacked(self, names: Sequence[str]) -> torch.Tensor:
        """Stack per-layer tensors on a new leading layer axis."""
        return torch.stack([self[n] for n in names])


class _StopForward(Exception):
    """Raised from a hook once everything asked for is captured; saves the rest of the pass."""


@contextmanager
def capture(
    model: Model, names: str | Sequence[str], fn: HookFn | None = None, *, store: bool = True, stop_early: bool = False
) -> Iterator[Captured]:
    """Attach hooks to ``names`` (one name or a list; globs allowed) for the duration of the block.

    ``fn(tensor, hook)`` follows the TransformerLens convention: return a tensor to replace
    the activation, or None to leave it. With ``store`` the (possibly edited) activations are
    kept, detached, in the yielded dict; with ``stop_early`` the forward pass is abandoned as
    soon as every name has fired (use :func:`forward`, which catches that).
    """
    resolved = resolve_names(model, names)
    acts = Captured()
    wanted = set(resolved)

    def make_hook(name: str) -> HookFn:
        def hook(tensor: torch.Tensor, hook: Any) -> torch.Tensor | None:
            out = fn(tensor, hook) if fn is not None else None
            if store:  # keyed by the name asked for (the hook point may carry an alias)
                acts[name] = (out if out is not None else tensor).detach()
            if stop_early and wanted.issubset(acts):
                raise _StopForward
            return out

        return hook

    with model.bridge.hooks(fwd_hooks=[(n, make_hook(n)) for n in resolved]):
        yield acts


def forward(
    model: Model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    names: str | Sequence[str],
    fn: HookFn | None = None,
    *,
    logits: bool = False,
) -> Captured:
    """One batched forward pass returning only the named activations.

    Unless ``logits`` is asked for (then stored under ``"logits"``), the pass stops as soon as
    the last named activation is produced, so nothing after it (later blocks, the MLM/LM head
    over the whole vocabulary) is computed.
    """
    mask = None if attention_mask is None else attention_mask.to(model.device)
    with torch.inference_mode(), capture(model, names, fn, stop_early=not logits) as acts:
        try:
            out = model.bridge(
                input_ids.to(model.device), attention_mask=mask, return_type="logits" if logits else None
            )
            if logits:
                acts["logits"] = out
        except _StopForward:
            pass
    return acts
