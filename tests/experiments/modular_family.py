"""A law family of a shape no built-in family has, for the conformance test: running sums mod p.

Two groups (``p2``, ``p3``: one per modulus), a typed level (the modulus p, ``LawJob.level``), a
prediction per level (law.csv's ``predicted_depth``: 1 for p = 2, 2 otherwise, written here only
to give the page a line to draw) and the sequence length T as the evaluation key. It is registered
by the test that uses it (:func:`register`), never by the package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pandas as pd
import torch

from depthprobe.probes.experiments.law_config import COMMON, LawConfig, LawGroup, LawJob, wide_control
from depthprobe.probes.experiments.laws import LawExperiment, measured_depths
from depthprobe.probes.experiments.protocol import EXPERIMENTS, Preset, preset_table, register_experiment
from depthprobe.probes.training.loop import target_loss


@dataclass(frozen=True)
class ModularConfig(LawConfig):
    moduli: tuple[int, ...] = (2, 3)
    lengths: tuple[int, ...] = (4, 8)


def sums(p: int, n: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` sequences of ``length`` digits below ``p`` and their running sums mod ``p``."""
    x = torch.randint(0, p, (n, length), generator=torch.Generator().manual_seed(seed))
    return x, x.cumsum(-1) % p


@dataclass(frozen=True)
class SumSource:
    p: int
    batch_size: int
    length: int
    seed: int

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return sums(self.p, self.batch_size, self.length, 1000 * self.seed + step)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return target_loss(logits, targets)


class Modular(LawExperiment):
    name = "modular-test"
    description = "running sums mod p (a test family)"
    Config = ModularConfig
    key = "T"
    second = "accuracy_last"
    law_columns: ClassVar[list[str]] = ["d_model", "group", "p", "T", "measured_depth", "predicted_depth"]
    member_columns = ("p",)
    columns: ClassVar[list[str]] = [*LawExperiment.columns, "p"]
    prediction = "A test prediction: depth 1 for p = 2, depth 2 otherwise."
    presets, costs = preset_table(
        {"smoke": Preset("2 moduli x depths 1, 2, 10 steps: under a minute", {**COMMON["smoke"], "steps": 10})}
    )

    def groups(self, cfg: ModularConfig) -> list[LawGroup]:
        ctx = max(cfg.lengths)
        return [LawGroup(f"p{p}", p, p, ctx, wide_control(cfg, p, ctx)) for p in cfg.moduli]

    def base_row(self, job: LawJob) -> dict[str, Any]:
        return {**super().base_row(job), "p": job.level}

    def source(self, job: LawJob) -> SumSource:
        return SumSource(int(job.level or 0), job.config.batch_size, max(job.config.lengths), job.seed)

    def eval_sets(self, job: LawJob, n: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        return {t: sums(int(job.level or 0), n, t, -1 - job.seed) for t in job.config.lengths}

    def scores(self, job: LawJob, predict: Any, sets: dict[int, Any]) -> dict[int, tuple[float, float]]:
        out = {}
        for t, (inputs, targets) in sets.items():
            right = (predict(inputs) == targets).float()
            out[t] = (float(right.mean()), float(right[:, -1].mean()))
        return out

    def law(self, cfg: ModularConfig, accuracy: pd.DataFrame) -> pd.DataFrame:
        law = measured_depths(accuracy, ["d_model", "group", "p", "T"], cfg)
        law["predicted_depth"] = [1 if p == 2 else 2 for p in law["p"]]
        return law[self.law_columns]


def register() -> None:
    """Register the family (once per process)."""
    if "modular-test" not in EXPERIMENTS.names():
        register_experiment(Modular)
