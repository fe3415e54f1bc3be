"""Training speed of native models, measured side by side in one run.

1. Steps per second (AdamW, next-token loss, default shape: 2 layers, d_model 64, 4 heads,
   vocab 64, 64 tokens x 32 sequences) of
   - the native TransformerBridge model trained the way `probe train` does it (`fast_logits`:
     the bridge's own parameters, no hook wrappers),
   - the same model trained through `bridge(tokens)` (every hook point and Python wrapper),
   - a minimal plain-PyTorch attention-only transformer of the same shape.
   Prints each ratio to plain PyTorch (target: within 1.3x). Rounds are interleaved and the
   best round of each is kept, so load from other processes hurts all of them alike.
2. Wall time to induction emergence for the default 2-layer config: train with the defaults
   of `probe train` and evaluate the best induction score on held-out repeat lengths every
   100 steps until it reaches 0.5 (target: under 5 minutes on 2 CPU cores).

    .venv/bin/python bench/bench_train.py [--rounds 5] [--steps 40] [--skip-emergence] [--threads N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: F401  (offline environment)
import torch
import torch.nn as nn
import torch.nn.functional as F

from depthprobe.probes.data import synthetic
from depthprobe.probes.models.loading import load
from depthprobe.probes.training.config import build_configs
from depthprobe.probes.training.fast_forward import fast_logits, lm_loss
from depthprobe.probes.training.train import parameters, train


class PlainBlock(nn.Module):
    """Pre-LN attention-only block: LayerNorm, q/k/v/o projections, causal softmax attention."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln, self.heads = nn.LayerNorm(d), heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, t, d = h.shape
        x = self.ln(h)
        q, k, v = (p(x).view(b, t, self.heads, d // self.heads).transpose(1, 2) for p in (self.q, self.k, self.v))
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [b, heads, t, d_head]
        return h + self.o(z.transpose(1, 2).reshape(b, t, d))


class Plain(nn.Module):
    def __init__(self, layers: int, d: int, heads: int, vocab: int, n_ctx: int) -> None:
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, d), nn.Embedding(n_ctx, d)
        self.blocks = nn.ModuleList(PlainBlock(d, heads) for _ in range(layers))
        self.ln, self.unembed = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos.weight[: tokens.shape[1]]
        for block in self.blocks:
            h = block(h)
        return self.unembed(self.ln(h))


def stepper(forward, params, data, cfg):
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    state = {"step": 0}

    def run(n: int) -> None:
        for _ in range(n):
            tokens = synthetic.batch_at(data, cfg.seed, state["step"], cfg.batch_size)
            loss = lm_loss(forward(tokens), tokens)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            state["step"] += 1

    return run


def steps_per_second(rounds: int, steps: int) -> dict[str, float]:
    native, data, cfg = build_configs()
    fast = load(native, device="cpu")
    hooked = load(native, device="cpu")
    plain = Plain(native.layers, native.d_model, native.heads, native.d_vocab, native.n_ctx)
    n_native = sum(p.numel() for p in parameters(fast))
    n_plain = sum(p.numel() for p in plain.parameters())
    print(f"parameters: native {n_native}, plain {n_plain}")
    runners = {
        "plain PyTorch": stepper(plain, list(plain.parameters()), data, cfg),
        "bridge, fast path (probe train)": stepper(lambda x: fast_logits(fast, x), parameters(fast), data, cfg),
        "bridge(tokens), hooks": stepper(
            lambda x: hooked.bridge(x, return_type="logits"), parameters(hooked), data, cfg
        ),
    }
    for run in runners.values():
        run(5)  # warm-up
    best = {name: float("inf") for name in runners}
    for _ in range(rounds):
        for name, run in runners.items():
            t0 = time.perf_counter()
            run(steps)
            best[name] = min(best[name], time.perf_counter() - t0)
    return {name: steps / t for name, t in best.items()}


class Emerged(Exception):
    pass


def emergence(every: int, threshold: float) -> None:
    from depthprobe.tasks.induction.evaluation import evaluate

    native, data, cfg = build_configs()
    seen: list[tuple[int, float]] = []
    t0 = time.perf_counter()
    spent = [0.0]

    def check(step: int, model) -> None:
        t = time.perf_counter()
        score = evaluate(model, data.eval_lengths, n_seqs=32, seed=cfg.seed + 1).best[0]
        spent[0] += time.perf_counter() - t
        seen.append((step, score))
        print(f"  step {step:5d}  best induction {score:.3f}  ({time.perf_counter() - t0:.0f} s)", flush=True)
        if score >= threshold:
            raise Emerged

    try:
        train(native, data, cfg, every=every, callback=check)
        print(f"induction did not reach {threshold} within {cfg.steps} steps")
    except Emerged:
        wall = time.perf_counter() - t0
        print(
            f"induction emergence (best score >= {threshold} on held-out lengths {list(data.eval_lengths)}): "
            f"step {seen[-1][0]}, wall time {wall:.0f} s ({wall - spent[0]:.0f} s training, "
            f"{spent[0]:.0f} s evaluating); target < 300 s"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40, help="steps per timed round")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (probe train uses 1)")
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--skip-emergence", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    rates = steps_per_second(args.rounds, args.steps)
    base = rates["plain PyTorch"]
    for name, rate in rates.items():
        print(f"{name:34s} {rate:7.1f} steps/s   time ratio to plain {base / rate:5.2f}x")
    print(f"probe train vs plain PyTorch: {base / rates['bridge, fast path (probe train)']:.2f}x (target <= 1.3x)")
    if not args.skip_emergence:
        emergence(args.every, 0.5)


if __name__ == "__main__":
    main()
