"""The offline report of a depth study (``probe study``): one self-contained ``report.html``.

Everything is read from the study folder; no model is loaded:

- ``study.json``: family, preset and the resolved config (``pairs`` for levine, ``corpus``);
- ``study.csv``: one row per member (status ``ok`` or ``failed`` with its ``error``);
- ``members/<member>/loss.csv``: the training curve (step, loss, val_loss, lr, tokens, elapsed_s);
- ``members/<member>/runs/<task>/``: the member's probe run folders (read with ``compare``).

The page: a header (family, preset, corpus, members ok/failed, device) and the member table, then
the family's plots, then for every family the kernel collapse at init vs after training and the
per-layer probe curves across depth. Failed members are listed with their error and left out of
every plot; a study without a finished member shows a note instead of plots.

Plots are inline SVG drawn here (lines with markers, seed spread as min-max error bars, optional
log x and zero line); the per-layer probe curves are ``compare.plot_svg`` figures embedded as
``data:`` images. Means and spreads are over seeds: the error bar of a point runs from the
smallest to the largest seed's value.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from depthprobe.probes.base.errors import ProbeError, suggest
from depthprobe.probes.render.report import table as html_table
from depthprobe.probes.render.viz import esc, page, write_atomic

FAMILIES = ("levine", "petty", "spa")
REQUIRED = ("family", "member", "depth", "val_loss", "status")
TASK_ORDER = ("induction", "kernels", "kernels-init", "attention-stats")
# the per-layer metric(s) drawn per task folder; the others are named in a note
PROBE_METRICS = {
    "induction": ("induction", "previous_token"),
    "kernels": ("mean_cosine",),
    "kernels-init": ("mean_cosine",),
    "attention-stats": ("entropy",),
}
MAX_PROBE_PLOTS = 4  # per task, when none of its preferred metrics is present
MAX_CURVE_POINTS = 400  # a training curve is thinned to at most this many steps (the last one kept)
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
SPREAD = "error bars: min to max over seeds"
EXPECTED = {
    "levine": (
        "Expected signature (Levine et al. 2020): deep minus shallow validation loss is about 0 at small "
        "budgets and clearly negative at large ones, and the crossover budget grows with the pair's depth. "
        "This page reports what the study measured; it does not test the expectation."
    ),
    "petty": (
        "Expected (Petty et al. 2023): loss falls steeply up to 3-4 layers, then flattens, then worsens once "
        "d_ff drops below d_model. This page reports what the study measured; it does not test the expectation."
    ),
    "spa": (
        "Expected (He et al. 2023): deep skipless vanilla trains far slower or not at all; E-SPA and U-SPA "
        "train; standard pre-LN is still best at equal steps. This page reports what the study measured; "
        "it does not test the expectation."
    ),
}


# ----------------------------------------------------------------------------------------------
# reading a study folder
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StudyData:
    """A study folder, read: its settings (study.json) and its member table (study.csv)."""

    folder: Path
    family: str
    preset: str | None
    config: dict[str, Any]
    table: pd.DataFrame  # study.csv, one row per member

    @property
    def ok(self) -> pd.DataFrame:
        """The finished members (status ok)."""
        return self.table[self.table["status"] == "ok"]

    @property
    def failed(self) -> pd.DataFrame:
        return self.table[self.table["status"] != "ok"]


def read_study(folder: Path) -> StudyData:
    """Read ``study.json`` and ``study.csv``; anything missing fails with one line naming the fix."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ProbeError(f"{folder} is not a folder; pass a study folder written by probe study")
    path = folder / "study.csv"
    if not path.is_file():
        raise ProbeError(f"{folder} has no study.csv; pass a study folder written by probe study")
    try:
        table = pd.read_csv(path, dtype={"member": str, "status": str, "error": str})
    except (OSError, ValueError) as exc:
        raise ProbeError(f"{path} cannot be read ({type(exc).__name__}); re-run probe study to rewrite it") from None
    missing = [c for c in REQUIRED if c not in table.columns]
    if missing:
        raise ProbeError(f"{path} has no {', '.join(missing)} column; re-run probe study to rewrite it")
    table["status"] = table["status"].fillna("").astype(str).str.strip()
    settings: dict[str, Any] = {}
    if (folder / "study.json").is_file():
        try:
            settings = json.loads((folder / "study.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ProbeError(
                f"{folder / 'study.json'} cannot be read ({type(exc).__name__}); re-run probe study to rewrite it"
            ) from None
        if not isinstance(settings, dict):
            raise ProbeError(f"{folder / 'study.json'} is not a JSON object; re-run probe study to rewrite it")
    family = settings.get("family") or next(iter(table["family"].dropna().astype(str)), None)
    if family not in FAMILIES:
        raise ProbeError(
            f"unknown study family {family!r} in {folder}{suggest(str(family), FAMILIES)}; "
            f"a study is one of: {', '.join(FAMILIES)}"
        )
    raw = settings.get("config")
    config: dict[str, Any] = raw if isinstance(raw, dict) else {}
    preset = settings.get("preset")
    return StudyData(folder, str(family), None if preset is None else str(preset), config, table)


# ----------------------------------------------------------------------------------------------
# numbers
# ----------------------------------------------------------------------------------------------


def budget_text(n: Any) -> str:
    """50000 -> '50K', 1600000 -> '1.6M' (a parameter budget for a legend or tick)."""
    v = float(n)
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(v) >= div:
            return f"{v / div:.3g}{unit}"
    return f"{v:.3g}"


def seed_spread(rows: pd.DataFrame, by: Sequence[str], value: str) -> pd.DataFrame:
    """Mean, min, max and count of ``value`` over the rows (seeds) of each ``by`` group; non-finite
    values are left out, and groups without a finite value are dropped."""
    v = pd.to_numeric(rows[value], errors="coerce")
    rows = rows.assign(_v=v)[np.isfinite(v)]
    if rows.empty:
        return pd.DataFrame(columns=[*by, "mean", "lo", "hi", "n"])
    g = rows.groupby(list(by), sort=True)["_v"]
    return pd.DataFrame({"mean": g.mean(), "lo": g.min(), "hi": g.max(), "n": g.count()}).reset_index()


def _pairs(study: StudyData) -> list[tuple[int, int]]:
    raw = study.config.get("pairs")
    if isinstance(raw, list) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in raw):
        return [(int(a), int(b)) for a, b in raw]
    depths = sorted({int(d) for d in study.ok["depth"]})
    return [(d, 2 * d) for d in depths if 2 * d in depths]


def levine_differences(study: StudyData) -> pd.DataFrame:
    """Deep minus shallow validation loss per pair (L, 2L), budget and seed, then over seeds.

    One row per (pair, budget) where both depths finished for at least one seed: ``shallow``,
    ``deep``, ``budget``, ``mean``, ``lo``, ``hi`` (min and max over seeds), ``n`` (seeds) and
    ``per_seed`` (seed -> difference).
    """
    ok = study.ok.assign(
        _budget=_num(study.ok, "budget").fillna(_num(study.ok, "params_nonembed")),
        _seed=_num(study.ok, "seed").fillna(0).astype(int),
        _loss=_num(study.ok, "val_loss"),
        _depth=_num(study.ok, "depth"),
    )
    ok = ok[np.isfinite(ok["_loss"]) & np.isfinite(ok["_budget"])]
    rows = []
    for shallow, deep in _pairs(study):
        a = ok[ok["_depth"] == shallow].groupby(["_budget", "_seed"])["_loss"].mean()
        b = ok[ok["_depth"] == deep].groupby(["_budget", "_seed"])["_loss"].mean()
        d = (b - a).dropna()
        for budget, per in d.groupby(level=0, sort=True):
            seeds = {int(s): float(v) for (_, s), v in per.items()}
            rows.append(
                {
                    "shallow": shallow,
                    "deep": deep,
                    "budget": float(budget),
                    "mean": float(np.mean(list(seeds.values()))),
                    "lo": min(seeds.values()),
                    "hi": max(seeds.values()),
                    "n": len(seeds),
                    "per_seed": seeds,
                }
            )
    return pd.DataFrame(rows, columns=["shallow", "deep", "budget", "mean", "lo", "hi", "n", "per_seed"])


def crossover(diffs: pd.DataFrame, shallow: int, deep: int) -> float | None:
    """The smallest budget from which every seed's deep-minus-shallow difference is below zero at
    that budget and at every larger one (None when there is none in the grid)."""
    d = diffs[(diffs["shallow"] == shallow) & (diffs["deep"] == deep)].sort_values("budget")
    found = None
    for budget, hi in zip(reversed(d["budget"].tolist()), reversed(d["hi"].tolist()), strict=True):
        if hi < 0:
            found = float(budget)
        else:
            break
    return found


# ----------------------------------------------------------------------------------------------
# direct SVG line charts
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Series:
    """One line of a chart: points (x, y), optional (lo, hi) error bars and point marks."""

    label: str
    points: tuple[tuple[float, float], ...]
    spread: tuple[tuple[float, float], ...] = ()  # one (lo, hi) per point, or none
    marks: tuple[str, ...] = ()  # one annotation per point ('' for none), or none
    dashed: bool = False
    color: str | None = None


def _finite(*v: float) -> bool:
    return all(isinstance(x, (int, float)) and math.isfinite(x) for x in v)


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi] (steps of 1, 2, 2.5 or 5 times a power of 10)."""
    if not hi > lo:
        lo, hi = lo - 0.5, hi + 0.5
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step - 1e-9) * step
    ticks = []
    t = start
    while t <= hi + step * 1e-9:
        ticks.append(0.0 if abs(t) < step * 1e-9 else t)
        t += step
    return ticks


def _tick(v: float) -> str:
    return f"{v:.4g}"


def chart_svg(
    series: Sequence[Series],
    *,
    title: str,
    x_label: str,
    y_label: str,
    log_x: bool = False,
    zero: bool = False,
    x_ticks: Sequence[tuple[float, str]] | None = None,
    width: int = 660,
    height: int = 320,
) -> str:
    """A line chart as inline SVG markup: each series a ``<g class='series' data-label=...>`` holding
    a polyline (its finite points, in order), a circle per point (with a hover title), min-max error
    bars (``<line class='spread'>``) and point marks; ``zero`` draws a line at y = 0 (class ``zero``).
    With ``log_x`` x is drawn on a log scale (points with x <= 0 are left out)."""
    kept: list[Series] = []
    for s in series:
        idx = [i for i, (x, y) in enumerate(s.points) if _finite(x, y) and (x > 0 or not log_x)]  # drawable points only
        kept.append(
            Series(
                s.label,
                tuple(s.points[i] for i in idx),
                tuple(s.spread[i] for i in idx) if s.spread else (),
                tuple(s.marks[i] for i in idx) if s.marks else (),
                s.dashed,
                s.color,
            )
        )
    xs = [x for s in kept for x, _ in s.points]
    ys = [y for s in kept for _, y in s.points]
    ys += [v for s in kept for lo_hi in s.spread for v in lo_hi if _finite(v)]
    if zero:
        ys.append(0.0)
    if not xs:
        return f"<p class='note'>{esc(title)}: no finite values to draw</p>"
    fx = (lambda v: math.log10(v)) if log_x else (lambda v: v)
    x0, x1 = min(fx(x) for x in xs), max(fx(x) for x in xs)
    if x1 == x0:
        x0, x1 = x0 - 0.5, x1 + 0.5
    pad = (x1 - x0) * 0.05
    x0, x1 = x0 - pad, x1 + pad
    yt = nice_ticks(min(ys), max(ys))
    y0, y1 = min(yt[0], min(ys)), max(yt[-1], max(ys))
    y0, y1 = y0 - (y1 - y0) * 0.04, y1 + (y1 - y0) * 0.04
    legend_rows = math.ceil(len(kept) / 3)
    left, right, top, plot_h = 64, 16, 28, height - 28 - 46
    total_h = height + 18 * legend_rows
    plot_w = width - left - right

    def px(x: float) -> float:
        return left + (fx(x) - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        return top + (1 - (y - y0) / ((y1 - y0) or 1.0)) * plot_h

    out = [
        f"<svg class='chart' width='{width}' height='{total_h}' viewBox='0 0 {width} {total_h}' role='img' "
        f"aria-label='{esc(title)}' font-family='DejaVu Sans, Arial, sans-serif' font-size='11'>",
        f"<rect width='{width}' height='{total_h}' fill='#ffffff'/>",
        f"<text x='{width / 2:g}' y='16' text-anchor='middle' font-size='13'>{esc(title)}</text>",
    ]
    for t in yt:
        y = py(t)
        out.append(f"<line x1='{left}' x2='{left + plot_w}' y1='{y:.1f}' y2='{y:.1f}' stroke='#e4e4e4'/>")
        out.append(f"<text x='{left - 5}' y='{y + 4:.1f}' text-anchor='end'>{esc(_tick(t))}</text>")
    if x_ticks is None:
        if log_x:
            lo_dec, hi_dec = math.ceil(x0), math.floor(x1)
            x_ticks = [(10.0**k, budget_text(10.0**k)) for k in range(lo_dec, hi_dec + 1)]
        else:
            x_ticks = [(t, _tick(t)) for t in nice_ticks(x0, x1) if x0 <= t <= x1]
    base = top + plot_h
    for t, text in x_ticks:
        if not (_finite(t) and (t > 0 or not log_x)):
            continue
        x = px(t)
        out.append(f"<line x1='{x:.1f}' x2='{x:.1f}' y1='{top}' y2='{base}' stroke='#efefef'/>")
        out.append(f"<text x='{x:.1f}' y='{base + 14}' text-anchor='middle'>{esc(text)}</text>")
    out.append(f"<rect x='{left}' y='{top}' width='{plot_w}' height='{plot_h}' fill='none' stroke='#888'/>")
    if zero:
        out.append(
            f"<line class='zero' x1='{left}' x2='{left + plot_w}' y1='{py(0):.1f}' y2='{py(0):.1f}' "
            "stroke='#000' stroke-width='1.2'/>"
        )
    scale = " (log scale)" if log_x else ""
    out.append(f"<text x='{left + plot_w / 2:g}' y='{base + 30}' text-anchor='middle'>{esc(x_label + scale)}</text>")
    out.append(
        f"<text transform='translate(14 {top + plot_h / 2:g}) rotate(-90)' text-anchor='middle'>{esc(y_label)}</text>"
    )
    for k, s in enumerate(kept):
        color = s.color or PALETTE[k % len(PALETTE)]
        dash = " stroke-dasharray='6 4'" if s.dashed else ""
        out.append(f"<g class='series' data-label='{esc(s.label)}'>")
        for (x, _), (lo, hi) in zip(s.points, s.spread, strict=True) if s.spread else []:
            if _finite(lo, hi) and hi > lo:
                X, a, b = px(x), py(lo), py(hi)
                out.append(
                    f"<line class='spread' x1='{X:.1f}' x2='{X:.1f}' y1='{a:.1f}' y2='{b:.1f}' stroke='{color}'/>"
                    f"<line x1='{X - 4:.1f}' x2='{X + 4:.1f}' y1='{a:.1f}' y2='{a:.1f}' stroke='{color}'/>"
                    f"<line x1='{X - 4:.1f}' x2='{X + 4:.1f}' y1='{b:.1f}' y2='{b:.1f}' stroke='{color}'/>"
                )
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
        out.append(f"<polyline class='line' points='{pts}' fill='none' stroke='{color}' stroke-width='1.6'{dash}/>")
        for i, (x, y) in enumerate(s.points):
            tip = f"{s.label}: x={_tick(x)}, y={y:.4g}"
            if s.spread and _finite(*s.spread[i]):
                tip += f" (seeds {s.spread[i][0]:.4g} to {s.spread[i][1]:.4g})"
            out.append(
                f"<circle cx='{px(x):.1f}' cy='{py(y):.1f}' r='3' fill='{color}'><title>{esc(tip)}</title></circle>"
            )
            if s.marks and s.marks[i]:
                right = px(x) > left + plot_w * 0.7  # near the right edge: the mark runs leftwards
                out.append(
                    f"<text class='mark' x='{px(x) + (-5 if right else 5):.1f}' y='{py(y) - 6:.1f}' font-size='10' "
                    f"text-anchor='{'end' if right else 'start'}' fill='#b00000'>{esc(s.marks[i])}</text>"
                )
        out.append("</g>")
    for k, s in enumerate(kept):
        color = s.color or PALETTE[k % len(PALETTE)]
        col, row = k % 3, k // 3
        lx, ly = left + col * (plot_w / 3), height + 4 + row * 18
        dash = " stroke-dasharray='6 4'" if s.dashed else ""
        out.append(
            f"<line x1='{lx:.1f}' x2='{lx + 22:.1f}' y1='{ly:.1f}' y2='{ly:.1f}' stroke='{color}' "
            f"stroke-width='2'{dash}/><text class='legend' x='{lx + 27:.1f}' y='{ly + 4:.1f}'>{esc(s.label)}</text>"
        )
    out.append("</svg>")
    return "".join(out)


def _series(label: str, agg: pd.DataFrame, x: str, **kw: Any) -> Series:
    agg = agg.sort_values(x)
    return Series(
        label,
        tuple(zip(agg[x].astype(float), agg["mean"].astype(float), strict=True)),
        tuple(zip(agg["lo"].astype(float), agg["hi"].astype(float), strict=True)),
        **kw,
    )


def _loss_vs_depth(lines: list[Series], depths: Sequence[float]) -> str:
    """The petty and spa figure: final validation loss against depth, one tick per depth."""
    chart = chart_svg(
        lines,
        title="validation loss vs depth",
        x_label="depth (layers)",
        y_label="validation loss (nats/token)",
        x_ticks=[(d, f"{int(d)}") for d in depths],
    )
    return _figure(chart)


def _figure(svg: str, caption: str = "") -> str:
    cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    return f"<figure class='plot'>{svg}{cap}</figure>"


# ----------------------------------------------------------------------------------------------
# the member table
# ----------------------------------------------------------------------------------------------

_INT_COLUMNS = {"depth", "d_model", "d_ff", "n_heads", "d_head", "budget", "params_nonembed", "params_embed"}
_INT_COLUMNS |= {"tokens", "seed", "step"}
_SCI_COLUMNS = {"flops", "lr"}


def cell_text(column: str, value: Any) -> str:
    """A study.csv cell as the member table shows it ('' for a missing value)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        v = float(value)
        if not math.isfinite(v):
            return str(v)
        if column in _INT_COLUMNS and v == int(v):
            return f"{int(v):,}"
        if column in _SCI_COLUMNS:
            return f"{v:.3g}"
        if column in ("wall_s", "tokens_per_s"):
            return f"{v:,.1f}"
        return f"{v:.4f}"
    return str(value)


# one line per member (the table scrolls sideways); only the error column wraps
MEMBERS_STYLE = (
    ".members table.data td, .members table.data th { white-space: nowrap; } "
    ".members table.data td:last-child { white-space: normal; min-width: 24em; }"
)


def members_table(study: StudyData) -> str:
    """study.csv as a table, numbers formatted; columns without a value in any row are left out."""
    t = study.table
    cols = [
        c for c in t.columns if c in ("member", "status") or (t[c].notna() & t[c].astype(str).str.strip().ne("")).any()
    ]
    records = [{c: cell_text(c, r[c]) for c in cols} for r in t.to_dict("records")]
    return f"<style>{MEMBERS_STYLE}</style><div class='members'>{html_table(records, cols)}</div>"


# ----------------------------------------------------------------------------------------------
# family sections
# ----------------------------------------------------------------------------------------------


def _num(df: pd.DataFrame, col: str) -> pd.Series:
    return pd.to_numeric(df[col], errors="coerce") if col in df.columns else pd.Series(np.nan, index=df.index)


def levine_section(study: StudyData) -> str:
    ok = study.ok.assign(budget=_num(study.ok, "budget"), depth=_num(study.ok, "depth"))
    ok = ok.assign(budget=ok["budget"].fillna(_num(ok, "params_nonembed")))
    agg = seed_spread(ok, ["depth", "budget"], "val_loss")
    budgets = sorted(set(agg["budget"].astype(float)))
    ticks = [(b, budget_text(b)) for b in budgets]
    lines = [_series(f"L={int(d)}", g, "budget") for d, g in agg.groupby("depth", sort=True)]
    parts = [
        "<h2>Validation loss vs non-embedding budget</h2>",
        f"<p class='meta'>One line per depth; mean over seeds, {SPREAD}. Budget: the target non-embedding "
        "parameter count (members match it within 1%).</p>",
        _figure(
            chart_svg(
                lines,
                title="validation loss vs budget",
                x_label="non-embedding parameters",
                y_label="validation loss (nats/token)",
                log_x=True,
                x_ticks=ticks,
            )
        ),
    ]
    diffs = levine_differences(study)
    parts.append("<h2>Deep minus shallow</h2>")
    parts.append(f"<p class='meta'>{esc(EXPECTED['levine'])}</p>")
    if diffs.empty:
        parts.append("<p class='note'>no pair has both depths finished at any budget; nothing to compare</p>")
        return "\n".join(parts)
    pair_lines = [
        _series(f"L={int(a)} vs L={int(b)}", g, "budget") for (a, b), g in diffs.groupby(["shallow", "deep"], sort=True)
    ]
    parts.append(
        f"<p class='meta'>val_loss(2L) - val_loss(L) for the same budget and seed; mean over seeds, "
        f"{SPREAD}; the black line is zero (below it the deeper member is better).</p>"
    )
    parts.append(
        _figure(
            chart_svg(
                pair_lines,
                title="deep minus shallow validation loss",
                x_label="non-embedding parameters",
                y_label="val_loss(2L) - val_loss(L)",
                log_x=True,
                zero=True,
                x_ticks=ticks,
            )
        )
    )
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
    parts.append("<div class='differences'>" + html_table(records) + "</div>")
    said = []
    for (a, b), _ in diffs.groupby(["shallow", "deep"], sort=True):
        c = crossover(diffs, a, b)
        where = (
            f"every seed below zero from {budget_text(c)} up"
            if c is not None
            else "not below zero for every seed at the largest budgets"
        )
        said.append(f"pair ({int(a)}, {int(b)}): {where}")
    parts.append(f"<p class='meta'>Measured: {esc('; '.join(said))}.</p>")
    return "\n".join(parts)


def _petty_group(study: StudyData, row: pd.Series) -> str:
    shrink = row.get("variant")
    if not isinstance(shrink, str) or not shrink:
        shrink = str(study.config.get("shrink", "d_ff"))
    budget = row.get("budget")
    b = budget_text(budget) if _finite(budget) else "?"
    return f"budget {b}, shrink {shrink}"


def petty_section(study: StudyData) -> str:
    ok = study.ok.assign(depth=_num(study.ok, "depth"))
    ok = ok.assign(group=[_petty_group(study, r) for _, r in ok.iterrows()])
    agg = seed_spread(ok, ["group", "depth"], "val_loss")
    lines = [_series(g, a, "depth") for g, a in agg.groupby("group", sort=False)]
    depths = sorted(set(ok["depth"].dropna().astype(float)))
    ticks = [(d, f"{int(d)}") for d in depths]
    parts = [
        "<h2>Validation loss vs depth</h2>",
        f"<p class='meta'>{esc(EXPECTED['petty'])}</p>",
        f"<p class='meta'>One line per budget and shrink mode; mean over seeds, {SPREAD}.</p>",
        _loss_vs_depth(lines, depths),
    ]
    shapes = ok.assign(d_ff=_num(ok, "d_ff"), d_model=_num(ok, "d_model"))
    shapes = shapes.sort_values("depth").drop_duplicates(["group", "depth"])
    width_lines = []
    for k, (g, s) in enumerate(shapes.groupby("group", sort=False)):
        color = PALETTE[k % len(PALETTE)]
        marks = tuple("d_ff < d_model" if f < m else "" for f, m in zip(s["d_ff"], s["d_model"], strict=True))
        width_lines.append(
            Series(f"d_ff, {g}", tuple(zip(s["depth"], s["d_ff"], strict=True)), marks=marks, color=color)
        )
        width_lines.append(
            Series(f"d_model, {g}", tuple(zip(s["depth"], s["d_model"], strict=True)), dashed=True, color=color)
        )
    narrow = shapes[shapes["d_ff"] < shapes["d_model"]]
    where = ", ".join(f"L={int(d)} ({g})" for d, g in zip(narrow["depth"], narrow["group"], strict=True))
    parts += [
        "<h2>Width vs depth</h2>",
        "<p class='meta'>d_ff (solid) and d_model (dashed) of each depth; points where d_ff &lt; d_model are "
        f"marked. d_ff below d_model at: {esc(where) if where else 'no depth'}.</p>",
        _figure(
            chart_svg(width_lines, title="d_ff vs depth", x_label="depth (layers)", y_label="width", x_ticks=ticks)
        ),
    ]
    return "\n".join(parts)


def _thin(df: pd.DataFrame, n: int = MAX_CURVE_POINTS) -> pd.DataFrame:
    if len(df) <= n:
        return df
    idx = np.unique(np.linspace(0, len(df) - 1, n).round().astype(int))
    return df.iloc[idx]


def read_losses(study: StudyData, members: Sequence[str]) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """member -> its loss.csv (step, loss; finite rows), and a note per member without a readable one."""
    out, notes = {}, []
    for m in members:
        path = study.folder / "members" / m / "loss.csv"
        if not path.is_file():
            notes.append(f"{m}: no loss.csv")
            continue
        try:
            df = pd.read_csv(path)
        except (OSError, ValueError) as exc:
            notes.append(f"{m}: loss.csv cannot be read ({type(exc).__name__})")
            continue
        if not {"step", "loss"} <= set(df.columns):
            notes.append(f"{m}: loss.csv has no step and loss columns")
            continue
        df = df.assign(step=pd.to_numeric(df["step"], errors="coerce"), loss=pd.to_numeric(df["loss"], errors="coerce"))
        bad = ~np.isfinite(df["loss"])
        if bad.any():
            first = df.loc[bad, "step"].iloc[0]
            notes.append(f"{m}: loss not finite from step {cell_text('step', first)} ({int(bad.sum())} steps left out)")
        out[m] = df[~bad & np.isfinite(df["step"])][["step", "loss"]]
    return out, notes


def spa_section(study: StudyData) -> str:
    ok = study.ok.assign(depth=_num(study.ok, "depth"), variant=study.ok.get("variant", "?"))
    ok = ok.assign(variant=ok["variant"].fillna("?").astype(str))
    curves, notes = read_losses(study, list(ok["member"]))
    variants = list(dict.fromkeys(ok["variant"]))
    color = {v: PALETTE[k % len(PALETTE)] for k, v in enumerate(variants)}
    parts = [
        "<h2>Training loss curves</h2>",
        f"<p class='meta'>{esc(EXPECTED['spa'])}</p>",
        "<p class='meta'>One plot per depth, one line per variant: training loss (loss.csv) at each step, "
        f"mean over the seeds that logged that step; long curves are thinned to {MAX_CURVE_POINTS} points.</p>",
    ]
    parts += [f"<p class='note'>{esc(n)}</p>" for n in notes]
    for depth, at in ok.groupby("depth", sort=True):
        lines = []
        for v in variants:
            frames = [curves[m] for m in at[at["variant"] == v]["member"] if m in curves]
            if not frames:
                continue
            mean = pd.concat(frames).groupby("step", sort=True)["loss"].mean().reset_index()
            mean = _thin(mean)
            lines.append(Series(v, tuple(zip(mean["step"], mean["loss"], strict=True)), color=color[v]))
        if lines:
            parts.append(
                _figure(
                    chart_svg(
                        lines, title=f"training loss, depth {int(depth)}", x_label="step", y_label="training loss"
                    )
                )
            )
    agg = seed_spread(ok, ["variant", "depth"], "val_loss")
    lines = [
        _series(v, agg[agg["variant"] == v], "depth", color=color[v]) for v in variants if (agg["variant"] == v).any()
    ]
    depths = sorted(set(ok["depth"].dropna().astype(float)))
    parts += [
        "<h2>Final validation loss vs depth</h2>",
        f"<p class='meta'>One line per variant; mean over seeds, {SPREAD}.</p>",
        _loss_vs_depth(lines, depths),
    ]
    return "\n".join(parts)


SECTIONS = {"levine": levine_section, "petty": petty_section, "spa": spa_section}


# ----------------------------------------------------------------------------------------------
# every family: kernel collapse and per-layer probe curves
# ----------------------------------------------------------------------------------------------


def _group(study: StudyData, row: pd.Series) -> str:
    if study.family == "levine":
        b = row.get("budget")
        return f"budget {budget_text(b)}" if _finite(b) else "budget ?"
    if study.family == "petty":
        return _petty_group(study, row)
    return str(row.get("variant") or "?")


def kernels_section(study: StudyData) -> str:
    ok = study.ok.assign(depth=_num(study.ok, "depth"))
    init, trained = _num(ok, "kernel_cos_last_init"), _num(ok, "kernel_cos_last")
    if not (np.isfinite(init).any() or np.isfinite(trained).any()):
        return ""
    ok = ok.assign(group=[_group(study, r) for _, r in ok.iterrows()])
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
            "trained - init": f"{b - a:+.4f}" if _finite(a, b) else "",
        }
        for m, d, a, b in zip(ok["member"], ok["depth"], init, trained, strict=True)
    ]
    depths = sorted(set(ok["depth"].dropna().astype(float)))
    return "\n".join(
        [
            "<h2>Kernel collapse at init and after training</h2>",
            "<p class='meta'>kernel_cos_last: mean cosine between token representations at the last layer "
            f"(1 = collapsed). Solid: after training; dashed: at init; mean over seeds, {SPREAD}.</p>",
            _figure(
                chart_svg(
                    lines,
                    title="last-layer kernel cosine vs depth",
                    x_label="depth (layers)",
                    y_label="kernel_cos_last",
                    x_ticks=[(d, f"{int(d)}") for d in depths],
                )
            ),
            html_table(records),
        ]
    )


_SEED = re.compile(r"-s\d+$")


def probe_members(study: StudyData) -> list[str]:
    """The finished members whose probe curves are drawn: one seed (the lowest) per configuration,
    a configuration being the member name without its ``-s<seed>`` suffix."""
    ok = study.ok.assign(
        _seed=_num(study.ok, "seed").fillna(0), _config=study.ok["member"].str.replace(_SEED, "", regex=True)
    )
    ok = ok.sort_values(["_config", "_seed"], kind="stable").drop_duplicates("_config")
    return list(study.ok["member"][study.ok["member"].isin(ok["member"])])


def _img(svg: str, alt: str) -> str:
    data = base64.b64encode(svg.encode("utf-8")).decode("ascii")
    return f"<img alt='{esc(alt)}' src='data:image/svg+xml;base64,{data}'>"


def probe_tasks(study: StudyData, members: Sequence[str]) -> dict[str, list[tuple[str, Path]]]:
    """task folder name -> [(member, run folder)] over ``members``, tasks in TASK_ORDER first."""
    from depthprobe.probes.render.compare import is_run_dir

    found: dict[str, list[tuple[str, Path]]] = {}
    for m in members:
        runs = study.folder / "members" / m / "runs"
        for d in sorted(runs.iterdir()) if runs.is_dir() else []:
            if not d.name.startswith(".") and is_run_dir(d):
                found.setdefault(d.name, []).append((m, d))
    order = [t for t in TASK_ORDER if t in found] + sorted(t for t in found if t not in TASK_ORDER)
    return {t: found[t] for t in order}


def probes_section(study: StudyData) -> str:
    from depthprobe.probes.render.compare import compare, peaks, plot_svg

    members = probe_members(study)
    tasks = probe_tasks(study, members)
    parts = ["<h2>Per-layer probe curves across depth</h2>"]
    if not tasks:
        parts.append("<p class='note'>no probe runs under members/*/runs; nothing to draw</p>")
        return "\n".join(parts)
    seeds = "one seed (the lowest) per configuration; " if len(members) < len(study.ok) else ""
    parts.append(
        f"<p class='meta'>Each line is one member ({seeds}label: member name); x is relative depth "
        "(block l at (l + 0.5) / L). Solid: the best head of each layer; dashed: the mean over heads. "
        "Every metric of a task: probe compare members/*/runs/TASK.</p>"
    )
    for task, runs in tasks.items():
        title = "kernels (at init)" if task == "kernels-init" else task
        parts.append(f"<h3>{esc(title)}</h3>")
        try:
            table = compare([p for _, p in runs])
        except ProbeError as exc:
            parts.append(f"<p class='error'>{esc(task)}: {esc(exc)}</p>")
            continue
        name = {str(p): m for m, p in runs}
        table = table.assign(label=table["run"].map(name).fillna(table["label"]))
        metrics = list(dict.fromkeys(table["metric"]))
        drawn = [m for m in PROBE_METRICS.get(task, ()) if m in metrics] or metrics[:MAX_PROBE_PLOTS]
        rest = [m for m in metrics if m not in drawn]
        peak = peaks(table[table["metric"].isin(drawn)])
        if len(peak):
            cols = ["metric", "label", "peak_layer", "peak_relative_depth", "peak_value", "layer_mean"]
            recs = [
                {c: (cell_text(c, r[c]) if c not in ("metric", "label", "peak_layer") else r[c]) for c in cols}
                for r in peak.to_dict("records")
            ]
            parts.append(html_table(recs, cols))
        parts += [f"<figure class='plot'>{_img(plot_svg(table, m), f'{task}: {m}')}</figure>" for m in drawn]
        if rest:
            parts.append(f"<p class='meta'>not drawn: {esc(', '.join(rest))}</p>")
    return "\n".join(parts)


# ----------------------------------------------------------------------------------------------
# the page
# ----------------------------------------------------------------------------------------------


def header(study: StudyData) -> tuple[str, list[str]]:
    """The page title and the header facts (family, preset, corpus, members ok/failed, device)."""
    n_ok, n_failed = len(study.ok), len(study.failed)
    devices = sorted({str(d) for d in study.ok.get("device", pd.Series(dtype=str)).dropna()})
    corpus = study.config.get("corpus") or "built-in Tiny Shakespeare"
    facts = [
        f"family {study.family}",
        f"preset {study.preset or 'none (explicit options)'}",
        f"corpus {corpus}",
        f"members {n_ok} ok, {n_failed} failed",
        f"device {', '.join(devices) if devices else 'unknown'}",
    ]
    return f"depthprobe study: {study.family}", facts


def render_study(folder: Path) -> str:
    """The study's report page (self-contained, offline) from the files of its folder."""
    study = read_study(folder)
    title, facts = header(study)
    parts = [f"<h1>{esc(title)}</h1>", "<p class='meta'>" + " · ".join(esc(f) for f in facts) + "</p>"]
    if len(study.failed):
        items = "".join(
            f"<li><b>{esc(m)}</b>: {esc(e if isinstance(e, str) and e else 'no error recorded')}</li>"
            for m, e in zip(study.failed["member"], study.failed.get("error", [None] * len(study.failed)), strict=True)
        )
        parts.append(f"<h2>Failed members</h2><p class='meta'>left out of every plot</p><ul class='error'>{items}</ul>")
    parts.append("<h2>Members</h2>" + members_table(study))
    if study.ok.empty:
        parts.append(
            f"<p class='note'>no member of this {esc(study.family)} study finished ({len(study.failed)} failed); "
            "there is nothing to plot. Fix the errors above and rerun probe study on the same folder "
            "(finished members are kept).</p>"
        )
    else:
        parts.append(SECTIONS[study.family](study))
        parts.append(kernels_section(study))
        parts.append(probes_section(study))
    if study.config:
        config = json.dumps(study.config, indent=2, ensure_ascii=False, default=str)
        parts.append(
            f"<h2>Study settings</h2><details><summary>study.json config</summary><pre>{esc(config)}</pre></details>"
        )
    return page(title, "\n".join(p for p in parts if p))


def write_report(folder: Path) -> Path:
    """Write ``folder/report.html`` (atomically: readers see the old page or the new one)."""
    folder = Path(folder)
    return write_atomic(folder / "report.html", render_study(folder))


__all__ = [
    "Series",
    "StudyData",
    "chart_svg",
    "levine_differences",
    "read_study",
    "render_study",
    "write_report",
]
