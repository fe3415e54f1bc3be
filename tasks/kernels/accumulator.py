"""The measurement of the kernels task: the metric names, the residual-stream hooks, running sums
of per-sequence metrics and of position-aligned normalised kernels per layer, the theory rows,
and one measured pass of a ``probes.models.variant_net`` model (what the sweep measures each member with).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from depthprobe.probes.hooks.capture import capture
from depthprobe.probes.measures import kernels
from depthprobe.probes.models import variant_net

ACCUMULATED = (
    "mean_cosine",
    "resid_ratio_fro",
    "resid_ratio_l1inf",
    "effective_rank_centred",
    "effective_rank_uncentred",
)  # per sequence, averaged over sequences
CONTRACTION = "contraction_exponent"  # log(r_l) / log(r_{l-1}) of the mean resid_ratio_fro; layer 0: NaN
METRICS = (*ACCUMULATED, CONTRACTION)

COLLAPSED = 0.99  # mean cosine at which we call the representation rank-collapsed


def resid_names(n_layers: int) -> list[str]:
    """Layer 0 = input of block 0 (the embeddings), layer l = output of block l-1."""
    return ["blocks.0.hook_resid_pre"] + [f"blocks.{i}.hook_resid_post" for i in range(n_layers)]


def with_contraction(per_layer: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Add the contraction exponent of ``resid_ratio_fro`` (layer l: that of block l-1, which produced it)."""
    return {**per_layer, CONTRACTION: kernels.contraction_exponents(per_layer["resid_ratio_fro"])}


def compact(c: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Move kept tokens to the front (order preserved): C [B, T, T], keep [B, T] -> both permuted."""
    t = keep.shape[1]
    idx = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices  # [B, T]
    rows = c.gather(1, idx[:, :, None].expand(-1, -1, t))
    return rows.gather(2, idx[:, None, :].expand(-1, t, -1)), keep.gather(1, idx)


@dataclass
class Accumulator:
    """Running sums of per-sequence metrics and of position-aligned normalised kernels per layer."""

    n_layers: int  # layers 0..L, so L + 1 of them
    kernel_len: int
    sums: torch.Tensor = field(init=False)  # [metric, layer]
    counts: torch.Tensor = field(init=False)  # [metric, layer]
    ksum: torch.Tensor = field(init=False)  # [layer, K, K]
    kcount: torch.Tensor = field(init=False)  # [layer, K, K]
    sequences: int = 0
    tokens: int = 0
    longest: int = 0

    def __post_init__(self) -> None:
        k = self.kernel_len
        self.sums = torch.zeros(len(ACCUMULATED), self.n_layers, dtype=torch.float64)
        self.counts = torch.zeros(len(ACCUMULATED), self.n_layers, dtype=torch.float64)
        self.ksum = torch.zeros(self.n_layers, k, k, dtype=torch.float64)
        self.kcount = torch.zeros(self.n_layers, k, k, dtype=torch.float64)

    def add(self, layer: int, x: torch.Tensor, keep: torch.Tensor) -> None:
        """Fold one layer of one batch in. x [B, T, d], keep [B, T] bool."""
        stats, c = kernels.sequence_stats(x, keep)
        for i, name in enumerate(ACCUMULATED):
            v = stats[name].cpu()
            ok = ~torch.isnan(v)
            self.sums[i, layer] += v[ok].sum()
            self.counts[i, layer] += ok.sum()
        c, kept = compact(c, keep.to(c.device))
        k = min(self.kernel_len, c.shape[1])
        pairs = (kept[:, :, None] & kept[:, None, :])[:, :k, :k].to(torch.float64)  # [B, k, k]
        self.ksum[layer, :k, :k] += (c[:, :k, :k] * pairs).sum(0).cpu()
        self.kcount[layer, :k, :k] += pairs.sum(0).cpu()

    def count(self, keep: torch.Tensor) -> None:
        self.sequences += keep.shape[0]
        self.tokens += int(keep.sum())
        self.longest = max(self.longest, int(keep.sum(1).max()))

    def merge(self, other: Accumulator) -> None:
        """Fold in another accumulator's sums (over other sequences)."""
        for name in ("sums", "counts", "ksum", "kcount"):
            getattr(self, name).add_(getattr(other, name))
        self.sequences += other.sequences
        self.tokens += other.tokens
        self.longest = max(self.longest, other.longest)

    def means(self) -> dict[str, np.ndarray]:
        """Every metric per layer: the averages, and the contraction exponent derived from them."""
        m = (self.sums / self.counts.clamp_min(1)).numpy()
        m[self.counts.numpy() == 0] = np.nan
        return with_contraction({name: m[i] for i, name in enumerate(ACCUMULATED)})

    def kernels(self) -> np.ndarray:
        """Mean normalised kernel per layer over position pairs seen, cut to the longest sequence.
        [L+1, K, K] (NaN: pair never seen)."""
        k = min(self.kernel_len, self.longest)
        out = (self.ksum / self.kcount.clamp_min(1)).numpy()[:, :k, :k]
        out[self.kcount.numpy()[:, :k, :k] == 0] = np.nan
        return out


def theory_rows(sigmas: torch.Tensor | None) -> dict[str, np.ndarray]:
    """Per-layer theory metrics from kernels [L+1, T, T]; NaN everywhere without a theory."""
    if sigmas is None:
        return {}
    per = [kernels.kernel_stats(s) for s in sigmas]
    return with_contraction({m: np.array([p[m] for p in per]) for m in per[0]})


def measure(net: variant_net.VariantTransformer, ids: torch.Tensor) -> Accumulator:
    """One pass over ids [B, T]; metrics folded in per layer as each residual is produced."""
    cfg = net.cfg
    model = variant_net.wrap(net)
    names = resid_names(cfg.depth)
    layer_of = {n: i for i, n in enumerate(names)}
    acc = Accumulator(cfg.depth + 1, ids.shape[1])
    keep = torch.ones(ids.shape, dtype=torch.bool, device=ids.device)

    def fold(x: torch.Tensor, hook: Any) -> None:
        acc.add(layer_of[hook.name], x, keep)

    with torch.inference_mode(), capture(model, names, fold, store=False):
        net(ids, return_type=None)
    acc.count(keep)
    return acc
