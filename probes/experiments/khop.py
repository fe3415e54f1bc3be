"""``khop``: k-hop induction (Sanford, Hsu and Telgarsky 2024), a depth-law family.

Members train on sequences of ``length`` letters from an alphabet of ``letters`` with the hop
counts ``ks`` mixed, are evaluated per k, and the hop-attention task reads where their heads look
(``hops.csv``, ``hop_layers.csv``). The prediction: Sanford et al.'s construction doubles the hops
resolved per layer after a two-layer induction head, so depth floor(log2 k) + 2 suffices
(:func:`predicted_depth`, the only place it is written; law.csv carries it to the page).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.options import ranged
from depthprobe.probes.experiments.laws import COMMON, LawConfig, LawExperiment, LawJob, measured_depths
from depthprobe.probes.experiments.protocol import MAX_SEQUENCES, at_least

if TYPE_CHECKING:
    import pandas as pd
    import torch

    from depthprobe.probes.models.model import Model
    from depthprobe.probes.training.loop import BatchSource


@dataclass(frozen=True)
class KHopConfig(LawConfig):
    """``ks``: hop counts mixed in training, each evaluated; ``length`` (N) letters of an alphabet
    of ``letters`` (A); ``hop_sequences``: sequences the hop-attention probe reads per member."""

    ks: tuple[int, ...] = (1, 2, 3, 4)
    length: int = 48
    letters: int = 4
    hop_sequences: int = ranged(64, min=1, max=MAX_SEQUENCES)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.ks or any(k < 1 for k in self.ks) or len(set(self.ks)) != len(self.ks):
            raise ProbeError(f"--ks must be distinct hop counts of 1 or more, e.g. 1,2,3,4, got {list(self.ks)}")
        if self.letters < 2:
            raise ProbeError(f"--letters must be at least 2 (no letter twice in a row), got {self.letters}")
        if self.length < 2:
            raise ProbeError(f"--length must be at least 2, got {self.length}")
        if self.max_k > self.length:
            raise ProbeError(
                f"--ks {self.max_k} is above --length {self.length}: more hops than letters never has a letter "
                "answer; use hop counts up to the length"
            )
        at_least(self, 1, "hop_sequences")

    @property
    def max_k(self) -> int:
        return max(self.ks)

    @property
    def vocab(self) -> int:
        """Letters, none and the hop-count tokens (probes.data.khop.vocab_size)."""
        return self.letters + 1 + self.max_k


def predicted_depth(k: int) -> int:
    """Sanford et al.'s construction: a two-layer induction head, then each layer doubles the hops
    resolved, so k hops need floor(log2 k) + 2 layers (docs/protocols.md §3.9)."""
    return math.floor(math.log2(k)) + 2


class KHop(LawExperiment):
    name = "khop"
    description = "k-hop induction (Sanford et al. 2024): the first depth that solves k hops, per k"
    Config = KHopConfig
    key = "k"
    law_columns: ClassVar[list[str]] = ["d_model", "k", "predicted_depth", "measured_depth", "difference"]
    second = "accuracy_all"
    extra_tables = ("hops.csv", "hop_layers.csv")
    prediction = (
        "Prediction (Sanford, Hsu and Telgarsky 2024, ICML): depth Theta(log k) suffices for k-hop induction and "
        "is needed at small width; their construction (a two-layer induction head, then each layer doubles the "
        "hops) reaches k hops at depth floor(log2 k) + 2 (law.csv's predicted_depth; the line on the heatmap). "
        "A 2-layer control with at least the deepest member's parameters tests that depth, not size, does it."
    )
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "smoke": {**COMMON["smoke"], "ks": (1, 2), "length": 12, "letters": 3, "hop_sequences": 8},
        "cpu": {**COMMON["cpu"], "depths": (1, 2, 3, 4, 5)},
        "demo": {**COMMON["cpu"], "ks": (1, 2), "depths": (1, 2, 3), "steps": 1000, "control": False},
        "cpu-k8": {**COMMON["cpu"], "depths": (1, 2, 3, 4, 5, 6), "ks": (1, 2, 3, 4, 8), "steps": 5000},
        "gpu": {
            **COMMON["gpu"],
            "depths": (1, 2, 3, 4, 5, 6, 7),
            "d_models": (128, 256),
            "ks": (1, 2, 3, 4, 6, 8, 12, 16),
            "length": 100,
            "steps": 20000,
            "hop_sequences": 128,
        },
    }
    costs: ClassVar[dict[str, str]] = {
        "smoke": "depths 1,2 at width 16, k 1,2, 40 steps: 3 members, 5-10 s on 2 CPU cores (the tests use it)",
        "cpu": "depths 1-5 and a wide 2-layer control at width 64, k 1-4, N 48, 2 seeds, 3,000 steps: 12 members, "
        "14 min with --jobs 2 on 2 idle CPU cores (measured; 27 CPU-minutes)",
        "demo": "k 1,2 at depths 1-3 (width 64), N 48, 2 seeds, 1,000 steps, no control (k 3 and 4 left out: at CPU "
        "scale k = 3 has needed one layer more than floor(log2 k) + 2, docs/depth-laws.md): 6 members, 4.5 min wall "
        "with --jobs 2 on 2 shared CPU cores, 2.9 CPU-minutes (measured; probe atlas runs it)",
        "cpu-k8": "k 1-4 and 8 (log against linear depth: 5 layers against 9), depths 1-6 and a wide 2-layer control "
        "at width 64, N 48, 2 seeds, 5,000 steps: 14 members, 45 CPU-minutes, 36.5 min with --jobs 2 on 2 shared "
        "CPU cores (measured; docs/depth-laws.md)",
        "gpu": "N 100, k 1-16, depths 1-7 and a control at widths 128 and 256, 3 seeds, 20,000 steps: 45 members, "
        "about 2.4-3.1 hours on one NVIDIA H200 one member at a time, 1.3-1.6 hours with --jobs 3 "
        "(from rates measured on an H200 at these shapes; training only; the preset not run end to end)",
    }

    def eval_keys(self, config: Any) -> int:
        return len(config.ks)

    def shape(self, cfg: KHopConfig, group: str | None) -> tuple[int, int]:
        return cfg.vocab, 1 + cfg.length

    def source(self, job: LawJob) -> BatchSource:
        from depthprobe.probes.training.sources import KHopSource

        cfg = job.config
        return KHopSource(cfg.ks, cfg.batch_size, cfg.length, cfg.letters, cfg.max_k, job.seed)

    def eval_sets(self, job: LawJob, n: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Per k, drawn from the evaluation seed space (never a training batch: probes.data.streams)."""
        from depthprobe.probes.data import khop

        cfg = job.config
        return {k: khop.eval_batch(k, n, cfg.length, cfg.letters, cfg.max_k, job.seed) for k in cfg.ks}

    def scores(self, job: LawJob, model: Model, sets: dict[int, Any]) -> dict[int, tuple[float, float]]:
        """Per k: accuracy over letter answers, and over all positions."""
        from depthprobe.probes.data import khop
        from depthprobe.probes.experiments.law_member import predict

        return {k: khop.accuracy(predict(model, x), y, job.config.letters) for k, (x, y) in sets.items()}

    def probe(self, job: LawJob, model: Model, folder: Path) -> None:
        """The hop-attention task (tables in runs/hop-attention): per head and hop (member, layer,
        head, hop, attention, chance), and per layer the largest hop resolved."""

        from depthprobe.probes.base.artifacts import write_csv
        from depthprobe.probes.experiments.probing import probe

        cfg = job.config
        result = probe(
            model,
            "hop-attention",
            folder / "runs" / "hop-attention",
            max_len=job.context,
            letters=cfg.letters,
            length=cfg.length,
            max_hop=cfg.max_k,
            hop=cfg.max_k,
            sequences=cfg.hop_sequences,
            seed=job.seed,
        )
        hop = result.scores["metric"].str.extract(r"^hop_(\d+)_attention$", expand=False).dropna().astype(int)
        hops = result.scores.loc[hop.index].assign(hop=hop, member=job.name).rename(columns={"value": "attention"})
        hops = hops.astype({"layer": int, "head": int})[["member", "layer", "head", "hop", "attention", "chance"]]
        layers = result.summary[["layer", "largest_hop", "heads"]].assign(member=job.name, depth=job.depth)
        write_csv(folder / "hops.csv", hops.reset_index(drop=True))
        write_csv(folder / "hop_layers.csv", layers[["member", "depth", "layer", "largest_hop", "heads"]])

    def law(self, cfg: KHopConfig, accuracy: pd.DataFrame) -> pd.DataFrame:
        """Per width and k: the predicted and the measured first depth and their difference
        (measured - predicted; empty when no depth reached the threshold). Controls left out."""
        law = measured_depths(accuracy, ["d_model", "k"], cfg)
        law["predicted_depth"] = law["k"].map(predicted_depth)
        law["difference"] = law["measured_depth"] - law["predicted_depth"]
        return law[self.law_columns]


__all__ = ["KHop", "KHopConfig", "predicted_depth"]
