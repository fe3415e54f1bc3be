"""attention-stats on minilm vs the bare Hugging Face forward (output_attentions=True) over the
same batches, measured side by side in one run. Prints the ratio (target: at most 1.25x).

Also prints, for reference, TransformerBridge.run_with_cache over the same batches: it caches
every hook and runs the MLM head over the whole vocabulary, which is where its ~2x goes.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from common import best_of, hf_eager, hf_forward

from depthprobe import probes
from depthprobe.probes.engine.task import Context, RunConfig, get_task
from depthprobe.probes.models.hub import minilm_path

EWT = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "ud-ewt-dev" / "en_ewt-ud-dev.conllu"


def text_file(tmp: Path) -> Path:
    """A fixed text set: EWT dev sentences when ../shared is present, else the built-in sample x20."""
    if EWT.exists():
        lines = [
            ln[len("# text = ") :] for ln in EWT.read_text(encoding="utf-8").splitlines() if ln.startswith("# text = ")
        ]
    else:
        lines = (Path(probes.__file__).parent.parent / "tasks" / "data" / "sample.txt").read_text().splitlines() * 20
    out = tmp / "bench.txt"
    out.write_text("\n".join(lines[:1000]) + "\n", encoding="utf-8")
    return out


def main() -> None:
    import tempfile

    torch.set_num_threads(max(1, torch.get_num_threads()))
    model = probes.load("minilm")
    hf = hf_eager(str(minilm_path()), model.device)
    with tempfile.TemporaryDirectory() as tmp:
        data = text_file(Path(tmp))
        task = get_task("attention-stats")
        ctx = Context(RunConfig(model="minilm", task="attention-stats", data=str(data)), task.Options())
        examples = task.load(model, ctx)
        batches = [(b.input_ids, b.attention_mask) for b in task.batches(model, examples, ctx)]

        def ours():
            return probes.run(model, "attention-stats", data)

        def bridge_cache():
            with torch.inference_mode():
                for ids, mask in batches:
                    model.bridge.run_with_cache(ids.to(model.device), attention_mask=mask.to(model.device))

        ours()  # warm-up (tokenizer caches, allocator)
        hf_forward(hf, batches, model.device)
        t_hf, t_ours = float("inf"), float("inf")
        for _ in range(3):  # interleaved, so both see the same machine load
            t_hf = min(t_hf, best_of(lambda: hf_forward(hf, batches, model.device), repeats=1))
            t_ours = min(t_ours, best_of(ours, repeats=1))
        t_cache = best_of(bridge_cache, repeats=1)
    n = sum(len(b[0]) for b in batches)
    print(f"attention-stats on {n} lines, {len(batches)} batches, device {model.device}")
    print(f"bare HF forward (output_attentions=True): {t_hf:.3f} s")
    print(f"depthprobe attention-stats (whole run):   {t_ours:.3f} s  ratio {t_ours / t_hf:.2f}x (target <= 1.25x)")
    print(f"bridge run_with_cache (reference):        {t_cache:.3f} s  ratio {t_cache / t_hf:.2f}x")


if __name__ == "__main__":
    main()
