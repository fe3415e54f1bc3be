"""Backward edits: a function of the gradient at a hook point, applied as the backward pass goes
through it (TransformerLens's ``bwd_hooks``, able to change the gradient).

``grad_edit(fn)`` is an edit for :func:`~.capture.capture` (``capture(model, {name: grad_edit(fn)})``,
or ``capture(model, names, grad_edit(fn))``): on the backward pass it calls ``fn(grad, hook)`` with
the gradient of whatever is differentiated with respect to the hook's activation (its shape); a
tensor returned replaces that gradient for everything upstream (earlier layers, the embeddings, the
weights), None leaves it. ``grad_edit(fn, edit=f)`` applies the forward edit ``f`` first. An
activation captured with ``grad=True`` is kept after the backward edit's node, so its own gradient
is the one arriving, before the edit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from depthprobe.probes.base.errors import ProbeError

GradFn = Callable[[torch.Tensor, Any], torch.Tensor | None]


HookFn = Callable[[torch.Tensor, Any], torch.Tensor | None]


def grad_edit(grad_fn: GradFn, edit: HookFn | None = None) -> HookFn:
    """The capture edit that applies ``edit`` (if any) on the forward pass and ``grad_fn(grad, hook)``
    to the gradient on the backward pass (see the module notes). Checked here, before any pass."""
    if not callable(grad_fn):
        raise ProbeError(
            f"grad_edit needs a function grad_fn(grad, hook) returning the new gradient (or None), "
            f"got {type(grad_fn).__name__}"
        )
    if edit is not None and not callable(edit):
        raise ProbeError(f"grad_edit's edit must be a function edit(tensor, hook), got {type(edit).__name__}")

    def both(tensor: torch.Tensor, hook: Any) -> torch.Tensor:
        out = edit(tensor, hook) if edit is not None else None
        return _attach(tensor if out is None else out, grad_fn, hook)

    return both


def _attach(tensor: torch.Tensor, grad_fn: GradFn, hook: Any) -> torch.Tensor:
    """A node of its own after ``tensor`` whose gradient ``grad_fn`` edits on the way back."""
    name = getattr(hook, "name", None) or "the hook"
    if not torch.is_grad_enabled():
        raise ProbeError(
            f"grad_fn edits gradients, but the pass through {name} runs under torch.no_grad() or inference_mode; "
            "run it inside torch.enable_grad()"
        )
    if not tensor.requires_grad:
        raise ProbeError(f"{name} carries no gradient in this pass (nothing before it needs one); edit a later hook")
    node = tensor.view_as(tensor)

    def edit(grad: torch.Tensor) -> torch.Tensor | None:
        out = grad_fn(grad, hook)
        if out is None:
            return None
        if not isinstance(out, torch.Tensor) or out.shape != grad.shape:
            got = f"shape {list(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
            raise ProbeError(
                f"grad_fn must return a gradient of {name}'s shape {list(grad.shape)} (or None), got {got}"
            )
        return out.to(grad.dtype)

    node.register_hook(edit)
    return node
