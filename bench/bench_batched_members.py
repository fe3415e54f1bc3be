"""Batched members against the same members one by one: training steps per second, in one run.

N depth-law members of one shape (khop: different seeds, the same mix of hop counts; or groups:
word problems of one group), each with
the law member's training step (forward, per-member loss, backward, clipping at 1, AdamW (0.9,
0.98) with decay on matrices, the warm-up/cosine rate) through the one loop,
:func:`probes.training.loop.train_steps`:

- sequential: each member in turn with its own optimiser, as ``probes/experiments/law_member.py`` trains it;
- batched: all N as one model, :func:`probes.training.batched.train_batched`.

Rounds interleave the two (the best round of each kept, so load from other processes hurts both
alike); a member-step is one update of one member, so the ratio batched / sequential is the
throughput gained. Both clocks are printed: this process's CPU time and wall time.

What it shows: the speed of the training step alone, on this machine, for the given shape. Not
shown: evaluations, probes and writing (the rest of a member's job), nor a GPU unless
``--device cuda``. ``torch.compile`` is not tried: on this machine compiling a member's forward took
164 s and its steps were no faster (``bench/bench_flops.py``).

    .venv/bin/python bench/bench_batched_members.py [--members 4] [--depth 4] [--width 64] [--length 48]
        [--batch 32] [--steps 10] [--rounds 3] [--device cpu|cuda] [--threads 1] [--family khop|groups]
        [--group s5]

``--length`` is khop's sequence length N (context N + 1) or the groups' sequence length T.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: F401  (offline environment)
import torch

from depthprobe.probes.data import groups, khop
from depthprobe.probes.models.loading import load
from depthprobe.probes.models.model import Model, NativeConfig
from depthprobe.probes.training.batched import train_batched
from depthprobe.probes.training.fast_forward import fast_logits
from depthprobe.probes.training.loop import BatchSource, Steps, train_steps
from depthprobe.probes.training.schedule import warmup_cosine
from depthprobe.probes.training.sources import GroupSource, KHopSource

LETTERS, KS = 4, (1, 2, 3, 4)
BETAS, DECAY = (0.9, 0.98), 0.01


def build(args: argparse.Namespace, seed: int) -> Model:
    if args.family == "khop":
        vocab, context = khop.vocab_size(LETTERS, max(KS)), args.length + 1
    else:
        vocab, context = groups.get_group(args.group).order, args.length
    cfg = NativeConfig(layers=args.depth, d_model=args.width, heads=4, d_vocab=vocab, n_ctx=context,
                       attn_only=False, seed=seed)  # fmt: skip
    return load(cfg, device=args.device)


def source(args: argparse.Namespace, seed: int) -> BatchSource:
    if args.family == "khop":
        return KHopSource(KS, args.batch, args.length, LETTERS, max(KS), seed)
    return GroupSource(args.group, args.batch, args.length, seed)


def rate(step: int) -> float:
    return warmup_cosine(step, 1e-3, 10**6, 100)


def sequential(args: argparse.Namespace) -> Callable[[int], None]:
    """A closure taking ``n`` steps of each of the N members in turn (each its own AdamW, as a law member)."""
    members = []
    for seed in range(args.members):
        model = build(args, seed)
        net = model.bridge.original_model
        params = [p for p in net.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": DECAY},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]  # fmt: skip
        opt = torch.optim.AdamW(groups, lr=1e-3, betas=BETAS)
        members.append((model, net, params, opt, source(args, seed)))
    done = [0]

    def run(n: int) -> None:
        plan = Steps(steps=done[0] + n, lr_at=rate, grad_clip=1.0, log_every=n, start=done[0])
        for model, net, params, opt, src in members:
            train_steps(net, lambda x, m=model: fast_logits(m, x), src, opt, params, plan, device=model.device)
        done[0] += n

    return run


def batched(args: argparse.Namespace) -> Callable[[int], None]:
    """A closure taking ``n`` steps of all N members as one batched model."""
    models = [build(args, seed) for seed in range(args.members)]
    sources = [source(args, seed) for seed in range(args.members)]

    def run(n: int) -> None:
        plan = Steps(steps=n, lr_at=rate, grad_clip=1.0, log_every=n)
        train_batched(models, sources, [rate] * len(models), plan, betas=BETAS, weight_decay=DECAY)

    return run


def timed(fn: Callable[[], None], device: str) -> tuple[float, float]:
    """(CPU seconds of this process, wall seconds) of one call, the device synchronised."""
    c0, w0 = time.process_time(), time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.process_time() - c0, time.perf_counter() - w0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=4, help="N members of one shape")
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--length", type=int, default=48, help="khop sequence length N (context N + 1)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=10, help="training steps per member per timed round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=1, help="CPU intra-op threads (law members train on 1)")
    ap.add_argument("--family", default="khop", choices=["khop", "groups"])
    ap.add_argument("--group", default="s5", help="groups: the group (z2, s3, a5, s5...)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    name = "cuda: " + torch.cuda.get_device_name() if args.device == "cuda" else f"cpu, {args.threads} thread(s)"
    what = "khop" if args.family == "khop" else f"groups ({args.group})"
    print(f"{args.members} {what} members: depth {args.depth}, d_model {args.width}, 4 heads, length {args.length}, "
          f"batch {args.batch}; {args.steps} steps a round, best of {args.rounds} rounds; {name}")  # fmt: skip
    runners = {"sequential": sequential(args), "batched": batched(args)}
    for fn in runners.values():
        fn(2)  # warm-up
    best: dict[tuple[str, int], float] = {}
    for _ in range(args.rounds):
        for key, fn in runners.items():
            times = timed(lambda fn=fn: fn(args.steps), args.device)
            for clock, t in enumerate(times):
                best[key, clock] = min(best.get((key, clock), float("inf")), t)
    member_steps = args.members * args.steps
    for clock, label in enumerate(("cpu time", "wall time")):
        seq, bat = member_steps / best["sequential", clock], member_steps / best["batched", clock]
        print(f"{label}: sequential {seq:.1f} member-steps/s ({seq / args.members:.1f} steps/s each) | batched "
              f"{bat:.1f} member-steps/s | batched/sequential {bat / seq:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
