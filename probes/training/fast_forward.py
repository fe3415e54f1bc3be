"""The training fast path: a native model's logits computed from its own parameters.

Speed: the bridge wraps every submodule of TransformerLens's ``NativeModel`` in a Python
component with a dozen hook points, and its LayerNorm is re-implemented in Python; at toy
sizes that overhead dominates a training step. :func:`fast_logits` computes the same
function directly from the innermost ``nn.Module``s (the very same parameter tensors), with
fused LayerNorm and ``scaled_dot_product_attention``. Nothing is copied: after training,
the bridge (hooks and all) computes this function, which ``tests/training/test_train.py`` checks.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import Any

import torch
import torch.nn.functional as F

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.models.model import Model
from depthprobe.probes.training.loop import IGNORE, target_loss


def inner(module: Any) -> Any:
    """The innermost original module under TransformerLens bridge wrappers (duck-typed: the
    modules' attributes are TransformerLens internals)."""
    while "_original_component" in module._modules:
        module = module._modules["_original_component"]
    return module


def _attention(attn: Any, x: torch.Tensor) -> torch.Tensor:
    """NativeAttention's function without its pattern output. x: [batch, pos, d_model]."""
    b, t, _ = x.shape
    h, dh = attn.n_heads, attn.d_head
    if attn.kv_repeats != 1:
        raise ProbeError("grouped-query attention is not supported by the training fast path")
    q = inner(attn.q)(x).view(b, t, h, dh).transpose(1, 2)  # [b, h, t, dh]
    k = inner(attn.k)(x).view(b, t, h, dh).transpose(1, 2)
    v = inner(attn.v)(x).view(b, t, h, dh).transpose(1, 2)
    if attn.rotary is not None:
        q, k = attn.rotary.apply_rope(q, k)
    z = F.scaled_dot_product_attention(q, k, v, is_causal=attn.causal, scale=1.0 / attn.scale)
    return inner(attn.o)(z.transpose(1, 2).reshape(b, t, h * dh))  # [b, t, h*dh] -> [b, t, d]


def fast_logits(model: Model, tokens: torch.Tensor, skip: Collection[int] = ()) -> torch.Tensor:
    """Logits [batch, pos, vocab] of a native model, computed from its own parameters.

    Same function as ``model.bridge(tokens)`` (checked in tests) at a fraction of the
    Python overhead; used for training and the law members' evaluations, never for probing.
    ``skip``: blocks whose output is their input (the same function as the bridge under
    :func:`~probes.hooks.depth.skip_layers`, checked in tests).
    """
    native = _native(model)
    h = _embed(native, tokens)
    for i, wrapped in enumerate(native.layers):
        if i not in skip:
            h = _block(inner(wrapped), h)
    return _readout(native, h)


def skipped_logits(model: Model, tokens: torch.Tensor) -> Iterator[tuple[int | None, torch.Tensor]]:
    """``(None, intact logits)``, then ``(s, logits with block s skipped)`` for every block s: the
    values of :func:`fast_logits` with ``skip=()`` and ``skip=(s,)``, bit for bit, at about half
    the block passes. Blocks before s compute in the pass without s what they compute intact, so
    that pass starts from the intact residual entering block s and runs blocks s+1..L-1 alone
    (the skipped block's output is its input): L(L+1)/2 block passes for L blocks instead of
    L(L+1) (the residual entering every block of ``tokens`` is held meanwhile)."""
    native = _native(model)
    blocks = [inner(wrapped) for wrapped in native.layers]
    h = _embed(native, tokens)
    entering = []
    for block in blocks:
        entering.append(h)
        h = _block(block, h)
    yield None, _readout(native, h)
    for s in range(len(blocks)):
        h = entering[s]
        for block in blocks[s + 1 :]:
            h = _block(block, h)
        yield s, _readout(native, h)


def _native(model: Model) -> Any:
    native = model.bridge.original_model
    if float(getattr(native, "output_logits_soft_cap", -1.0)) > 0:
        raise ProbeError("logit soft-capping is not supported by the training fast path")
    return native


def _embed(native: Any, tokens: torch.Tensor) -> torch.Tensor:
    """The residual entering block 0: token embeddings (plus learned positions). [b, t, d]"""
    h = inner(native.tok_embed)(tokens)
    if native.pos is not None:
        h = h + inner(native.pos).weight[: tokens.shape[1]]
    return h


def _block(block: Any, h: torch.Tensor) -> torch.Tensor:
    """One pre-LN block (its innermost module) on the residual ``h``."""
    h = h + _attention(inner(block.attn), inner(block.ln1)(h))
    if not block.cfg.attn_only:
        mlp = inner(block.mlp)
        mid = mlp.act(inner(mlp.fc_in)(inner(block.ln2)(h)))
        if mlp.ln is not None:
            mid = mlp.ln(mid)
        h = h + inner(mlp.fc_out)(mid)
    return h


def _readout(native: Any, h: torch.Tensor) -> torch.Tensor:
    return inner(native.head)(inner(native.ln_out)(h))


def lm_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over every position. logits [b, t, v], tokens [b, t].

    The targets are shifted, not the logits: position t - 1 has no next token and is not scored
    (:data:`~probes.training.loop.IGNORE`), so the logits are used in place instead of copied
    (``logits[:, :-1]``) and their gradient is not a zero-filled copy either: the same mean, with
    copying and filling down from 11% to 4% of a study member's step (``bench/bench_flops.py``)."""
    targets = F.pad(tokens[:, 1:], (0, 1), value=IGNORE)  # [b, t - 1] -> [b, t]
    return target_loss(logits, targets)
