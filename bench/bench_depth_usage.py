"""depth-usage on minilm vs the bare Hugging Face passes the protocol needs, side by side in one run.

The protocol is L + 1 forward passes per batch (one intact, one per skipped block); the pass for
block 0 is whole, the passes for blocks s > 0 rerun only blocks s+1..L-1 from the intact residual,
so for L = 6 the run computes 22 block passes where whole passes would compute 42. The baseline:
L + 1 bare Hugging Face forwards (``output_hidden_states=True``, SDPA attention) over the same
batches (bar: at most 0.75x). Prints both and the ratio; ``--lines N`` (default 128) EWT dev
sentences, or the built-in sample repeated when ../shared is absent.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from contextlib import contextmanager
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
    parser.add_argument("--repeats", type=int, default=3)
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

        def whole():  # as before the prefix was reused: every skip pass from the embeddings
            with whole_passes():
                return probes.run(model, "depth-usage", data)

        cases = {"bare": bare, "ours": ours, "whole": whole}
        for fn in cases.values():  # warm-up
            fn()
        times: dict[str, list[float]] = {name: [] for name in cases}
        for r in range(args.repeats):  # interleaved, rotating the order, so all see the same machine load
            names = list(cases)[r % 3 :] + list(cases)[: r % 3]
            for name in names:
                times[name].append(best_of(cases[name], repeats=1))
    print(f"depth-usage on {len(lines)} lines, {len(batches)} batches, device {model.device}, {L + 1} passes each")
    print(f"load average after: {os.getloadavg()}; seconds per round: {times}")
    med = {name: statistics.median(t) for name, t in times.items()}
    ratios = [o / b for o, b in zip(times["ours"], times["bare"], strict=True)]
    print(f"bare HF forward x {L + 1} (output_hidden_states=True): median {med['bare']:.3f} s")
    print(f"depthprobe depth-usage (whole run), skip passes from the prefix: median {med['ours']:.3f} s")
    each = ", ".join(f"{x:.2f}x" for x in ratios)
    print(f"  per-round ratio to bare: {each}; median {statistics.median(ratios):.2f}x")
    before = [w / b for w, b in zip(times["whole"], times["bare"], strict=True)]
    print(f"the same with whole skip passes (before): median {med['whole']:.3f} s; ratio to bare median "
          f"{statistics.median(before):.2f}x")  # fmt: skip


@contextmanager
def whole_passes():
    """Within the block depth-usage cannot record its blocks' calls, so every skip pass is whole."""
    from depthprobe.tasks.depth_usage import task as du

    @contextmanager
    def nothing(model):
        yield None

    du.recording_blocks, before = nothing, du.recording_blocks
    try:
        yield
    finally:
        du.recording_blocks = before


if __name__ == "__main__":
    main()
