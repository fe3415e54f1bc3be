"""``groups``: group word problems (Liu et al. 2023; Merrill and Sabharwal 2025), a depth-law family.

Members of each group train on its word problems under Merrill and Sabharwal's length curriculum
(T = 2, 4, 8, ... up to the longest evaluated length, moving on when the current length is solved
on a check set apart from the evaluation sets; ``curriculum=false``: the longest length only) and
are evaluated at each length T. The prediction: for solvable groups the depth needed stays
constant in T; for non-solvable ones it grows like log T (law.csv's ``predicted_shape``, written
only here). A_5's controls have its order, so the same 60 x 60 table to learn: Z_60 (abelian,
so commutativity differs as well as solvability) and A_4 x Z_5 (``A4xZ5``: solvable, non-abelian,
so only solvability differs). A gap already at T = 2 (pairs) is learnability of the table, which
no depth theory predicts; only differences at longer T could be depth. Besides the law:
``positions.csv`` (accuracy, and for permutation groups the sign's accuracy, at every position of
the longest sequences: position t is the length-(t + 1) problem), ``prefix.csv`` (per depth the
longest prefix solved) and ``curriculum.csv`` (when each member moved on).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.options import ranged
from depthprobe.probes.experiments.law_config import COMMON, LawConfig, LawGroup, LawJob, wide_control
from depthprobe.probes.experiments.laws import LawExperiment, measured_depths
from depthprobe.probes.experiments.protocol import MAX_SEQUENCES, Preset, at_least, distinct, preset_table

if TYPE_CHECKING:
    import pandas as pd
    import torch

    from depthprobe.probes.experiments.law_member import Predict
    from depthprobe.probes.models.model import Model
    from depthprobe.probes.training.loop import BatchSource


LAW_COLUMNS = ["d_model", "group", "solvable", "T", "log2_T", "measured_depth", "predicted_shape"]


@dataclass(frozen=True)
class GroupsConfig(LawConfig):
    """``groups``: the groups compared (names); ``lengths``: the T evaluated; ``curriculum``: train
    on 2, 4, 8, ... up to the longest T, checking the current length on ``check_sequences``
    sequences every ``check_every`` updates (else on the longest T only)."""

    groups: tuple[str, ...] = ("s3", "z60", "a5")
    lengths: tuple[int, ...] = (4, 8, 16)
    curriculum: bool = True
    check_every: int = 50
    check_sequences: int = ranged(64, min=1, max=MAX_SEQUENCES)

    def __post_init__(self) -> None:
        super().__post_init__()
        from depthprobe.probes.data import groups as group_data  # torch: not at import (probe --help)

        if not self.groups:
            raise ProbeError(
                f"--groups needs at least one group, e.g. --groups s3,a5 (from {', '.join(group_data.GROUPS)})"
            )
        for name in self.groups:
            group_data.get_group(name)
        distinct(self, "groups")
        if not self.lengths or any(t < 1 for t in self.lengths) or len(set(self.lengths)) != len(self.lengths):
            raise ProbeError(
                f"--lengths must be distinct lengths T of 1 or more, e.g. 4,8,16, got {list(self.lengths)}"
            )
        if self.curriculum and max(self.lengths) < 2:
            raise ProbeError("--curriculum needs a longest length of at least 2; give --lengths up to 2 or more")
        at_least(self, 1, "check_every", "check_sequences")


class Groups(LawExperiment):
    name = "groups"
    description = "group word problems (Liu et al. 2023): the first depth per group and length T"
    Config = GroupsConfig
    key = "T"
    law_columns: ClassVar[list[str]] = LAW_COLUMNS
    second = "accuracy_last"
    extra_tables = ("positions.csv", "curriculum.csv")
    prediction = (
        "Prediction (Liu et al. 2023, 'Transformers learn shortcuts to automata'; Merrill and Sabharwal 2025, "
        "'A little depth goes a long way'): for solvable groups (Z_2, S_3, Z_60, A_4 x Z_5) the depth needed stays "
        "constant in T; for non-solvable ones (A_5, S_5) it grows like log T. Members train under Merrill and "
        "Sabharwal's length curriculum. At CPU scale expect at most a learnability gap between A_5 and its controls "
        "of the same order (Z_60, abelian; A_4 x Z_5, solvable and non-abelian), not a log T staircase, which needs "
        "GPU-scale runs; a gap already at T = 2 is learning the table, not depth."
    )
    presets, costs = preset_table(
        {
            "smoke": Preset(
                "z2, s3 at T 4,8 with the curriculum 2, 4, 8: 2 members per group (the controls would equal "
                "depth 2), about 5 CPU-seconds on 2 CPU cores (measured; the tests use it)",
                {
                    **COMMON["smoke"],
                    "groups": ("z2", "s3"),
                    "lengths": (4, 8),
                    "check_every": 10,
                    "check_sequences": 16,
                },
            ),
            "cpu": Preset(
                "s3, z60, A4xZ5 and a5, T 2,4,8,16 with the curriculum 2, 4, 8, 16, depths 1-4 and a control, 2 "
                "seeds, 3,000 steps: 40 members, about 10 CPU-minutes (measured per group on 2 shared cores: A4xZ5 2.8 "
                "CPU-minutes, z60 and a5 5.8; s3 not rerun; docs/depth-laws.md)",
                {
                    **COMMON["cpu"],
                    "depths": (1, 2, 3, 4),
                    "groups": ("s3", "z60", "A4xZ5", "a5"),
                    "lengths": (2, 4, 8, 16),
                },
            ),
            "gpu": Preset(
                "z2, s3, z60, a5, s5 at T 8-128 with the curriculum, depths 1-8 at widths 128 and 256: 195 members, "
                "about 10-14 hours one at a time, 5.6-6.8 hours with --jobs 3 on one GPU "
                "(estimated from khop member rates measured on one NVIDIA H200: 80-104 steps/s one at a time, "
                "53-65 each with --jobs 3; training only; not run)",
                {
                    **COMMON["gpu"],
                    "depths": (1, 2, 3, 4, 6, 8),
                    "d_models": (128, 256),
                    "groups": ("z2", "s3", "z60", "a5", "s5"),
                    "lengths": (8, 16, 32, 64, 128),
                    "steps": 20000,
                    "check_every": 100,
                    "check_sequences": 128,
                },
            ),
        }
    )

    def groups(self, cfg: GroupsConfig) -> list[LawGroup]:
        """One group per named group: its order is the vocabulary, the longest T the context (every
        member trains on every T: no level of its own)."""
        from depthprobe.probes.data import groups as group_data

        shapes = [(name, group_data.get_group(name).order, max(cfg.lengths)) for name in cfg.groups]
        return [LawGroup(name, None, vocab, ctx, wide_control(cfg, vocab, ctx)) for name, vocab, ctx in shapes]

    def source(self, job: LawJob) -> BatchSource:
        from depthprobe.probes.data import groups as group_data
        from depthprobe.probes.training.sources import CurriculumSource, GroupSource

        cfg = job.config
        if cfg.curriculum:
            lengths = group_data.curriculum(max(cfg.lengths))
            checks = {
                "check_every": cfg.check_every,
                "check_sequences": cfg.check_sequences,
                "threshold": cfg.threshold,
            }
            return CurriculumSource(str(job.group), cfg.batch_size, lengths, job.seed, **checks)
        return GroupSource(str(job.group), cfg.batch_size, max(cfg.lengths), job.seed)

    def probe(self, job: LawJob, model: Model, folder: Path, source: BatchSource) -> None:
        """``positions.csv``: at each position of the longest evaluation set, the accuracy and (for
        permutation groups) the sign's accuracy; with the curriculum, ``curriculum.csv``: the length
        trained from each step on (step 0: the first)."""
        import pandas as pd

        from depthprobe.probes.base.artifacts import write_csv
        from depthprobe.probes.data import groups as group_data
        from depthprobe.probes.experiments.law_member import predict
        from depthprobe.probes.training.sources import CurriculumSource

        group = group_data.get_group(str(job.group))
        inputs, targets = group_data.eval_batch(group, job.config.eval_sequences, max(job.config.lengths), job.seed)
        pred = predict(model, inputs)
        per = group_data.position_accuracy(pred, targets).tolist()
        signs = group_data.sign_accuracy(group, pred, targets).tolist() if group.signs else [None] * len(per)
        per_position = {"position": range(len(per)), "accuracy": per, "sign_accuracy": signs}
        write_csv(folder / "positions.csv", pd.DataFrame({**job.ids(), **per_position}))
        if isinstance(source, CurriculumSource):
            moves = pd.DataFrame([(0, source.lengths[0]), *source.moves], columns=["step", "length"])
            write_csv(folder / "curriculum.csv", moves.assign(member=job.name)[["member", "step", "length"]])

    def eval_sets(self, job: LawJob, n: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Per T, drawn from the evaluation seed space (never a training batch: probes.data.streams)."""
        from depthprobe.probes.data import groups as group_data

        group = group_data.get_group(str(job.group))
        return {t: group_data.eval_batch(group, n, t, job.seed) for t in job.config.lengths}

    def scores(self, job: LawJob, predict: Predict, sets: dict[int, Any]) -> dict[int, tuple[float, float]]:
        """Per T: accuracy over every position of the length-T sequences, and at the last position."""
        out = {}
        for t, (inputs, targets) in sets.items():
            right = (predict(inputs) == targets).float()
            out[t] = (float(right.mean()), float(right[:, -1].mean()))
        return out

    def law(self, cfg: GroupsConfig, accuracy: pd.DataFrame) -> pd.DataFrame:
        """Per width, group and T: the measured first depth, with the predicted shape. Controls left out."""
        from depthprobe.probes.data import groups as group_data

        law = measured_depths(accuracy, ["d_model", "group", "T"], cfg, sort=False)
        law["solvable"] = law["group"].map({g: group_data.get_group(str(g)).solvable for g in law["group"].unique()})
        law["log2_T"] = [round(math.log2(int(t)), 3) for t in law["T"]]
        law["predicted_shape"] = law["solvable"].map({True: "constant in T", False: "grows like log T"})
        return law[self.law_columns]

    def tables(self, config: GroupsConfig, members: pd.DataFrame, folder: Path) -> dict[str, pd.DataFrame]:
        tables = super().tables(config, members, folder)
        tables["prefix.csv"] = prefix_table(config, tables["positions.csv"], tables["curriculum.csv"])
        return tables

    def middle(self, config: GroupsConfig, tables: dict[str, pd.DataFrame]) -> list[str]:
        """The control against the deepest member, and the longest prefix solved (prefix.csv)."""
        from depthprobe.probes.render.html import table as html_table

        parts = super().middle(config, tables)
        prefix = tables.get("prefix.csv")
        if prefix is not None and not prefix.empty:
            parts.append(
                "<h2>Longest prefix solved</h2><p class='meta'>per depth: the largest L such that every position "
                f"t < L of the longest sequences has accuracy >= {config.threshold} (position t is the length-(t + 1) "
                "problem), min and max over seeds; trained_to: the last curriculum length reached (min over seeds); "
                "sign_accuracy_last: for permutation groups, how often the product's sign is right at the last "
                "position</p>" + html_table(prefix.astype(object).where(prefix.notna(), "").to_dict("records"))
            )
        return parts


PREFIX_COLUMNS = [
    "d_model",
    "group",
    "order",
    "solvable",
    "depth",
    "control",
    "longest_prefix_min",
    "longest_prefix_max",
    "trained_to",
    "accuracy_last",
    "sign_accuracy_last",
]


def prefix_table(cfg: GroupsConfig, positions: pd.DataFrame, curriculum: pd.DataFrame) -> pd.DataFrame:
    """Per width, group, depth (and the control): the longest prefix solved over seeds, the last
    curriculum length reached, and the accuracies at the last position (means over seeds)."""
    import pandas as pd
    import torch

    from depthprobe.probes.data import groups as group_data

    if positions.empty:
        return pd.DataFrame(columns=PREFIX_COLUMNS)
    keys = ["d_model", "group", "depth", "control"]
    ordered = positions.sort_values("position", kind="stable")  # members keep their first-seen order
    per_member = ordered.groupby([*keys, "member"], sort=False).agg(
        prefix=("accuracy", lambda acc: group_data.longest_prefix_solved(torch.tensor(acc.tolist()), cfg.threshold)),
        accuracy_last=("accuracy", "last"),
        sign_accuracy_last=("sign_accuracy", "last"),
    )
    reached = curriculum.groupby("member")["length"].max() if not curriculum.empty else pd.Series(dtype=float)
    per_member["trained_to"] = per_member.index.get_level_values("member").map(reached)
    out = per_member.groupby(level=keys, sort=False).agg(
        longest_prefix_min=("prefix", "min"),
        longest_prefix_max=("prefix", "max"),
        trained_to=("trained_to", "min"),
        accuracy_last=("accuracy_last", "mean"),
        sign_accuracy_last=("sign_accuracy_last", "mean"),
    )
    out = out.reset_index()
    groups = [group_data.get_group(str(g)) for g in out["group"]]
    out["order"], out["solvable"] = [g.order for g in groups], [g.solvable for g in groups]
    out[["accuracy_last", "sign_accuracy_last"]] = out[["accuracy_last", "sign_accuracy_last"]].map(round, ndigits=4)
    return out[PREFIX_COLUMNS]


__all__ = ["Groups", "GroupsConfig", "prefix_table"]
