"""The task's evaluation for training loops: induction scores and repeated-half loss of a causal model
averaged over repeat lengths. What the depth sweep (and ``bench/bench_train.py``) needs from the task.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from depthprobe.probes.data.synthetic import sequences
from depthprobe.probes.hooks.capture import forward, pattern_names
from depthprobe.probes.models.model import Model
from depthprobe.tasks.induction.metrics import copy_losses, head_score_sums


@dataclass(frozen=True)
class Evaluation:
    induction: torch.Tensor  # [layer, head] mean induction score over the lengths
    loss_repeated: float  # mean next-token loss over second copies (r_1..r_{S-1})
    loss_first: float  # the same over first copies

    @property
    def best(self) -> tuple[float, int, int]:
        flat = int(self.induction.argmax())
        layer, head = divmod(flat, self.induction.shape[1])
        return float(self.induction[layer, head]), layer, head


def evaluate(model: Model, lengths: Sequence[int], n_seqs: int = 32, seed: int = 0, batch_size: int = 64) -> Evaluation:
    """Induction scores and repeated-half loss of a causal model, averaged over repeat lengths
    (each length weighs the same). Used by the depth sweep on held-out lengths."""
    names = pattern_names(model.info.n_layers)
    ind = torch.zeros(model.info.n_layers, model.info.n_heads, dtype=torch.float64)
    late = early = 0.0
    for s in lengths:
        seqs = sequences(model, s, n_seqs, seed)
        for chunk in seqs.split(batch_size):
            acts = forward(model, chunk, None, names, logits=True)
            a = acts.stacked(names).transpose(0, 1)  # [layer, b, h, q, k] -> [b, layer, h, q, k]
            ind += head_score_sums(a, s)["induction"].cpu() / (n_seqs * len(lengths))
            first, second = copy_losses(acts["logits"], chunk.to(a.device), s)
            early += float(first.sum()) / (n_seqs * len(lengths))
            late += float(second.sum()) / (n_seqs * len(lengths))
    return Evaluation(induction=ind, loss_repeated=late, loss_first=early)
