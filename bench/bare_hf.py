"""The bare Hugging Face script that `probe run` is measured against (bench_whole_process.py).

Load the tokenizer and the model (eager attention), tokenize each batch of texts, run the
forward pass with ``output_attentions=True`` and keep nothing. The batches come from a JSON file:
a list of batches, each a list of strings (the texts the probe run feeds, in its order).
With ``--batches`` omitted it does only the fixed cost: imports, tokenizer and model load.

Usage: python bench/bare_hf.py MODEL_DIR [--batches FILE.json] [--dtype float32]
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from transformers import AutoModel, AutoTokenizer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batches", default=None)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tok = AutoTokenizer.from_pretrained(args.model)
    model = (
        AutoModel.from_pretrained(args.model, attn_implementation="eager", torch_dtype=getattr(torch, args.dtype))
        .to(device)
        .eval()
    )
    batches = []
    if args.batches:
        with open(args.batches, encoding="utf-8") as fh:
            batches = json.load(fh)
    n_tokens = 0
    with torch.inference_mode():
        for texts in batches:
            enc = tok(texts, padding=True, return_tensors="pt")
            n_tokens += int(enc["attention_mask"].sum())
            model(
                input_ids=enc["input_ids"].to(device),
                attention_mask=enc["attention_mask"].to(device),
                output_attentions=True,
            )
    print(f"bare: {len(batches)} batches, {n_tokens} tokens")


if __name__ == "__main__":
    main()
