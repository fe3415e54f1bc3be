"""One row of docs/api.md's table of trained induction circuits: train a 2-layer attention-only
model with `probe train`'s defaults (d_model 64, vocab 64, sequences of 64 with a repeated segment,
batch 32, AdamW, weight decay 0.01 unless given) at lr 3e-3 with 50 warm-up steps, then score its
edges with ``probes.circuit`` and prune them to 0.9 with ``probes.prune``.

The pair: 32 sequences, BOS, 10 random tokens (1..63) and the same 10 again. ``--corruption
first`` redraws the whole first copy and measures the mean log-probability of the next token at
the second copy's positions 11..19; ``--corruption alternate`` redraws only the first copy's odd
positions (1, 3, ..., 9) and measures it at 11, 13, ..., 19, whose next tokens sit at kept
(even) positions: the induction heads' values are unchanged and only their keys, which the
previous-token head writes, differ (K-composition alone).

Prints the layer-0 heads' attention to the previous token and the layer-1 heads' to the token
after the earlier copy, then per method the rank of the strongest layer-0 head -> layer-1 key
edge and the edges prune keeps.

Usage: python scripts/circuit_trained.py --heads 4 --steps 3000 --seed 1 --corruption alternate
"""

from __future__ import annotations

import argparse

import torch

from depthprobe import probes

HALF = 10


def pair(corruption: str, n: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Clean and corrupted ids, and the query positions of the metric."""
    g = torch.Generator().manual_seed(0)
    first, other = (torch.randint(1, 64, (n, HALF), generator=g) for _ in range(2))
    clean = torch.cat([torch.zeros(n, 1, dtype=torch.long), first, first], 1)
    corrupt = clean.clone()
    if corruption == "first":
        corrupt[:, 1 : HALF + 1] = other
        return clean, corrupt, torch.arange(HALF + 1, 2 * HALF)
    corrupt[:, 1 : HALF + 1 : 2] = other[:, ::2]
    return clean, corrupt, torch.arange(HALF + 1, 2 * HALF, 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--corruption", choices=["first", "alternate"], default="alternate")
    ap.add_argument("--methods", default="patch,eap-ig")
    args = ap.parse_args()
    torch.set_num_threads(1)
    settings = {"heads": args.heads, "steps": args.steps, "seed": args.seed, "weight_decay": args.weight_decay}
    model = probes.train(layers=2, lr=3e-3, warmup=50, **settings).model
    clean, corrupt, queries = pair(args.corruption)

    def next_logprob(logits: torch.Tensor) -> torch.Tensor:
        lp = logits[:, queries].log_softmax(-1)
        return lp.gather(-1, clean[:, queries + 1, None])[..., 0].mean(-1)

    names = ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    _, cache = probes.run_with_cache(model, clean, names=names)
    prev = cache[names[0]].diagonal(-1, -2, -1).mean((0, 2))
    induction = cache[names[1]].diagonal(-(HALF - 1), -2, -1)[:, :, HALF + 1 :].mean((0, 2))
    with torch.no_grad():
        print(settings, args.corruption, "clean", round(float(next_logprob(model.bridge(clean)).mean()), 2))
    print("previous-token attention", [round(x, 2) for x in prev.tolist()])
    print("induction attention", [round(x, 2) for x in induction.tolist()])
    for method in args.methods.split(","):
        table = probes.circuit(model, clean, corrupt, next_logprob, method, ig_steps=16)
        to_key = table["sender"].str.fullmatch(r"0-\d+") & table["receiver"].str.fullmatch(r"1-\d+\.k")
        rank = int(to_key.to_numpy().argmax())
        kept = probes.prune(model, clean, corrupt, next_logprob, table, target=0.9).attrs
        print(
            f"{method}: {table['sender'][rank]} -> {table['receiver'][rank]} rank {rank + 1}; prune keeps "
            f"{kept['edges']} of {kept['of']} ({kept['edges'] / kept['of']:.1%}), recovering {kept['recovered']:.3f}"
        )
        print(
            "  top 8:",
            ", ".join(f"{s} -> {r} {v:.2f}" for s, r, v in table[["sender", "receiver", "score"]][:8].values),
        )


if __name__ == "__main__":
    main()
