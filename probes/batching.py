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
