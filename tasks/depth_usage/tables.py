"""What depth-usage writes: the tidy rows, the per-block summary, the notes and the three plots
(contribution curve, skip x later heatmap, logit-lens curve)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import torch

from depthprobe.probes.engine.task import Context, Output, tidy
from depthprobe.probes.models.model import Model
from depthprobe.probes.render.charts import heatmap_svg
from depthprobe.probes.render.lines import Series, chart_svg

PER_BLOCK = (
    "relative_contribution",
    "cosine",
    "attn_relative_contribution",
    "attn_cosine",
    "mlp_relative_contribution",
    "mlp_cosine",
    "skip_output",
    "skip_kl",
    "skip_top1",
)
PER_RESIDUAL = ("lens_kl", "lens_top1")  # layer l = the residual h_l (0 = embeddings, L = the last)
SKIP_COLUMNS = ("skipped", "later")


def score_rows(means: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    """Tidy rows: per block ``layer`` (contributions; skip_* with ``skipped`` = layer), per skipped
    block and later block ``skip_later`` (``layer`` = ``skipped`` = s, ``later`` = j > s), per
    residual h_l the lens rows."""
    rows: list[dict[str, Any]] = []
    for metric in (*PER_BLOCK, *PER_RESIDUAL):
        if metric in means:
            skip = metric.startswith("skip_")
            for layer, v in enumerate(means[metric].tolist()):
                rows.append({"layer": layer, "metric": metric, "value": v, "skipped": layer if skip else None})
    if "skip_later" in means:
        m = means["skip_later"]
        L = m.shape[0]
        rows += [
            {"layer": s, "metric": "skip_later", "value": float(m[s, j]), "skipped": s, "later": j}
            for s in range(L)
            for j in range(s + 1, L)
        ]
    return rows


def output_effect(means: dict[str, torch.Tensor]) -> tuple[str, list[float]]:
    """The metric that ranks blocks by how much skipping them changes the output: KL where the
    model has an unembedding, else 1 - cos of the final residual."""
    metric = "skip_kl" if "skip_kl" in means else "skip_output"
    return metric, means[metric].tolist() if metric in means else []


def summary_table(means: dict[str, torch.Tensor], n_layers: int) -> pd.DataFrame:
    """One row per block: its contribution, its sublayers', and the effect of skipping it."""
    rows = []
    for layer in range(n_layers):
        row: dict[str, Any] = {"layer": layer}
        for metric in PER_BLOCK:
            if metric in means:
                row[metric] = round(float(means[metric][layer]), 4)
        if "lens_kl" in means:
            row["lens_kl_after"] = round(float(means["lens_kl"][layer + 1]), 4)
        rows.append(row)
    return pd.DataFrame(rows)


def finish(means: dict[str, torch.Tensor], model: Model, ctx: Context[Any], tokens: int, texts: int) -> Output:
    """The task's Output from the means over tokens."""
    rows = [{"head": None, **dict.fromkeys(SKIP_COLUMNS), **r} for r in score_rows(means)]
    scores = tidy(rows, ctx.config.model, "depth-usage").astype({c: "Int64" for c in ("head", *SKIP_COLUMNS)})
    L = model.info.n_layers
    metric, effect = output_effect(means)
    headline: dict[str, Any] = {"n_texts": texts, "n_tokens": tokens, "n_layers": L}
    headline["relative_contribution"] = [round(float(v), 4) for v in means["relative_contribution"]]
    if effect:
        order = sorted(range(L), key=lambda i: effect[i])
        headline.update(output_effect_metric=metric, least_needed=order[0], most_needed=order[-1])
        headline["skip_effect"] = [round(v, 4) for v in effect]
    return Output(
        scores=scores,
        summary=summary_table(means, L),
        notes=notes(means, model, tokens, texts, headline),
        headline=headline,
        plots=plots(means),
    )


def notes(means: dict[str, torch.Tensor], model: Model, tokens: int, texts: int, head: dict[str, Any]) -> list[str]:
    out = [
        f"{texts} texts, {tokens} tokens, each text one sequence; every value is a mean over all tokens "
        "(special tokens included) of a per-token value; h_0 = the embeddings (blocks.0.hook_resid_pre), "
        "h_(l+1) = blocks.l.hook_resid_post, c_l = h_(l+1) - h_l",
    ]
    if "attn_relative_contribution" not in means:
        out.append(
            "the blocks are not sums of their sublayers' outputs (post-LN: a LayerNorm follows each sublayer), "
            "so c_l is the whole block's change, LayerNorm included, and no per-sublayer rows are given"
        )
    if "least_needed" in head:
        effect = head["skip_effect"]
        lo, hi = head["least_needed"], head["most_needed"]
        what = (
            "mean KL(p || p') of the output distribution"
            if head["output_effect_metric"] == "skip_kl"
            else ("mean 1 - cos(h_L', h_L) of the final residual")
        )
        out.append(
            f"skipping block {lo} changes the output least ({what} {effect[lo]:.4g}), block {hi} most "
            f"({effect[hi]:.4g}); a skipped block's output is its input, later blocks run as usual"
        )
    if "lens_kl" in means:
        out.append("logit lens: layer l is the residual h_l read through the model's head (0 = embeddings)")
    elif model.has_lm_head is False:
        out.append(f"{model.name} has no trained head over the vocabulary: no KL, top-1 or logit lens")
    return out


def plots(means: dict[str, torch.Tensor]) -> dict[str, str]:
    """The contribution curve, the skip x later heatmap and the logit-lens curve (standalone SVG)."""
    out: dict[str, str] = {}
    curves = [m for m in PER_BLOCK if m in means and not m.startswith("skip_")]
    out["contribution"] = chart_svg(
        [_series(m, means[m]) for m in curves],
        title="what each block adds: ||c_l|| / ||h_l|| and cos(c_l, h_l)",
        x_label="block l",
        y_label="value",
        zero=True,
        legend_cols=2,
        standalone=True,
    )
    if "skip_later" in means:
        m = means["skip_later"].numpy().copy()  # [skipped, later]
        L = m.shape[0]
        m[np.tril_indices(L)] = math.nan  # only later blocks j > s are defined
        if L > 1:  # rows: skipped 0..L-2, columns: later 1..L-1
            rows, cols = list(range(L - 1)), list(range(1, L))
            out["skip_later"] = heatmap_svg(m[:-1, 1:], rows, cols, row_title="skipped block", col_title="later block")
    if "lens_kl" in means:
        out["lens"] = chart_svg(
            [_series(m, means[m]) for m in PER_RESIDUAL],
            title="logit lens: KL(final || lens_l) and top-1 agreement",
            x_label="residual h_l (0 = embeddings)",
            y_label="value",
            zero=True,
            standalone=True,
        )
    return out


def _series(label: str, values: torch.Tensor) -> Series:
    return Series(label, tuple((float(i), float(v)) for i, v in enumerate(values.tolist())))
