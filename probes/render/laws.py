"""The report sections of a depth-law study (``probe study --family khop``, ``groups``).

From the study's tables in memory (``probes.experiments.laws``): the prediction's text, the law
table (law.csv: the family's prediction against the measured depth), an accuracy heatmap depth x key
(per group where the family has groups) with law.csv's predicted first depth drawn on it as a line,
the wide shallow control against the deepest member, the learning curves per key (depth, control
and group from members.csv's columns) and the hop-attention summary, each a function that
:meth:`probes.experiments.laws.LawExperiment.page` puts in order. The runner's frame adds the
members and the settings. The page reports; it asserts nothing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from depthprobe.probes.render.charts import CELL, heatmap_svg
from depthprobe.probes.render.charts import LEFT as CHART_LEFT
from depthprobe.probes.render.charts import TOP as CHART_TOP
from depthprobe.probes.render.html import esc
from depthprobe.probes.render.html import table as html_table
from depthprobe.probes.render.lines import Series, chart_svg

NOTE = "This page reports what the study measured against the prediction; it does not test it."
# heatmap_svg's layout of annotated cells at its narrowest (probes.render.charts; predicted_line reads
# the layout of the heatmap it draws on from its data-grid)
CELL_W, CELL_H, LEFT, TOP = *CELL, CHART_LEFT, CHART_TOP
MIN_WIDTH = 480  # px: the narrowest accuracy heatmap
PREDICTED = "#d62728"  # the predicted first depth's line


def _keys(table: pd.DataFrame, key: str) -> list[str]:
    """What a law family's results are per: ``key``, after ``group`` where the family has groups."""
    return ["group", key] if "group" in table and table["group"].notna().any() else [key]


def _numbers(svg: str, pattern: str) -> list[float]:
    """The numbers of the first match of ``pattern`` in a heatmap's SVG (its root's attributes)."""
    found = re.search(pattern, svg)
    if found is None:
        raise ValueError(f"not a heatmap drawn by charts.heatmap_svg: no {pattern}")
    return [float(v) for g in found.groups() for v in g.split()]


def predicted_line(svg: str, depths: list[int], predicted: Sequence[int | None]) -> str:
    """The heatmap (``charts.heatmap_svg``, whose ``data-grid`` says where its cells are) with a
    red line over the top edge of each column's predicted depth (the bottom edge when the prediction
    is deeper than every row; no segment where a column's prediction is None), and the line's
    legend under the column title."""
    left, top, cw, ch = _numbers(svg, r'data-grid="([^"]+)"')
    segments: list[list[tuple[float, float]]] = [[]]
    for j, p in enumerate(predicted):
        if p is None:
            segments.append([])
            continue
        y = top + next((i for i, d in enumerate(depths) if d >= p), len(depths)) * ch
        segments[-1] += [(left + j * cw, y), (left + (j + 1) * cw, y)]
    path = " ".join("M" + " L".join(f"{x:g},{y:g}" for x, y in seg) for seg in segments if seg)
    width, height = (int(v) for v in _numbers(svg, r'width="(\d+)" height="(\d+)"'))
    y = height + 6
    line = (
        f'<path class="predicted" d="{path}" fill="none" stroke="{PREDICTED}" stroke-width="3">'
        "<title>predicted first depth (law.csv)</title></path>"
        f'<line x1="{left:g}" x2="{left + 24:g}" y1="{y:g}" y2="{y:g}" stroke="{PREDICTED}" stroke-width="3"/>'
        f'<text x="{left + 30:g}" y="{y + 4:g}">predicted first depth (law.csv)</text>'
    )
    grown = svg.replace(f'height="{height}"', f'height="{height + 18}"', 1).replace(
        f'viewBox="0 0 {width} {height}"', f'viewBox="0 0 {width} {height + 18}"', 1
    )
    grown = grown.replace(
        f'<rect width="{width}" height="{height}"', f'<rect width="{width}" height="{height + 18}"', 1
    )
    return grown[: grown.rindex("</svg>")] + line + "</svg>"


def _predicted(predicted: pd.DataFrame | None, keys: list[str], values: tuple, key: str) -> dict | None:
    """Column value -> law.csv's predicted first depth, for the heatmap at ``values`` of ``keys``."""
    if predicted is None or predicted.empty:
        return None
    at = predicted
    for k, v in zip(keys, values, strict=True):
        if k in at:
            at = at[at[k].astype(str) == str(v)]
    return {c: int(p) for c, p in zip(at[key], at["predicted_depth"], strict=True) if pd.notna(p)} or None


def heatmaps(
    key: str,
    acc: pd.DataFrame,
    law: pd.DataFrame,
    *,
    threshold: float | None = None,
    predicted: pd.DataFrame | None = None,
) -> str:
    """Accuracy heatmaps per width (and group, when the family has groups), depth x key, coloured on a
    fixed 0-1 scale with ``threshold`` marked, and law.csv's predicted first depth drawn on each as a
    line. ``predicted``: the cells' predictions (columns d_model, ``key``, predicted_depth, and group
    where the family has groups); default law.csv's rows where they are per ``key`` (khop: per k).
    Inline SVG, at least :data:`MIN_WIDTH` px wide."""
    main = acc[~acc["control"].astype(bool)]
    keys = ["d_model", "group"] if "group" in main and main["group"].notna().any() else ["d_model"]
    if predicted is None and {"predicted_depth", key} <= set(law):
        predicted = law
    parts = []
    for values, at in main.groupby(keys, sort=False):
        grid = at.pivot_table(index="depth", columns=key, values="accuracy", aggfunc="mean")  # nan: none finished
        depths, cols = grid.index.tolist(), grid.columns.tolist()
        what = ", ".join(f"{k} {v}" for k, v in zip(keys, values, strict=True))
        svg = heatmap_svg(
            grid.to_numpy(np.float64),
            depths,
            cols,
            row_title="depth",
            col_title=key,
            scale=(0.0, 1.0),
            threshold=threshold,
            title=f"accuracy, {what}",
            min_width=MIN_WIDTH,
        )
        said = [f"accuracy (mean over seeds) by depth and {key}, {what}; colours on a fixed 0-1 scale"]
        if threshold is not None:
            said.append(f"outlined: at or above the threshold {threshold:g} (the black mark on the colour bar)")
        at_cols = _predicted(predicted, keys, values, key)
        if at_cols is not None and any(c in at_cols for c in cols):  # a line over some column
            svg = predicted_line(svg, depths, [at_cols.get(c) for c in cols])
            said.append("red line: law.csv's predicted first depth (cells below it are predicted to solve)")
        parts.append(f"<figure class='lawmap'>{svg}<figcaption>{esc('; '.join(said))}</figcaption></figure>")
    return "<h2>Accuracy</h2><div class='lawmaps'>" + "".join(parts) + "</div>"


def curves(key: str, curve: pd.DataFrame, members: pd.DataFrame, threshold: float) -> str:
    """Learning curves: one chart per key (and group), a line per depth (mean over seeds; per depth
    and width when the members have several widths); depth, control, group and d_model come from
    members.csv's columns."""
    if curve.empty:
        return ""
    cols = [c for c in ("member", "depth", "control", "group", "d_model") if c in members]
    curve = curve.merge(members[cols], on="member", how="left")
    if "d_model" not in curve:
        curve["d_model"] = 0
    main = curve[~curve["control"].astype(bool)]
    widths = main["d_model"].nunique() > 1  # a line per depth and width: seeds of one width only
    keys = _keys(curve, key)
    charts = []
    for group, at in curve.groupby(keys, sort=True):
        series = []
        for (depth, control, width), line in at.groupby(["depth", "control", "d_model"], sort=True):
            mean = line.groupby("step")["accuracy"].agg(["mean", "min", "max"])
            label = f"control L{int(depth)}" if control else f"depth {int(depth)}"
            label += f", d_model {int(width)}" if widths and not control else ""
            points = tuple(zip(mean.index.astype(float), mean["mean"], strict=True))
            spread = tuple(zip(mean["min"], mean["max"], strict=True))
            series.append(Series(label, points, spread=spread, dashed=bool(control)))
        name = " ".join(f"{k} {v}" for k, v in zip(keys, group, strict=True))
        charts.append(
            chart_svg(
                series,
                title=f"accuracy during training, {name}",
                x_label="step",
                y_label="accuracy",
                rules=(threshold,),
                width=460,
                height=260,
            )
        )
    return (
        "<h2>Learning curves</h2><p class='meta'>error bars: min to max over seeds; dotted: the threshold</p>"
        + "".join(charts)
    )


def control(key: str, acc: pd.DataFrame, members: pd.DataFrame) -> str:
    """The wide shallow control's accuracies next to the deepest member's, with parameter counts."""
    ctrl = acc[acc["control"].astype(bool)]
    if ctrl.empty:
        return ""
    main = acc[~acc["control"].astype(bool)]
    deepest = main[main["depth"] == main["depth"].max()]
    keys = _keys(acc, key)
    params = members.set_index("member")["params"] if "params" in members else pd.Series(dtype=float)
    parts = []
    for label, part in (("wide 2-layer control", ctrl), (f"depth {main['depth'].max()}", deepest)):
        at = part.groupby(keys, sort=True).agg(
            d_model=("d_model", "first"), member=("member", "first"), mean=("accuracy", "mean")
        )
        parts.append(at.reset_index().assign(model=label))
    rows = pd.concat(parts)
    rows["params"] = rows["member"].map(params).fillna(0).astype(int)
    rows["accuracy (mean over seeds)"] = rows["mean"].map(round, ndigits=4)
    return (
        "<h2>Wide shallow control</h2><p class='meta'>2 layers with at least the deepest member's "
        "parameters (counted from the built models)</p>"
        + html_table(rows.to_dict("records"), ["model", "d_model", "params", *keys, "accuracy (mean over seeds)"])
    )


def blank_reason(at: pd.DataFrame, threshold: float, seeds: int) -> str:
    """Why a law row has no measured depth, from the accuracies behind it (one row per member;
    columns depth, seed, accuracy): which depth came closest, over how many seeds."""
    if at.empty:
        return "no member at this setting finished"
    by = at.groupby("depth")["accuracy"].agg(["min", "max", "count"])
    reached = at.assign(ok=at["accuracy"] >= threshold).groupby("depth")["ok"].sum()
    full = by[(by["min"] >= threshold)]
    if not full.empty:  # every finished seed reached it, but seeds are missing
        d = int(full.index[0])
        return f"depth {d} reached {threshold:g} in its {int(by.loc[d, 'count'])} finished seed(s) of {seeds}"
    d = int(by["min"].idxmax())  # the shallowest depth whose worst seed came closest
    lo, hi, n = by.loc[d, "min"], by.loc[d, "max"], int(by.loc[d, "count"])
    return f"no depth reached {threshold:g} in every seed (best: depth {d}, accuracy {lo:.3f}" + (
        f" to {hi:.3f} over {n} seeds, {int(reached[d])} of {n} at the threshold)" if n > 1 else ")"
    )


def law_table(law: pd.DataFrame, acc: pd.DataFrame, threshold: float) -> str:
    """law.csv as a table, with the reason for each blank measured depth (the accuracies behind it:
    acc's rows, controls left out, whose values equal the law row's in every column both share)."""
    records = law.astype(object).where(law.notna(), "").to_dict("records")
    main = acc[~acc["control"].astype(bool)] if "control" in acc else acc
    shared = [c for c in law.columns if c in main.columns and c not in ("depth", "seed", "accuracy")]
    seeds = int(main["seed"].nunique()) if "seed" in main else 1
    blank = any(r.get("measured_depth") == "" for r in records)
    for rec in records if blank else []:
        at = main.loc[(main[shared] == pd.Series({c: rec[c] for c in shared})).all(axis=1)] if shared else main
        rec["why no measured depth"] = blank_reason(at, threshold, seeds) if rec["measured_depth"] == "" else ""
    note = (
        f"<p class='meta'>measured depth: the smallest depth whose accuracy is at least {threshold:g} in every "
        "seed; a blank one says why.</p>"
        if blank
        else ""
    )
    return "<h2>The law</h2>" + note + html_table(records)


def intro(prediction: str) -> str:
    """The prediction's text, and what the page does with it."""
    return f"<p>{esc(prediction)} {esc(NOTE)}</p>"


__all__ = ["blank_reason", "control", "curves", "heatmaps", "intro", "law_table", "predicted_line"]
