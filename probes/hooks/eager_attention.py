"""Eager attention for delegating modules, so that attention edits take effect on every architecture.

On some families (BERT, RoBERTa, OPT, GPT-J) TransformerBridge delegates attention to the wrapped
Hugging Face module and fires ``hook_pattern`` / ``hook_attn_scores`` only afterwards, on weights
the module has already used: an edit there changes the captured tensor but not the output, and
``hook_attn_scores`` receives the post-softmax weights. For those modules :func:`install` routes
the attention product through a function that computes exactly what the module's eager attention
computes, firing the bridge's own hooks where the tensors are used: the pre-softmax scores (mask
added) through ``hook_attn_scores``, the softmax weights through ``hook_pattern`` before they
multiply the values. Edits then act like ``z = pattern @ v``. A delegating module of any other
family is left as it is; edits of those two hooks there are refused before any forward pass, naming
``hook_z`` (the per-head output, which always takes effect).
"""

from __future__ import annotations

import copy
import re
import types
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch.nn import functional as F

from depthprobe.probes.base.errors import ProbeError

INTERFACE = "depthprobe_eager"
# Hugging Face attention classes whose eager attention is softmax(q k^T * scaling + mask) @ v,
# dispatched through the attention-function interface (called with the module first).
INTERFACE_CLASSES = frozenset({"BertSelfAttention", "RobertaSelfAttention", "OPTAttention"})
# Classes whose attention product is the method ``_attn(query, key, value, attention_mask)``.
METHOD_CLASSES = frozenset({"GPTJAttention"})

_BRIDGE: weakref.WeakKeyDictionary[torch.nn.Module, Any] = weakref.WeakKeyDictionary()
_registered = False


def _delegates(attn: Any) -> bool:
    """True when the bridge hands the whole attention to the HF module (hooks fire post hoc)."""
    from transformer_lens.model_bridge.generalized_components.attention import AttentionBridge

    return (
        isinstance(attn, AttentionBridge)
        and type(attn).forward is AttentionBridge.forward
        and not getattr(attn.original_component, "accepts_pattern_fn", False)
    )


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
            kind = type(module).__name__
            if kind in INTERFACE_CLASSES:
                _register()
                if config_copy is None:  # one copy per model: only these modules use the eager function
                    config_copy = copy.copy(module.config)
                    config_copy._attn_implementation_internal = INTERFACE
                module.config = config_copy
            elif kind in METHOD_CLASSES:
                module._attn = types.MethodType(_method_attention, module)
            else:
                continue
            _BRIDGE[module] = attn
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
