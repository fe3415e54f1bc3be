"""Run reports: one self-contained, offline HTML page per run directory (``report.html``).

Contents, top to bottom: title, model and task, notes, the summary table, headline numbers,
layer x head heatmaps (the panels the task listed in summary.json's ``heatmaps``; without any,
one per metric of scores.csv that has a single value per layer and head), the attention views of
views.json (circuitsvis, bundle inlined once), the task's plots (plots/*.svg), the run's files
and its manifest. Every string from a run (model names, tokens, notes, file names, table cells)
is escaped; plots are embedded as ``data:`` images, which can neither run script nor fetch.

``write_report(run_dir)`` renders a run directory (called by ``Result.save`` and by
``probe report RUN_DIR``); ``result_html(result)`` is the notebook display of a Result.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard
from urllib.parse import quote

import numpy as np
import pandas as pd

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.render.attention import MAX_TOKENS, View, inline_frame, views_html
from depthprobe.probes.render.charts import heatmap_svg as draw_heatmap
from depthprobe.probes.render.html import esc, no_paths, notebook_bundle, page, svg_img, table, write_atomic

MAX_DEFAULT_PANELS = 12  # heatmaps drawn when the task lists none (one per metric)
MAX_PANELS = 48  # panels drawn at most; the rest are named in a note
ANNOTATE_CELLS = 16 * 16  # write the value in every cell up to this many cells


# ----------------------------------------------------------------------------------------------
# reading a run directory
# ----------------------------------------------------------------------------------------------


@dataclass
class RunData:
    """Everything a report shows, read from a run directory or taken from a Result."""

    summary: dict[str, Any]
    scores: pd.DataFrame | None = None
    manifest: dict[str, Any] | None = None
    views: list[dict[str, Any]] = field(default_factory=list)
    plots: dict[str, str] = field(default_factory=dict)  # name -> SVG text
    files: list[tuple[str, int]] = field(default_factory=list)  # (relative path, bytes)
    problems: list[str] = field(default_factory=list)  # what could not be read

    @classmethod
    def read(cls, run_dir: Path) -> RunData:
        run_dir = Path(run_dir)
        if not run_dir.is_dir():
            raise ProbeError(f"{run_dir} is not a directory; pass a run directory written by probe run")
        try:
            summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ProbeError(f"{run_dir} has no summary.json; pass a run directory written by probe run") from None
        except (OSError, ValueError) as exc:
            raise ProbeError(f"{run_dir / 'summary.json'} cannot be read ({exc}); re-run the task") from None
        if not isinstance(summary, dict):
            raise ProbeError(f"{run_dir / 'summary.json'} is not a JSON object; re-run the task")
        data = cls(summary=summary)
        data.scores = data._read("scores.csv", run_dir, lambda p: pd.read_csv(p))
        data.manifest = data._read("manifest.json", run_dir, lambda p: json.loads(p.read_text(encoding="utf-8")))
        views = data._read("views.json", run_dir, lambda p: json.loads(p.read_text(encoding="utf-8")))
        if views is not None and not isinstance(views, list):
            data.problems.append("views.json is not a list of views")
            views = None
        data.views = views or []
        for svg in sorted((run_dir / "plots").glob("*.svg")) if (run_dir / "plots").is_dir() else []:
            try:
                data.plots[svg.stem] = svg.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                data.problems.append(f"plots/{svg.name} cannot be read: {exc}")
        data.files = file_sizes(run_dir)
        return data

    def _read(self, name: str, run_dir: Path, reader: Any) -> Any:
        path = run_dir / name
        if not path.exists():
            return None
        try:
            return reader(path)
        except Exception as exc:  # a damaged artifact is reported in the page, not fatal
            self.problems.append(f"{name} cannot be read: {type(exc).__name__}: {exc}")
            return None


# ----------------------------------------------------------------------------------------------
# tables
# ----------------------------------------------------------------------------------------------


def _key_values(d: Mapping[str, Any]) -> str:
    return table([{"name": k, "value": v} for k, v in d.items()], ["name", "value"])


# ----------------------------------------------------------------------------------------------
# heatmaps
# ----------------------------------------------------------------------------------------------


def _matches(column: pd.Series, value: Any) -> pd.Series:
    """Rows whose ``column`` equals ``value``, robust to the CSV round trip (1 vs 1.0, True vs 'True')."""
    if isinstance(value, bool):
        return column.astype(str).str.lower() == str(value).lower()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return pd.to_numeric(column, errors="coerce") == value
    return column.astype(str) == str(value)


def _has_grid(scores: pd.DataFrame | None) -> TypeGuard[pd.DataFrame]:
    return scores is not None and not scores.empty and {"layer", "head", "metric", "value"} <= set(scores.columns)


def panel_matrix(scores: pd.DataFrame, panel: Mapping[str, Any]) -> tuple[pd.DataFrame, int]:
    """Rows of ``scores`` for one panel pivoted to layer x head (mean of duplicates); rows used."""
    rows = scores[_matches(scores["metric"], panel.get("metric"))]
    for col, value in (panel.get("where") or {}).items():
        if col not in rows.columns:
            raise ValueError(f"scores.csv has no column {col!r}")
        rows = rows[_matches(rows[col], value)]
    rows = rows.dropna(subset=["layer", "head"])
    rows = rows.assign(
        layer=rows["layer"].astype(int),
        head=rows["head"].astype(int),
        value=pd.to_numeric(rows["value"], errors="coerce"),
    )
    return _mean_grid(rows["layer"].to_numpy(), rows["head"].to_numpy(), rows["value"].to_numpy(float)), len(rows)


def _mean_grid(layers: np.ndarray, heads: np.ndarray, values: np.ndarray) -> pd.DataFrame:
    """layer x head means of the finite values (NaN where a cell has none), rows and columns sorted;
    what ``pivot_table(aggfunc="mean")`` gives, without its cost."""
    ls, hs = np.unique(layers), np.unique(heads)
    li, hi = np.searchsorted(ls, layers), np.searchsorted(hs, heads)
    ok = np.isfinite(values)
    total = np.zeros((len(ls), len(hs)))
    count = np.zeros((len(ls), len(hs)))
    np.add.at(total, (li[ok], hi[ok]), values[ok])
    np.add.at(count, (li[ok], hi[ok]), 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        grid = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    return pd.DataFrame(grid, index=pd.Index(ls, name="layer"), columns=pd.Index(hs, name="head"))


def default_panels(scores: pd.DataFrame | None) -> tuple[list[dict[str, Any]], list[str]]:
    """One panel per metric with exactly one value per layer and head (up to a limit)."""
    if not _has_grid(scores):
        return [], []
    panels, skipped = [], []
    grid_rows = scores.dropna(subset=["layer", "head"])
    for metric, g in grid_rows.groupby("metric", sort=False):
        if g.duplicated(["layer", "head"]).any():
            skipped.append(str(metric))
        else:
            panels.append({"title": str(metric), "metric": metric, "where": {}})
    notes = []
    if skipped:
        notes.append(
            f"no default heatmap for {', '.join(skipped)}: several rows per layer and head "
            "(the task can list panels with a 'where' selection)"
        )
    if len(panels) > MAX_DEFAULT_PANELS:
        notes.append(
            f"{len(panels) - MAX_DEFAULT_PANELS} more metrics not drawn "
            f"({', '.join(str(p['metric']) for p in panels[MAX_DEFAULT_PANELS:])}); see scores.csv"
        )
        panels = panels[:MAX_DEFAULT_PANELS]
    return panels, notes


def heatmap_svg(grid: pd.DataFrame) -> str:
    """A layer x head heatmap (layer 0 at the top) as SVG text, drawn directly (``charts.heatmap_svg``)."""
    values = grid.to_numpy(dtype=float)  # [layer, head]
    return draw_heatmap(values, list(grid.index), list(grid.columns), annotate=values.size <= ANNOTATE_CELLS)


def heatmaps_html(scores: pd.DataFrame | None, panels: Sequence[Mapping[str, Any]]) -> str:
    notes: list[str] = []
    if not panels:
        panels, notes = default_panels(scores)
    if not panels:
        return ""
    if not _has_grid(scores):
        return (
            "<h2>Heatmaps</h2><p class='error'>the task listed heatmap panels but scores.csv has no "
            "layer/head/metric/value rows</p>"
        )
    if len(panels) > MAX_PANELS:
        notes.append(f"{len(panels) - MAX_PANELS} more panels not drawn; see scores.csv")
        panels = panels[:MAX_PANELS]
    figures = []
    for panel in panels:
        title = str(panel.get("title") or panel.get("metric"))
        try:
            grid, n_rows = panel_matrix(scores, panel)
        except (ValueError, TypeError) as exc:
            figures.append(f"<figure class='heatmap'><h3>{esc(title)}</h3><p class='error'>{esc(exc)}</p></figure>")
            continue
        where = ", ".join(f"{k}={v}" for k, v in (panel.get("where") or {}).items())
        caption = f"metric {panel.get('metric')}" + (f" where {where}" if where else "")
        if grid.empty:
            figures.append(
                f"<figure class='heatmap'><h3>{esc(title)}</h3>"
                f"<p class='error'>no rows of scores.csv match ({esc(caption)})</p></figure>"
            )
            continue
        if n_rows > grid.notna().sum().sum():
            caption += f"; mean of {n_rows} rows over {int(grid.notna().sum().sum())} cells"
        figures.append(
            f"<figure class='heatmap'><h3>{esc(title)}</h3>{svg_img(heatmap_svg(grid), title)}"
            f"<figcaption>{esc(caption)}</figcaption></figure>"
        )
    note_html = "".join(f"<p class='note'>{esc(n)}</p>" for n in notes)
    return f"<h2>Layer x head heatmaps</h2>{note_html}<div class='heatmaps'>{''.join(figures)}</div>"


# ----------------------------------------------------------------------------------------------
# the page
# ----------------------------------------------------------------------------------------------


def _views(raw: Sequence[Any]) -> tuple[list[View], list[str]]:
    views, errors = [], []
    for i, d in enumerate(raw):
        try:
            if not isinstance(d, Mapping):
                raise ValueError("not an object")
            views.append(View.from_dict(dict(d)))
        except (ValueError, TypeError) as exc:
            title = d.get("title", "") if isinstance(d, Mapping) else ""
            errors.append(f"view {i} {title!s}: {exc}")
    return views, errors


def _plots_html(plots: Mapping[str, str]) -> str:
    if not plots:
        return ""
    figs = "".join(
        f"<figure class='plot'>{svg_img(svg, name)}<figcaption>{esc(name)}.svg</figcaption></figure>"
        for name, svg in plots.items()
    )
    return f"<h2>Plots</h2>{figs}"


def _files_html(files: Sequence[tuple[str, int]]) -> str:
    if not files:
        return ""
    items = "".join(
        f"<li><a href=\"{esc(quote(name))}\">{esc(name)}</a> <span class='meta'>({size:,} bytes)</span></li>"
        for name, size in files
    )
    return f"<h2>Files</h2><ul>{items}</ul>"


def _header(data: RunData) -> tuple[str, str]:
    s, m = data.summary, data.manifest or {}
    task, model = s.get("task", "?"), no_paths(s.get("model", "?"))
    title = f"depthprobe: {task} on {model}"
    info = m.get("model") or {}
    facts = []
    if info.get("depths"):  # a sweep: one model per depth, each described in the table
        facts.append(f"{info.get('name', model)}: a sweep over depths {', '.join(map(str, info['depths']))}")
    elif info:
        kind = "decoder" if info.get("causal") else "encoder"
        facts.append(
            f"{info.get('resolved', model)}: {kind}, {info.get('n_layers')} layers x "
            f"{info.get('n_heads')} heads, d_model {info.get('d_model')}"
        )
    for key in ("created", "device", "git_commit"):
        if m.get(key):
            facts.append(f"{key.replace('_', ' ')} {m[key]}")
    config = m.get("config") or {}
    if config.get("data"):
        facts.append(f"data {config['data']}")
    meta = " · ".join(esc(no_paths(f)) for f in facts)  # no absolute path of this machine
    head = (
        f"<h1>{esc(title)}</h1><p class='meta'>model <b>{esc(model)}</b> · task <b>{esc(task)}</b>"
        f"{' · ' + meta if meta else ''}</p>"
    )
    return title, head


def render(data: RunData) -> str:
    """The report page for one run."""
    title, head = _header(data)
    s = data.summary
    parts = [head]
    parts += [f"<p class='error'>{esc(p)}</p>" for p in data.problems]
    notes = s.get("notes") or []
    if notes:
        parts.append("<h2>Notes</h2><ul class='notes'>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>")
    parts.append("<h2>Summary</h2>" + table(s.get("summary") or []))
    extra = {**(s.get("counts") or {}), **(s.get("headline") or {})}
    if extra:
        parts.append(f"<details><summary>headline numbers and counts</summary>{_key_values(extra)}</details>")
    parts.append(heatmaps_html(data.scores, s.get("heatmaps") or []))
    views, errors = _views(data.views)
    payloads: list[dict[str, Any]] = []
    if views or errors:
        body, payloads = views_html(views, MAX_TOKENS)
        errs = "".join(f"<p class='error'>{esc(e)}</p>" for e in errors)
        parts.append(
            "<h2>Attention views</h2><p class='meta'>Click a head to enlarge it; hover a cell or a "
            f"token for values. Rows attend from (queries), columns attend to (keys).</p>{errs}{body}"
        )
    parts.append(_plots_html(data.plots))
    parts.append(_files_html(data.files))
    if data.manifest:
        manifest = json.dumps(data.manifest, indent=2, ensure_ascii=False)
        parts.append(
            f"<h2>Run details</h2><details><summary>manifest.json</summary><pre>{esc(manifest)}</pre></details>"
        )
    return page(title, "\n".join(p for p in parts if p), payloads)


def file_sizes(run_dir: Path) -> list[tuple[str, int]]:
    """(relative path, bytes) of every file of a run folder but its report, sorted."""
    return sorted(
        (p.relative_to(run_dir).as_posix(), p.stat().st_size)
        for p in Path(run_dir).rglob("*")
        if p.is_file() and p.name != "report.html"
    )


def write_report(run_dir: Path) -> Path:
    """Render ``run_dir/report.html`` from the run's saved files (``probe report``); returns its path."""
    return write_page(Path(run_dir), RunData.read(Path(run_dir)))


def write_page(run_dir: Path, data: RunData) -> Path:
    """Render ``data`` as ``run_dir/report.html``, the one builder of a run's page (a Result being
    saved passes its data from memory, ``probe report`` reads it from the folder).

    A failure while drawing (a bug, not bad input) still writes a page: the summary, the notes
    and the error, so that a finished run is never lost to its report; a warning says so.
    """
    try:
        text = render(data)
    except Exception as exc:
        import warnings

        message = f"the full report could not be drawn: {type(exc).__name__}: {exc}"
        warnings.warn(f"{run_dir}: {message}", RuntimeWarning, stacklevel=2)
        fallback = RunData(summary=data.summary, problems=[*data.problems, message], files=data.files)
        text = render(fallback)
    return write_atomic(run_dir / "report.html", text)


_NOTEBOOK_STYLE = """<style>
.depthprobe table.data { border-collapse: collapse; margin: 6px 0; }
.depthprobe table.data th, .depthprobe table.data td { border: 1px solid #ddd; padding: 2px 6px; text-align: left; }
.depthprobe .heatmaps { display: grid; grid-template-columns: repeat(auto-fill, minmax(360px, 1fr)); gap: 10px 16px; }
.depthprobe figure.heatmap img { width: 100%; height: auto; }
.depthprobe figure.plot img { max-width: 100%; height: auto; }
.depthprobe figure { margin: 0; } .depthprobe h3 { font-size: 13px; margin: 6px 0 2px; }
.depthprobe .meta, .depthprobe figcaption { color: #666; font-size: 12px; }
</style>"""


def _views_frame(raw: Sequence[Any], title: str) -> str:
    """A run's attention views as an inline page (iframe srcdoc: the report's own CSP and loader)."""
    views, errors = _views(list(raw))
    if not views:
        return "".join(f"<p class='error'>{esc(e)}</p>" for e in errors)
    body, payloads = views_html(views)
    frame = page(title, body, payloads, bundle=notebook_bundle())  # the bundle once per notebook
    return "<h2>Attention views</h2>" + inline_frame(frame, title, height=80 + 560 * len(views))


def result_html(result: Any) -> str:
    """Notebook display of a Result: notes, summary, heatmaps and plots (no script)."""
    data = RunData(summary=result.summary_json(), scores=result.scores)
    title = f"depthprobe: {result.task} on {result.model_info['name']}"
    parts = [f"<h2>{esc(title)}</h2>"]
    parts.append("<ul>" + "".join(f"<li>{esc(n)}</li>" for n in result.notes) + "</ul>")
    parts.append(table(data.summary["summary"]))
    parts.append(heatmaps_html(result.scores, result.heatmaps))
    parts.append(_plots_html(result.plots))
    parts.append(_views_frame(result.views, title))
    return f"{_NOTEBOOK_STYLE}<div class='depthprobe'>{''.join(p for p in parts if p)}</div>"
