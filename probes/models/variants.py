"""The configuration of the depth-study network (:mod:`probes.models.variant_net`):
:class:`SPAConfig` (depth, width, attention, skips, LayerNorm position, MLPs (ReLU or TAT), seed, dtype), its
``spa:`` spec, its parameter count and size check, and the named variants (vanilla, skip,
skip-scaled, value-skipinit, u-spa, e-spa, dong, pre-ln, post-ln) as presets of its fields."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from depthprobe.probes.base.errors import ProbeError, suggest
from depthprobe.probes.base.options import check_choices, check_seed, coerce, field_types, parse_pairs
from depthprobe.probes.models.device import check_size

SPA = ("e-spa", "u-spa")
ORTHOGONAL_BY_DEFAULT = ("value-skipinit", "e-spa", "u-spa")
KERNEL_CONTROLLED = ("value-skipinit", "e-spa", "u-spa")  # attention built to hold a kernel; TAT MLPs only
DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class SPAConfig:
    """One member of the family. ``branch_scale`` None means 1/sqrt(depth). ``positional`` "none": no
    positional encoding (causal masking carries position); "learned": a learned absolute position
    embedding W_P [n_ctx, width] added to the token embedding, learned from zeros (so at
    initialisation the network is exactly the one without it)."""

    depth: int = 4
    width: int = 256
    heads: int = 4
    n_ctx: int = 128
    d_vocab: int = 4096
    attention: Literal["softmax", "uniform", "value-skipinit", "e-spa", "u-spa"] = "softmax"
    skip: bool = False
    branch_scale: float | None = 1.0
    norm: Literal["none", "pre", "post"] = "none"
    causal: bool = True
    mlp: bool = False
    mlp_kind: Literal["relu", "tat"] = "relu"  # tat: leaky ReLU with slopes set by the kernel budget (TAT)
    d_mlp: int | None = None  # None: 4 * width
    orthogonal: bool | None = None  # None: orthogonal W_V/W_O for value-skipinit, e-spa, u-spa
    gamma_last: float = 0.005
    rho_last: float = 0.8
    seed: int = 0
    dtype: Literal["float32", "float64"] = "float32"  # parameters, buffers and activations
    positional: Literal["none", "learned"] = "none"  # learned: an absolute position embedding W_P [n_ctx, width]

    def __post_init__(self) -> None:
        for name in ("depth", "width", "heads", "n_ctx", "d_vocab"):
            if getattr(self, name) < 1:
                raise ProbeError(f"spa model: {name} must be at least 1, got {getattr(self, name)}")
        if self.width % self.heads:
            raise ProbeError(f"spa model: width={self.width} is not divisible by heads={self.heads}; pick a multiple")
        check_choices(self, "spa model:")
        if self.attention in SPA and not self.causal:
            raise ProbeError(
                f"spa model: {self.attention} builds causal (lower-triangular) attention; "
                "drop causal=false or pick another attention"
            )
        if not 0 < self.gamma_last < 50:
            raise ProbeError(f"spa model: gamma_last must be in (0, 50), got {self.gamma_last}")
        if not 0 <= self.rho_last < 1:
            raise ProbeError(f"spa model: rho_last must be in [0, 1), got {self.rho_last}")
        if self.branch_scale is not None and not self.branch_scale > 0:
            raise ProbeError(f"spa model: branch_scale must be positive, got {self.branch_scale}")
        check_seed(self.seed, "spa model: seed")
        if self.mlp_kind == "tat" and not self.mlp:
            raise ProbeError("spa model: mlp_kind=tat builds MLP blocks; add mlp=true (sweep: --mlp)")
        if self.mlp and self.mlp_kind == "relu" and self.attention in KERNEL_CONTROLLED:
            raise ProbeError(
                f"spa model: {self.attention} with ReLU MLP blocks is refused: its attention holds a target "
                "kernel, but plain ReLU MLPs push cosines toward 1; use the TAT-style leaky-ReLU MLPs He et al. "
                "pair it with (mlp_kind=tat, study --mlp tat, sweep --mlp --mlp-kind tat) or attention-only "
                "blocks (mlp=false, sweep --attn-only)"
            )

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def n_params(self) -> int:
        """Parameter count of :class:`VariantTransformer` for this config."""
        d, d_mlp = self.width, self.d_mlp or 4 * self.width
        ln = 2 * d if self.norm != "none" else 0
        block = 4 * d * d + ln + (2 * self.heads if self.attention == "value-skipinit" else 0)
        if self.mlp:
            block += 2 * d * d_mlp + ln
        pos = self.n_ctx * d if self.positional == "learned" else 0
        return 2 * self.d_vocab * d + pos + self.depth * block

    def n_bytes(self, training: bool = False) -> int:
        """float32 weights (x4 when training: gradients and Adam's moments) + per-layer masks; SPA
        variants add their float64 target kernels and float32 bias per layer."""
        per_layer = self.n_ctx**2 * (1 + (8 * 3 + 4 if self.attention in SPA else 0))
        scale = 2 if self.dtype == "float64" else 1
        return scale * (16 if training else 4) * self.n_params() + self.depth * per_layer

    def check_size(self, training: bool = False, device: Any = None) -> None:
        check_size(
            self.n_params(), self.n_bytes(training), f"spa model (depth {self.depth}, width {self.width})", device
        )

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.depth) if self.branch_scale is None else self.branch_scale

    @property
    def is_orthogonal(self) -> bool:
        return self.attention in ORTHOGONAL_BY_DEFAULT if self.orthogonal is None else self.orthogonal

    def spec(self) -> str:
        """Every field, except ``mlp_kind`` while it is relu and ``positional`` while it is none (so
        specs from before them stay the same)."""
        fields = {k: v for k, v in dataclasses.asdict(self).items() if (k, v) not in _UNSPOKEN}
        return "spa:" + ",".join(f"{k}={_fmt(v)}" for k, v in fields.items())

    @classmethod
    def parse(cls, spec: str) -> SPAConfig:
        """``spa:variant=e-spa,depth=16,width=256`` -> SPAConfig (variant presets first, then keys)."""
        types = field_types(cls)
        pairs = parse_pairs(spec, "spa", ["variant", *types], "spa:variant=e-spa,depth=8")
        kwargs: dict[str, Any] = {k: coerce(v, types[k], f"spa spec {k}") for k, v in pairs.items() if k != "variant"}
        depth = kwargs.get("depth", cls.depth)
        preset = variant_config(pairs["variant"], depth) if "variant" in pairs else {}
        return cls(**{**preset, **kwargs})


_UNSPOKEN = (("mlp_kind", "relu"), ("positional", "none"))  # defaults left out of spec()


def _fmt(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) or v is None else str(v)


# ----------------------------------------------------------------------------- named variants


VariantName = Literal["vanilla", "skip", "skip-scaled", "value-skipinit", "u-spa", "e-spa", "dong", "pre-ln", "post-ln"]


@dataclass(frozen=True)
class Variant:
    name: VariantName
    description: str
    make: Callable[[int], dict[str, Any]]  # depth -> SPAConfig fields


VARIANTS: dict[VariantName, Variant] = {  # every VariantName, in its order
    v.name: v
    for v in (
        Variant(
            "vanilla",
            "no skip, no LayerNorm, attention only (He et al.'s vanilla transformer)",
            lambda depth: {"skip": False},
        ),
        Variant("skip", "skip connections, branch scale 1", lambda depth: {"skip": True, "branch_scale": 1.0}),
        Variant(
            "skip-scaled",
            "skip connections, branch scale 1/sqrt(depth)",
            lambda depth: {"skip": True, "branch_scale": 1.0 / math.sqrt(depth)},
        ),
        Variant(
            "value-skipinit",
            "no skip; attention alpha I + beta A with alpha=1, beta=0 at init",
            lambda depth: {"attention": "value-skipinit"},
        ),
        Variant("u-spa", "no skip; U-SPA attention (uniform target kernel)", lambda depth: {"attention": "u-spa"}),
        Variant("e-spa", "no skip; E-SPA attention (exponential target kernel)", lambda depth: {"attention": "e-spa"}),
        Variant(
            "dong",
            "no skip, no MLP, non-causal softmax attention at random init: Dong et al.'s doubly "
            "exponential collapse (use dtype float64 to follow it past two layers)",
            lambda depth: {"attention": "softmax", "causal": False, "skip": False, "mlp": False},
        ),
        Variant(
            "pre-ln", "skips with pre-LayerNorm (the standard GPT-2 block)", lambda depth: {"skip": True, "norm": "pre"}
        ),
        Variant(
            "post-ln",
            "skips with post-LayerNorm (the original / BERT block)",
            lambda depth: {"skip": True, "norm": "post"},
        ),
    )
}
BASELINE = ("vanilla", "skip", "skip-scaled", "pre-ln", "post-ln")  # take the --attention option


def variant_config(name: str, depth: int, attention: str = "uniform") -> dict[str, Any]:
    """SPAConfig fields of a named variant at ``depth``; baselines use ``attention``."""
    if name not in VARIANTS:
        raise ProbeError(f"unknown variant {name!r}{suggest(name, VARIANTS)}; choose from {', '.join(VARIANTS)}")
    fields = {"depth": depth, **VARIANTS[name].make(depth)}
    if name in BASELINE:
        fields["attention"] = attention
    return fields
