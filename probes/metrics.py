"""Pure functions on tensors; each testable on hand-built inputs without a model.

Shapes: ``A`` is attention [batch, layer, head, query, key] (rows sum to 1 over real keys);
``mask`` is [batch, pos] with 1 for real tokens.
"""
from __future__ import annotations

import torch


def row_entropy(a: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of each attention row (0 log 0 = 0). [..., q, k] -> [..., q]."""
    a = a.to(torch.float64)
    return -(a * torch.where(a > 0, a.log(), torch.zeros_like(a))).sum(-1)


def diagonal(a: torch.Tensor, offset: int) -> torch.Tensor:
    """A[..., i, i + offset] for every query i, 0 where i + offset is out of range. [..., q]."""
    n = a.shape[-1]
    d = torch.diagonal(a, offset=offset, dim1=-2, dim2=-1)  # [..., n - |offset|]
    pad = torch.zeros(d.shape[:-1] + (abs(offset),), dtype=d.dtype, device=d.device)
    return torch.cat([pad, d], -1) if offset < 0 else torch.cat([d, pad], -1)[..., :n]


def attention_stat_sums(a: torch.Tensor, mask: torch.Tensor, is_first: torch.Tensor,
                        is_sep: torch.Tensor | None, is_punct: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-head sums over real query tokens of Clark et al.'s §3 statistics.

    a: [batch, layer, head, q, k]; mask, is_first, is_sep, is_punct: [batch, pos] (bool/0-1).
    Returns metric -> [layer, head] sums (float64); divide by ``mask.sum()`` for the means.
    Previous/next-token attention at the first/last real token counts as 0. Per-query values
    are computed in the pattern's dtype (rows of at most a few hundred terms); the sums over
    queries and batches are float64.
    """
    b, n_layer, n_head, n_q, n_k = a.shape
    a = a.float() if not a.is_floating_point() or a.dtype == torch.float16 else a
    real = mask.to(a.dtype)
    key_sets = [is_first, is_punct] + ([is_sep] if is_sep is not None else [])
    keys = torch.stack([k.to(a.dtype) for k in key_sets], -1)  # [b, k, m]
    # attention mass on each key set: [b, l*h*q, k] @ [b, k, m] -> [b, l, h, q, m]
    mass = torch.bmm(a.reshape(b, -1, n_k), keys).view(b, n_layer, n_head, n_q, len(key_sets))
    nxt_real = torch.cat([real[:, 1:], torch.zeros_like(real[:, :1])], 1)[:, None, None, :]
    per_query = {
        "to_first": mass[..., 0],
        "to_punct": mass[..., 1],
        "to_prev": diagonal(a, -1),
        "to_next": diagonal(a, 1) * nxt_real,
        "to_self": diagonal(a, 0),
        "entropy": torch.special.entr(a).sum(-1),
    }
    if is_sep is not None:
        per_query["to_sep"] = mass[..., 2]
    q = mask.to(torch.float64)[:, None, None, :]  # weights of real queries
    return {k: (v.to(torch.float64) * q).sum(dim=(0, 3)) for k, v in per_query.items()}
