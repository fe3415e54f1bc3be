"""Pure functions on tensors; each testable on hand-built inputs without a model.

Shapes: ``A`` is attention [batch, layer, head, query, key] (rows sum to 1 over real keys);
``mask`` is [batch, pos] with 1 for real tokens.
"""

from __future__ import annotations

import torch


def diagonal(a: torch.Tensor, offset: int) -> torch.Tensor:
    """A[..., i, i + offset] for every query i, 0 where i + offset is out of range. [..., q]."""
    n = a.shape[-1]
    d = torch.diagonal(a, offset=offset, dim1=-2, dim2=-1)  # [..., n - |offset|]
    pad = torch.zeros((*d.shape[:-1], abs(offset)), dtype=d.dtype, device=d.device)
    return torch.cat([pad, d], -1) if offset < 0 else torch.cat([d, pad], -1)[..., :n]


def _per_query(
    a: torch.Tensor,
    real: torch.Tensor,
    is_first: torch.Tensor,
    is_sep: torch.Tensor | None,
    is_punct: torch.Tensor,
    entropy: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """Per query, in ``a``'s dtype: attention to the first token, punctuation and [SEP] keys, to the
    previous, next (0 at the last real token: ``real`` is [batch, pos]) and same token, and the
    given ``entropy`` of each row. [b, l, h, q] each."""
    b, n_layer, n_head, n_q, n_k = a.shape
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
        "entropy": entropy,
    }
    if is_sep is not None:
        per_query["to_sep"] = mass[..., 2]
    return per_query


def attention_stat_sums(
    a: torch.Tensor, mask: torch.Tensor, is_first: torch.Tensor, is_sep: torch.Tensor | None, is_punct: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Per-head sums over real query tokens of Clark et al.'s §3 statistics.

    a: [batch, layer, head, q, k]; mask, is_first, is_sep, is_punct: [batch, pos] (bool/0-1).
    Returns metric -> [layer, head] sums (float64); divide by ``mask.sum()`` for the means.
    Previous/next-token attention at the first/last real token counts as 0. Per-query values
    are computed in the pattern's dtype (rows of at most a few hundred terms); the sums over
    queries and batches are float64.
    """
    a = a.float() if not a.is_floating_point() or a.dtype == torch.float16 else a
    per_query = _per_query(a, mask.to(a.dtype), is_first, is_sep, is_punct, torch.special.entr(a).sum(-1))
    q = mask.to(torch.float64)[:, None, None, :]  # weights of real queries
    return {k: (v.to(torch.float64) * q).sum(dim=(0, 3)) for k, v in per_query.items()}


# ---------------------------------------------------------------------------------------------
# Clark et al.'s own averaging (General_Analysis notebook and head_distances.py)
# ---------------------------------------------------------------------------------------------

CLARK_ENTROPY_SMOOTHING = 1e-4  # rows become (1 - s) * a + s / n before the entropy
CLARK_JS_SMOOTHING = 1e-3  # head_distances.py: (1 - s) * a + s / n before the JS divergence


def smoothed_entropy(
    a: torch.Tensor, n: torch.Tensor | int, key_mask: torch.Tensor | None = None, s: float = CLARK_ENTROPY_SMOOTHING
) -> torch.Tensor:
    """Entropy in nats of rows smoothed as (1 - s) * a + s / n over the n real keys. [..., q, k] -> [..., q].

    ``n`` broadcasts against ``a`` (per sentence); ``key_mask`` (broadcasting against ``a``)
    marks the real keys, padding keys are left out."""
    a = a.to(torch.float64)
    n = torch.as_tensor(n, dtype=torch.float64, device=a.device)
    e = torch.special.entr((1 - s) * a + s / n)
    return (e if key_mask is None else e * key_mask.to(e.dtype)).sum(-1)


def clark_stat_sums(
    a: torch.Tensor, mask: torch.Tensor, is_first: torch.Tensor, is_sep: torch.Tensor | None, is_punct: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Per-head sums over sentences of per-sentence means, as Clark et al.'s General_Analysis.

    a: [batch, layer, head, q, k] (one sentence per batch row, right-padded); mask, is_first,
    is_sep, is_punct: [batch, pos]. Per sentence of n real tokens every real token is a query
    and each statistic is the sum over queries divided by n; the returned values are those
    per-sentence means summed over the batch ([layer, head], float64): divide by the number of
    sentences. Keys: to_first, to_punct, to_prev, to_next, to_self, entropy (rows smoothed over
    the n real keys, see :func:`smoothed_entropy`), entropy_first (the row of the first token
    alone); with ``is_sep``: to_sep, sep_to_sep (mean over [SEP] queries of the attention to
    [SEP] keys) and other_to_sep (the same over the other n - n_sep queries).
    """
    a = a.to(torch.float64)
    real = mask.to(torch.float64)  # [b, pos]
    n = real.sum(1)  # [b]
    q = real[:, None, None, :]
    entropy = smoothed_entropy(a, n[:, None, None, None, None], real[:, None, None, None, :])
    per_query = _per_query(a, real, is_first, is_sep, is_punct, entropy)
    out = {k: ((v * q).sum(-1) / n[:, None, None]).sum(0) for k, v in per_query.items()}
    out["entropy_first"] = per_query["entropy"][..., 0].sum(0)
    if is_sep is not None:
        sep = is_sep.to(torch.float64) * real
        n_sep = sep.sum(1)
        for name, w, denom in (("sep_to_sep", sep, n_sep), ("other_to_sep", real - sep, n - n_sep)):
            per_sentence = (per_query["to_sep"] * w[:, None, None, :]).sum(-1) / denom.clamp(min=1)[:, None, None]
            out[name] = per_sentence.sum(0)
    return out


def uniform_entropy_sum(mask: torch.Tensor, causal: bool = False) -> float:
    """Sum over sentences of the entropy of uniform attention, Clark et al.'s reference level.

    Encoders: log n per sentence of n real tokens. Causal models (query i sees i + 1 keys): the
    mean over the sentence's queries of log(i + 1)."""
    n = mask.to(torch.float64).sum(1)
    if not causal:
        return float(n.log().sum())
    return float(sum(torch.arange(1, int(k) + 1, dtype=torch.float64).log().mean() for k in n))


def js_distance_mean(a: torch.Tensor, s: float = CLARK_JS_SMOOTHING, chunk: int = 1 << 22) -> torch.Tensor:
    """Jensen-Shannon divergence (nats) between every pair of heads, mean over the queries.

    a: [head, n, n], one sentence's attention of every head (all layers flattened), real tokens
    only. Rows are smoothed as (1 - s) * a + s / n first (Clark et al.'s head_distances.py, which
    sums over tokens where this takes the mean). Returns [head, head] float64, symmetric, zero
    diagonal. Computed as H(m) - (H(p) + H(q)) / 2 with m = (p + q) / 2 in the pattern's dtype
    (float32 for model attention: about 1e-6 nats of rounding; float64 in, float64 throughout),
    over the upper triangle only, ``chunk`` elements at a time so memory stays bounded."""
    dtype = a.dtype if a.dtype in (torch.float32, torch.float64) else torch.float32
    p = (1 - s) * a.to(dtype) + s / a.shape[-1]  # > 0 everywhere: m log m needs no special case
    h_count = p.shape[0]
    h_rows = (p * p.log()).sum(-1).mean(-1).to(torch.float64)  # [head] mean of sum p log p
    h_mix = torch.zeros(h_count, h_count, dtype=torch.float64, device=p.device)
    step = max(1, min(chunk // max(1, p.numel()), -(-h_count // 8)))  # small row blocks: ~triangle
    for i in range(0, h_count, step):
        m = (p[i : i + step, None] + p[None, i:]) * 0.5  # [c, head - i, n, n]
        h_mix[i : i + step, i:] = (m * m.log()).sum(-1).mean(-1).to(torch.float64)
    h_mix = torch.triu(h_mix)
    h_mix = h_mix + h_mix.T - torch.diag(h_mix.diagonal())
    out = (h_rows[:, None] + h_rows[None, :]) / 2 - h_mix
    out.fill_diagonal_(0.0)
    return out
