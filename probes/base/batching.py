"""Length-sorted, padded batches: one forward pass per batch, little padding."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Batch:
    """Padded model input for one forward pass plus whatever the task needs to score it."""

    input_ids: torch.Tensor  # [batch, pos]
    attention_mask: torch.Tensor  # [batch, pos], 1 for real tokens
    items: Sequence[Any]  # the task's examples in this batch, in row order


def by_length(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices grouped into batches of similar length (longest first, stable)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad id sequences -> (input_ids, attention_mask), both [batch, max_len]."""
    n = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), n), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), n), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(list(s), dtype=torch.long)
        mask[b, : len(s)] = 1
    return ids, mask


def length_batches(
    items: Sequence[Any], seqs: Sequence[Sequence[int]], batch_size: int, pad_id: int
) -> Iterator[Batch]:
    """Batches of (items, padded seqs), grouped by length."""
    for idx in by_length([len(s) for s in seqs], batch_size):
        ids, mask = pad([seqs[i] for i in idx], pad_id)
        yield Batch(ids, mask, [items[i] for i in idx])


CPU_BATCH_SIZE = 32  # examples per forward pass when none is given and the device is not CUDA
MEMORY_SHARE = 0.5  # share of the free device memory a batch may plan for


def auto_batch_size(
    free_bytes: int, *, n_layers: int, n_heads: int, d_model: int, max_len: int, value_bytes: int, cap: int = 512
) -> int:
    """Examples per forward pass that fit in ``MEMORY_SHARE`` of ``free_bytes`` (a power of two,
    1 to ``cap``), for inputs of up to ``max_len`` pieces.

    One example's worst case: every layer's attention pattern in the model's dtype and a float32
    copy for the metrics (``n_layers * n_heads * max_len**2 * (value_bytes + 4)``), one layer's
    float64 maps while it is scored (``n_heads * max_len**2 * 8``) and the residual-stream
    activations (``n_layers * max_len * d_model * 16 * value_bytes``: hidden states, the MLP's 4x
    width, queries, keys, values and their hooks).
    """
    if min(n_layers, n_heads, d_model, max_len, value_bytes) < 1:
        raise ValueError("model sizes, max_len and value_bytes must be positive")
    per_example = (
        n_layers * n_heads * max_len**2 * (value_bytes + 4)
        + n_heads * max_len**2 * 8
        + n_layers * max_len * d_model * 16 * value_bytes
    )
    fits = int(max(0, free_bytes) * MEMORY_SHARE) // per_example
    size = 1
    while size * 2 <= min(fits, cap):
        size *= 2
    return size
