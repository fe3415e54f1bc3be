"""depth-usage on minilm vs the bare Hugging Face passes the protocol needs, side by side in one run.

The protocol needs L + 1 forward passes per batch (one intact, one per skipped block). The bar:
L + 1 bare Hugging Face forwards (``output_hidden_states=True``, SDPA attention) over the same
batches. Prints both and the ratio; ``--lines N`` (default 128) EWT dev sentences, or the built-in
sample repeated when ../shared is absent.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from bench_attention_stats import text_file
from common import best_of

from depthprobe import probes
from depthprobe.probes.engine.task import Context, RunConfig, get_task
from depthprobe.probes.models.hub import minilm_path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    from transformers import AutoModel

    model = probes.load("minilm")
    hf = AutoModel.from_pretrained(str(minilm_path())).to(model.device).eval()
    L = model.info.n_layers
    with tempfile.TemporaryDirectory() as tmp:
        data = text_file(Path(tmp))
        lines = data.read_text(encoding="utf-8").splitlines()[: args.lines]
        data.write_text("\n".join(lines) + "\n", encoding="utf-8")
        task = get_task("depth-usage")
        ctx = Context(RunConfig(model="minilm", task="depth-usage", data=str(data)), task.Options())
        batches = [(b.input_ids, b.attention_mask) for b in task.batches(model, task.load(model, ctx), ctx)]

        def bare():
            with torch.inference_mode():
                for _ in range(L + 1):
                    for ids, mask in batches:
                        hf(
                            input_ids=ids.to(model.device),
                            attention_mask=mask.to(model.device),
                            output_hidden_states=True,
                        )

        def ours():
            return probes.run(model, "depth-usage", data)

        bare(), ours()  # warm-up
        t_bare = t_ours = float("inf")
        for _ in range(args.repeats):  # interleaved, so both see the same machine load
            t_bare = min(t_bare, best_of(bare, repeats=1))
            t_ours = min(t_ours, best_of(ours, repeats=1))
    print(f"depth-usage on {len(lines)} lines, {len(batches)} batches, device {model.device}, {L + 1} passes each")
    print(f"bare HF forward x {L + 1} (output_hidden_states=True): {t_bare:.3f} s")
    print(f"depthprobe depth-usage (whole run):          {t_ours:.3f} s  ratio {t_ours / t_bare:.2f}x")


if __name__ == "__main__":
    main()
