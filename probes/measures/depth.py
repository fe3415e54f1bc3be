"""Depth usage (docs/protocols.md §3.10; Csordás, Manning and Potts 2025): per-token values of what a block
adds to the residual stream, and of how the rest of the model changes when a block is skipped.

Every function returns the *sum* over the real tokens (``mask`` [batch, pos], 1 = real) of a
per-token value, a float64 scalar tensor on the inputs' device (no synchronisation per value), so
that a run adds batches and divides by the token count once.
A norm of zero in a denominator gives 0 (0 / 0: a zero vector changed by nothing), and the
cosine with a zero vector is 0.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor
Resid = Tensor  # [batch, pos, d_model]
Logits = Tensor  # [batch, pos, vocab]


def _ratio(num: Tensor, den: Tensor) -> Tensor:
    """num / den per token, 0 where den is 0 (then num is 0 in every use here, or meaningless)."""
    return torch.where(den > 0, num / den.clamp_min(torch.finfo(den.dtype).tiny), torch.zeros_like(num))


def _cos(a: Tensor, b: Tensor) -> Tensor:
    """Per-token cosine of [..., d] vectors, 0 where either is zero."""
    return _ratio((a * b).sum(-1), a.norm(dim=-1) * b.norm(dim=-1))


def _masked_sum(values: Tensor, mask: Tensor) -> Tensor:
    return (values * mask.to(values.dtype)).sum()


def contribution_sums(added: Resid, base: Resid, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Sums over tokens of ||c|| / ||h|| and cos(c, h): ``added`` = c (a block's or sublayer's
    output added to the stream), ``base`` = h (the residual it is added to)."""
    c, h = added.double(), base.double()
    rel = _ratio(c.norm(dim=-1), h.norm(dim=-1))  # [batch, pos]
    return _masked_sum(rel, mask), _masked_sum(_cos(c, h), mask)


def relative_change_sum(changed: Resid, original: Resid, mask: Tensor) -> Tensor:
    """Sum over tokens of ||c' - c|| / ||c||: how much a later block's contribution moved."""
    c2, c = changed.double(), original.double()
    return _masked_sum(_ratio((c2 - c).norm(dim=-1), c.norm(dim=-1)), mask)


def cosine_distance_sum(changed: Resid, original: Resid, mask: Tensor) -> Tensor:
    """Sum over tokens of 1 - cos(h', h) (the final residual of an encoder without an unembedding)."""
    return _masked_sum(1.0 - _cos(changed.double(), original.double()), mask)


def kl_top1_sums(p_logits: Logits, q_logits: Logits, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Sums over tokens of KL(p || q) (nats) and of [argmax p == argmax q]; p, q from logits."""
    logp = torch.log_softmax(p_logits.float(), -1)
    logq = torch.log_softmax(q_logits.float(), -1)
    kl = (logp.exp() * (logp - logq)).sum(-1).double()  # [batch, pos]
    agree = (p_logits.argmax(-1) == q_logits.argmax(-1)).double()
    return _masked_sum(kl, mask), _masked_sum(agree, mask)


def linear_map_r2(x_fit: Tensor, y_fit: Tensor, x_test: Tensor, y_test: Tensor) -> float:
    """R^2 on held-out tokens of the least-squares affine map x -> y fitted on other tokens
    (x [n, d_x], y [n, d_y]): 1 - sum of squared errors / sum of squares around the test mean of y,
    summed over the output dimensions (1: y is an affine function of x; 0: no better than the mean)."""
    xf, yf = x_fit.double(), y_fit.double()
    mx, my = xf.mean(0), yf.mean(0)
    w = torch.linalg.lstsq(xf - mx, yf - my, driver="gelsd").solution  # [d_x, d_y]
    pred = (x_test.double() - mx) @ w + my
    yt = y_test.double()
    sst = ((yt - yt.mean(0)) ** 2).sum()
    return float(1.0 - ((yt - pred) ** 2).sum() / sst) if sst > 0 else float("nan")
