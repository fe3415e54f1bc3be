"""Training step time of a study member against a plain-PyTorch model of the same shape.

The member is built and trained exactly as `probe study` does it (a native TransformerBridge
decoder with MLPs, `probes.training.lm`'s step: the corpus batch of (seed, step), the fast forward
path, AdamW with decay on matrices only, clipping at 1, the warm-up/cosine learning rate). The
baseline is a minimal nanoGPT-style PyTorch model with the same shape (pre-LN blocks with biases,
causal scaled_dot_product_attention, GELU MLP of width d_ff, learned positions, untied unembedding)
and the same optimizer and batches. Rounds are interleaved; the best round of each is kept.
Prints the ratio (target: at most 1.1x) and the member's tokens/s.

    .venv/bin/python bench/bench_study.py [--rounds 5] [--steps 20] [--layers 4] [--d-model 64] [--d-ff 256]
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

from depthprobe.probes.data import corpus as corpora
from depthprobe.probes.models.loading import load
from depthprobe.probes.models.model import NativeConfig
from depthprobe.probes.training.fast_forward import lm_loss
from depthprobe.probes.training.lm import LMConfig, native, optimizer


class Block(nn.Module):
    def __init__(self, d: int, heads: int, d_ff: int) -> None:
        super().__init__()
        self.ln1, self.ln2, self.heads = nn.LayerNorm(d), nn.LayerNorm(d), heads
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc_in, self.fc_out = nn.Linear(d, d_ff), nn.Linear(d_ff, d)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, t, d = h.shape
        q, k, v = self.qkv(self.ln1(h)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [b, heads, t, d_head]
        h = h + self.o(z.transpose(1, 2).reshape(b, t, d))
        return h + self.fc_out(F.gelu(self.fc_in(self.ln2(h))))


class Plain(nn.Module):
    def __init__(self, layers: int, d: int, heads: int, d_ff: int, vocab: int, n_ctx: int) -> None:
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, d), nn.Embedding(n_ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads, d_ff) for _ in range(layers))
        self.ln, self.unembed = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos.weight[: tokens.shape[1]]
        for block in self.blocks:
            h = block(h)
        return self.unembed(self.ln(h))


def stepper(forward, params, opt, corpus, cfg: LMConfig):
    state = {"step": 0}

    def run(n: int) -> None:
        for _ in range(n):
            step = state["step"]
            tokens = corpora.train_batch(corpus.train_ids, cfg.seed, step, cfg.batch_size, cfg.context, corpus.bos)
            for group in opt.param_groups:
                group["lr"] = cfg.lr_at(step)
            loss = lm_loss(forward(tokens), tokens)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            state["step"] += 1

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20, help="steps per timed round")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--d-ff", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (a study member uses 1)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    corpus = corpora.load_corpus(None)
    cfg = LMConfig(tokens=10**9, batch_size=32, context=128)
    native_cfg = NativeConfig(layers=args.layers, d_model=args.d_model, heads=args.heads, d_mlp=args.d_ff,
                              d_vocab=corpus.vocab, n_ctx=cfg.context, attn_only=False)  # fmt: skip
    member = native(load(native_cfg, device="cpu"))
    member.module.train()
    torch.manual_seed(0)
    plain = Plain(args.layers, args.d_model, args.heads, args.d_ff, corpus.vocab, cfg.context)
    plain_opt = torch.optim.AdamW(
        [{"params": [p for p in plain.parameters() if p.dim() >= 2], "weight_decay": cfg.weight_decay},
         {"params": [p for p in plain.parameters() if p.dim() < 2], "weight_decay": 0.0}],
        lr=cfg.lr, betas=cfg.betas,
    )  # fmt: skip
    n_member = sum(p.numel() for p in member.module.parameters())
    n_plain = sum(p.numel() for p in plain.parameters())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); parameters: member {n_member}, "
          f"plain {n_plain}; {args.layers} layers, d_model {args.d_model}, d_ff {args.d_ff}, vocab {corpus.vocab}, "
          f"batch {cfg.batch_size} x {cfg.context} tokens")  # fmt: skip
    member_params = [p for p in member.module.parameters() if p.requires_grad]
    runners = {
        "plain PyTorch": stepper(plain, list(plain.parameters()), plain_opt, corpus, cfg),
        "study member (probe study)": stepper(member.logits, member_params, optimizer(member, cfg), corpus, cfg),
    }
    for run in runners.values():
        run(3)  # warm-up
    best = {name: float("inf") for name in runners}
    for _ in range(args.rounds):
        for name, run in runners.items():
            t0 = time.perf_counter()
            run(args.steps)
            best[name] = min(best[name], (time.perf_counter() - t0) / args.steps)
    per_step = cfg.batch_size * cfg.context
    for name, t in best.items():
        print(f"{name:28s} {1000 * t:7.1f} ms/step  {per_step / t:9.0f} tokens/s")
    ratio = best["study member (probe study)"] / best["plain PyTorch"]
    print(f"study member step time vs plain PyTorch: {ratio:.2f}x (target <= 1.1x)")


if __name__ == "__main__":
    main()
