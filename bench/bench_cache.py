"""``probes.run_with_cache`` of every hook against TransformerLens's own ``run_with_cache`` on the
same bridge, side by side in one run, on minilm.

Both cache every hook of the bridge (``names=None``; TransformerLens's default) for the same
token ids and mask, called as a user would (no ``torch.no_grad`` around either). Two inputs: the
minilm notebook's ten sentences (12 tokens) and the 30 sentences of ``tasks/data/sample.txt``
(padded to the longest). The caches are checked to hold the same tensors first.

Usage: python bench/bench_cache.py [--rounds 5] [--threads 1]
Prints the best time of each side over interleaved rounds and the ratio (target: at most 1.2x).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from common import best_of

from depthprobe import probes

SAMPLE = Path(probes.__file__).resolve().parent.parent / "tasks" / "data" / "sample.txt"
NOUNS = ["keys", "dogs", "boys", "cars", "books", "girls", "birds", "cats", "houses", "trees"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = probes.load("minilm", device="cpu")
    inputs = {
        "notebook": [f"The {n} near the old house are very big." for n in NOUNS],
        "sample.txt": SAMPLE.read_text(encoding="utf-8").splitlines(),
    }
    print(f"minilm, {torch.get_num_threads()} threads, {args.rounds} interleaved rounds")
    for label, texts in inputs.items():
        ids, mask = model.encode(texts)

        def theirs(ids=ids, mask=mask):
            return model.bridge.run_with_cache(ids, attention_mask=mask)

        def ours(ids=ids, mask=mask):
            return probes.run_with_cache(model, ids, attention_mask=mask)

        # ours first: it reroutes BERT's attention so that hook_attn_scores holds the scores, not the
        # pattern (probes/hooks/eager_attention.py); TransformerLens's call then runs the same modules
        (_, mine), (_, tl) = ours(), theirs()  # also the warm-up
        shared = [k for k in mine if k in tl]
        worst = max(float((mine[k] - tl[k]).abs().max()) for k in shared)
        assert worst < 1e-5, f"the caches differ by {worst:.2e}"

        def theirs_no_grad(ids=ids, mask=mask):
            with torch.no_grad():
                return model.bridge.run_with_cache(ids, attention_mask=mask)

        t_theirs, t_ours, t_no_grad = [], [], []
        for _ in range(args.rounds):
            t_theirs.append(best_of(theirs, repeats=1))
            t_ours.append(best_of(ours, repeats=1))
            t_no_grad.append(best_of(theirs_no_grad, repeats=1))
        a, b, c = min(t_ours), min(t_theirs), min(t_no_grad)
        rounds = ", ".join(f"{x / y:.2f}" for x, y in zip(t_ours, t_theirs, strict=True))
        print(
            f"{label} ({len(texts)} x {ids.shape[1]} tokens; {len(mine)} tensors, TransformerLens {len(tl)}, "
            f"equal to {worst:.1e}): bridge.run_with_cache {b * 1000:.0f} ms, probes.run_with_cache "
            f"{a * 1000:.0f} ms, ratio {a / b:.2f}x (rounds: {rounds}; target <= 1.2x); against "
            f"bridge.run_with_cache under torch.no_grad() ({c * 1000:.0f} ms): {a / c:.2f}x"
        )


if __name__ == "__main__":
    main()
