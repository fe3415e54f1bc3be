"""What every task's scores table shares: its leading columns and how a head is labelled."""

from __future__ import annotations

SCORE_COLUMNS = ["model", "task", "layer", "head", "metric", "value"]


def head_label(layer: int, head: int) -> str:
    """``L-H``, 0-indexed: ``head_label(1, 2)`` is ``"1-2"`` (layer 1, head 2)."""
    return f"{layer}-{head}"
