"""Activation patching on minilm against a plain Hugging Face loop doing the same, side by side in one run.

The inputs are the minilm notebook's ten contrast pairs (12 tokens each, no padding; its metric:
how far the mean embedding moves from the corrupted towards the clean one). Two sweeps:

- per head: ``probes.patch(model, clean, corrupt, hooks="blocks.*.attn.hook_z")``, 72 runs (6
  layers x 12 heads). The plain loop: one clean pass keeping each layer's input to the attention
  output projection (``attention.output.dense``, the heads' outputs side by side), then, as a
  user's loop would, 72 patched forwards one by one, each with a forward pre-hook on one layer's
  output projection writing that head's 32 clean columns.
- per position: ``hooks="blocks.*.hook_resid_pre"``, 72 runs (6 layers x 12 positions). The plain
  loop: forward pre-hooks on each ``encoder.layer[i]`` (its input hidden states), the same way.

Both loops run ``BertModel`` with eager attention and no head over the vocabulary (what minilm
is), under ``torch.inference_mode()``, on the same thread count (one by default: on shared cores
two threads slow the loop's many small operations far more than the packed passes); the tables
are checked equal to the loop's values first.

- per neuron: ``hooks="blocks.3.mlp.hook_post", per="neuron", neurons=<64 of its 1,536>``, 64
  runs. The plain loop: a forward hook on ``encoder.layer[3].intermediate`` (the MLP activation)
  keeping the clean output, then 64 patched forwards, each with a forward hook writing one
  neuron's clean column (every position).

Usage: python bench/bench_patching.py [--rounds 3] [--copies 1] [--threads 1]
(``--copies N`` repeats the ten pairs N times: a wider input). Prints the best time of each side
over interleaved rounds and the ratio (target: at most 1.0x).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from common import best_of, hf_eager

from depthprobe import probes
from depthprobe.probes.models.hub import minilm_path

NOUNS = [("keys", "key"), ("dogs", "dog"), ("boys", "boy"), ("cars", "car"), ("books", "book")]
NOUNS += [("girls", "girl"), ("birds", "bird"), ("cats", "cat"), ("houses", "house"), ("trees", "tree")]


def _input(args: tuple, kwargs: dict) -> torch.Tensor:
    """A module's input: its first argument (or hidden_states= when passed by name)."""
    return args[0] if args else kwargs["hidden_states"]


def keep(kept: dict[int, torch.Tensor], i: int):
    def hook(module, args, kwargs):
        kept[i] = _input(args, kwargs)

    return hook


def hf_sweep(hf, clean, corrupt, metric, where: str) -> torch.Tensor:
    """The plain loop: [72, ...] metric values, layer by layer, head (or position) by head."""
    (c_ids, c_mask), (x_ids, x_mask) = clean, corrupt
    layers = hf.encoder.layer
    modules = [layer.attention.output.dense if where == "head" else layer for layer in layers]
    kept: dict[int, torch.Tensor] = {}
    with torch.inference_mode():
        handles = [m.register_forward_pre_hook(keep(kept, i), with_kwargs=True) for i, m in enumerate(modules)]
        hf(input_ids=c_ids, attention_mask=c_mask)
        for h in handles:
            h.remove()
        d_head = hf.config.hidden_size // hf.config.num_attention_heads
        slots = hf.config.num_attention_heads if where == "head" else c_ids.shape[1]
        values = []
        for i, module in enumerate(modules):
            for s in range(slots):
                cols = (..., slice(s * d_head, (s + 1) * d_head)) if where == "head" else (slice(None), s)

                def write(m, args, kwargs, i=i, cols=cols):
                    x = _input(args, kwargs).clone()
                    x[cols] = kept[i][cols]
                    return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})

                handle = module.register_forward_pre_hook(write, with_kwargs=True)
                out = hf(input_ids=x_ids, attention_mask=x_mask).last_hidden_state
                handle.remove()
                values.append(metric(out))
    return torch.stack(values)


NEURON_LAYER, NEURONS = 3, list(range(0, 1536, 24))  # 64 neurons of one layer's MLP


def hf_neurons(hf, clean, corrupt, metric) -> torch.Tensor:
    """The plain per-neuron loop: [64, ...] metric values, one patched forward per neuron."""
    (c_ids, c_mask), (x_ids, x_mask) = clean, corrupt
    module = hf.encoder.layer[NEURON_LAYER].intermediate
    kept: list[torch.Tensor] = []
    with torch.inference_mode():
        handle = module.register_forward_hook(lambda m, args, out: kept.append(out))
        hf(input_ids=c_ids, attention_mask=c_mask)
        handle.remove()
        values = []
        for i in NEURONS:

            def write(m, args, out, i=i):
                out = out.clone()
                out[..., i] = kept[0][..., i]
                return out

            handle = module.register_forward_hook(write)
            values.append(metric(hf(input_ids=x_ids, attention_mask=x_mask).last_hidden_state))
            handle.remove()
    return torch.stack(values)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--copies", type=int, default=1, help="repeat the ten pairs this many times")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (one: shared cores disturb both less)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = probes.load("minilm", device="cpu")
    hf = hf_eager(str(minilm_path()), model.device)
    clean_texts = [f"The {p} near the old house are very big." for p, _ in NOUNS] * args.copies
    corrupt_texts = [f"The {s} near the old house are very big." for _, s in NOUNS] * args.copies
    clean, corrupt = model.encode(clean_texts), model.encode(corrupt_texts)
    with torch.inference_mode():
        clean_emb = hf(input_ids=clean[0], attention_mask=clean[1]).last_hidden_state.mean(1)
        corrupt_emb = hf(input_ids=corrupt[0], attention_mask=corrupt[1]).last_hidden_state.mean(1)
    direction = clean_emb - corrupt_emb

    def restored(out: torch.Tensor) -> torch.Tensor:  # [batch]: 0 = the corrupted embedding, 1 = the clean one
        return ((out.mean(1) - corrupt_emb) * direction).sum(-1) / (direction * direction).sum(-1)

    sweeps = {"head": "blocks.*.attn.hook_z", "position": "blocks.*.hook_resid_pre", "neuron": "neuron"}
    print(
        f"minilm, {len(clean_texts)} pairs x {clean[0].shape[1]} tokens, {torch.get_num_threads()} threads, "
        f"{args.rounds} interleaved rounds"
    )
    for where, hooks in sweeps.items():

        def ours(hooks=hooks):
            if hooks == "neuron":
                hook, kw = f"blocks.{NEURON_LAYER}.mlp.hook_post", {"per": "neuron", "neurons": NEURONS}
                return probes.patch(model, clean_texts, corrupt_texts, hooks=hook, metric=restored, **kw)
            return probes.patch(model, clean_texts, corrupt_texts, hooks=hooks, metric=restored)

        def plain(where=where):
            if where == "neuron":
                return hf_neurons(hf, clean, corrupt, restored)
            return hf_sweep(hf, clean, corrupt, restored, where)

        table, ref = ours(), plain()  # also the warm-up
        diff = (torch.tensor(table["value"].to_numpy()) - ref.mean(1).double()).abs().max()
        assert diff < 1e-5, f"per-{where} tables differ from the plain loop's by {diff:.2e}"
        t_ours, t_plain = [], []
        for _ in range(args.rounds):
            t_plain.append(best_of(plain, repeats=1))
            t_ours.append(best_of(ours, repeats=1))
        a, b = min(t_ours), min(t_plain)
        rounds = ", ".join(f"{x / y:.2f}" for x, y in zip(t_ours, t_plain, strict=True))
        print(
            f"per {where} ({len(table)} runs; values equal to {diff:.1e}): plain HF loop {b:.2f} s, "
            f"probes.patch {a:.2f} s, ratio {a / b:.2f}x (rounds: {rounds}; target <= 1.0x)"
        )


if __name__ == "__main__":
    main()
