"""``khop``: k-hop induction (Sanford, Hsu and Telgarsky 2024), a depth-law family.

Members train on sequences of ``length`` letters from an alphabet of ``letters`` with the hop
counts ``ks`` mixed, are evaluated per k, and the hop-attention task reads where their heads look
(``hops.csv``, ``hop_layers.csv``). The prediction: depth floor(log2 k) + 2 suffices
(:func:`predicted_depth`, the only place it is written; law.csv carries it to the page). A
construction reaching that count (a sketch, with pointers as well as answers): layer 0 copies the
previous letter to each position; layer 1 is an induction step, after which position i holds a
pointer p(i) and the answer X at p(i); each further layer attends one hop beyond the pointer held
(to p of it: the last position up to the pointer whose previous letter is the answer held) and reads
the pointer and the answers held there, so the hops held go 1, 3, 7, ...: 2^(L-1) - 1 after L
layers. Its heads attend to i - 1 at layer 0, to p(i) at layer 1 and to p^(2^(l-1))(i) at layer
l >= 2 (largest hops by layer 0, 1, 2, 4, ...). A construction that doubles answers only, after a
two-layer induction step, composes 2^(L-2) hops in L layers and needs ceil(log2 k) + 2: the slower
one (``ceil_depth`` in law.csv). law.csv also gives the linear rule k + 1 and the first depths of
Sanford et al.'s own stored runs (:data:`AUTHORS_DEPTHS`), and marks budget-limited depths
(:func:`outcomes`): the first depth is a property of width, budget and the mix of k; only its
logarithmic growth is the theory's.
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
from depthprobe.probes.experiments.protocol import MAX_SEQUENCES, Preset, at_least, preset_table

if TYPE_CHECKING:
    import pandas as pd
    import torch

    from depthprobe.probes.experiments.law_member import Predict
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
    """Sanford et al.'s count: with pointers as well as answers, L layers hold 2^(L-1) - 1 hops, so
    k hops need floor(log2 k) + 2 layers (the module docstring sketches a construction;
    docs/protocols.md §3.9)."""
    return math.floor(math.log2(k)) + 2


def ceil_depth(k: int) -> int:
    """The slower construction (answers only, doubled after a two-layer induction step: 2^(L-2)
    hops in L layers): ceil(log2 k) + 2."""
    return math.ceil(math.log2(k)) + 2


def linear_depth(k: int) -> int:
    """A linear rule, one layer per hop after the first: k + 1."""
    return k + 1


# Sanford et al.'s stored runs (github.com/chsanford/hop-induction-heads, local/errors.json, keys
# "((depth, heads, -1), k)": the error with fresh samples of models with d_model 128 (4 heads) and
# 256 (8 heads), no MLP, N = 100, A = 4, k = 0-16 mixed, 100,000 steps at lr 1e-4, depths 2-6): per
# heads and k, the first depth whose error is <= 0.01. A k missing (4 heads, k >= 11) reached it at
# no depth of 2-6.
AUTHORS_DEPTHS: dict[int, dict[int, int]] = {
    4: {1: 2, 2: 3, 3: 4, 4: 5, 5: 6, 6: 6, 7: 6, 8: 6, 9: 6, 10: 6},
    8: {1: 2, 2: 3, 3: 3, 4: 4, 5: 4, 6: 4, 7: 4, 8: 5, 9: 5, 10: 5, 11: 5, 12: 5, 13: 5, 14: 6, 15: 6, 16: 6},
}
HOP_LAYER_COLUMNS = [
    "member",
    "depth",
    "layer",
    "largest_hop",
    "heads",
    "previous_token",
    "previous_token_chance",
    "previous_occurrence",
    "previous_occurrence_chance",
]  # hop_layers.csv
BUDGET_WINDOW = 2000  # steps: a curve still gaining over its last BUDGET_WINDOW steps ...
BUDGET_GAIN = 0.01  # ... by more than this is budget-limited (:func:`outcomes`)


def curve_gains(curves: pd.DataFrame, window: int = BUDGET_WINDOW) -> pd.DataFrame:
    """Per member and k: ``gain``, the learning curve's accuracy at its last evaluation step minus
    its accuracy at the last evaluation step at or before (last - ``window``); NA where the curve
    has no evaluation that early (a run shorter than ``window`` steps)."""
    import pandas as pd

    rows = []
    for (member, k), curve in curves.groupby(["member", "k"], sort=False) if not curves.empty else []:
        curve = curve.sort_values("step")
        last = curve.iloc[-1]
        early = curve[curve["step"] <= last["step"] - window]
        gain = float(last["accuracy"] - early.iloc[-1]["accuracy"]) if len(early) else None
        rows.append({"member": member, "k": k, "gain": gain})
    return pd.DataFrame(rows, columns=["member", "k", "gain"]).astype({"k": "int64", "gain": "Float64"})


def outcomes(acc: pd.DataFrame, curves: pd.DataFrame, threshold: float, gain: float = BUDGET_GAIN) -> pd.DataFrame:
    """accuracy.csv with ``gain_last`` (:func:`curve_gains`) and ``outcome`` per member and k:
    ``solved`` (accuracy >= ``threshold``), ``budget-limited`` (below it, its curve still gaining
    more than ``gain`` over its last :data:`BUDGET_WINDOW` steps) or ``failed`` (below it otherwise,
    an unmeasured gain included)."""
    import numpy as np

    out = acc.drop(columns=["gain_last", "outcome"], errors="ignore")
    gains = curve_gains(curves)
    out = out.merge(gains.rename(columns={"gain": "gain_last"}), on=["member", "k"], how="left")
    limited = (out["gain_last"] > gain).fillna(False).astype(bool)
    solved = out["accuracy"] >= threshold
    out["outcome"] = np.where(solved, "solved", np.where(limited, "budget-limited", "failed"))
    return out


def budget_limited(acc: pd.DataFrame, d_model: int, k: int, measured: Any, seeds: int) -> str:
    """The depths at (``d_model``, ``k``) shallower than ``measured`` (every depth when it is NA)
    whose every seed is solved or budget-limited and at least one budget-limited, as "4" or "3 4"
    ("" when none, or when ``acc`` has no ``outcome``: :func:`outcomes`)."""
    import pandas as pd

    if "outcome" not in acc:
        return ""
    at = acc[~acc["control"].astype(bool) & (acc["d_model"] == d_model) & (acc["k"] == k)]
    if not pd.isna(measured):
        at = at[at["depth"] < measured]
    depths = []
    for depth, cell in at.groupby("depth", sort=True):
        seen = cell["outcome"]
        learning = seen.isin(["solved", "budget-limited"]).all() and (seen == "budget-limited").any()
        if cell["seed"].nunique() >= seeds and learning:
            depths.append(str(int(depth)))
    return " ".join(depths)


class KHop(LawExperiment):
    name = "khop"
    description = "k-hop induction (Sanford et al. 2024): the first depth that solves k hops, per k"
    Config = KHopConfig
    key = "k"
    law_columns: ClassVar[list[str]] = [
        "d_model",
        "k",
        "predicted_depth",
        "measured_depth",
        "difference",
        "budget_limited",
        "ceil_depth",
        "linear_depth",
        "authors_4_heads",
        "authors_8_heads",
    ]
    second = "accuracy_all"
    extra_tables = ("hops.csv", "hop_layers.csv")
    prediction = (
        "Prediction (Sanford, Hsu and Telgarsky 2024, ICML): depth Theta(log k) suffices for k-hop induction and "
        "is needed at small width; with pointers as well as answers L layers hold 2^(L-1) - 1 hops, so k hops need "
        "depth floor(log2 k) + 2 (law.csv's predicted_depth; the line on the heatmap). law.csv sets beside it the "
        "slower answers-only construction (ceil(log2 k) + 2), a linear rule (k + 1) and the first depths of the "
        "authors' own runs at 4 and 8 heads; budget_limited names the shallower depths whose members were still "
        "learning (more than 0.01 gained over the last 2,000 steps). A 2-layer control with at least the deepest "
        "member's parameters (where the study has one) tests that depth, not size, does it."
    )
    presets, costs = preset_table(
        {
            "smoke": Preset(
                "depths 1,2 at width 16, k 1,2, 40 steps: 3 members, 5-10 s on 2 CPU cores (the tests use it)",
                {**COMMON["smoke"], "ks": (1, 2), "length": 12, "letters": 3, "hop_sequences": 8},
            ),
            "cpu": Preset(
                "depths 1-5 and a wide 2-layer control at width 64, k 1-4, N 48, 2 seeds, 3,000 steps: 12 members, "
                "13 min with --jobs 2 on 2 CPU cores (measured, longest member first; 26 CPU-minutes)",
                {**COMMON["cpu"], "depths": (1, 2, 3, 4, 5)},
            ),
            "demo": Preset(
                "k 1,2 at depths 1-3 (width 64), N 48, 2 seeds, 1,000 steps, no control (k 3 and 4 left out: at CPU "
                "scale k = 3 has needed one layer more than floor(log2 k) + 2, docs/depth-laws.md): 6 members, 81 s "
                "wall with --jobs 2 on 2 idle CPU cores inside probe atlas (measured; 4.5 min and 2.9 CPU-minutes "
                "alone on shared cores)",
                {**COMMON["cpu"], "ks": (1, 2), "depths": (1, 2, 3), "steps": 1000, "control": False},
            ),
            "cpu-k8": Preset(
                "k 1-4 and 8 (log against linear depth: 5 layers against 9), depths 1-6 and a wide 2-layer control at "
                "width 64, N 48, 2 seeds, 5,000 steps: 14 members, 45 CPU-minutes, 36.5 min with --jobs 2 on 2 shared "
                "CPU cores (measured; docs/depth-laws.md)",
                {**COMMON["cpu"], "depths": (1, 2, 3, 4, 5, 6), "ks": (1, 2, 3, 4, 8), "steps": 5000},
            ),
            "staircase": Preset(
                "k 1-8 mixed, depths 2-5 at widths 32 and 64, N 48, 2 seeds, 8,000 steps, no control: 16 members, 76 "
                "CPU-minutes planned by --dry-run; measured with --jobs 2 on 2 shared CPU cores: width 32 86 min wall "
                "(33.8 CPU-minutes; the plan says 15.7), width 64 56 min wall (docs/depth-laws.md)",
                {
                    **COMMON["cpu"],
                    "depths": (2, 3, 4, 5),
                    "d_models": (32, 64),
                    "ks": (1, 2, 3, 4, 5, 6, 7, 8),
                    "steps": 8000,
                    "control": False,
                },
            ),
            "gpu": Preset(
                "N 100, k 1-16, depths 1-7 and a control at widths 128 and 256, 3 seeds, 20,000 steps: 45 members, "
                "about 2.4-3.1 hours on one NVIDIA H200 one member at a time, 1.3-1.6 hours with --jobs 3 "
                "(from rates measured on an H200 at these shapes; training only; the preset not run end to end)",
                {
                    **COMMON["gpu"],
                    "depths": (1, 2, 3, 4, 5, 6, 7),
                    "d_models": (128, 256),
                    "ks": (1, 2, 3, 4, 6, 8, 12, 16),
                    "length": 100,
                    "steps": 20000,
                    "hop_sequences": 128,
                },
            ),
        }
    )

    def groups(self, cfg: KHopConfig) -> list[LawGroup]:
        """One group: every member trains on all of ``ks`` mixed (no level of its own)."""
        return [LawGroup(None, None, cfg.vocab, 1 + cfg.length, wide_control(cfg, cfg.vocab, 1 + cfg.length))]

    def source(self, job: LawJob) -> BatchSource:
        from depthprobe.probes.training.sources import KHopSource

        cfg = job.config
        return KHopSource(cfg.ks, cfg.batch_size, cfg.length, cfg.letters, cfg.max_k, job.seed)

    def eval_sets(self, job: LawJob, n: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Per k, drawn from the evaluation seed space (never a training batch: probes.data.streams)."""
        from depthprobe.probes.data import khop

        cfg = job.config
        return {k: khop.eval_batch(k, n, cfg.length, cfg.letters, cfg.max_k, job.seed) for k in cfg.ks}

    def scores(self, job: LawJob, predict: Predict, sets: dict[int, Any]) -> dict[int, tuple[float, float]]:
        """Per k: accuracy over letter answers, and over all positions."""
        from depthprobe.probes.data import khop

        return {k: khop.accuracy(predict(x), y, job.config.letters) for k, (x, y) in sets.items()}

    def probe(self, job: LawJob, model: Model, folder: Path, source: BatchSource) -> None:
        """The hop-attention task (tables in runs/hop-attention): per head and hop (member, layer,
        head, hop, attention, chance), and per layer the largest hop resolved, the heads resolving
        it and the layer's largest attention to the previous token and to the previous occurrence
        of X_i, with their chance levels (:data:`HOP_LAYER_COLUMNS`)."""

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
        layers = result.summary.assign(member=job.name, depth=job.depth)
        write_csv(folder / "hops.csv", hops.reset_index(drop=True))
        write_csv(folder / "hop_layers.csv", layers[HOP_LAYER_COLUMNS])

    def middle(self, config: KHopConfig, tables: dict[str, pd.DataFrame]) -> list[str]:
        """The control against the deepest member, and the hop-attention summary (:func:`hop_section`)."""
        import pandas as pd

        return [*super().middle(config, tables), hop_section(tables.get("hop_layers.csv", pd.DataFrame()))]

    def tables(self, config: KHopConfig, members: pd.DataFrame, folder: Path) -> dict[str, pd.DataFrame]:
        """The law family's tables, with accuracy.csv's ``gain_last`` and ``outcome`` (:func:`outcomes`,
        from curves.csv) and law.csv's ``budget_limited`` read from them."""
        tables = super().tables(config, members, folder)
        if not tables["accuracy.csv"].empty:
            tables["accuracy.csv"] = outcomes(tables["accuracy.csv"], tables["curves.csv"], config.threshold)
            tables["law.csv"] = self.law(config, tables["accuracy.csv"])
        return tables

    def law(self, cfg: KHopConfig, accuracy: pd.DataFrame) -> pd.DataFrame:
        """Per width and k: the predicted (floor) and the measured first depth and their difference
        (measured - predicted; empty when no depth reached the threshold), the budget-limited depths
        (:func:`budget_limited`), and beside them the ceil and linear rules and the authors' first
        depths at 4 and 8 heads (:data:`AUTHORS_DEPTHS`; empty where they have none). Controls left out."""
        law = measured_depths(accuracy, ["d_model", "k"], cfg)
        law["predicted_depth"] = law["k"].map(predicted_depth)
        law["difference"] = law["measured_depth"] - law["predicted_depth"]
        law["budget_limited"] = [
            budget_limited(accuracy, d, k, m, cfg.seeds)
            for d, k, m in zip(law["d_model"], law["k"], law["measured_depth"], strict=True)
        ]
        law["ceil_depth"] = law["k"].map(ceil_depth)
        law["linear_depth"] = law["k"].map(linear_depth)
        for heads, depths in AUTHORS_DEPTHS.items():
            law[f"authors_{heads}_heads"] = law["k"].map(depths).astype("Int64")
        return law[self.law_columns]


def hop_section(layers: pd.DataFrame) -> str:
    """Per member and layer, the largest hop some head resolves (hop-attention task)."""
    from depthprobe.probes.render.html import table as html_table

    if layers.empty:
        return ""
    wide = layers.pivot_table(index=["member", "depth"], columns="layer", values="largest_hop", aggfunc="first")
    records = wide.rename(columns=lambda layer: f"layer {int(layer)}").reset_index().to_dict("records")
    return (
        "<h2>Hop attention</h2><p class='meta'>per member and layer: the largest hop j some head resolves "
        "(mean attention from i to p^j(i) >= 0.5 and >= 3x chance; 0: none). A construction reaching "
        "floor(log2 k) + 2 layers holds pointers as well as answers: its heads attend to i - 1 at layer 0, p(i) "
        "at layer 1 and p^(2^(l-1))(i) at layer l >= 2 (0, 1, 2, 4, ...), 2^(L-1) - 1 hops after L layers; "
        "hop_layers.csv also gives each layer's attention to i - 1 and to p(i) - 1. Attention is where a head "
        "looks, not proof of use.</p>" + html_table(records)
    )


__all__ = [
    "AUTHORS_DEPTHS",
    "KHop",
    "KHopConfig",
    "budget_limited",
    "ceil_depth",
    "curve_gains",
    "hop_section",
    "linear_depth",
    "outcomes",
    "predicted_depth",
]
