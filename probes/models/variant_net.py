"""The depth-study network: a hookable transformer for studies of signal propagation (docs/kernels.md)
in every named variant (skipless, skips, pre-/post-LN, Value-SkipInit, E-SPA, U-SPA, Dong et al.'s);
its configuration and the variants are :mod:`probes.models.variants`.

TransformerBridge's native models are always pre-LN with skips, so they cannot express skipless
or normalisation-free networks. This family is built on TransformerLens's ``HookedRootModule`` and
``HookPoint``, so ``probes.capture`` and every task work on it unchanged (wrap it with
:func:`build`, or load ``spa:variant=e-spa,depth=16`` through ``probes.load``).

Inputs: token ids [batch, pos] looked up in a random embedding table W_E with N(0, 1) entries
(no positional embedding), so distinct tokens give Sigma_0 ~ I with unit diagonal; or float
embeddings [batch, pos, d_model] used as they are. With ``positional="learned"`` token ids get
W_E[token] + W_P[pos], W_P [n_ctx, d_model] learned from zeros (so at initialisation the network,
its weights and Sigma_0 are exactly those of the same seed without it);
float embeddings are still used as they are. ``attention_mask`` [batch, pos] (1 = real)
masks padded keys.

Hook points (0-indexed blocks): ``hook_embed``; ``blocks.{i}.hook_resid_pre``,
``.ln1.hook_normalized``, ``.attn.hook_q/k/v``, ``.attn.hook_attn_scores``, ``.attn.hook_pattern``
[batch, head, query, key], ``.attn.hook_z``, ``.hook_attn_out`` (branch output, after the branch
scale), ``.hook_resid_mid`` / ``.ln2.hook_normalized`` / ``.mlp.hook_pre`` / ``.mlp.hook_post`` /
``.hook_mlp_out`` (with MLP), ``.hook_resid_post``.

Block: ``x <- [LN](x + a * attn([LN] x))`` with the skip, ``x <- [LN](a * attn([LN] x))``
without; LN position "pre", "post" or "none"; a = ``branch_scale``; the same again for the MLP.

Attention variants (``hook_pattern`` is the matrix that multiplies the values, except the fixed
SPA row rescaling D, which is applied after it):

- ``softmax``: standard softmax(QK^T / sqrt(d_head)) with fan-in Gaussian W_Q, W_K (Vaswani et
  al. 2017); rank collapses without skips (Dong et al. 2021).
- ``uniform``: the same with W_Q = 0 at init, so every query averages its visible keys; the
  initialisation He et al. 2023 analyse, whose kernel obeys Sigma_l = A Sigma_{l-1} A^T.
- ``value-skipinit``: A <- alpha I + beta softmax(...), per-head trainable alpha = 1, beta = 0 at
  init, so attention starts as the identity (He et al. 2023, §3, after SkipInit of De & Smith 2020).
- ``e-spa``: D softmax(QK^T / sqrt(d_head) + B) V with W_Q = 0, B = log(A_l / rowsum) (clamped at
  -80), D = diag(rowsum), A_l = chol(Sigma_l) chol(Sigma_{l-1})^-1 for the target
  Sigma_l[i, j] = exp(-gamma_l |i - j|), 1 - exp(-2 gamma_l) = (1 - exp(-2 gamma_L))^(l/L),
  gamma_L = 0.005 (He et al. 2023, §3, Exponential Signal Preserving Attention). Causal only.
- ``u-spa``: the same with the uniform target (1 - rho_l) I + rho_l 11^T, 1 - rho_l^2 =
  (1 - rho_L^2)^(l/L) (He et al. 2023, Uniform Signal Preserving Attention); rho_L = 0.8 is this
  project's choice, matched to E-SPA's kernel at gamma_L 0.005 (docs/kernels.md), not the paper's.

Weights: W_V and W_O are orthogonal (d_model x d_model, split into heads) for value-skipinit,
e-spa and u-spa, as He et al. prescribe, so X W_V W_O preserves the kernel exactly; otherwise
fan-in Gaussian N(0, 1/fan_in). MLP: ReLU, W_in ~ N(0, 2/d_model) (He init), W_out ~ N(0, 1/d_mlp).
W_K ~ N(0, 1/d_model). Everything is drawn from a generator seeded with ``seed``.

TAT MLPs (``mlp_kind="tat"``, Zhang et al. 2022): scaled orthogonal W_in, W_out and the q-preserving
leaky ReLU sqrt(2 / (1 + a^2)) leaky_relu(u, a), with a per-block slope a from the kernel budget
(:mod:`probes.measures.tat`): E-SPA / U-SPA split each block's step along their schedule between
attention and MLP (and build each attention for the kernel the previous MLP hands on); other
variants take TAT's rule. Refused: value-skipinit, e-spa and u-spa with ReLU MLP blocks. Their
attention holds a target kernel, but a plain ReLU MLP maps cosine 0 to 1/pi and pushes every
cosine toward 1.

``dtype`` float64 builds parameters and buffers (and so every activation) in float64: needed to
follow a residual ratio below float32's ~1e-7 floor (the ``dong`` variant: non-causal softmax, no
skip, no MLP, Dong et al.'s doubly exponential collapse).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformer_lens.hook_points import HookPoint
from transformer_lens.HookedRootModule import HookedRootModule

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.measures import kernels, tat
from depthprobe.probes.models.device import resolve_device
from depthprobe.probes.models.model import Model, ModelInfo
from depthprobe.probes.models.variants import SPA, SPAConfig

# ----------------------------------------------------------------------------- modules


def _gauss(gen: torch.Generator, *shape: int, std: float) -> nn.Parameter:
    return nn.Parameter(torch.randn(*shape, generator=gen) * std)


def _orth(gen: torch.Generator, n: int, dtype: torch.dtype = torch.float32) -> nn.Parameter:
    """nn.init.orthogonal_'s construction (QR of float32 N(0, 1) draws, signs fixed by diag R), with
    the QR in ``dtype``: float64 gives the same matrix orthogonal to float64 precision."""
    with kernels.serial():
        flat = torch.empty(n, n).normal_(0, 1, generator=gen)
        q, r = torch.linalg.qr(flat.to(dtype))
        return nn.Parameter(q * torch.diagonal(r).sign())


def _orth_rect(gen: torch.Generator, rows: int, cols: int, dtype: torch.dtype, gain: float) -> nn.Parameter:
    """A [rows, cols] matrix with orthonormal rows or columns (whichever are fewer), times ``gain``."""
    with kernels.serial():
        flat = torch.empty(max(rows, cols), min(rows, cols)).normal_(0, 1, generator=gen)
        q, r = torch.linalg.qr(flat.to(dtype))
        q = q * torch.diagonal(r).sign()  # [max, min], orthonormal columns
        return nn.Parameter(gain * (q if rows >= cols else q.T))


class LayerNorm(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(width))
        self.b = nn.Parameter(torch.zeros(width))
        self.hook_normalized = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x - x.mean(-1, keepdim=True)
        x = x / (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()
        return self.hook_normalized(x) * self.w + self.b


class Attention(nn.Module):
    # set in __init__ with setattr / register_buffer
    hook_q: HookPoint
    hook_k: HookPoint
    hook_v: HookPoint
    hook_attn_scores: HookPoint
    hook_pattern: HookPoint
    hook_z: HookPoint
    causal_mask: torch.Tensor  # [n_ctx, n_ctx] bool
    spa_bias: torch.Tensor  # SPA variants only: [n_ctx, n_ctx]
    spa_scale: torch.Tensor  # SPA variants only: [n_ctx]

    def __init__(self, cfg: SPAConfig, gen: torch.Generator, spa_a: torch.Tensor | None) -> None:
        super().__init__()
        d, h = cfg.width, cfg.heads
        self.cfg = cfg
        zero_q = cfg.attention in ("uniform", "e-spa", "u-spa")
        self.W_Q = nn.Parameter(torch.zeros(d, d)) if zero_q else _gauss(gen, d, d, std=d**-0.5)
        self.W_K = _gauss(gen, d, d, std=d**-0.5)
        if cfg.is_orthogonal:
            self.W_V, self.W_O = _orth(gen, d, cfg.torch_dtype), _orth(gen, d, cfg.torch_dtype)
        else:
            self.W_V, self.W_O = _gauss(gen, d, d, std=d**-0.5), _gauss(gen, d, d, std=d**-0.5)
        if cfg.attention == "value-skipinit":
            self.alpha = nn.Parameter(torch.ones(h))
            self.beta = nn.Parameter(torch.zeros(h))
        if spa_a is not None:
            bias, rowsum = kernels.softmax_realisation(spa_a)
            self.register_buffer("spa_bias", bias.to(cfg.torch_dtype))  # [n_ctx, n_ctx]
            self.register_buffer("spa_scale", rowsum.to(cfg.torch_dtype))  # [n_ctx]
        self.register_buffer("causal_mask", torch.tril(torch.ones(cfg.n_ctx, cfg.n_ctx, dtype=torch.bool)))
        for name in ("hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z"):
            setattr(self, name, HookPoint())

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        b, t, d = x.shape
        h, dh = self.cfg.heads, self.cfg.head_dim
        q = self.hook_q((x @ self.W_Q).view(b, t, h, dh))  # [b, t, d] -> [b, t, h, dh]
        k = self.hook_k((x @ self.W_K).view(b, t, h, dh))
        v = self.hook_v((x @ self.W_V).view(b, t, h, dh))
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(dh)
        if hasattr(self, "spa_bias"):
            scores = scores + self.spa_bias[:t, :t]
        scores = self.hook_attn_scores(scores.masked_fill(~self._allowed(t, mask), float("-inf")))
        pattern = scores.softmax(-1)  # [b, h, q, k]
        if self.cfg.attention == "value-skipinit":
            eye = torch.eye(t, dtype=x.dtype, device=x.device)
            pattern = self.alpha[:, None, None] * eye + self.beta[:, None, None] * pattern
        pattern = self.hook_pattern(pattern)
        if hasattr(self, "spa_bias"):
            pattern = pattern * self.spa_scale[:t, None]  # D * softmax(...)
        z = self.hook_z(torch.einsum("bhqk,bkhe->bqhe", pattern, v))  # [b, t, h, dh]
        return z.reshape(b, t, d) @ self.W_O

    def _allowed(self, t: int, mask: torch.Tensor | None) -> torch.Tensor:
        """[b or 1, 1, q, k] keys each query may see; a padded query always sees itself (no NaN rows)."""
        if self.cfg.causal:
            allowed = self.causal_mask[:t, :t][None, None]
        else:
            allowed = torch.ones(1, 1, t, t, dtype=torch.bool, device=self.causal_mask.device)
        if mask is None:
            return allowed
        real = mask.bool()
        eye = torch.eye(t, dtype=torch.bool, device=real.device)
        return (allowed & real[:, None, None, :]) | (eye & ~real[:, None, :, None])


class MLP(nn.Module):
    """ReLU (``slope`` None): W_in ~ N(0, 2/d_model). TAT: scaled orthogonal W_in, W_out
    (max(1, sqrt(fan_out / fan_in)) times orthonormal rows or columns) and the q-preserving leaky
    ReLU sqrt(2 / (1 + a^2)) leaky_relu(u, a) (:mod:`probes.measures.tat`)."""

    def __init__(self, cfg: SPAConfig, gen: torch.Generator, slope: float | None = None) -> None:
        super().__init__()
        d_mlp = cfg.d_mlp or 4 * cfg.width
        self.slope = slope
        if slope is None:
            self.W_in = _gauss(gen, cfg.width, d_mlp, std=math.sqrt(2.0 / cfg.width))
            self.W_out = _gauss(gen, d_mlp, cfg.width, std=d_mlp**-0.5)
        else:  # TAT's scaled orthogonal weights: x W_in keeps the kernel exactly
            self.W_in = _orth_rect(gen, cfg.width, d_mlp, cfg.torch_dtype, math.sqrt(max(1.0, d_mlp / cfg.width)))
            self.W_out = _orth_rect(gen, d_mlp, cfg.width, cfg.torch_dtype, math.sqrt(max(1.0, cfg.width / d_mlp)))
        self.hook_pre, self.hook_post = HookPoint(), HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = self.hook_pre(x @ self.W_in)
        if self.slope is None:
            return self.hook_post(torch.relu(u)) @ self.W_out
        gain = math.sqrt(2.0 / (1.0 + self.slope**2))
        return self.hook_post(gain * nn.functional.leaky_relu(u, self.slope)) @ self.W_out


class Block(nn.Module):
    def __init__(
        self, cfg: SPAConfig, gen: torch.Generator, spa_a: torch.Tensor | None, slope: float | None = None
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.attn = Attention(cfg, gen, spa_a)
        self.ln1 = LayerNorm(cfg.width) if cfg.norm != "none" else None
        self.hook_resid_pre, self.hook_attn_out, self.hook_resid_post = HookPoint(), HookPoint(), HookPoint()
        if cfg.mlp:
            self.mlp = MLP(cfg, gen, slope)
            self.ln2 = LayerNorm(cfg.width) if cfg.norm != "none" else None
            self.hook_resid_mid, self.hook_mlp_out = HookPoint(), HookPoint()

    def _sub(
        self, x: torch.Tensor, f: Callable[[torch.Tensor], torch.Tensor], ln: LayerNorm | None, hook: HookPoint
    ) -> torch.Tensor:
        out = hook(self.cfg.scale * f(ln(x) if ln is not None and self.cfg.norm == "pre" else x))
        x = x + out if self.cfg.skip else out
        return ln(x) if ln is not None and self.cfg.norm == "post" else x

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = self._sub(self.hook_resid_pre(x), lambda y: self.attn(y, mask), self.ln1, self.hook_attn_out)
        if self.cfg.mlp:
            x = self._sub(self.hook_resid_mid(x), self.mlp, self.ln2, self.hook_mlp_out)
        return self.hook_resid_post(x)


class VariantTransformer(HookedRootModule):
    """The model; ``forward(input, attention_mask=None, return_type=None)`` like a bridge."""

    def __init__(self, cfg: SPAConfig) -> None:
        super().__init__()
        self.cfg = cfg
        gen = torch.Generator().manual_seed(cfg.seed)
        self.W_E = _gauss(gen, cfg.d_vocab, cfg.width, std=1.0)
        self.hook_embed = HookPoint()
        spa = spa_matrices(cfg, cfg.n_ctx) if cfg.attention in SPA else None
        slopes = mlp_slopes(cfg) or (None,) * cfg.depth
        self.blocks = nn.ModuleList(
            Block(cfg, gen, None if spa is None else spa[i], slopes[i]) for i in range(cfg.depth)
        )
        self.W_U = _gauss(gen, cfg.width, cfg.d_vocab, std=cfg.width**-0.5)
        if cfg.positional == "learned":  # zeros: at init the network is the one without it
            self.W_P = nn.Parameter(torch.zeros(cfg.n_ctx, cfg.width))
        self.to(cfg.torch_dtype)  # Gaussian draws are the float32 ones, cast: the same weights in either dtype
        self.setup()

    def forward(
        self, input: torch.Tensor, attention_mask: torch.Tensor | None = None, return_type: str | None = "logits"
    ) -> torch.Tensor | None:
        if input.dim() == 2:
            if input.shape[1] > self.cfg.n_ctx:
                raise ProbeError(
                    f"input has {input.shape[1]} positions but the model's n_ctx is {self.cfg.n_ctx}; "
                    "shorten the input or build the model with a larger n_ctx"
                )
            x = self.W_E[input]  # [b, t] -> [b, t, d]
            if self.cfg.positional == "learned":
                x = x + self.W_P[: input.shape[1]]
        elif input.dim() == 3 and input.shape[-1] == self.cfg.width:
            x = input.to(self.W_E.dtype)
        else:
            raise ProbeError(
                f"spa model input must be token ids [batch, pos] or embeddings [batch, pos, "
                f"{self.cfg.width}], got shape {tuple(input.shape)}"
            )
        x = self.hook_embed(x)
        for block in self.blocks:
            x = block(x, attention_mask)
        if return_type is None:
            return None
        if return_type in ("logits", "residual"):
            return x @ self.W_U if return_type == "logits" else x
        raise ProbeError(f"return_type must be None, 'logits' or 'residual', got {return_type!r}")

    def theory(self, t: int) -> torch.Tensor | None:
        return theory_kernels(self.cfg, t)


# ----------------------------------------------------------------------------- theory


def spa_matrices(cfg: SPAConfig, t: int) -> torch.Tensor:
    """A_1..A_L of an E-SPA / U-SPA config (with TAT MLPs: built for the kernel each MLP hands on). [L, T, T]."""
    if cfg.mlp and cfg.mlp_kind == "tat":
        return tat.spa_plan(cfg.attention, t, cfg.depth, cfg.gamma_last, cfg.rho_last)[0]
    return kernels.spa_attentions(cfg.attention, t, cfg.depth, cfg.gamma_last, cfg.rho_last)


def mlp_slopes(cfg: SPAConfig) -> tuple[float, ...] | None:
    """The TAT slope of every block's MLP, or None (no MLP, or ReLU MLPs): E-SPA / U-SPA split
    each block's kernel step with the attention; other variants take TAT's rule with eta = rho_last
    (:mod:`probes.measures.tat`)."""
    if not (cfg.mlp and cfg.mlp_kind == "tat"):
        return None
    if cfg.attention in SPA:  # E-SPA's slopes depend on T (far lags): plan at n_ctx, as the model is built
        return tat.spa_plan(cfg.attention, cfg.n_ctx, cfg.depth, cfg.gamma_last, cfg.rho_last)[1]
    return (tat.network_slope(cfg.depth, cfg.rho_last),) * cfg.depth


def mixing_matrices(cfg: SPAConfig, t: int) -> list[torch.Tensor] | None:
    """The fixed attention matrix of every block at init, or None (softmax at random init)."""
    if cfg.attention == "uniform":
        return [kernels.uniform_attention(t, cfg.causal)] * cfg.depth
    if cfg.attention == "value-skipinit":
        return [torch.eye(t, dtype=kernels.F64)] * cfg.depth
    if cfg.attention in SPA:
        return list(spa_matrices(cfg, cfg.n_ctx)[:, :t, :t])
    return None


def theory_kernels(cfg: SPAConfig, t: int, sigma0: torch.Tensor | None = None) -> torch.Tensor | None:
    """Infinite-width kernels Sigma_0..Sigma_L at init for T = t tokens (Sigma_0 = I: distinct
    tokens with N(0, 1) embeddings). LayerNorm acts as kernel normalisation (zero feature means
    at infinite width); an MLP applies the ReLU arc-cosine map, or a TAT MLP its leaky-ReLU C-map.
    None for softmax at random init, which has no fixed attention matrix. [L+1, T, T] float64."""
    mix = mixing_matrices(cfg, t)
    if mix is None:
        return None
    s = torch.eye(t, dtype=kernels.F64) if sigma0 is None else sigma0.to(kernels.F64)
    out = [s]
    slopes = mlp_slopes(cfg) or (None,) * cfg.depth
    for a, slope in zip(mix, slopes, strict=True):
        s = _theory_sub(cfg, s, functools.partial(kernels.attention_step, a=a))
        if cfg.mlp:
            s = _theory_sub(
                cfg, s, kernels.relu_step if slope is None else functools.partial(tat.lrelu_step, slope=slope)
            )
        out.append(s)
    return torch.stack(out)


def _theory_sub(cfg: SPAConfig, s: torch.Tensor, f: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    branch = cfg.scale**2 * f(kernels.normalised(s) if cfg.norm == "pre" else s)
    s = s + branch if cfg.skip else branch
    return kernels.normalised(s) if cfg.norm == "post" else s


# ----------------------------------------------------------------------------- wrapping, training


def build(cfg: SPAConfig | str, device: str | torch.device | None = None, name: str | None = None):
    """An SPA model wrapped as a :class:`probes.models.model.Model` (tokenizer None)."""
    if isinstance(cfg, str):
        name = name or cfg
        cfg = SPAConfig.parse(cfg)
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    cfg.check_size(device=dev)
    net = VariantTransformer(cfg).to(dev).eval()
    return wrap(net, name or cfg.spec(), f"random-init:seed={cfg.seed}", dev)


def wrap(net: VariantTransformer, name: str = "spa", weights: str = "", device: torch.device | None = None) -> Model:
    """``net`` as a :class:`probes.models.model.Model` (tokenizer None); ``device`` defaults to
    the device of its weights."""
    cfg = net.cfg
    info = ModelInfo(
        name=name,
        source="spa",
        resolved=cfg.spec(),
        causal=cfg.causal,
        n_layers=cfg.depth,
        n_heads=cfg.heads,
        d_model=cfg.width,
        max_len=cfg.n_ctx,
        weights=weights,
    )
    return Model(bridge=net, tokenizer=None, info=info, device=device or net.W_E.device)


def random_tokens(n: int, t: int, d_vocab: int, seed: int = 0) -> torch.Tensor:
    """n sequences of t distinct token ids (Sigma_0 -> I at infinite width). [n, t]."""
    if t > d_vocab:
        raise ProbeError(f"{t} distinct tokens per sequence need d_vocab >= {t}, got {d_vocab}")
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(d_vocab, generator=gen)[:t] for _ in range(n)])


# ----------------------------------------------------------------------------- checkpoints


def save_checkpoint(model: Model, folder: str | Path, extra: dict[str, Any] | None = None) -> Path:
    """A trained SPA model as ``model.safetensors`` + ``depthprobe.json`` (format, spec), never
    pickled; ``probes.load(folder)`` (or ``probe run -m folder``) loads it back."""
    from safetensors.torch import save_file

    from depthprobe.probes.models.checkpoints import (
        CHECKPOINT_CONFIG,
        CHECKPOINT_WEIGHTS,
        SPA_FORMAT,
        atomic_write_text,
        save_safetensors,
    )

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.bridge.state_dict().items()}
    save_safetensors(save_file, state, out / CHECKPOINT_WEIGHTS)
    meta = {"format": SPA_FORMAT, "spa": model.bridge.cfg.spec(), **(extra or {})}
    atomic_write_text(out / CHECKPOINT_CONFIG, json.dumps(meta, indent=2))
    return out


def load_checkpoint(folder: str | Path, device: torch.device, name: str | None = None) -> Model:
    """What :func:`save_checkpoint` wrote."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from depthprobe.probes.models.checkpoints import CHECKPOINT_WEIGHTS, checkpoint_meta
    from depthprobe.probes.models.hub import hash_file

    d = Path(folder)
    cfg = SPAConfig.parse(str(checkpoint_meta(d).get("spa", "")))
    weights = d / CHECKPOINT_WEIGHTS
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ProbeError(
            f"{weights} is not a readable safetensors file ({str(exc).splitlines()[0]}); restore it or retrain"
        ) from None
    cfg.check_size(device=device)
    net = VariantTransformer(cfg)
    try:
        net.load_state_dict(state)
    except RuntimeError as exc:
        raise ProbeError(f"{weights} does not match its spec {cfg.spec()}: {str(exc).splitlines()[0]}") from None
    return wrap(net.to(device).eval(), name or str(d), hash_file(weights), device)
