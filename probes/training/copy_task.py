"""Training a depth-study network (:class:`~probes.models.variant_net.VariantTransformer`) on the copy
task, for the kernels sweep's trained kernels: Adam on the repeated half's next-token loss,
gradient norm clipped at 1, through the one training loop."""

from __future__ import annotations

from typing import Any

import torch

from depthprobe.probes.training.loop import Steps, Window, train_steps
from depthprobe.probes.training.sources import CopySource


def train_copy(net: Any, steps: int, t: int, batch: int = 16, lr: float = 1e-3, seed: int = 0) -> list[float]:
    """Train ``net`` in place for ``steps`` updates at a constant ``lr``; returns each step's loss."""
    if steps < 1:
        return []
    losses: list[float] = []

    def keep(window: Window) -> None:
        losses.append(window.loss)

    source = CopySource(batch_size=batch, t=t, d_vocab=net.cfg.d_vocab, seed=seed)
    train_steps(
        net,
        lambda ids: net(ids, return_type="logits"),
        source,
        torch.optim.Adam(net.parameters(), lr=lr),
        net.parameters(),
        Steps(steps=steps, lr_at=lambda step: lr, grad_clip=1.0, log_every=1),
        device=net.W_E.device,
        on_window=keep,
    )
    return losses
