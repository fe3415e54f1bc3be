"""syntax on the whole EWT dev set with minilm vs the bare Hugging Face forward
(output_attentions=True) over the same batches, measured side by side in one run.

Prints the ratio (target: at most 1.25x), where the task's time goes (capture forward vs
word-level scoring), and the accuracies of det, obj, nsubj, case and ALL (best head vs
the fixed-offset baseline).  Usage: python bench/bench_syntax.py [--repeats N] [--limit N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from common import best_of, hf_eager, hf_forward

from depthprobe import probes
from depthprobe.probes.engine.task import Context, RunConfig, get_task
from depthprobe.probes.hooks.capture import forward
from depthprobe.probes.models.hub import minilm_path

EWT = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "ud-ewt-dev"
SHOWN = ("det", "obj", "nsubj", "case", "ALL")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--limit", type=int, default=None, help="first N sentences only (default: all)")
    args = ap.parse_args()
    if not EWT.exists():
        sys.exit(f"{EWT} is missing: this benchmark needs ../shared/data/ud-ewt-dev")
    model = probes.load("minilm")
    hf = hf_eager(str(minilm_path()), model.device)
    task = get_task("syntax")
    ctx = Context(RunConfig(model="minilm", task="syntax", data=str(EWT), limit=args.limit), task.Options())
    examples = task.load(model, ctx)
    batches = list(task.batches(model, examples, ctx))
    pairs = [(b.input_ids, b.attention_mask) for b in batches]
    names = task.hook_names(model, ctx)

    def ours():
        return probes.run(model, "syntax", EWT, limit=args.limit)

    result = ours()  # warm-up, and the numbers we report
    t_hf, t_ours, stages = [], [], []
    for _ in range(args.repeats):  # interleaved, so that other load hits both alike
        t_hf.append(best_of(lambda: hf_forward(hf, pairs, model.device), repeats=1))
        t0 = time.perf_counter()
        stages.append(ours().timings)
        t_ours.append(time.perf_counter() - t0)
    # where the task's time goes (one more pass, split into its two parts)
    t_fwd = t_acc = 0.0
    state = task.start(model, ctx, examples)
    for b in batches:
        t0 = time.perf_counter()
        acts = forward(model, b.input_ids, b.attention_mask, names)
        t1 = time.perf_counter()
        task.accumulate(state, b, acts)
        t_fwd, t_acc = t_fwd + t1 - t0, t_acc + time.perf_counter() - t1

    words = result.headline["n_words"]
    print(
        f"syntax on EWT dev: {len(examples)} sentences ({examples.skipped} skipped), {words} words, "
        f"{len(batches)} batches, device {model.device}, {torch.get_num_threads()} threads"
    )
    print(f"bare HF forward (output_attentions=True): {min(t_hf):.2f} s  (runs: {', '.join(f'{t:.2f}' for t in t_hf)})")
    print(
        f"depthprobe syntax (whole run):           {min(t_ours):.2f} s  (runs: {', '.join(f'{t:.2f}' for t in t_ours)})"
    )
    print(
        f"ratio {min(t_ours) / min(t_hf):.2f}x (target <= 1.25x); "
        f"per round: {', '.join(f'{o / h:.2f}x' for o, h in zip(t_ours, t_hf, strict=True))}"
    )
    fastest = stages[t_ours.index(min(t_ours))]
    print("stages of the fastest run: " + ", ".join(f"{k} {v:.2f} s" for k, v in fastest.items()))
    print(f"separately: capture forward {t_fwd:.2f} s, word-level scoring {t_acc:.2f} s")
    summary = result.summary.set_index("relation")
    print(
        f"{'relation':10s} {'count':>6s} {'head':>6s} {'clark':>6s} {'direction':16s} {'acc':>6s} {'base':>6s} "
        f"{'offset':>6s}"
    )
    for rel in SHOWN:
        r = summary.loc[rel]
        print(
            f"{rel:10s} {r['count']:6d} {r['best_head']:>6s} {r['clark_notation']:>6s} {r['direction']:16s} "
            f"{r['accuracy']:6.1f} {r['baseline']:6.1f} {r['offset']:6d}"
        )


if __name__ == "__main__":
    main()
