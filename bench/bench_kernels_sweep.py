"""Wall time of the default kernels sweep (six variants x depths 1..64, width 256, 128 tokens),
next to a baseline measured in the same run: the same forward passes as bare matmuls (per block
the four d x d projections and the two attention products over the same batch; no model
objects, hooks, metrics, theory, plots or initialisation).

    .venv/bin/python bench/bench_kernels_sweep.py [--threads 1] [--samples 8]

--threads sets torch's CPU threads for both the baseline and the sweep (the sweep's default is 1).

Target: the sweep under 60 s on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import time

import torch

from depthprobe.probes.api.sweep import sweep
from depthprobe.tasks.kernels.sweep import DEFAULT_VARIANTS

DEPTHS = (1, 2, 4, 8, 16, 32, 64)


def bare_forward(n_blocks: int, batch: int, t: int, d: int, heads: int) -> float:
    """Seconds for n_blocks bare attention blocks over [batch, t, d]."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, t, d, generator=gen)
    w = [torch.randn(d, d, generator=gen) / d**0.5 for _ in range(4)]
    start = time.perf_counter()
    with torch.inference_mode():
        for _ in range(n_blocks):
            q, k, v = (x @ w[i] for i in range(3))
            q, k, v = (m.view(batch, t, heads, d // heads) for m in (q, k, v))  # [b, t, h, dh]
            a = torch.einsum("bqhe,bkhe->bhqk", q, k).softmax(-1)
            x = torch.einsum("bhqk,bkhe->bqhe", a, v).reshape(batch, t, d) @ w[3]
            x = x / x.norm(dim=-1, keepdim=True) * d**0.5  # keep values finite
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    n_blocks = len(DEFAULT_VARIANTS) * sum(DEPTHS)
    base = bare_forward(n_blocks, args.samples, args.seq_len, args.width, 4)
    start = time.perf_counter()
    res = sweep("kernels", DEPTHS, width=args.width, seq_len=args.seq_len, samples=args.samples, threads=args.threads)
    took = time.perf_counter() - start
    print(
        f"threads={args.threads} width={args.width} T={args.seq_len} samples={args.samples} "
        f"variants={len(DEFAULT_VARIANTS)} depths={DEPTHS} ({n_blocks} blocks)"
    )
    print(f"baseline (bare matmul forward, same blocks): {base:7.2f} s")
    print(
        f"kernels sweep (build, forward, metrics, theory, plots): {took:7.2f} s  "
        f"ratio {took / base:.2f}x  target < 60 s: {'yes' if took < 60 else 'NO'}"
    )
    print(f"rows {len(res.scores)}; vanilla final cosine at 16: {res.headline['final_cosine']['vanilla'][16]:.4f}")


if __name__ == "__main__":
    main()
