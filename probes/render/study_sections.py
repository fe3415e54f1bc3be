"""The sections of a study's report: the family's own plots (levine, petty, spa), the kernel
collapse at init vs after training, and the per-layer probe curves across depth.

Plots are inline SVG line charts (``probes.render.lines``: lines with markers, seed spread as
min-max error bars, optional log x and zero line); the per-layer probe curves are
``probes.render.compare.plot_svg`` charts embedded as ``data:`` images. Failed members are left
out of every plot. The probe runs arrive compared (by ``probes.experiments.text``); nothing here
reads a run folder.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from depthprobe.probes.render.compare import plot_svg
from depthprobe.probes.render.html import esc, svg_img
from depthprobe.probes.render.html import table as html_table
from depthprobe.probes.render.lines import PALETTE, Series, budget_text, chart_svg, finite
from depthprobe.probes.render.study_data import (
    MAX_CURVE_POINTS,
    StudyData,
    cell_text,
    crossover,
    levine_differences,
    num,
    probe_members,
    read_losses,
    seed_spread,
    thin,
)

SPREAD = "error bars: min to max over seeds"
UNTESTED = "This page reports what the study measured; it does not test the expectation."
# ----------------------------------------------------------------------------------------------
# figures
# ----------------------------------------------------------------------------------------------


def _series(label: str, agg: pd.DataFrame, x: str, **kw: Any) -> Series:
    agg = agg.sort_values(x)
    return Series(
        label,
        tuple(zip(agg[x].astype(float), agg["mean"].astype(float), strict=True)),
        tuple(zip(agg["lo"].astype(float), agg["hi"].astype(float), strict=True)),
        **kw,
    )


def _figure(lines: list[Series], **chart: Any) -> str:
    """A line chart of the page (``probes.render.lines.chart_svg``)."""
    return f"<figure class='plot'>{chart_svg(lines, **chart)}</figure>"


def _depth_ticks(rows: pd.DataFrame) -> list[tuple[float, str]]:
    """A tick per depth of ``rows`` (their ``depth`` column, as numbers)."""
    return [(d, f"{int(d)}") for d in sorted(set(rows["depth"].dropna().astype(float)))]


def _loss_vs_depth(lines: list[Series], ticks: list[tuple[float, str]]) -> str:
    """The petty and spa figure: final validation loss against depth, one tick per depth."""
    y_label = "validation loss (nats/token)"
    return _figure(lines, title="validation loss vs depth", x_label="depth (layers)", y_label=y_label, x_ticks=ticks)


def _budget_figure(lines: list[Series], ticks: list[tuple[float, str]], **chart: Any) -> str:
    """levine's figures: against the non-embedding budget, log x, a tick per budget."""
    return _figure(lines, x_label="non-embedding parameters", log_x=True, x_ticks=ticks, **chart)


# ----------------------------------------------------------------------------------------------
# family sections
# ----------------------------------------------------------------------------------------------


def levine_section(study: StudyData, prediction: str) -> str:
    ok = study.ok.assign(budget=num(study.ok, "budget"), depth=num(study.ok, "depth"))
    agg = seed_spread(ok, ["depth", "budget"], "val_loss")
    ticks = [(b, budget_text(b)) for b in sorted(set(agg["budget"].astype(float)))]
    lines = [_series(f"L={int(d)}", g, "budget") for d, g in agg.groupby("depth", sort=True)]
    y_label = "validation loss (nats/token)"
    parts = [
        "<h2>Validation loss vs non-embedding budget</h2>",
        f"<p class='meta'>One line per depth; mean over seeds, {SPREAD}. Budget: the target non-embedding "
        "parameter count (members match it within 5%; each miss is budget_miss in members.csv).</p>",
        _budget_figure(lines, ticks, title="validation loss vs budget", y_label=y_label),
        "<h2>Deep minus shallow</h2>",
        f"<p class='meta'>{esc(prediction)} {UNTESTED}</p>",
    ]
    diffs = levine_differences(study)
    if diffs.empty:
        parts.append("<p class='note'>no pair has both depths finished at any budget; nothing to compare</p>")
    else:
        parts += _deep_minus_shallow(diffs, ticks)
    return "\n".join(parts)


def _deep_minus_shallow(diffs: pd.DataFrame, ticks: list[tuple[float, str]]) -> list[str]:
    """The deep-minus-shallow chart of every pair, its table and where each pair crosses zero."""
    pair_lines, said = [], []
    for (a, b), pair in diffs.groupby(["shallow", "deep"], sort=True):
        pair_lines.append(_series(f"L={int(a)} vs L={int(b)}", pair, "budget"))
        c = crossover(pair)
        where = (
            f"every seed below zero from {budget_text(c)} up"
            if c is not None
            else "not below zero for every seed at the largest budgets"
        )
        said.append(f"pair ({int(a)}, {int(b)}): {where}")
    records = [
        {
            "pair": f"({int(r.shallow)}, {int(r.deep)})",
            "budget": budget_text(r.budget),
            "mean": f"{r.mean:+.4f}",
            "min": f"{r.lo:+.4f}",
            "max": f"{r.hi:+.4f}",
            "seeds": int(r.n),
            "per seed": ", ".join(f"s{s}: {v:+.4f}" for s, v in sorted(r.per_seed.items())),
        }
        for r in diffs.itertuples()
    ]
    title, y_label = "deep minus shallow validation loss", "val_loss(2L) - val_loss(L)"
    return [
        f"<p class='meta'>val_loss(2L) - val_loss(L) for the same budget and seed; mean over seeds, "
        f"{SPREAD}; the black line is zero (below it the deeper member is better).</p>",
        _budget_figure(pair_lines, ticks, title=title, y_label=y_label, zero=True),
        "<div class='differences'>" + html_table(records) + "</div>",
        f"<p class='meta'>Measured: {esc('; '.join(said))}.</p>",
    ]


def petty_group(study: StudyData, row: pd.Series) -> str:
    """petty's lines: one per budget and shrink mode (every petty member has its budget; the study has
    one --shrink)."""
    return f"budget {budget_text(row['budget'])}, shrink {study.config['shrink']}"


def petty_section(study: StudyData, prediction: str) -> str:
    ok = study.ok.assign(depth=num(study.ok, "depth"), d_ff=num(study.ok, "d_ff"), d_model=num(study.ok, "d_model"))
    group = petty_group(study, ok.iloc[0])  # one line: a petty study has one budget and one --shrink
    ticks = _depth_ticks(ok)
    parts = [
        "<h2>Validation loss vs depth</h2>",
        f"<p class='meta'>{esc(prediction)} {UNTESTED}</p>",
        f"<p class='meta'>One line per budget and shrink mode; mean over seeds, {SPREAD}.</p>",
        _loss_vs_depth([_series(group, seed_spread(ok, ["depth"], "val_loss"), "depth")], ticks),
    ]
    shapes = ok.sort_values("depth").drop_duplicates("depth")
    depth, d_ff, d_model = shapes["depth"], shapes["d_ff"], shapes["d_model"]
    marks = tuple("d_ff < d_model" if f < m else "" for f, m in zip(d_ff, d_model, strict=True))
    width_lines = [
        Series(f"d_ff, {group}", tuple(zip(depth, d_ff, strict=True)), marks=marks, color=PALETTE[0]),
        Series(f"d_model, {group}", tuple(zip(depth, d_model, strict=True)), dashed=True, color=PALETTE[0]),
    ]
    where = ", ".join(f"L={int(d)} ({group})" for d in depth[d_ff < d_model])
    ratios = "; ".join(f"L={int(d)}: {f / m:.2f} ({group})" for d, f, m in zip(depth, d_ff, d_model, strict=True))
    parts += [
        "<h2>Width vs depth</h2>",
        "<p class='meta'>d_ff (solid) and d_model (dashed) of each depth; points where d_ff &lt; d_model are "
        f"marked. d_ff below d_model at: {esc(where) if where else 'no depth'}. d_ff/d_model: {esc(ratios)}. "
        "A ratio near 1 is the boundary, not the d_ff much smaller than d_model regime where Petty et al.'s "
        "curves turn up.</p>",
        _figure(width_lines, title="d_ff vs depth", x_label="depth (layers)", y_label="width", x_ticks=ticks),
    ]
    return "\n".join(parts)


def spa_section(study: StudyData, prediction: str) -> str:
    ok = study.ok.assign(depth=num(study.ok, "depth"))  # every spa member has a variant (its row, even failed)
    curves, notes = read_losses(study, list(ok["member"]))
    variants = list(dict.fromkeys(ok["variant"]))
    color = {v: PALETTE[k % len(PALETTE)] for k, v in enumerate(variants)}
    parts = [
        "<h2>Training loss curves</h2>",
        f"<p class='meta'>{esc(prediction)} {UNTESTED}</p>",
        "<p class='meta'>One plot per depth, one line per variant: training loss (loss.csv) at each step, "
        f"mean over the seeds that logged that step; long curves are thinned to {MAX_CURVE_POINTS} points.</p>",
    ]
    parts += [f"<p class='note'>{esc(n)}</p>" for n in notes]
    empty = pd.DataFrame(columns=["member", "step", "loss"])
    logged = pd.concat(curves, names=["member", None]).reset_index("member") if curves else empty
    for depth, at in logged.merge(ok[["member", "depth", "variant"]]).groupby("depth", sort=True):
        mean = at.groupby(["variant", "step"], sort=True)["loss"].mean()
        lines = [
            Series(v, tuple(thin(mean[v].reset_index()).itertuples(index=False, name=None)), color=color[v])
            for v in variants
            if v in mean.index
        ]
        parts.append(
            _figure(lines, title=f"training loss, depth {int(depth)}", x_label="step", y_label="training loss")
        )
    agg = seed_spread(ok, ["variant", "depth"], "val_loss")
    lines = [
        _series(v, agg[agg["variant"] == v], "depth", color=color[v]) for v in variants if (agg["variant"] == v).any()
    ]
    parts += [
        "<h2>Final validation loss vs depth</h2>",
        f"<p class='meta'>One line per variant; mean over seeds, {SPREAD}.</p>",
        _loss_vs_depth(lines, _depth_ticks(ok)),
    ]
    return "\n".join(parts)


# ----------------------------------------------------------------------------------------------
# every family: kernel collapse and per-layer probe curves
# ----------------------------------------------------------------------------------------------


def kernels_section(study: StudyData, group: Callable[[StudyData, pd.Series], str]) -> str:
    ok = study.ok.assign(depth=num(study.ok, "depth"))
    init, trained = num(ok, "kernel_cos_last_init"), num(ok, "kernel_cos_last")
    if not (np.isfinite(init).any() or np.isfinite(trained).any()):
        return ""
    ok = ok.assign(group=[group(study, r) for _, r in ok.iterrows()])
    lines = []
    for k, (g, rows) in enumerate(ok.groupby("group", sort=False)):
        color = PALETTE[k % len(PALETTE)]
        for col, when, dashed in (("kernel_cos_last", "trained", False), ("kernel_cos_last_init", "init", True)):
            agg = seed_spread(rows, ["depth"], col)
            if len(agg):
                lines.append(_series(f"{g}, {when}", agg, "depth", color=color, dashed=dashed))
    records = [
        {
            "member": m,
            "depth": cell_text("depth", d),
            "at init": cell_text("", a),
            "trained": cell_text("", b),
            "trained - init": f"{b - a:+.4f}" if finite(a, b) else "",
        }
        for m, d, a, b in zip(ok["member"], ok["depth"], init, trained, strict=True)
    ]
    return "\n".join(
        [
            "<h2>Kernel collapse at init and after training</h2>",
            "<p class='meta'>kernel_cos_last: mean cosine between token representations at the last layer "
            f"(1 = collapsed). Solid: after training; dashed: at init; mean over seeds, {SPREAD}.</p>",
            _figure(
                lines,
                title="last-layer kernel cosine vs depth",
                x_label="depth (layers)",
                y_label="kernel_cos_last",
                x_ticks=_depth_ticks(ok),
            ),
            html_table(records),
        ]
    )


TASK_TITLES = {"kernels-init": "kernels (at init)"}
# the per-layer metric(s) drawn per task folder; the others are named in a note
PROBE_METRICS = {
    "induction": ("induction", "previous_token"),
    "kernels": ("mean_cosine",),
    "kernels-init": ("mean_cosine",),
    "attention-stats": ("entropy",),
}
MAX_PROBE_PLOTS = 4  # per task, when none of its preferred metrics is present
PEAK_COLUMNS = ["metric", "label", "peak_layer", "peak_relative_depth", "peak_value", "layer_mean"]


def probes_section(study: StudyData, tasks: Mapping[str, tuple[pd.DataFrame, pd.DataFrame] | str]) -> str:
    """Per-layer probe curves across depth: per probe task of the drawn members, its peaks table and a
    plot per drawn metric; ``tasks``: task folder -> (the comparison table of its member runs, labelled
    by member name, and where each metric peaks; ``probes.api.compare``) or why its runs could not be
    compared."""
    parts = ["<h2>Per-layer probe curves across depth</h2>"]
    if not tasks:
        parts.append("<p class='note'>no probe runs under members/*/runs; nothing to draw</p>")
        return "\n".join(parts)
    seeds = "one seed (the lowest) per configuration; " if len(probe_members(study)) < len(study.ok) else ""
    parts.append(
        f"<p class='meta'>Each line is one member ({seeds}label: member name); x is relative depth "
        "(block l at (l + 0.5) / L). Solid: the best head of each layer; dashed: the mean over heads. "
        "Every metric of a task: probe compare members/*/runs/TASK.</p>"
    )
    for task, compared in tasks.items():
        parts.append(f"<h3>{esc(TASK_TITLES.get(task, task))}</h3>")
        if isinstance(compared, str):
            parts.append(f"<p class='error'>{esc(task)}: {esc(compared)}</p>")
            continue
        table, peak = compared
        metrics = list(dict.fromkeys(table["metric"]))
        drawn = [m for m in PROBE_METRICS.get(task, ()) if m in metrics] or metrics[:MAX_PROBE_PLOTS]
        peak = peak[peak["metric"].isin(drawn)] if len(peak) else peak
        if len(peak):
            recs = [
                {c: (r[c] if c in ("metric", "label", "peak_layer") else cell_text(c, r[c])) for c in PEAK_COLUMNS}
                for r in peak.to_dict("records")
            ]
            parts.append(html_table(recs, PEAK_COLUMNS))
        parts += [f"<figure class='plot'>{svg_img(plot_svg(table, m), f'{task}: {m}')}</figure>" for m in drawn]
        if len(drawn) < len(metrics):
            parts.append(f"<p class='meta'>not drawn: {esc(', '.join(m for m in metrics if m not in drawn))}</p>")
    return "\n".join(parts)


__all__ = ["kernels_section", "probes_section"]
