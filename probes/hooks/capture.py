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

import contextlib
import fnmatch
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from depthprobe.probes.base.errors import ProbeError, suggest
from depthprobe.probes.hooks import eager_attention, guard
from depthprobe.probes.models import bridge_norms, native_attention
from depthprobe.probes.models.model import Model

HookFn = Callable[[torch.Tensor, Any], torch.Tensor | None]
Reduce = Callable[[str, torch.Tensor], Any]  # (hook name, activation) -> what the capture keeps of it


def pattern_names(n_layers: int) -> list[str]:
    return [f"blocks.{i}.attn.hook_pattern" for i in range(n_layers)]


def resolve_names(model: Model, names: str | Sequence[str]) -> list[str]:
    """Expand globs and check every name exists, before any forward pass. A single name (a
    string) is one name, not a sequence of characters."""
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, Sequence) or not all(isinstance(n, str) for n in names):
        raise ProbeError(
            f"hook names must be a string or a list of strings (globs allowed), got {type(names).__name__}; "
            "e.g. names='blocks.*.attn.hook_pattern'"
        )
    hook_dict = model.bridge.hook_dict  # built afresh by each read: read once
    available = list(hook_dict)
    out: list[str] = []
    seen: set[str] = set()
    for name in names:
        if any(ch in name for ch in "*?["):
            matches = [n for n in available if fnmatch.fnmatchcase(n, name)]
            if not matches:
                raise ProbeError(f"hook pattern {name!r} matches no hook of {model.name}{suggest(name, available)}")
        elif name in hook_dict:
            matches = [name]
        else:
            raise ProbeError(
                f"unknown hook {name!r}{suggest(name, available)}; "
                "hook names follow TransformerLens, e.g. blocks.0.attn.hook_pattern"
            )
        out.extend(m for m in matches if m not in seen)
        seen.update(matches)
    return _ungated(model, hook_dict, out, explicit={n for n in names if n in hook_dict})


def _ungated(model: Model, hook_dict: Mapping[str, Any], names: list[str], explicit: set[str]) -> list[str]:
    """Drop hooks the bridge keeps off (``hook_result`` until ``set_use_attn_result(True)``...) from
    glob matches; refuse them when named."""
    gated = getattr(model.bridge, "_gated_hook_reason", None)
    if gated is None or not names:
        return names
    reasons = {n: gated(getattr(hook_dict[n], "name", None) or n) for n in names}
    for name, reason in reasons.items():
        if reason is not None and name in explicit:
            raise ProbeError(f"hook {name!r} is off on {model.name}; call model.bridge.set_{reason}(True) first")
    kept = [n for n in names if reasons[n] is None]
    if not kept:
        raise ProbeError(f"every hook matching {names[0]!r} is off on {model.name}; name it to see which setter")
    return kept


class Captured(dict):
    """hook name -> tensor from the last forward pass inside the capture."""

    def stacked(self, names: Sequence[str]) -> torch.Tensor:
        """Stack per-layer tensors on a new leading layer axis."""
        return torch.stack([self[n] for n in names])


class _StopForward(Exception):
    """Raised from a hook once everything asked for is captured; saves the rest of the pass.
    Never leaves :func:`capture`: the block it stops ends there, without an error."""


Names = str | Sequence[str] | Mapping[str, HookFn]
_NO_GRAD = (
    "capture(..., grad=True) keeps gradients, but this pass runs under torch.no_grad() or inference_mode; "
    "run it outside them (or inside torch.enable_grad())"
)


def _hook_fns(model: Model, names: Names, fn: HookFn | None) -> dict[str, HookFn | None]:
    """Resolved hook name -> its edit function (None: capture only), checked before any pass."""
    if fn is not None and not callable(fn):
        raise ProbeError(
            f"fn must be a function fn(tensor, hook), got {type(fn).__name__}; "
            "for a different edit per hook pass the dict as names= (name -> function)"
        )
    if not isinstance(names, Mapping):
        return dict.fromkeys(resolve_names(model, names), fn)
    if fn is not None:
        raise ProbeError("give either a dict of name -> function or one fn for all names, not both")
    if not names:
        raise ProbeError("capture needs at least one hook name")
    fns: dict[str, HookFn | None] = {}
    for pattern, f in names.items():
        if not callable(f):
            raise ProbeError(f"the value for {pattern!r} must be a function fn(tensor, hook), got {type(f).__name__}")
        for n in resolve_names(model, pattern):
            fns[n] = f
    return fns


def _check_edits(model: Model, edited: list[str]) -> None:
    """Attention hooks fire where their tensors are used (HF families and native models); an edit
    that would still be discarded is refused, before any pass. Normalization skips the work no
    hook reads (:mod:`~depthprobe.probes.models.bridge_norms`)."""
    eager_attention.install(model.bridge)
    native_attention.install(model.bridge)
    bridge_norms.install()
    eager_attention.check_editable(model.bridge, edited)
    native_attention.check_editable(model.bridge, edited)


@contextmanager
def capture(
    model: Model,
    names: Names,
    fn: HookFn | None = None,
    *,
    store: bool = True,
    stop_early: bool = False,
    grad: bool = False,
    clone: bool = False,
    reduce: Reduce | None = None,
) -> Iterator[Captured]:
    """Attach hooks to ``names`` for the duration of the block: one name, a list (globs allowed),
    or a dict of name -> function (a different edit per hook).

    ``fn(tensor, hook)`` follows the TransformerLens convention: return a tensor to replace
    the activation, or None to leave it. With ``store`` the (possibly edited) activations are
    kept in the yielded dict, detached; with ``grad`` they are kept as the very tensors the pass
    goes on with (the hook hands the kept tensor back, so a reshaped view such as ``hook_z`` or
    ``hook_q`` is in the graph), gradients attached (run the model outside inference mode);
    with ``clone``, as copies that later in-place edits in the same pass cannot change. With
    ``reduce(name, tensor)`` its value is kept instead, as the hook fires (not with ``grad``).
    With ``stop_early`` the forward pass is abandoned as soon as every name has fired, unless
    another capture is open on the model (its hooks must see the whole pass); the block ends
    there, quietly. Edits of pattern or score hooks that could not take effect are refused
    before any forward pass, naming ``hook_z``. Hooks act on the model itself, so a capture is
    refused while another thread has one open on the same model (see :mod:`.guard`).
    """
    fns = _hook_fns(model, names, fn)
    _check_edits(model, [n for n, f in fns.items() if f is not None])
    acts = Captured()
    wanted, fired = set(fns), set()
    stop = stop_early and guard.open_count(model.bridge) == 0

    def make_hook(name: str, edit: HookFn | None) -> HookFn:
        def hook(tensor: torch.Tensor, hook: Any) -> torch.Tensor | None:
            if grad and not torch.is_grad_enabled():
                raise ProbeError(_NO_GRAD)
            out = edit(tensor, hook) if edit is not None else None
            if store:  # keyed by the name asked for (the hook point may carry an alias)
                kept = out if out is not None else tensor
                if grad:  # a node of its own: its gradient is what flows through this hook point alone
                    kept = kept.view_as(kept)  # (q, k and v read one tensor; TransformerLens's grads are per hook)
                kept = kept if grad else kept.detach().clone() if clone else kept.detach()
                acts[name] = reduce(name, kept) if reduce is not None and not grad else kept
            fired.add(name)
            if stop and wanted.issubset(fired):
                raise _StopForward
            if grad and store:  # the pass goes on with the kept tensor, so its gradient is the real one
                return acts[name]
            return out

        return hook

    bridge = model.bridge
    with guard.hold(bridge, model.name, editing=any(f is not None for f in fns.values())):
        try:
            with bridge.hooks(fwd_hooks=[(n, make_hook(n, f)) for n, f in fns.items()]):
                yield acts
        except _StopForward:
            pass


def forward(
    model: Model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    names: Names,
    fn: HookFn | None = None,
    *,
    logits: bool = False,
    grad: bool = False,
    reduce: Reduce | None = None,
) -> Captured:
    """One batched forward pass returning only the named activations.

    Unless ``logits`` is asked for (then stored under ``"logits"``), the pass stops as soon as
    the last named activation is produced, so nothing after it (later blocks, the MLM/LM head
    over the whole vocabulary) is computed. Inside another capture the pass runs to the end.
    ``grad`` runs outside inference mode and keeps gradients. ``reduce`` as in :func:`capture`.
    """
    mask = None if attention_mask is None else attention_mask.to(model.device)
    mode = contextlib.nullcontext() if grad else torch.inference_mode()
    with mode, capture(model, names, fn, stop_early=not logits, grad=grad, reduce=reduce) as acts:
        out = model.bridge(input_ids.to(model.device), attention_mask=mask, return_type="logits" if logits else None)
        if logits:
            acts["logits"] = out
    return acts
