"""Training speed against the machine: a member step's FLOP/s beside matmuls of its own shapes.

For two study-member shapes, one thread, in one run with interleaved rounds (the best round of each
kept, so load from other processes hurts all alike):

- ``lm``: a petty/levine ``cpu``-preset member: depth 4, d_model 64, 4 heads, d_ff 256, vocab 1024
  (the built-in corpus's), context 128, batch 32, trained on corpus batches;
- ``khop``: a k-hop law member: depth 4, d_model 64, 4 heads, d_mlp 256, vocab 9, context 49, batch 32.

Each member takes full training steps (forward, backward, gradient clipping at 1, AdamW with decay
groups, the warm-up/cosine learning rate) through the one loop, :func:`probes.training.loop.train_steps`,
with the study member's optimiser (:func:`probes.training.lm.optimizer`; the law members of
``probes/experiments/law_member.py`` build it with the same builder, other betas, the same work) and
logits (:func:`probes.training.lm.native`). Printed per member:

- step GFLOP/s: counted FLOPs / step time. Counted (per token, forward): every matmul of a linear
  layer, ``2 * d_in * d_out`` (q, k, v, o, fc_in, fc_out per layer, the unembedding), and attention's
  scores and values, ``2 * 2 * t * d`` per layer (the full t x t square, PaLM's convention, although
  a causal kernel may skip the masked half); training = 3 x forward (backward = 2 x forward).
  Not counted: embeddings, layer norms, GELU, softmax, cross-entropy, AdamW (elementwise work).
- member-shape matmul GFLOP/s: the very GEMMs of the step, timed alone on random tensors: for
  each linear layer ``[b*t, d_in] x [d_in, d_out]`` and its two backward GEMMs
  (``[b*t, d_out] x [d_out, d_in]``, ``[d_in, b*t] x [b*t, d_out]``), and the attention bmm's
  (``[b*h, t, dh] x [b*h, dh, t]`` and ``[b*h, t, t] x [b*h, t, dh]``, forward and backward):
  the ceiling of a step made of matmuls only.
- peak GFLOP/s: a square 1024 x 1024 float32 matmul (the machine's single-thread matmul peak).
- the ratios step / member-shape matmuls and step / peak.

Both clocks are printed: this process's CPU time (what load from other processes disturbs least:
compare these figures) and wall time (what a user waits; on a loaded machine it includes the time
the scheduler gave to others).

Where the rest goes (torch.profiler, self time by kind of op over 10 steps, one thread, load about
5 on the 2 cores; lm / khop, before -> after the changes of issue #23):

- matmuls (mm/addmm forward and backward): 45 -> 49% / 46 -> 47%; the small weight-gradient GEMMs
  (``[64, 4096] x [4096, 64]``) run well below the square-matmul peak, hence the matmul ceiling;
- attention (the CPU flash-attention kernel, forward and backward): 23 -> 25% / 21 -> 22%, at about
  10-12 GFLOP/s: the kernel is slow at d_head 16, and the alternatives measured slower still
  (``SDPBackend.MATH`` 1.8x, explicit ``baddbmm``/softmax/``bmm`` 1.7x the flash time);
- cross-entropy over the vocabulary (log-softmax and its backward): 7 -> 9% / 1%, plus, before,
  a copy of the logits without the last position and a zero-filled gradient of that copy:
  copy/fill 11 -> 4% of the lm step (``lm_loss`` now shifts the targets instead);
- AdamW: the per-parameter loop (about ten small kernels for each of 69 tensors) cost about 6 ms a
  step, 2% of lm's and 7% of khop's; the fused kernel 0.5 ms;
- GELU 5% / 7-8%, layer norms 2% / 3-4%, residual adds and embeddings 1-2%, clipping under 0.5%;
- autograd bookkeeping, views and Python: 5% / 13-14% (a fixed 6-10 ms a step: the khop member's
  step is short).

Not taken: ``torch.compile`` of the forward took 164 s to compile on this machine (over 400 eager
steps) and its steps were no faster within the noise; one fused q/k/v GEMM instead of three was no
faster (15.3 vs 15.6 ms forward and backward); ``foreach`` clipping saved nothing measurable.

    .venv/bin/python bench/bench_flops.py [--rounds 5] [--steps 10] [--members lm,khop]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: F401  (offline environment)
import torch

from depthprobe.probes.data import corpus as corpora
from depthprobe.probes.data import khop
from depthprobe.probes.models.loading import load
from depthprobe.probes.models.model import NativeConfig
from depthprobe.probes.training.lm import LMConfig, native, optimizer
from depthprobe.probes.training.loop import BatchSource, Steps, train_steps
from depthprobe.probes.training.sources import CorpusSource, KHopSource


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    d: int
    heads: int
    d_ff: int
    vocab: int
    t: int
    batch: int

    def linears(self) -> list[tuple[int, int]]:
        """(d_in, d_out) of every linear layer of a step, in order."""
        block = [(self.d, self.d)] * 4 + [(self.d, self.d_ff), (self.d_ff, self.d)]
        return block * self.layers + [(self.d, self.vocab)]

    def flops(self) -> float:
        """Training FLOPs of one step: 3 x (linear matmuls + attention scores and values)."""
        per_token = sum(2 * i * o for i, o in self.linears()) + self.layers * 2 * 2 * self.t * self.d
        return 3.0 * per_token * self.batch * self.t


def member_step(shape: Shape, source: BatchSource, seed_steps: int) -> Callable[[int], None]:
    """A closure taking ``n`` training steps of a freshly built member through ``train_steps``."""
    native_cfg = NativeConfig(layers=shape.layers, d_model=shape.d, heads=shape.heads, d_mlp=shape.d_ff,
                              d_vocab=shape.vocab, n_ctx=shape.t, attn_only=False)  # fmt: skip
    model = load(native_cfg, device="cpu")
    cfg = LMConfig(tokens=10**9, batch_size=shape.batch, context=shape.t)
    trainable = native(model)
    net, forward, opt = trainable.module, trainable.logits, optimizer(trainable, cfg)
    params = [p for p in net.parameters() if p.requires_grad]
    done = [0]

    def run(n: int) -> None:
        plan = Steps(steps=done[0] + n, lr_at=cfg.lr_at, grad_clip=cfg.grad_clip, log_every=seed_steps + n,
                     start=done[0])  # fmt: skip
        train_steps(net, forward, source, opt, params, plan, device=model.device)
        done[0] += n

    return run


def shape_matmuls(shape: Shape) -> tuple[Callable[[], None], float]:
    """The step's GEMMs on random tensors (forward and both backward GEMMs) and their FLOPs."""
    m, bh, t, dh = shape.batch * shape.t, shape.batch * shape.heads, shape.t, shape.d // shape.heads
    pairs = []
    for i, o in shape.linears():
        pairs += [((m, i), (i, o)), ((m, o), (o, i)), ((i, m), (m, o))]
    att = [((bh, t, dh), (bh, dh, t)), ((bh, t, t), (bh, t, dh))] * 3 * shape.layers  # forward + 2 backward each
    mats = [(torch.randn(a), torch.randn(b)) for a, b in pairs + att]
    flops = sum(2.0 * a.shape[-2] * a.shape[-1] * b.shape[-1] * (a.shape[0] if a.dim() == 3 else 1) for a, b in mats)

    def run() -> None:
        for a, b in mats:
            torch.matmul(a, b)

    return run, flops


def khop_source(shape: Shape) -> KHopSource:
    letters, ks = 4, (1, 2, 3, 4)
    return KHopSource(ks=ks, batch_size=shape.batch, length=shape.t - 1, letters=letters, max_k=max(ks), seed=0)


CLOCKS = ("cpu", "wall")  # this thread's CPU time (what load from other processes disturbs least), wall time


def timed(fn: Callable[[], None]) -> tuple[float, float]:
    """(CPU seconds of this process, wall seconds) of one call."""
    c0, w0 = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c0, time.perf_counter() - w0


def keep_best(best: dict[tuple[str, str], float], key: str, times: tuple[float, float], per: int = 1) -> None:
    for clock, t in zip(CLOCKS, times, strict=True):
        best[clock, key] = min(best.get((clock, key), float("inf")), t / per)


def measure(rounds: int, steps: int, names: list[str]) -> None:
    corpus = corpora.load_corpus(None)
    shapes = {
        "lm": Shape("lm (petty/levine cpu member)", 4, 64, 4, 256, corpus.vocab, 128, 32),
        "khop": Shape("khop law member", 4, 64, 4, 256, khop.vocab_size(4, 4), 49, 32),
    }
    sources = {"lm": CorpusSource(corpus, 0, 32, 128), "khop": khop_source(shapes["khop"])}
    for s in (shapes[n] for n in names):
        print(f"{s.name}: {s.layers} layers, d {s.d}, d_ff {s.d_ff}, vocab {s.vocab}, {s.batch} x {s.t} tokens, "
              f"{s.flops() / 1e9:.2f} GFLOP counted per step")  # fmt: skip
    steppers = {n: member_step(shapes[n], sources[n], steps) for n in names}
    gemms = {n: shape_matmuls(shapes[n]) for n in names}
    square = torch.randn(1024, 1024), torch.randn(1024, 1024)
    best: dict[tuple[str, str], float] = {}
    for fn in steppers.values():
        fn(3)  # warm-up
    for _ in range(rounds):
        for n in names:
            keep_best(best, n, timed(partial(steppers[n], steps)), steps)
            keep_best(best, n + ":mm", timed(gemms[n][0]))
        for _ in range(5):
            keep_best(best, "peak", timed(lambda: torch.mm(*square)))
    for clock in CLOCKS:
        peak = 2.0 * 1024**3 / best[clock, "peak"] / 1e9
        print(f"{clock} time: peak (square 1024 matmul, 1 thread) {peak:.1f} GFLOP/s")
        for n in names:
            s = shapes[n]
            step = s.flops() / best[clock, n] / 1e9
            mm = gemms[n][1] / best[clock, n + ":mm"] / 1e9
            print(f"  {s.name}: {1000 * best[clock, n]:.1f} ms/step | step {step:.1f} GFLOP/s | member-shape "
                  f"matmuls {mm:.1f} GFLOP/s | step/matmuls {step / mm:.2f} | step/peak {step / peak:.2f}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10, help="training steps per timed round")
    ap.add_argument("--members", default="lm,khop", help="comma-separated: lm, khop")
    args = ap.parse_args()
    torch.set_num_threads(1)
    names = [n for n in args.members.split(",") if n]
    load_avg = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread, load average {load_avg:.2f}, "
          f"{args.rounds} rounds x {args.steps} steps (best round kept)")  # fmt: skip
    measure(args.rounds, args.steps, names)


if __name__ == "__main__":
    main()
