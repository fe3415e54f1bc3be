"""What a finished induction run reports besides its scores: the heatmap titles, the summary table,
the notes and the K-composition table written to ``k_composition.csv``.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

import pandas as pd
import torch

from depthprobe.probes.base.scores import head_label
from depthprobe.probes.models.model import Model

if TYPE_CHECKING:
    from depthprobe.tasks.induction.task import Options, State


TITLES = {
    "induction": "induction score A[i, i-S+1]",
    "previous_token": "previous-token score A[i, i-1]",
    "duplicate_token": "duplicate-token score A[i, i-S]",
    "copying": "copying score (eigenvalues of W_E W_V W_O W_U)",
    "k_composition_max": "K-composition with the best earlier head",
    "k_composition_max_init": "K-composition with the best earlier head, at initialisation",
}


def icl_note(model: Model, o: Options, level: dict[str, float], icl: dict) -> str:
    if "icl_score" in level:
        early, late = icl["icl_positions"]
        source = "Tiny Shakespeare (built in)" if o.icl_text is None else o.icl_text
        return (
            f"ICL score (Olsson et al.): loss at token {late} minus loss at token {early} = "
            f"{level['icl_score']:.3f} +- {icl['icl_score_se']:.3f} nats, {icl['icl_windows']} windows of "
            f"{icl['icl_context']} tokens of {source}"
        )
    if not model.info.causal:
        return "no ICL score: an encoder sees both sides of every token, so it has no next-token loss to compare"
    if model.tokenizer is None:
        return "no ICL score: the model has no tokenizer, so there is no natural text to score it on"
    if o.icl_windows == 0:
        return "no ICL score: icl_windows=0"
    return f"no ICL score: a context of {model.info.max_len} tokens is too short for two positions"


def run_notes(
    state: State,
    o: Options,
    chance: dict[str, float],
    means: dict[str, torch.Tensor],
    model_level: dict[str, float],
    icl: dict,
) -> list[str]:
    """The notes of a finished run: inputs, chance levels, K-composition trained and at
    initialisation (native models), the repeat copying score (causal models) and the ICL score."""
    model = state.model
    notes = [
        f"{state.n} sequences of {'[BOS] r r' if model.info.causal else '[CLS] r r [SEP]'} with "
        f"|r| = {state.repeat_len} distinct random ordinary tokens; heads are L-H, 0-indexed",
        "chance (1 / attendable positions, averaged over the scored queries): "
        + ", ".join(f"{k} {v:.4f}" for k, v in chance.items()),
    ]
    if "k_composition_max_init" in means:
        trained, init = means["k_composition_max"][1:], means["k_composition_max_init"][1:]
        notes.append(
            f"K-composition with the best earlier head, layers 1+: trained {float(trained.min()):.3f}-"
            f"{float(trained.max()):.3f} (mean {float(trained.mean()):.3f}); the same architecture at "
            f"initialisation (seed {(model.info.native or {}).get('seed')}) {float(init.min()):.3f}-"
            f"{float(init.max()):.3f} (mean {float(init.mean()):.3f})"
        )
    if model.info.causal:
        notes.append(
            f"repeat copying score (loss on the second copy minus the first): "
            f"{model_level['repeat_copying_score']:.3f} nats"
        )
    notes.append(icl_note(model, o, model_level, icl))
    return notes


def summarise(scores: pd.DataFrame, top: int, model_level: dict[str, float]) -> pd.DataFrame:
    """Per metric: mean, chance level, heads over 0.5 and the top heads (L-H, 0-indexed)."""
    out = []
    for metric, g in scores.groupby("metric", sort=False):
        best = g.nlargest(top, "value")
        chance = g["chance"].iloc[0]
        out.append(
            {
                "metric": metric,
                "mean": round(float(g["value"].mean()), 4),
                "chance": None if pd.isna(chance) else round(float(chance), 4),
                "heads_over_0.5": int((g["value"] > 0.5).sum()),
                "top_heads": ", ".join(f"{head_label(r.layer, r.head)} ({r.value:.2f})" for r in best.itertuples()),
            }
        )
    for metric, value in model_level.items():
        out.append({"metric": metric, "mean": round(value, 4), "chance": None, "heads_over_0.5": None, "top_heads": ""})
    df = pd.DataFrame(out)
    df["heads_over_0.5"] = df["heads_over_0.5"].astype("Int64")  # counts stay integers beside the blanks
    return df


def composition_csv(comp: torch.Tensor) -> str:
    n_l, n_h = comp.shape[0], comp.shape[1]
    rows = [
        {"src_layer": l1, "src_head": h1, "layer": l2, "head": h2, "k_composition": float(comp[l1, h1, l2, h2])}
        for l1 in range(n_l)
        for h1 in range(n_h)
        for l2 in range(l1 + 1, n_l)
        for h2 in range(n_h)
    ]
    buf = io.StringIO()
    pd.DataFrame(rows).to_csv(buf, index=False)
    return buf.getvalue()
