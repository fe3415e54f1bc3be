"""Normalization without the work no hook reads.

TransformerLens's normalization bridge (``NormalizationBridge``, on the native-autograd path every
Hugging Face family takes) computes the centred input, its variance, ``hook_scale`` and
``hook_normalized`` on every pass, and then, when no hook edited them, returns the wrapped
module's own output, discarding them. With no hook on either hook point (no capture, no edit, no
backward hook) those tensors are read by nothing: :func:`install` gives the bridge class a
shortcut that returns the wrapped module's output directly, the very tensor the full path returns
then. With a hook on either point the bridge's own path runs, unchanged.
"""

from __future__ import annotations

from typing import Any

import torch

_installed = False


def install() -> None:
    """Give TransformerLens's normalization bridge the shortcut (once per process; idempotent)."""
    global _installed
    if _installed:
        return
    from transformer_lens.model_bridge.generalized_components.normalization import NormalizationBridge

    full = NormalizationBridge._hf_autograd_forward_with_hooks

    def forward(self: Any, x: torch.Tensor) -> torch.Tensor:
        module = self.original_component
        if module is None or isinstance(module, torch.nn.Identity) or _hooked(self):
            return full(self, x)
        result = module(x)
        return result if result.dtype == x.dtype else result.to(x.dtype)

    forward.__doc__ = full.__doc__
    NormalizationBridge._hf_autograd_forward_with_hooks = forward  # type: ignore[method-assign]
    _installed = True


def _hooked(norm: Any) -> bool:
    """Whether any hook sits on the bridge's scale or normalized hook point."""
    points = (getattr(norm, "hook_scale", None), getattr(norm, "hook_normalized", None))
    return any(p is None or p.fwd_hooks or p.bwd_hooks for p in points)
