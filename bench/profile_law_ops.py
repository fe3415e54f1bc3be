"""Where one training update of a law member spends its CPU time, by kind of op (torch's
profiler, self CPU time, one thread as a member trains), and how fast its matrix products run
against the same products timed alone: what is left to win without changing the arithmetic.

    .venv/bin/python bench/profile_law_ops.py --family khop --depths 3 --ks 2
    .venv/bin/python bench/profile_law_ops.py --family crasp --depths 2 --ks 4
"""

from __future__ import annotations

import os
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: F401  (offline environment)
import torch

KINDS = {  # op name prefix -> kind
    "aten::mm": "matrix products",
    "aten::addmm": "matrix products",
    "aten::bmm": "matrix products",
    "aten::_scaled_dot_product": "attention (scaled_dot_product_attention)",
    "aten::gelu": "GELU",
    "aten::native_layer_norm": "layer norm",
    "aten::_fused_adamw": "AdamW",
    "aten::_log_softmax": "loss (log-softmax, NLL)",
    "aten::nll_loss": "loss (log-softmax, NLL)",
    "aten::linalg_vector_norm": "gradient clipping",
}


def kind(name: str) -> str:
    return next((k for prefix, k in KINDS.items() if name.startswith(prefix)), "everything else")


def gemm_alone(shapes: list[tuple[int, int, int]], repeats: int = 50) -> float:
    """GFLOP/s of the update's matrix products (m, k, n) timed alone, one after another."""
    mats = [(torch.randn(m, k), torch.randn(k, n)) for m, k, n in shapes]
    for a, b in mats:
        a @ b
    t0 = time.perf_counter()
    for _ in range(repeats):
        for a, b in mats:
            a @ b
    seconds = (time.perf_counter() - t0) / repeats
    return sum(2 * m * k * n for m, k, n in shapes) / seconds / 1e9


def main() -> None:
    from profile_law_step import member_args, member_step
    from torch.profiler import ProfilerActivity, profile

    args = member_args(__doc__, steps=10)

    step, shape = member_step(args.family, int(args.depths), args.ks)
    for s in range(5):
        step(s)
    with profile(activities=[ProfilerActivity.CPU], with_flops=True, record_shapes=True) as prof:
        for s in range(args.steps):
            step(s)
    by_kind: dict[str, float] = defaultdict(float)
    gemm_us, gemm_flops, shapes = 0.0, 0.0, []
    for evt in prof.key_averages(group_by_input_shape=True):
        by_kind[kind(evt.key)] += evt.self_cpu_time_total
        if kind(evt.key) == "matrix products" and evt.flops:
            gemm_us += evt.self_cpu_time_total
            gemm_flops += evt.flops
            dims = [d for d in evt.input_shapes if len(d) == 2]
            if len(dims) >= 2:
                (m, k), (_, n) = dims[-2], dims[-1]
                shapes += [(m, k, n)] * (evt.count // args.steps)
    total = sum(by_kind.values())
    print(f"{args.family} L{args.depths}, batch {shape}; load average {os.getloadavg()}")
    print(f"{'kind of op':45s} {'ms/update':>9s} {'share':>6s}")
    for name, us in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        print(f"{name:45s} {us / 1e3 / args.steps:9.1f} {100 * us / total:5.0f}%")
    in_step = gemm_flops / (gemm_us / 1e6) / 1e9
    alone = gemm_alone(shapes)
    print(f"matrix products: {in_step:.0f} GFLOP/s in the update; the same products alone: {alone:.0f} GFLOP/s")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
