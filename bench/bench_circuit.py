"""What each circuit method costs and how well it ranks edges, on the research notebook's trained
induction model (2 layers, d_model 64, 4 heads, attention-only, 1200 steps; about two minutes on a
CPU) and its induction pair with the first half corrupted (16 sequences: BOS, 10 random tokens,
the same 10 again; the corruption redraws the first half, so the previous-token -> induction key
edges carry the difference).

For ``eap``, ``eap-ig`` (``--ig-steps``) and ``patch`` (the exact edge scores, the baseline): the
seconds of ``probes.circuit`` and their ratio to patching's in the same run, Pearson r of the 81
edge scores with patching's, and how many top edges ``probes.prune`` keeps to recover 0.9.

Usage: python bench/bench_circuit.py [--ig-steps 16] [--train-steps 1200]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from depthprobe import probes


def pair() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    first = torch.randint(1, 64, (16, 10), generator=g)
    bos = torch.zeros(16, 1, dtype=torch.long)
    return torch.cat([bos, first, first], 1), torch.cat([bos, torch.randint(1, 64, (16, 10), generator=g), first], 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ig-steps", type=int, default=16)
    ap.add_argument("--train-steps", type=int, default=1200)
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model = probes.train(f"{tmp}/m", layers=2, steps=args.train_steps, lr=3e-3, warmup=50).model
    clean, corrupt = pair()

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return logits[:, 11:-1].log_softmax(-1).gather(-1, clean[:, 12:, None])[..., 0].mean(-1)

    tables, seconds = {}, {}
    for method in ("patch", "eap", "eap-ig"):
        start = time.perf_counter()
        tables[method] = probes.circuit(model, clean, corrupt, metric, method, ig_steps=args.ig_steps)
        seconds[method] = time.perf_counter() - start
    exact = tables["patch"].set_index(["sender", "receiver"])["score"]
    for method, table in tables.items():
        scores = table.set_index(["sender", "receiver"])["score"].reindex(exact.index)
        r = torch.corrcoef(torch.tensor([exact.to_list(), scores.to_list()]))[0, 1]
        kept = probes.prune(model, clean, corrupt, metric, table, target=0.9)
        print(
            f"{method:7s}: {seconds[method]:6.2f} s ({seconds[method] / seconds['patch']:.2f}x patch); r with patch "
            f"{r:.3f}; prune(0.9) keeps {kept.attrs['edges']} of {kept.attrs['of']} edges "
            f"(recovers {kept.attrs['recovered']:.3f})"
        )


if __name__ == "__main__":
    main()
