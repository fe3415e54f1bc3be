"""``crasp``: the C-RASP depth hierarchy (Yang, Cadilhac and Chiang 2025, "Knee-Deep in C-RASP",
arXiv 2506.16055), a depth-law family.

One language L_k per member (k non-empty alternating blocks of a and b, first block a:
:mod:`probes.data.crasp`); a NoPE decoder (no positional encoding, BOS the only anchor) reads BOS
x_0..x_{n-1} and says at every x_t whether the prefix is in L_k. Members train on lengths
{max(nmin, k)..nmax} and are scored by exact-match string accuracy (every position right), with
token accuracy beside it, on four length ranges: the training lengths and about 2x, 4x, 8x longer.
The prediction: C-RASP depth k - 2 recognises L_k and depth k - 3 does not, so the first depth
that length-generalises is k - 2 (:func:`predicted_depth`, the only place it is written). A member
solves L_k when its exact-match accuracy on the range ending at ``solve_at`` (129-256 in the cpu
preset, 4x the training lengths) is >= ``threshold``. At the training lengths shallower models may
fit L_k with shortcuts (the BOS token's attention weight gives the position), so the law is about
length generalisation.

Tables:

- ``accuracy.csv``: per member and range (``max_length``): exact-match string accuracy
  (``accuracy``), token accuracy, ``step_reached``, with the member's ``k``.
- ``law.csv``: per width and k, the predicted first depth (k - 2), the measured one (the first
  depth whose exact-match accuracy on the deciding range is >= the threshold in every seed), their
  difference, the first depth that reaches it at the training lengths (in distribution), the
  control's exact-match accuracy on the deciding range, and depth 1 beside its exact limit without
  positions (:mod:`probes.data.crasp_cap`: per token for every k, per string for k <= 4).
- ``depths.csv``: per k, model and range: exact-match accuracy (mean and min over seeds), token
  accuracy and the majority-class token accuracy.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.options import ranged
from depthprobe.probes.experiments.law_config import COMMON, ROW_COLUMNS, USAGE_SEQUENCES, LawConfig, LawGroup, LawJob
from depthprobe.probes.experiments.laws import LawExperiment, measured_depths
from depthprobe.probes.experiments.protocol import Preset, preset_table

if TYPE_CHECKING:
    import pandas as pd
    import torch

    from depthprobe.probes.experiments.law_member import Predict
    from depthprobe.probes.models.model import Model, NativeConfig
    from depthprobe.probes.training.loop import BatchSource

VOCAB = 4  # a, b, BOS, PAD (probes.data.crasp.VOCAB; this module imports no torch)
LAW_COLUMNS = [
    "d_model",
    "k",
    "predicted_depth",
    "measured_depth",
    "difference",
    "solve_range",
    "in_distribution_depth",
    "control_depth",
    "control_d_model",
    "control_exact_match",
    "depth1_exact_match",
    "depth1_string_cap",
    "depth1_token_accuracy",
    "depth1_token_cap",
]


@dataclass(frozen=True)
class CraspConfig(LawConfig):
    """``ks``: the languages L_k (one per member); training lengths {max(nmin, k)..nmax};
    ``eval_lengths``: the upper ends of the evaluation ranges (nmin..first, first + 1..second, ...);
    ``solve_at``: the range (by its upper end) whose exact-match accuracy decides "solved";
    ``control_scale``: the wide shallow control (depth k - 3) is this many times the widest member."""

    ks: tuple[int, ...] = (3, 4, 5, 6)
    nmin: int = 32
    nmax: int = 64
    eval_lengths: tuple[int, ...] = (64, 128, 256, 512)
    solve_at: int = 256
    control_scale: float = ranged(2.0, above=1, max=100)  # above 1: a control wider than every member
    threshold: float = 0.95

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.ks or any(k < 1 for k in self.ks) or len(set(self.ks)) != len(self.ks):
            raise ProbeError(f"--ks must be distinct block counts of 1 or more, e.g. 3,4,5,6, got {list(self.ks)}")
        if self.nmin < 1 or self.nmax < max(self.nmin, max(self.ks)):
            raise ProbeError(
                f"--nmin and --nmax need 1 <= nmin and nmax >= max(nmin, k) = {max(self.nmin, max(self.ks))}, "
                f"got {self.nmin}, {self.nmax}"
            )
        e = self.eval_lengths
        if not e or e[0] < max(self.nmin, max(self.ks)) or any(b <= a for a, b in itertools.pairwise(e)):
            raise ProbeError(f"--eval-lengths must rise from at least max(nmin, k), e.g. 64,128,256,512, got {list(e)}")
        if self.solve_at not in e:
            raise ProbeError(f"--solve-at must be one of --eval-lengths {list(e)}, got {self.solve_at}")
        if self.nmax > max(e):
            raise ProbeError(
                f"--nmax {self.nmax} is above the longest --eval-lengths {max(e)}: a member's context is 1 + the "
                "longest evaluation length; lower --nmax or give longer --eval-lengths"
            )
        if self.control and max(self.ks) > 3 and self.control_width <= max(self.d_models):
            raise ProbeError(
                f"--control-scale {self.control_scale} gives a control of width {self.control_width}, not wider than "
                f"the widest member ({max(self.d_models)}): it trains a member again; give a larger --control-scale"
            )

    @property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        """The evaluation ranges: (nmin, first), (first + 1, second), ..."""
        lows = (self.nmin, *(hi + 1 for hi in self.eval_lengths[:-1]))
        return tuple(zip(lows, self.eval_lengths, strict=True))

    @property
    def control_width(self) -> int:
        """The control's width: ``control_scale`` x the widest member, a multiple of the heads."""
        return max(self.heads, round(self.control_scale * max(self.d_models) / self.heads) * self.heads)


def predicted_depth(k: int) -> int:
    """Yang, Cadilhac and Chiang: C-RASP depth k - 2 recognises L_k, depth k - 3 does not (L_1..L_3
    at depth 1)."""
    return max(1, k - 2)


@dataclass(frozen=True)
class CraspJob(LawJob):
    """A member trained on L_k: its ``level`` is k, its ``group`` the language's name, ``L<k>``."""

    @property
    def k(self) -> int:
        return self.level or 0

    @property
    def name(self) -> str:
        kind = "control-" if self.control else ""
        return f"k{self.k}-{kind}L{self.depth}-d{self.d_model}-s{self.seed}"

    def native(self) -> NativeConfig:
        return replace(super().native(), positional="none")


class Crasp(LawExperiment):
    name = "crasp"
    description = "C-RASP languages L_k (Yang et al. 2025): the first NoPE depth that length-generalises, per k"
    Config = CraspConfig
    Job = CraspJob
    columns: ClassVar[list[str]] = [*ROW_COLUMNS, "k"]
    key = "max_length"
    second = "token_accuracy"
    extra_tables = ("ranges.csv",)
    member_columns = ("k",)
    id_columns = ("group", "k", "depth", "d_model", "heads", "seed", "control")
    law_columns = LAW_COLUMNS
    prediction = (
        "Prediction (Yang, Cadilhac and Chiang 2025, 'Knee-Deep in C-RASP'): fixed-precision transformers without "
        "positional encoding equal C-RASP depth for depth, and C-RASP depth k - 2 recognises L_k while depth k - 3 "
        "does not, so the first depth that length-generalises on L_k is k - 2 (law.csv's predicted_depth). Solved: "
        "exact-match accuracy (every position right) >= the threshold on the range law.csv names, in every seed. "
        "At the training lengths shallower models may fit L_k with shortcuts: the law is about longer strings."
    )
    presets, costs = preset_table(
        {
            "smoke": Preset(
                "L_4 at depths 1, 2 (width 16) and the control (depth 1, width 32), lengths 8-16, evaluated to 32, "
                "40 steps: 3 members, about 5 CPU-seconds on 2 CPU cores (measured; the tests use it)",
                {**COMMON["smoke"], "ks": (4,), "nmin": 8, "nmax": 16, "eval_lengths": (16, 32), "solve_at": 32},
            ),
            "cpu": Preset(
                "L_3-L_6 at depths 1-5 (width 64) and the control (depth k - 3, width 128), lengths 32-64, evaluated "
                "to 512, 2 seeds, 2,000 steps: 46 members, 53 min with --jobs 2 on 2 idle CPU cores (measured, longest "
                "member first; 105 CPU-minutes: docs/depth-laws.md)",
                {**COMMON["cpu"], "depths": (1, 2, 3, 4, 5), "steps": 2000},
            ),
            "demo": Preset(
                "L_3 and L_4 at depths 1, 2 (width 64) and L_4's control (depth 1, width 128), lengths 16-32, "
                "evaluated to 128, 2 seeds, 500 steps: 10 members, 54 s wall with --jobs 2 on 2 idle CPU cores inside "
                "probe atlas (measured; 2.8 min and 2.0 CPU-minutes alone on shared cores)",
                {
                    **COMMON["cpu"],
                    "ks": (3, 4),
                    "depths": (1, 2),
                    "nmin": 16,
                    "nmax": 32,
                    "eval_lengths": (32, 64, 128),
                    "solve_at": 128,
                    "steps": 500,
                },
            ),
            "gpu": Preset(
                "L_3-L_10 at depths 1-8 at widths 128 and 256 and the control (depth k - 3, width 512), 3 seeds, "
                "10,000 steps: 405 members: about 11-14 hours one at a time, 5.8-7.1 hours with --jobs 3 on one GPU "
                "(estimated from khop member rates measured on one NVIDIA H200: 80-104 steps/s one at a time, "
                "53-65 each with --jobs 3; training only; not run)",
                {
                    **COMMON["gpu"],
                    "depths": (1, 2, 3, 4, 5, 6, 7, 8),
                    "d_models": (128, 256),
                    "ks": (3, 4, 5, 6, 7, 8, 9, 10),
                    "steps": 10000,
                },
            ),
        }
    )

    def groups(self, cfg: CraspConfig) -> list[LawGroup]:
        """One group per language L_k (level k), its control depth k - 3 at ``control_width`` (none
        where k - 3 < 1)."""
        control = {k: (k - 3, cfg.control_width) if k > 3 else None for k in cfg.ks}
        return [LawGroup(f"L{k}", k, VOCAB, 1 + max(cfg.eval_lengths), control[k]) for k in cfg.ks]

    def base_row(self, job: LawJob) -> dict[str, Any]:
        return {**super().base_row(job), "k": job.level}

    def source(self, job: LawJob) -> BatchSource:
        from depthprobe.probes.training.sources import CRaspSource

        cfg = job.config
        return CRaspSource(job.level or 0, cfg.batch_size, cfg.nmin, cfg.nmax, job.seed)

    def eval_sets(self, job: LawJob, n: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Per range (keyed by its upper end), from the evaluation seed space (probes.data.streams)."""
        from depthprobe.probes.data import crasp

        return {hi: crasp.eval_batch(job.level or 0, n, lo, hi, job.seed) for lo, hi in job.config.ranges}

    def scores(self, job: LawJob, predict: Predict, sets: dict[int, Any]) -> dict[int, tuple[float, float]]:
        """Per range: (exact-match string accuracy, token accuracy)."""
        from depthprobe.probes.data import crasp

        out = {}
        for hi, (inputs, targets) in sets.items():
            s = crasp.scores(predict(inputs, crasp.predictions), targets)
            out[hi] = (s["exact_match"], s["token_accuracy"])
        return out

    def usage(self, job: LawJob, sets: dict[int, Any]) -> tuple[torch.Tensor, dict[int, Any]]:
        """Strings of L_k of the longest training length, ``nmax`` (no padding), from the
        evaluation seed space; the sets of the training range and the solve range: the question is
        which blocks the member needs where it was trained and where the law is decided (the longest
        range alone is 3/4 of the evaluation cost and would be read once per block)."""
        from depthprobe.probes.data import crasp

        cfg = job.config
        inputs = crasp.eval_batch(job.level or 0, USAGE_SEQUENCES, cfg.nmax, cfg.nmax, job.seed)[0]
        return inputs, {key: s for key, s in sets.items() if key in (cfg.ranges[0][1], cfg.solve_at)}

    def probe(self, job: LawJob, model: Model, folder: Path, source: BatchSource) -> None:
        """``ranges.csv``: per range its lengths and the majority-class token accuracy of the final
        evaluation set (what always answering the more frequent class scores)."""
        import pandas as pd

        from depthprobe.probes.base.artifacts import write_csv
        from depthprobe.probes.data import crasp

        sets = self.eval_sets(job, job.config.eval_sequences)
        rows = []
        for lo, hi in job.config.ranges:
            majority = crasp.scores(sets[hi][1], sets[hi][1])["majority_accuracy"]
            rows.append(
                {"member": job.name, "min_length": max(lo, job.level or 0), "max_length": hi, "majority": majority}
            )
        write_csv(folder / "ranges.csv", pd.DataFrame(rows))

    def tables(self, config: CraspConfig, members: pd.DataFrame, folder: Path) -> dict[str, pd.DataFrame]:
        tables = super().tables(config, members, folder)
        tables["depths.csv"] = by_depth(tables["accuracy.csv"], tables["ranges.csv"])
        return tables

    def law(self, cfg: CraspConfig, accuracy: pd.DataFrame) -> pd.DataFrame:
        return law_table(cfg, accuracy)

    def page(self, config: CraspConfig, tables: dict[str, pd.DataFrame], folder: Path, *_: Any) -> list[str]:
        """The laws' page with law.csv's predicted first depth of L_k on its heatmap's solve-range
        column (law.csv's solve_range, read at its longest length; the in-distribution column has no
        prediction), and the solve range's accuracies behind law.csv (the law is read there)."""
        import pandas as pd

        acc, law = tables.get("accuracy.csv"), tables["law.csv"]
        if acc is None or acc.empty:
            return super().page(config, tables, folder)
        cells = {
            "d_model": law["d_model"],
            "group": [f"L{k}" for k in law["k"]],
            "max_length": [int(str(r).rsplit("-", 1)[-1]) for r in law["solve_range"]],
            "predicted_depth": law["predicted_depth"],
        }
        predicted = None if law.empty else pd.DataFrame(cells)
        return super().page(config, tables, folder, predicted, acc[acc["max_length"] == config.solve_at])

    def middle(self, config: CraspConfig, tables: dict[str, pd.DataFrame]) -> list[str]:
        """Exact-match accuracy per model and range (depths.csv) in place of the wide control's table."""
        return depths_section(tables)


DEPTH_COLUMNS = [
    "k",
    "model",
    "depth",
    "d_model",
    "control",
    "min_length",
    "max_length",
    "exact_match",
    "exact_match_min",
    "token_accuracy",
    "majority",
]


def law_table(cfg: CraspConfig, acc: pd.DataFrame) -> pd.DataFrame:
    """law.csv: one row per width and k (see the module's docstring)."""
    keys = ["d_model", "k"]
    solve, train = acc[acc["max_length"] == cfg.solve_at], acc[acc["max_length"] == cfg.eval_lengths[0]]
    law = measured_depths(solve, keys, cfg)
    law["predicted_depth"] = law["k"].map(predicted_depth)
    law["difference"] = law["measured_depth"] - law["predicted_depth"]
    lo_solve = dict((hi, lo) for lo, hi in cfg.ranges)[cfg.solve_at]
    law["solve_range"] = [f"{max(lo_solve, k)}-{cfg.solve_at}" for k in law["k"]]
    in_distribution = measured_depths(train, keys, cfg).rename(columns={"measured_depth": "in_distribution_depth"})
    control = (
        solve[solve["control"].astype(bool)]
        .groupby("k")
        .agg(
            control_depth=("depth", "first"),
            control_d_model=("d_model", "first"),
            control_exact_match=("accuracy", "mean"),
        )
    )
    one = train[(train["depth"] == 1) & ~train["control"].astype(bool)]  # depth 1 at the training range
    one = one.groupby(keys).agg(
        depth1_exact_match=("accuracy", "mean"), depth1_token_accuracy=("token_accuracy", "mean")
    )
    law = (
        law.merge(in_distribution, on=keys, how="left")
        .merge(control, on="k", how="left")
        .merge(one, on=keys, how="left")
    )
    law["depth1_string_cap"], law["depth1_token_cap"] = zip(*(depth_one_caps(cfg, k) for k in law["k"]), strict=True)
    rounded = [
        "control_exact_match",
        "depth1_exact_match",
        "depth1_string_cap",
        "depth1_token_accuracy",
        "depth1_token_cap",
    ]
    law[rounded] = law[rounded].astype(float).map(round, ndigits=4)
    return law[LAW_COLUMNS].astype({"control_depth": "Int64", "control_d_model": "Int64"})


def depth_one_caps(cfg: CraspConfig, k: int) -> tuple[float, float]:
    """Depth 1's exact limits without positions at the training range (:mod:`probes.data.crasp_cap`):
    per string (k <= 4; nan beyond) and per token."""
    from depthprobe.probes.data import crasp_cap

    lo, hi = max(cfg.nmin, k), cfg.eval_lengths[0]
    string_cap = 1.0 if k <= 3 else crasp_cap.string_cap_l4(lo, hi)[0] if k == 4 else math.nan
    return string_cap, crasp_cap.token_cap(k, lo, hi)


def by_depth(acc: pd.DataFrame, ranges: pd.DataFrame) -> pd.DataFrame:
    """Per k, model (depth, or the control) and range: the accuracies over seeds and the majority."""
    import pandas as pd

    if acc.empty:
        return pd.DataFrame(columns=DEPTH_COLUMNS)
    if ranges.empty:
        acc = acc.assign(min_length=math.nan, majority=math.nan)
    else:
        acc = acc.merge(ranges, on=["member", "max_length"], how="left")
    out = acc.groupby(["k", "control", "depth", "d_model", "max_length"], sort=True).agg(
        min_length=("min_length", "min"),
        exact_match=("accuracy", "mean"),
        exact_match_min=("accuracy", "min"),
        token_accuracy=("token_accuracy", "mean"),
        majority=("majority", "mean"),
    )
    out = out.reset_index()
    out["model"] = [
        f"control: depth {depth}, d_model {d}" if control else f"depth {depth}"
        for control, depth, d in zip(out["control"], out["depth"], out["d_model"], strict=True)
    ]
    rounded = ["exact_match", "exact_match_min", "token_accuracy", "majority"]
    out[rounded] = out[rounded].map(round, ndigits=4)
    return out[DEPTH_COLUMNS]


def depths_section(tables: dict[str, pd.DataFrame]) -> list[str]:
    """Exact-match accuracy per model and range (depths.csv), between the heatmaps and the curves."""
    import pandas as pd

    from depthprobe.probes.render.html import table as html_table

    depths = tables.get("depths.csv", pd.DataFrame())
    if depths.empty:
        return []
    wide = depths.pivot_table(index=["k", "model"], columns="max_length", values="exact_match", aggfunc="first")
    records = wide.rename(columns=lambda hi: f"exact match, lengths to {hi}").reset_index().to_dict("records")
    return ["<h2>Exact-match accuracy by model and length</h2>" + html_table(records)]


__all__ = ["Crasp", "CraspConfig", "CraspJob", "by_depth", "law_table", "predicted_depth"]
