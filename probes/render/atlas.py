"""The atlas page: what depth buys, one section per finding (``probe atlas``).

Each section holds the paper's prediction beside the measurement (the finding's rows of
atlas.csv), its figures, what it shows and what it does not, the command that ran it, the command
that reproduces it at full scale with that command's measured cost, and a link to the finding's
own report. The page is one offline file (the page kit's: no script, no network reference);
figures are ``data:`` SVG images.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from depthprobe.probes.render.charts import heatmap_svg
from depthprobe.probes.render.html import esc, page, svg_img, table
from depthprobe.probes.render.laws import MIN_WIDTH
from depthprobe.probes.render.lines import Series, chart_svg

TITLE = "What depth buys: the depthprobe atlas"
ROW_COLUMNS = ["level", "prediction", "measured", "seeds", "verdict"]
SMOKE_NOTE = (
    "Smoke scale: every finding ran at its smallest settings to test the machinery, in seconds. "
    "These numbers do not show any finding; run probe atlas without --scale for the demo."
)
INTRO = (
    "Each section below ran at a small scale on this machine: the paper's prediction beside the "
    "measurement, what the run shows and what it does not, the command that ran it, and the command "
    "that reproduces it at full scale with its measured cost. Each finding's folder holds its full report."
)

# the atlas's own rules on top of the page kit's: commands wrap anywhere, figures sit side by side
STYLE = (
    "section code{overflow-wrap:anywhere} .figures{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start}"
    " .figures img{max-width:100%;height:auto}"
)


@dataclass(frozen=True)
class Section:
    """One finding's section, as data (the experiments layer fills it from the finding's folder)."""

    slug: str
    title: str
    paper: str
    prediction: str
    rows: Sequence[Mapping[str, Any]]
    figures: Sequence[tuple[str, str]]  # (standalone SVG, alt text)
    shows: str
    not_shows: str
    command: str
    full_command: str
    full_cost: str
    link: str


def section_html(s: Section) -> str:
    """One finding: prediction, measurement table, figures, what it shows, commands, link."""
    figures = "".join(
        f"<figure class='plot'>{svg_img(svg, alt)}<figcaption>{esc(alt)}</figcaption></figure>"
        for svg, alt in s.figures
    )
    cost = f" <span class='meta'>({esc(s.full_cost)})</span>" if s.full_cost else ""
    return (
        f"<section id='{esc(s.slug)}'><h2>{esc(s.title)}</h2>"
        f"<p class='meta'>{esc(s.paper)}</p>"
        f"<p><b>Prediction.</b> {esc(s.prediction)}</p>"
        f"<h3>Prediction beside measurement</h3>{table(list(s.rows), ROW_COLUMNS)}"
        f"<div class='figures'>{figures}</div>"
        f"<p><b>What it shows.</b> {esc(s.shows)}</p>"
        f"<p><b>What it does not show.</b> {esc(s.not_shows)}</p>"
        f"<p><b>This run:</b> <code>{esc(s.command)}</code></p>"
        f"<p><b>Full scale:</b> <code>{esc(s.full_command)}</code>{cost}</p>"
        f"<p><a href='{esc(s.link)}'>the full report of this run</a></p></section>"
    )


def atlas_page(sections: Sequence[Section], *, smoke: bool = False) -> str:
    """The whole page: a title, the scale's note, a table of contents, one section per finding."""
    toc = "".join(f"<li><a href='#{esc(s.slug)}'>{esc(s.title)}</a></li>" for s in sections)
    note = f"<p class='note'>{esc(SMOKE_NOTE)}</p>" if smoke else ""
    body = f"<style>{STYLE}</style><h1>{esc(TITLE)}</h1>{note}<p>{esc(INTRO)}</p><ul>{toc}</ul>"
    body += "".join(map(section_html, sections))
    return page(TITLE, body)


def first_depth_chart(
    predicted: Mapping[Any, Any], per_seed: Mapping[int, Mapping[Any, Any]], deepest: int, key: str = "k"
) -> tuple[str, str]:
    """The first depth that solves each level, per seed (points, each seed a little to the side so
    that equal values stay visible; a level no depth solved is drawn at ``deepest + 1``, marked
    'none'), beside the prediction (dashed)."""
    levels = sorted(predicted)
    lines = [Series("predicted", tuple((float(k), float(predicted[k])) for k in levels), dashed=True)]
    for i, (seed, firsts) in enumerate(sorted(per_seed.items())):
        dx = (i - (len(per_seed) - 1) / 2) * 0.08
        depth = [deepest + 1 if _blank(firsts.get(k)) else firsts[k] for k in levels]
        marks = tuple("none" if _blank(firsts.get(k)) else "" for k in levels)
        lines.append(
            Series(f"seed {seed}", tuple((k + dx, float(d)) for k, d in zip(levels, depth, strict=True)), marks=marks)
        )
    svg = chart_svg(
        lines,
        title=f"first depth that solves each {key}",
        x_label=key,
        y_label="first solving depth",
        zero=True,
        x_ticks=[(float(k), str(k)) for k in levels],
        x_range=(min(levels) - 0.5, max(levels) + 0.5),
        rules=[float(deepest)],
        standalone=True,
    )
    alt = (
        f"first solving depth per {key} and seed (offset sideways), beside the prediction (dashed); "
        "dotted: the deepest depth run"
    )
    return svg, alt


def accuracy_heatmap(
    values: np.ndarray, depths: Sequence[Any], keys: Sequence[Any], threshold: float
) -> tuple[str, str]:
    """Accuracy, depth x level (mean over seeds), drawn by the shared heatmap as on the law pages:
    a fixed 0-1 colour scale with the threshold marked, at least the law pages' width."""
    svg = heatmap_svg(
        values,
        list(depths),
        list(keys),
        row_title="depth",
        col_title="k",
        scale=(0.0, 1.0),
        threshold=threshold,
        title="accuracy (mean over seeds)",
        min_width=MIN_WIDTH,
    )
    return svg, (
        f"accuracy by depth (rows) and k (columns), mean over seeds, on a fixed 0-1 scale; outlined: at or above "
        f"{threshold:g}; solved: >= {threshold:g} in every seed"
    )


def block_chart(skip_output: Sequence[float], spare: float) -> tuple[str, str]:
    """1 - cos of the final states with each block skipped; dotted at the cut ``spare``."""
    series = Series("skip_output (1 - cos)", tuple((float(i), float(v)) for i, v in enumerate(skip_output)))
    svg = chart_svg(
        [series],
        title="how much skipping each block moves the final token states",
        x_label="skipped block",
        y_label="1 - cos",
        zero=True,
        x_ticks=[(float(i), str(i)) for i in range(len(skip_output))],
        rules=[spare],
        standalone=True,
    )
    return (
        svg,
        f"1 - cos of the final token states with one block skipped; dotted: {spare:g}, the cut for 'can be spared'",
    )


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or str(value) in ("<NA>", "nan")


__all__ = ["Section", "accuracy_heatmap", "atlas_page", "block_chart", "first_depth_chart"]
