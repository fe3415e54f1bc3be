"""Helpers shared by the bench scripts: timing and the bare Hugging Face baseline."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch


def best_of(fn: Callable[[], object], repeats: int = 3) -> float:
    """Minimum wall time of `repeats` calls (the least disturbed by other load)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def hf_eager(path: str, device: torch.device):
    from transformers import AutoModel

    return AutoModel.from_pretrained(path, attn_implementation="eager").to(device).eval()


def hf_forward(model, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], device: torch.device) -> None:
    """The bar: bare HF forward with output_attentions=True over the given batches."""
    with torch.inference_mode():
        for ids, mask in batches:
            model(input_ids=ids.to(device), attention_mask=mask.to(device), output_attentions=True)
