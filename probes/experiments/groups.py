"""``groups``: group word problems (Liu et al. 2023; Merrill and Sabharwal 2025), a depth-law family.

Members of each group train on its word problems of the longest length and are evaluated at each
length T. The prediction: for solvable groups the depth needed stays constant in T; for
non-solvable ones it grows like log T (law.csv's ``predicted_shape``, written only here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.experiments.laws import COMMON, LawConfig, LawExperiment, LawJob, measured_depth

if TYPE_CHECKING:
    import pandas as pd
    import torch

    from depthprobe.probes.models.model import Model
    from depthprobe.probes.training.loop import BatchSource

LAW_COLUMNS = ["d_model", "group", "solvable", "T", "log2_T", "measured_depth", "predicted_shape"]


@dataclass(frozen=True)
class GroupsConfig(LawConfig):
    """``groups``: the groups compared (names); ``lengths``: the T evaluated (members train on the longest)."""

    groups: tuple[str, ...] = ("s3", "a5")
    lengths: tuple[int, ...] = (4, 8, 16)

    def __post_init__(self) -> None:
        super().__post_init__()
        from depthprobe.probes.data import groups as group_data  # torch: not at import (probe --help)

        if not self.groups:
            raise ProbeError(
                f"--groups needs at least one group, e.g. --groups s3,a5 (from {', '.join(group_data.GROUPS)})"
            )
        for name in self.groups:
            group_data.get_group(name)
        if not self.lengths or any(t < 1 for t in self.lengths) or len(set(self.lengths)) != len(self.lengths):
            raise ProbeError(
                f"--lengths must be distinct lengths T of 1 or more, e.g. 4,8,16, got {list(self.lengths)}"
            )


class Groups(LawExperiment):
    name = "groups"
    description = "group word problems (Liu et al. 2023): the first depth per group and length T"
    Config = GroupsConfig
    key = "T"
    second = "accuracy_last"
    prediction = (
        "Prediction (Liu et al. 2023, 'Transformers learn shortcuts to automata'; Merrill and Sabharwal 2025, "
        "'A little depth goes a long way'): for solvable groups (Z_2, S_3) the depth needed stays constant in T; "
        "for non-solvable ones (A_5, S_5) it grows like log T."
    )
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "smoke": {**COMMON["smoke"], "groups": ("z2", "s3"), "lengths": (4, 8)},
        "cpu": {
            **COMMON["cpu"],
            "depths": (1, 2, 3, 4),
            "d_models": (64,),
            "groups": ("s3", "a5"),
            "lengths": (4, 8, 16),
            "steps": 3000,
        },
        "gpu": {
            **COMMON["gpu"],
            "depths": (1, 2, 3, 4, 6, 8),
            "d_models": (128, 256),
            "groups": ("z2", "s3", "a5", "s5"),
            "lengths": (8, 16, 32, 64, 128),
            "steps": 20000,
        },
    }
    costs: ClassVar[dict[str, str]] = {
        "smoke": "z2, s3 at T 4,8: 3 members per group, 5-10 s on 2 CPU cores (the tests use it)",
        "cpu": "s3 vs a5, T 4,8,16, depths 1-4 and a control, 2 seeds, 3,000 steps: 20 members, 9 min with --jobs 2 "
        "(measured on shared cores; 15 CPU-minutes)",
        "gpu": "z2, s3, a5, s5 at T 8-128, depths 1-8 at widths 128 and 256: 156 members, about 3-4 hours on one "
        "large GPU (estimated; not run on a GPU)",
    }

    def groups_of(self, cfg: GroupsConfig) -> list[str | None]:
        return list(cfg.groups)

    def shape(self, cfg: GroupsConfig, group: str | None) -> tuple[int, int]:
        from depthprobe.probes.data import groups as group_data

        return group_data.get_group(str(group)).order, max(cfg.lengths)

    def source(self, job: LawJob) -> BatchSource:
        from depthprobe.probes.training.sources import GroupSource

        return GroupSource(str(job.group), job.config.batch_size, max(job.config.lengths), job.seed)

    def eval_sets(self, job: LawJob, n: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Per T, drawn from the evaluation seed space (never a training batch: probes.data.streams)."""
        from depthprobe.probes.data import groups as group_data

        group = group_data.get_group(str(job.group))
        return {t: group_data.eval_batch(group, n, t, job.seed) for t in job.config.lengths}

    def scores(self, job: LawJob, model: Model, sets: dict[int, Any]) -> dict[int, tuple[float, float]]:
        """Per T: accuracy over every position of the length-T sequences, and at the last position."""
        from depthprobe.probes.experiments.law_member import predict

        out = {}
        for t, (inputs, targets) in sets.items():
            right = (predict(model, inputs) == targets).float()
            out[t] = (float(right.mean()), float(right[:, -1].mean()))
        return out

    def law(self, cfg: GroupsConfig, accuracy: pd.DataFrame) -> pd.DataFrame:
        """Per width, group and T: the measured first depth, with the predicted shape. Controls left out."""
        import pandas as pd

        from depthprobe.probes.data import groups as group_data

        if accuracy.empty:
            return pd.DataFrame(columns=LAW_COLUMNS)
        rows = accuracy[~accuracy["control"].astype(bool)]
        out = []
        for (d, g, t), at in rows.groupby(["d_model", "group", "T"], sort=False):
            solvable = group_data.get_group(str(g)).solvable
            out.append(
                {
                    "d_model": d,
                    "group": g,
                    "solvable": solvable,
                    "T": t,
                    "log2_T": round(math.log2(int(t)), 3),
                    "measured_depth": measured_depth(at, cfg.threshold, cfg.seeds),
                    "predicted_shape": "constant in T" if solvable else "grows like log T",
                }
            )
        return pd.DataFrame(out).astype({"measured_depth": "Int64"})


__all__ = ["Groups", "GroupsConfig"]
