"""coref on minilm vs the bare Hugging Face forward (output_attentions=True) over the same
windows / GAP texts and the same batches, measured side by side in one run.

Data: all of OntoGUM dev (../shared/data/ontogum-dev) and GAP dev (../shared/data/gap-dev).
Ours is the whole task run (reading and validating the data, windowing, forward passes,
word-level attention and scoring, summary) with the model already loaded; the bar is only the
HF forward passes. Prints each ratio (target: at most 1.25x) and the headline accuracies.

    .venv/bin/python bench/bench_coref.py [--repeats N] [--threads N] [--only ontogum|gap]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from common import hf_eager, hf_forward

from depthprobe import probes
from depthprobe.probes.engine.task import Context, RunConfig, get_task
from depthprobe.probes.models.hub import minilm_path

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
SETS = {"ontogum": DATA / "ontogum-dev", "gap": DATA / "gap-dev" / "gap-development.tsv"}


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def bench(model, hf, name: str, data: Path, repeats: int) -> None:
    task = get_task("coref")
    ctx = Context(RunConfig(model="minilm", task="coref", data=str(data)), task.Options())
    examples = task.load(model, ctx)
    batches = [(b.input_ids, b.attention_mask) for b in task.batches(model, examples, ctx)]
    t_hf, runs = [], []
    for _ in range(repeats):  # interleaved, so drifting machine load hits both alike
        t, _ = timed(lambda: hf_forward(hf, batches, model.device))
        t_hf.append(t)
        runs.append(timed(lambda: probes.run(model, "coref", data)))
    hf_s = min(t_hf)
    ours_s, result = min(runs, key=lambda r: r[0])
    n_tok = sum(int(m.sum()) for _, m in batches)
    print(
        f"\n== {name}: {len(examples)} inputs, {len(batches)} batches, {n_tok} real tokens, "
        f"device {model.device}, {torch.get_num_threads()} threads, best of {repeats}"
    )
    print(f"bare HF forward (output_attentions=True): {hf_s:8.2f} s")
    print(f"depthprobe coref (whole run):             {ours_s:8.2f} s  ratio {ours_s / hf_s:.2f}x (target <= 1.25x)")
    print(f"  our phases: { {k: round(v, 2) for k, v in result.timings.items()} }")
    print(result.summary.to_string(index=False))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--only", choices=sorted(SETS), default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    missing = [str(p) for p in SETS.values() if not p.exists()]
    if missing:
        sys.exit(f"development data not found: {', '.join(missing)}")
    model = probes.load("minilm")
    hf = hf_eager(str(minilm_path()), model.device)
    probes.run(model, "coref")  # warm-up on the built-in sample
    for name, data in SETS.items():
        if args.only in (None, name):
            bench(model, hf, name, data, args.repeats)


if __name__ == "__main__":
    main()
