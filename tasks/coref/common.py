"""What both coref protocols share: batches held under an attention-pattern budget, the best
head (ties to the lowest layer, then head), percentages, Clark's 1-indexed head names and the
tidy per-head accuracy rows behind the heatmaps.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from depthprobe.probes.base.batching import by_length, pad
from depthprobe.probes.base.scores import head_label
from depthprobe.probes.engine.task import Batch

PATTERN_BUDGET = 1 << 30  # bytes of float32 attention patterns held for one batch


def budget_batches(
    items: Sequence, seqs: Sequence[Sequence[int]], batch_size: int, pad_id: int, per_token_pair: int
) -> Iterator[Batch]:
    """Length-sorted batches of at most ``batch_size`` rows whose attention patterns
    (rows x T x T x ``per_token_pair`` bytes) fit in PATTERN_BUDGET."""
    order = [i for group in by_length([len(s) for s in seqs], len(seqs) or 1) for i in group]
    k = 0
    while k < len(order):
        t = len(seqs[order[k]])  # longest of this batch (sorted longest first)
        rows = max(1, min(batch_size, PATTERN_BUDGET // max(1, t * t * per_token_pair)))
        idx = order[k : k + rows]
        ids, mask = pad([seqs[i] for i in idx], pad_id)
        yield Batch(ids, mask, [items[i] for i in idx])
        k += rows


def best_head(correct: torch.Tensor) -> tuple[int, int]:
    """(layer, head) with the most correct answers; ties -> lowest layer, then lowest head."""
    flat = correct.reshape(-1)  # [layer * head], layer-major
    i = int(flat.argmax())
    return divmod(i, correct.shape[1])


def pct(k: int | float, n: int) -> float | None:
    return None if n == 0 else round(100.0 * k / n, 2)


def clark(layer_idx: int, h: int) -> str:
    """Clark et al.'s 1-indexed name of a head (docs/protocols.md §2), beside the L-H label."""
    return head_label(layer_idx + 1, h + 1)


def heatmap_rows(correct: torch.Tensor, n: Sequence[int], labels: Sequence[str], column: str) -> list[dict]:
    """Tidy rows: accuracy of every head overall and per group (type or gender)."""
    rows = []
    total, n_all = correct.sum(0), sum(n)
    groups = [("all", total, n_all)] + [(g, correct[i], n[i]) for i, g in enumerate(labels) if n[i]]
    for label, c, k in groups:
        for layer in range(c.shape[0]):
            for head in range(c.shape[1]):
                rows.append(
                    {
                        "layer": layer,
                        "head": head,
                        "metric": "accuracy",
                        "value": float(c[layer, head]) / k if k else float("nan"),
                        column: label,
                        "n": k,
                        "clark_head": clark(layer, head),
                    }
                )
    return rows
