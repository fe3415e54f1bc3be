"""Signal-propagation kernels (docs/kernels.md): pure functions on tensors, no model.

Measurements on a representation X, shape [T, d] or batched [B, T, d], with an optional token
mask [T] / [B, T] (True for tokens that count; padding and excluded specials are False):

- ``kernel``: Sigma = X X^T / d                                   [..., T, T]
- ``normalised``: C = diag(Sigma)^-1/2 Sigma diag(Sigma)^-1/2 (cosines)
- ``mean_offdiag_cosine``: mean of C[i, j] over counted pairs i != j
- ``residual_ratio``: Dong et al. 2021, ||X - 1 xbar^T|| / ||X|| in the Frobenius norm or the
  composite norm sqrt(||.||_1 ||.||_inf) (max column sum times max row sum of |entries|). Dong et
  al. take the x that minimises the norm; xbar (the mean token) minimises the Frobenius norm, so
  there the two agree, while the composite ratio with xbar is an upper bound on theirs.
- ``contraction_exponents``: log(r_l) / log(r_{l-1}) of a sequence of residual ratios, the
  exponent of the block that produced layer l (it tends to 1 when r falls by a fixed factor per
  layer, and is 3 for Dong et al.'s cubic contraction)
- ``effective_rank`` (metric ``effective_rank_centred``): exp(entropy of the normalised singular
  values of the centred X) (Roy & Vetterli 2007): the spread around the mean token; centring
  removes one direction, so its maximum is min(T - 1, d). It does not detect rank collapse (a tiny
  spread can still be isotropic).
- ``effective_rank_uncentred``: the same of X itself; it drops to 1 under rank collapse.

Infinite-width theory (He et al. 2023, "Deep Transformers without Shortcuts"): with orthogonal
(or, in expectation, fan-in Gaussian) value/output weights an attention layer with a fixed mixing
matrix A maps the kernel Sigma -> A Sigma A^T; a skip adds it: Sigma -> Sigma + a^2 A Sigma A^T.
E-SPA and U-SPA pick target kernels Sigma_l and realise A_l = chol(Sigma_l) chol(Sigma_{l-1})^-1,
so A_l Sigma_{l-1} A_l^T = Sigma_l exactly; ``softmax_realisation`` turns A_l into the bias B and
rescaling D of D * softmax(QK^T / sqrt(d_head) + B) with W_Q = 0.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.runtime import torch_threads

F64 = torch.float64


# ----------------------------------------------------------------------------- measurements


def _batched(x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """[T, d] or [B, T, d] (+ mask) -> float64 [B, T, d] with masked rows zeroed, bool [B, T]."""
    if x.dim() not in (2, 3):
        raise ValueError(f"kernel metrics take [T, d] or [B, T, d] tensors, got shape {tuple(x.shape)}")
    single = x.dim() == 2
    x = x.to(F64)
    if single:
        x = x[None]  # [1, T, d]
    if mask is None:
        m = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
    else:
        m = (mask[None] if single else mask).to(device=x.device).bool()
    return x * m[..., None], m, single


def _out(v: torch.Tensor, single: bool) -> torch.Tensor:
    return v[0] if single else v


def kernel(x: torch.Tensor) -> torch.Tensor:
    """Sigma = X X^T / d: [..., T, d] -> [..., T, T] (float64)."""
    x = x.to(F64)
    return x @ x.transpose(-1, -2) / x.shape[-1]


def normalised(sigma: torch.Tensor, eps: float = 1e-300) -> torch.Tensor:
    """C = diag^-1/2 Sigma diag^-1/2; rows/columns of zero-norm tokens become 0. [..., T, T]."""
    sigma = sigma.to(F64)
    diag = torch.diagonal(sigma, dim1=-2, dim2=-1)  # [..., T]
    inv = torch.where(diag > eps, diag.clamp_min(eps).rsqrt(), torch.zeros_like(diag))
    return sigma * inv[..., :, None] * inv[..., None, :]


def pair_mask(m: torch.Tensor) -> torch.Tensor:
    """[..., T] token mask -> [..., T, T] mask of counted pairs i != j."""
    eye = torch.eye(m.shape[-1], dtype=torch.bool, device=m.device)
    return m[..., :, None] & m[..., None, :] & ~eye


def mean_offdiag(c: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of c[i, j] over counted pairs i != j; NaN with fewer than two tokens. [..., T, T] -> [...]."""
    m = torch.ones(c.shape[:-1], dtype=torch.bool, device=c.device) if mask is None else mask.bool()
    pairs = pair_mask(m).to(F64)
    n = pairs.sum((-1, -2))
    total = (c.to(F64) * pairs).sum((-1, -2))
    return torch.where(n > 0, total / n.clamp_min(1), torch.full_like(total, math.nan))


def mean_offdiag_cosine(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean off-diagonal cosine of the tokens of X. [T, d] -> scalar, [B, T, d] -> [B]."""
    xb, m, single = _batched(x, mask)
    return _out(mean_offdiag(normalised(kernel(xb)), m), single)


def centred(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """X - 1 xbar^T over counted rows (other rows stay 0). [B, T, d] float64, [B, T] -> [B, T, d]."""
    n = m.sum(-1).clamp_min(1).to(F64)[:, None, None]  # [B, 1, 1]
    xbar = (x * m[..., None]).sum(1, keepdim=True) / n  # [B, 1, d]
    return (x - xbar) * m[..., None]


def composite_norm(x: torch.Tensor) -> torch.Tensor:
    """sqrt(||X||_1 ||X||_inf): max column abs-sum times max row abs-sum. [..., T, d] -> [...]."""
    a = x.abs()
    return (a.sum(-2).amax(-1) * a.sum(-1).amax(-1)).sqrt()


def residual_ratio(x: torch.Tensor, mask: torch.Tensor | None = None, norm: str = "fro") -> torch.Tensor:
    """Dong et al.'s ||X - 1 xbar^T|| / ||X|| ("fro" or "l1inf"). [T, d] -> scalar, [B, T, d] -> [B]."""
    xb, m, single = _batched(x, mask)
    res = centred(xb, m)
    if norm == "fro":
        num, den = res.flatten(1).norm(dim=-1), xb.flatten(1).norm(dim=-1)
    elif norm == "l1inf":
        num, den = composite_norm(res), composite_norm(xb)
    else:
        raise ValueError(f"residual norm must be 'fro' or 'l1inf', got {norm!r}")
    ratio = torch.where(den > 0, num / den.clamp_min(1e-300), torch.full_like(den, math.nan))
    return _out(ratio, single)


def serial():
    """Small LAPACK calls (128 x 128 eigendecompositions, QR, Cholesky) on one thread."""
    return torch_threads(1)


def _spectral_erank(s: torch.Tensor, floor: torch.Tensor) -> torch.Tensor:
    """exp(entropy) of singular values s [..., n] after zeroing those <= floor [..., 1]; 0 if none left."""
    s = torch.where(s > floor, s, torch.zeros_like(s))
    total = s.sum(-1, keepdim=True)
    p = s / total.clamp_min(1e-300)
    h = -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(-1)
    return torch.where(total[..., 0] > 0, h.exp(), torch.zeros_like(h))


def centred_gram(g: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """R R^T for R = X - 1 xbar^T over counted rows, from G = X X^T (masked rows of X zero) in
    O(T^2): G_ij - a_i - a_j + b, a = G m / n, b = m^T G m / n^2. [B, T, T], [B, T] -> [B, T, T]."""
    mf = m.to(g.dtype)
    n = mf.sum(-1).clamp_min(1)[:, None]  # [B, 1]
    a = (g * mf[:, None, :]).sum(-1) / n  # [B, T]
    b = (a * mf).sum(-1, keepdim=True) / n  # [B, 1]
    gc = g - a[:, :, None] - a[:, None, :] + b[:, :, None]
    return gc * mf[:, :, None] * mf[:, None, :]


def _erank_of_gram(gc: torch.Tensor, xnorm: torch.Tensor, rtol: float) -> torch.Tensor:
    """Effective rank from the centred Gram R R^T [B, T, T] (eigenvalues s^2) and ||X||_F [B]. -> [B]."""
    with serial():
        s = torch.linalg.eigvalsh(gc).clamp_min(0).sqrt()
    return _spectral_erank(s, rtol * xnorm[:, None])


def effective_rank(x: torch.Tensor, mask: torch.Tensor | None = None, rtol: float = 1e-6) -> torch.Tensor:
    """exp(entropy of p = s / sum(s)), s the singular values of the centred X.

    Singular values at or below ``rtol * ||X||_F`` count as zero (float32 activations resolve
    nothing finer, and singular values from a float64 Gram matrix resolve about 1e-8 of ||X||_F);
    a centred X that is all zero (identical tokens) has effective rank 0.
    [T, d] -> scalar, [B, T, d] -> [B].
    """
    xb, m, single = _batched(x, mask)
    g = xb @ xb.transpose(-1, -2)  # [B, T, T]
    return _out(_erank_of_gram(centred_gram(g, m), xb.flatten(1).norm(dim=-1), rtol), single)


def effective_rank_uncentred(x: torch.Tensor, mask: torch.Tensor | None = None, rtol: float = 1e-6) -> torch.Tensor:
    """exp(entropy of p = s / sum(s)), s the singular values of X itself (same floor as
    ``effective_rank``): T for T orthogonal tokens of equal norm, 1 for a rank-one X (collapse).
    [T, d] -> scalar, [B, T, d] -> [B]."""
    xb, _, single = _batched(x, mask)
    g = xb @ xb.transpose(-1, -2)  # masked rows are zero, so they add only zero eigenvalues
    return _out(_erank_of_gram(g, xb.flatten(1).norm(dim=-1), rtol), single)


def contraction_exponents(r: np.ndarray) -> np.ndarray:
    """Residual ratios r_0..r_L -> e_0..e_L with e_l = log(r_l) / log(r_{l-1}) (e_0 = NaN): the
    exponent of the block that produced layer l, i.e. log(r_{l+1}) / log(r_l) for block l.

    A ratio that falls by a constant factor q per layer (r_l = c q^l) gives exponents that tend to
    1; a cubic contraction r_l = r_{l-1}^3 (Dong et al.'s doubly exponential rate) gives 3. NaN
    where a ratio is 0, 1 or not finite (log undefined or zero). Near r = 1 (distinct tokens at
    layer 0) the exponent is large and says nothing about the rate."""
    r = np.asarray(r, dtype=np.float64)
    out = np.full(r.shape, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log(r)
        ok = np.isfinite(logs[:-1]) & np.isfinite(logs[1:]) & (logs[:-1] != 0)
        out[1:][ok] = logs[1:][ok] / logs[:-1][ok]
    return out


def sequence_stats(x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Every per-sequence metric at once, plus the normalised kernels C [B, T, T] (masked rows 0).
    One T x T x d product serves the kernel and the effective rank. [B, T, d] -> ({metric: [B]}, C)."""
    xb, m, _ = _batched(x, mask)
    g = xb @ xb.transpose(-1, -2)  # [B, T, T] = d * Sigma
    c = normalised(g)
    res = centred(xb, m)
    fro = xb.flatten(1).norm(dim=-1)
    return {
        "mean_cosine": mean_offdiag(c, m),
        "resid_ratio_fro": res.flatten(1).norm(dim=-1) / fro.clamp_min(1e-300),
        "resid_ratio_l1inf": composite_norm(res) / composite_norm(xb).clamp_min(1e-300),
        "effective_rank_centred": _erank_of_gram(centred_gram(g, m), fro, 1e-6),
        "effective_rank_uncentred": _erank_of_gram(g, fro, 1e-6),
    }, c


def kernel_stats(sigma: torch.Tensor, rtol: float = 1e-6) -> dict[str, float]:
    """The metrics a kernel alone determines (for theory curves): mean off-diagonal cosine, the
    Frobenius residual ratio sqrt(1 - 1^T S 1 / (T tr S)), the centred effective rank from the
    eigenvalues of P S P, P = I - 11^T / T, and the uncentred one from those of S (same floor as
    ``effective_rank``)."""
    s = sigma.to(F64)
    t = s.shape[-1]
    tr = float(torch.diagonal(s).sum())
    p = torch.eye(t, dtype=F64) - 1.0 / t
    with serial():
        sv = torch.linalg.eigvalsh(p @ s @ p).clamp_min(0).sqrt()
        su = torch.linalg.eigvalsh(s).clamp_min(0).sqrt()
    floor = torch.tensor([rtol * math.sqrt(max(tr, 0.0))], dtype=F64)
    return {
        "mean_cosine": float(mean_offdiag(normalised(s))),
        "resid_ratio_fro": math.sqrt(max(0.0, 1.0 - float(s.sum()) / (t * tr))) if tr > 0 else math.nan,
        "effective_rank_centred": float(_spectral_erank(sv, floor)),
        "effective_rank_uncentred": float(_spectral_erank(su, floor)),
    }


# ----------------------------------------------------------------------------- theory


def uniform_attention(t: int, causal: bool = True, dtype: torch.dtype = F64) -> torch.Tensor:
    """The attention matrix of W_Q = 0: each query averages its visible keys. [T, T]."""
    if causal:
        a = torch.tril(torch.ones(t, t, dtype=dtype))
        return a / a.sum(-1, keepdim=True)
    return torch.full((t, t), 1.0 / t, dtype=dtype)


def attention_step(sigma: torch.Tensor, a: torch.Tensor, skip: bool = False, alpha: float = 1.0) -> torch.Tensor:
    """One attention layer in the infinite-width limit: A S A^T, or S + alpha^2 A S A^T with a skip."""
    branch = a @ sigma @ a.transpose(-1, -2)
    return sigma + alpha**2 * branch if skip else branch


def relu_step(sigma: torch.Tensor) -> torch.Tensor:
    """ReLU MLP with He-initialised input (var 2/fan-in) and fan-in output weights: the arc-cosine
    kernel map (Cho & Saul 2009) sqrt(S_ii S_jj) (sin t + (pi - t) cos t) / pi, t = arccos C_ij."""
    c = normalised(sigma).clamp(-1.0, 1.0)
    d = torch.diagonal(sigma, dim1=-2, dim2=-1).clamp_min(0).sqrt()
    t = torch.arccos(c)
    return d[..., :, None] * d[..., None, :] * (torch.sin(t) + (math.pi - t) * c) / math.pi


def espa_gamma(layer: int, depth: int, gamma_last: float = 0.005) -> float:
    """E-SPA schedule 1 - exp(-2 gamma_l) = (1 - exp(-2 gamma_L))^(l/L); gamma_0 = inf."""
    if layer == 0:
        return math.inf
    rhs = (-math.expm1(-2.0 * gamma_last)) ** (layer / depth)
    return -0.5 * math.log1p(-rhs)


def current_share(kind: str, t: int, gamma_last: float = 0.005, rho_last: float = 0.8) -> float:
    """The current token's share of the last layer's variance at init, at position ``t - 1``: the
    squared last diagonal entry of chol(Sigma_L) (the variance the earlier positions cannot explain).
    E-SPA: 1 - exp(-2 gamma_L) at every position after the first; U-SPA: (1 - rho)(1 + n rho) /
    (1 + (n - 1) rho) with n = t - 1 earlier positions, which falls to 1 - rho_L as t grows."""
    if kind == "e-spa":
        return 1.0 if t == 1 else -math.expm1(-2.0 * gamma_last)
    if kind == "u-spa":
        n = t - 1
        return (1.0 - rho_last) * (1.0 + n * rho_last) / (1.0 + (n - 1) * rho_last)
    raise ValueError(f"current_share exists for e-spa and u-spa, not {kind!r}")


def espa_kernel(t: int, gamma: float) -> torch.Tensor:
    """Sigma[i, j] = exp(-gamma |i - j|) (the identity for gamma = inf). [T, T]."""
    if math.isinf(gamma):
        return torch.eye(t, dtype=F64)
    pos = torch.arange(t, dtype=F64)
    return torch.exp(-gamma * (pos[:, None] - pos[None, :]).abs())


def uspa_rho(layer: int, depth: int, rho_last: float = 0.8) -> float:
    """U-SPA schedule, E-SPA's form with rho in place of exp(-gamma):
    1 - rho_l^2 = (1 - rho_L^2)^(l/L); rho_0 = 0."""
    return math.sqrt(1.0 - (1.0 - rho_last**2) ** (layer / depth))


def uspa_kernel(t: int, rho: float) -> torch.Tensor:
    """Sigma = (1 - rho) I + rho 11^T. [T, T]."""
    return (1.0 - rho) * torch.eye(t, dtype=F64) + rho * torch.ones(t, t, dtype=F64)


def target_kernels(kind: str, t: int, depth: int, gamma_last: float = 0.005, rho_last: float = 0.8) -> torch.Tensor:
    """E-SPA ("e-spa") or U-SPA ("u-spa") targets Sigma_0..Sigma_L. [L+1, T, T] float64."""
    if kind == "e-spa":
        return torch.stack([espa_kernel(t, espa_gamma(layer_idx, depth, gamma_last)) for layer_idx in range(depth + 1)])
    if kind == "u-spa":
        return torch.stack([uspa_kernel(t, uspa_rho(layer_idx, depth, rho_last)) for layer_idx in range(depth + 1)])
    raise ValueError(f"target kernels exist for e-spa and u-spa, not {kind!r}")


@functools.lru_cache(maxsize=16)
def spa_attentions(kind: str, t: int, depth: int, gamma_last: float = 0.005, rho_last: float = 0.8) -> torch.Tensor:
    """A_1..A_L of E-SPA/U-SPA; index l-1 holds the matrix of block l-1 (0-indexed). [L, T, T].
    Cached: treat the result as read-only."""
    targets = target_kernels(kind, t, depth, gamma_last, rho_last)
    with serial():
        chol = torch.linalg.cholesky(targets)  # [L+1, T, T]
        return torch.linalg.solve_triangular(chol[:-1], chol[1:], upper=False, left=False)


def softmax_realisation(a: torch.Tensor, log_floor: float = -80.0) -> tuple[torch.Tensor, torch.Tensor]:
    """A (non-negative, lower triangular) -> (B, D) with D * softmax(B + causal mask) = A.

    B = log(A / rowsum) clamped at ``log_floor`` (exp(-80) ~ 2e-35 is still a normal float32, so
    nothing underflows to an all--inf row and no log(0) or log(negative) turns into NaN);
    D = rowsum. Returns B [T, T] and D [T] in float64.
    """
    a = a.to(F64)
    worst = float(a.min())
    if worst < -1e-8 * float(a.abs().max()):
        raise ProbeError(
            f"attention matrix has a negative entry ({worst:.3g}); it cannot be realised by "
            "a softmax (check the kernel schedule: targets must grow monotonically)"
        )
    a = a.clamp_min(0)
    rowsum = a.sum(-1)  # [T]
    p = a / rowsum[:, None]
    bias = torch.where(p > 0, p.clamp_min(1e-300).log(), torch.full_like(p, log_floor)).clamp_min(log_floor)
    return bias, rowsum
