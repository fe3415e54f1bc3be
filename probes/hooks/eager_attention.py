"""Eager attention for delegating modules, so that attention edits take effect on every architecture.

On some families (BERT, RoBERTa, OPT, GPT-J) TransformerBridge delegates attention to the wrapped
Hugging Face module and fires ``hook_pattern`` / ``hook_attn_scores`` only afterwards, on weights
the module has already used: an edit there changes the captured tensor but not the output, and
``hook_attn_scores`` receives the post-softmax weights. For those modules :func:`install` routes
the attention product through a function that computes exactly what the module's eager attention
computes, firing the bridge's own hooks where the tensors are used: the pre-softmax scores (mask
added) through ``hook_attn_scores``, the softmax weights through ``hook_pattern`` before they
multiply the values. Edits then act like ``z = pattern @ v``.

Which way a module computes its attention is read from the installed transformers, never assumed
from a version: the names its ``forward`` uses (:func:`route_of`) tell whether it dispatches
through the attention-function interface (``ALL_ATTENTION_FUNCTIONS`` keyed by
``config._attn_implementation``) or calls its own ``_attn`` method. GPT-J, for one, called
``_attn`` up to transformers 4.x and goes through the interface in 5.x. A module is rerouted only
when its class is known (:data:`KNOWN`) and the route its installed ``forward`` takes is one we
implement for that class; any other delegating module is left as it is, and edits of those two
hooks there are refused before any forward pass, naming ``hook_z`` (the per-head output, which
always takes effect).
"""

from __future__ import annotations

import copy
import inspect
import re
import types
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch.nn import functional as F

from depthprobe.probes.base.errors import ProbeError

INTERFACE = "depthprobe_eager"
# Hugging Face attention class -> {route: whether its eager scores are computed in float32}, for
# the routes whose eager attention is softmax(q k^T * scaling + mask) @ v as implemented below.
# "interface": dispatched through the attention-function interface (called with the module first);
# "method": the method ``_attn(query, key, value, attention_mask)`` (GPT-J before transformers 5).
KNOWN: dict[str, dict[str, bool]] = {
    "BertSelfAttention": {"interface": False},
    "RobertaSelfAttention": {"interface": False},
    "OPTAttention": {"interface": False},
    "GPTJAttention": {"interface": True, "method": True},
}

_BRIDGE: weakref.WeakKeyDictionary[torch.nn.Module, Any] = weakref.WeakKeyDictionary()
_FLOAT32_SCORES: weakref.WeakKeyDictionary[torch.nn.Module, bool] = weakref.WeakKeyDictionary()
_registered = False


def _delegates(attn: Any) -> bool:
    """True when the bridge hands the whole attention to the HF module (hooks fire post hoc)."""
    from transformer_lens.model_bridge.generalized_components.attention import AttentionBridge

    return (
        isinstance(attn, AttentionBridge)
        and type(attn).forward is AttentionBridge.forward
        and not getattr(attn.original_component, "accepts_pattern_fn", False)
    )


def route_of(cls: type) -> str | None:
    """How the installed ``cls.forward`` computes attention: "interface", "method" or None (neither).

    Read from the names its code uses, so that it follows the installed transformers: the interface
    is looked up in ``ALL_ATTENTION_FUNCTIONS`` by ``config._attn_implementation`` on each call.
    """
    forward = getattr(cls, "forward", None)
    code = getattr(inspect.unwrap(forward), "__code__", None) if callable(forward) else None
    names = set(code.co_names) if code is not None else set()
    if {"ALL_ATTENTION_FUNCTIONS", "_attn_implementation"} <= names:
        return "interface"
    if "_attn" in names:
        return "method"
    return None


def _finish(bridge: Any, scores: torch.Tensor, value: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """scores [b, h, q, k] -> hooks -> softmax (float32) -> hook_pattern -> pattern @ value."""
    scores = bridge.hook_attn_scores(scores)
    pattern = F.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    pattern = bridge.hook_pattern(pattern)
    pattern = F.dropout(pattern, p=p, training=training)
    return torch.matmul(pattern, value)


def _interface_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    # query/key/value: [batch, head, pos, d_head]
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    if _FLOAT32_SCORES.get(module, False):  # GPT-J: q k^T in float32 against overflow
        query, key = query.to(torch.float32), key.to(torch.float32)
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : key.shape[-2]]
    out = _finish(_BRIDGE[module], scores, value, dropout, module.training)
    # weights are not returned: the bridge would fire its hooks a second time, post hoc
    return out.transpose(1, 2).contiguous(), None  # [batch, pos, head, d_head]


def _method_attention(
    self: Any,  # a GPT-J attention module: scale_attn, attn_dropout
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, None]:
    """GPT-J's ``_attn``: scores in float32, divided by sqrt(d_head)."""
    scores = torch.matmul(query.to(torch.float32), key.to(torch.float32).transpose(-1, -2)) / self.scale_attn
    if attention_mask is not None:
        scores = scores + attention_mask
    return _finish(_BRIDGE[self], scores, value, self.attn_dropout.p, self.training), None


def _register() -> None:
    global _registered
    if not _registered:
        from transformers import AttentionInterface

        AttentionInterface.register(INTERFACE, _interface_attention)
        _registered = True


def install(bridge: Any) -> None:
    """Route every delegating attention of ``bridge`` through eager attention where its family is known (idempotent)."""
    if getattr(bridge, "_depthprobe_eager_attention", False):
        return
    config_copy = None
    for block in getattr(bridge, "blocks", []):
        attn = getattr(block, "attn", None)
        if attn is None or not _delegates(attn):
            continue
        for module in attn.original_component.modules():
            routes = KNOWN.get(type(module).__name__, {})
            route = route_of(type(module))
            if route is None or route not in routes:
                continue
            if route == "interface":
                _register()
                if config_copy is None:  # one copy per model: only these modules use the eager function
                    config_copy = copy.copy(module.config)
                    config_copy._attn_implementation_internal = INTERFACE
                if getattr(config_copy, "_attn_implementation", None) != INTERFACE:
                    continue  # this transformers reads the implementation elsewhere: leave it, refuse edits
                module.config = config_copy
            else:
                module._attn = types.MethodType(_method_attention, module)
            _BRIDGE[module] = attn
            _FLOAT32_SCORES[module] = routes[route]
            attn._depthprobe_eager = True
            break
    bridge._depthprobe_eager_attention = True


_LAYER = re.compile(r"^blocks\.(\d+)\.attn\.(hook_pattern|hook_attn_scores)$")


def check_editable(bridge: Any, names: Sequence[str]) -> None:
    """Refuse, before any forward pass, an edit of a pattern or score hook that would be discarded."""
    install(bridge)
    for name in names:
        m = _LAYER.match(name)
        if m is None:
            continue
        attn = bridge.blocks[int(m.group(1))].attn
        if _delegates(attn) and not getattr(attn, "_depthprobe_eager", False):
            kind = type(attn.original_component).__name__
            raise ProbeError(
                f"an edit of {name} would be ignored: {kind} computes attention inside the Hugging Face "
                f"module; edit blocks.{m.group(1)}.attn.hook_z (per-head output [batch, pos, head, d_head]) instead"
            )
