"""Kernel recursion of uniform attention, built step by step from ``attention_step``."""

import torch

from depthprobe.probes.measures import kernels


def uniform_recursion(t: int, depth: int, causal: bool = True, skip: bool = False, alpha: float = 1.0) -> torch.Tensor:
    """Kernels Sigma_0 = I, ..., Sigma_depth of uniform attention. [depth+1, T, T] float64."""
    a = kernels.uniform_attention(t, causal)
    s = torch.eye(t, dtype=torch.float64)
    out = [s]
    for _ in range(depth):
        s = kernels.attention_step(s, a, skip, alpha)
        out.append(s)
    return torch.stack(out)
