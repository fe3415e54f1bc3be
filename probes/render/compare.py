"""The comparison page of ``probe compare``: per-layer curves of runs of one task across models of
different depth and width, on one relative-depth axis, from the comparison table.

The table and its peaks are built by ``probes.api.compare`` (which reads the run folders); here
they are only drawn: a models table, a peaks table and one line chart per metric (best head
solid, mean over heads dashed, a line per model), each chart embedded as a ``data:`` image.
"""

from __future__ import annotations

import pandas as pd

from depthprobe.probes.render.html import esc, page, svg_img
from depthprobe.probes.render.html import table as html_table
from depthprobe.probes.render.lines import PALETTE, Series, chart_svg

MAX_PLOTS = 24  # metrics drawn in report.html at most; the rest are named in a note


def plot_svg(table: pd.DataFrame, metric: str) -> str:
    """Best-head value (solid) and mean over heads (dashed) against relative depth, a line per model."""
    rows = table[table["metric"] == metric]
    lines = []
    for k, label in enumerate(dict.fromkeys(rows["label"])):
        g = rows[rows["label"] == label].sort_values("relative_depth")
        color = PALETTE[k % len(PALETTE)]
        depth = [float(x) for x in g["relative_depth"]]
        top = tuple(zip(depth, (float(v) for v in g["best_value"]), strict=True))
        lines.append(Series(str(label), top, color=color))
        if (g["heads"] > 1).any():
            mean = tuple(zip(depth, (float(v) for v in g["head_mean"]), strict=True))
            lines.append(Series(f"{label}, head mean", mean, dashed=True, color=color))
    best = "smallest" if rows["better"].iloc[0] == "lower" else "largest"
    has_heads = (rows["heads"] > 1).any()
    y_label = metric + (f" (best head: {best}; dashed: head mean)" if has_heads else "")
    return chart_svg(
        lines,
        title=metric,
        x_label="relative depth",
        y_label=y_label,
        x_ticks=[(t, f"{t:g}") for t in (0.0, 0.25, 0.5, 0.75, 1.0)],
        x_range=(0.0, 1.0),
        standalone=True,
    )


def render(table: pd.DataFrame, peak: pd.DataFrame) -> str:
    """The offline comparison page: models, peaks table (``peak``: where each metric peaks per
    model), one plot per metric."""
    task = str(table["task"].iloc[0]) if len(table) else "?"
    models = table.drop_duplicates("label")
    title = f"depthprobe compare: {task}, {len(models)} model" + ("" if len(models) == 1 else "s")
    parts = [
        f"<h1>{esc(title)}</h1>",
        (
            "<p class='meta'>Each line is one model, labelled with its depth L and width d; x is relative depth "
            "(blocks at (layer + 0.5) / L, residual-stream positions between blocks at positions / L). "
            "Solid: the best head of each layer; dashed: the mean over heads.</p>"
        ),
    ]
    parts.append(
        "<h2>Models</h2>"
        + html_table(models[["label", "model", "n_layers", "d_model", "n_heads", "run"]].to_dict("records"))
    )
    metrics = list(dict.fromkeys(table["metric"]))
    parts.append(
        "<h2>Where each behaviour peaks</h2><p class='meta'>peak = the layer whose best head is best "
        "(largest value; smallest for entropy, loss and perplexity; ties to the lowest layer); "
        "sharpness = |peak - mean over layers|.</p>"
    )
    cols = [
        "metric",
        "label",
        "peak_layer",
        "peak_relative_depth",
        "peak_head",
        "peak_value",
        "layer_mean",
        "sharpness",
        "first_value",
        "last_value",
        "margin_at_peak",
    ]
    cols = [c for c in cols if c in peak.columns and peak[c].notna().any()]
    records = peak.astype(object).where(peak.notna(), None).to_dict("records")  # NA cells print empty
    parts.append(html_table(records, cols) if len(peak) else "<p class='meta'>(no values)</p>")
    drawn = metrics[:MAX_PLOTS]
    parts.append("<h2>Per-layer curves</h2>")
    if len(metrics) > MAX_PLOTS:
        parts.append(
            f"<p class='note'>{len(metrics) - MAX_PLOTS} more metrics not drawn "
            f"({esc(', '.join(metrics[MAX_PLOTS:]))}); pick them with probe compare --metric</p>"
        )
    parts += [f"<figure class='plot'><h3>{esc(m)}</h3>{svg_img(plot_svg(table, m), m)}</figure>" for m in drawn]
    parts.append(
        "<h2>Files</h2><ul><li><a href='compare.csv'>compare.csv</a> (one row per model, layer, metric)"
        "</li><li><a href='peaks.csv'>peaks.csv</a></li><li><a href='compare.json'>compare.json</a></li></ul>"
    )
    return page(title, "\n".join(parts))


__all__ = ["plot_svg", "render"]
