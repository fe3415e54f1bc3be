"""Comparing runs of one task across models of different depth and width, on one depth axis.

``compare(runs)`` reads run folders (written by ``probe run``; no model is loaded) and returns a
tidy table with one row per (model, layer, metric); ``save(table, out)`` writes ``compare.csv``,
``peaks.csv``, ``compare.json`` and an offline ``report.html`` (drawn by ``probes.render.compare``).
The rules, also in docs/compare.md:

- **Run folder**: a folder holding ``manifest.json`` and ``scores.csv`` (one with no rows is refused, never
  dropped). Any other folder (a study, a folder of runs) stands for every run folder below it, at any depth;
  hidden folders (``.*.partial``, unfinished writes) are skipped and a run folder is not searched inside.
- **Metric**: a metric of ``scores.csv`` together with the values of its *selector* columns, joined by
  ``/`` (``accuracy/nsubj/dependent->head`` for syntax, ``accuracy/pronoun`` for coref). A selector
  is a text column that takes several values for the same layer, head and metric; columns that
  are fixed by the layer and head (a hook name, Clark's notation) are not selectors. Nothing here
  knows a task's metric names, so new metrics need no change.
- **Relative depth**: rows of a block (attention heads) sit at ``(layer + 0.5) / n_layers``, the
  middle of the block. Residual-stream rows sit between blocks: ``blocks.i.hook_resid_pre`` at
  ``i / n_layers``, ``hook_resid_mid`` at ``(i + 0.5) / n_layers``, ``hook_resid_post`` at
  ``(i + 1) / n_layers`` (so the embeddings are at 0 and the last block's output at 1); a run
  without hook names whose layers run 0..n_layers is read the same way (layer l after l blocks).
- **Best**: the best head of a layer has the largest value, except for metrics whose name contains
  ``entropy``, ``loss`` or ``perplexity``, where it has the smallest.
  Ties go to the lowest head; a layer's peak ties go to the lowest layer. The ``better`` column says
  which (``higher`` or ``lower``). Rows without heads
  (per-layer metrics) have one value per layer: best and mean are that value.
- **Baselines**: syntax, per relation, the best fixed offset (the run's ``baselines.csv``; ties to
  the offset nearest 0, then the leftward one, as the task does); coref, per mention type or GAP
  gender, the strongest of the run's baselines (its summary, in percent, divided by 100).
  ``margin`` = best head minus baseline (baseline minus best for lower-is-better metrics).
- A selector column whose name is one of the table's own columns is kept as ``scores_<name>``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from depthprobe.probes.base import artifacts
from depthprobe.probes.base.errors import ProbeError, suggest
from depthprobe.probes.base.scores import SCORE_COLUMNS
from depthprobe.probes.render.compare import render

RUN_FILES = ("manifest.json", "scores.csv")
LOWER_IS_BETTER = ("entropy", "loss", "perplexity")
DEFAULT_ROOT = Path("artifacts") / "compare"
COLUMNS = [
    "task",
    "model",
    "label",
    "n_layers",
    "d_model",
    "n_heads",
    "layer",
    "relative_depth",
    "metric",
    "better",
    "best_value",
    "best_head",
    "head_mean",
    "heads",
    "baseline",
    "baseline_name",
    "margin",
    "run",
]
_HOOK = re.compile(r"^blocks\.(\d+)\.hook_resid_(pre|mid|post)$")
_HOOK_OFFSET = {"pre": 0.0, "mid": 0.5, "post": 1.0}
_NO_BASELINE_ROWS = {"mentions evaluated", "examples", "best head"}  # coref summary rows that are not baselines


@dataclass(frozen=True)
class Run:
    """One run folder, read."""

    path: Path
    task: str
    model: str
    n_layers: int
    d_model: int
    n_heads: int | None
    scores: pd.DataFrame
    summary: dict[str, Any]


# ----------------------------------------------------------------------------------------------
# finding and reading run folders
# ----------------------------------------------------------------------------------------------


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and all((path / f).is_file() for f in RUN_FILES)


def _below(root: Path) -> list[Path]:
    found = []
    for here, dirs, _files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        if is_run_dir(Path(here)):
            found.append(Path(here))
            dirs[:] = []  # a run folder's own subfolders (plots/) hold no runs
    return found


def find_runs(paths: Iterable[str | Path]) -> list[Path]:
    """Run folders named by ``paths``: each is a run folder, or a folder searched for run folders."""
    folders = [Path(p) for p in paths]
    if not folders:
        raise ProbeError("no run folders given; pass two or more run folders written by probe run, or a study folder")
    out: list[Path] = []
    for p in folders:
        if not p.exists():
            raise ProbeError(f"{p} does not exist; pass a run folder written by probe run (or a study folder)")
        if not p.is_dir():
            raise ProbeError(f"{p} is not a folder; pass a run folder written by probe run (or a study folder)")
        found = [p] if is_run_dir(p) else _below(p)
        if not found:
            raise ProbeError(
                f"{p} holds no run folders (folders with manifest.json and scores.csv); "
                "pass folders written by probe run"
            )
        out += found
    seen: set[Path] = set()
    unique = []
    for p in out:
        if p.resolve() not in seen:
            seen.add(p.resolve())
            unique.append(p)
    return unique


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ProbeError(f"{path} cannot be read ({type(exc).__name__}); re-run the task to rewrite it") from None


def read_run(path: Path) -> Run:
    """Read one run folder; anything missing fails with one line naming the folder."""
    path = Path(path)
    manifest = _json(path / "manifest.json")
    config = manifest.get("config") if isinstance(manifest, dict) else None
    info = manifest.get("model") if isinstance(manifest, dict) else None
    if not isinstance(config, dict) or not isinstance(info, dict) or not config.get("task"):
        raise ProbeError(f"{path / 'manifest.json'} names no task and model; pass a run folder written by probe run")
    if info.get("source") == "sweep":
        raise ProbeError(
            f"{path} is a probe sweep (several models in one table); compare the probe run "
            "folders of single models instead"
        )
    for key in ("n_layers", "d_model"):
        if not isinstance(info.get(key), int) or info[key] < 1:
            raise ProbeError(
                f"{path / 'manifest.json'} has no model {key}; re-run the task with probe run to record it"
            )
    try:
        scores = pd.read_csv(path / "scores.csv")
    except (OSError, ValueError) as exc:
        raise ProbeError(f"{path / 'scores.csv'} cannot be read ({type(exc).__name__}); re-run the task") from None
    missing = [c for c in ("layer", "metric", "value") if c not in scores.columns]
    if missing:
        raise ProbeError(f"{path / 'scores.csv'} has no {', '.join(missing)} column; re-run the task")
    summary = _json(path / "summary.json") if (path / "summary.json").is_file() else {}
    return Run(
        path=path,
        task=str(config["task"]),
        model=str(info.get("name") or path.name),
        n_layers=info["n_layers"],
        d_model=info["d_model"],
        n_heads=info.get("n_heads") if isinstance(info.get("n_heads"), int) else None,
        scores=scores,
        summary=summary if isinstance(summary, dict) else {},
    )


def _runs(n: int) -> str:
    return f"{n} run" + ("" if n == 1 else "s")


def _one_task(runs: list[Run], task: str | None) -> list[Run]:
    tasks = list(dict.fromkeys(r.task for r in runs))
    if task is not None:
        kept = [r for r in runs if r.task == task]
        if not kept:
            raise ProbeError(
                f"no run of task {task!r} among the runs{suggest(task, tasks)}; they are of: {', '.join(tasks)}"
            )
        return kept
    if len(tasks) > 1:
        counts = ", ".join(f"{t} ({_runs(sum(r.task == t for r in runs))})" for t in tasks)
        raise ProbeError(
            f"runs of different tasks: {counts}; compare runs of one task (--task {tasks[0]} keeps only those)"
        )
    return runs


# ----------------------------------------------------------------------------------------------
# the table
# ----------------------------------------------------------------------------------------------


def better(metric: str) -> str:
    """'lower' for metrics where smaller is better (entropy, loss, perplexity), else 'higher'."""
    return "lower" if any(w in metric.lower() for w in LOWER_IS_BETTER) else "higher"


def _column(selector: str) -> str:
    """A selector's column in the table; renamed when it would clash with one of ours."""
    return f"scores_{selector}" if selector in COLUMNS else selector


_SHOWN_BY_LABEL = {"layers", "depth", "d_model", "width"}  # spec keys the label's (L=, d=) already says


def _short(name: str) -> str:
    """A model name for a legend: a folder's last part (a study member's name for its ``checkpoint``
    folder); a spec without its depth and width keys."""
    kind, sep, rest = name.partition(":")
    if sep and kind.isidentifier() and "=" in rest:
        keep = [kv for kv in rest.split(",") if kv.split("=", 1)[0].strip() not in _SHOWN_BY_LABEL]
        return f"{kind}:{','.join(keep)}" if keep else kind
    if os.sep not in name:
        return name
    path = Path(name)
    return path.parent.name if path.name == "checkpoint" and path.parent.name else path.name  # a study member


def _labels(runs: list[Run]) -> list[str]:
    labels = [f"{_short(r.model)} (L={r.n_layers}, d={r.d_model})" for r in runs]
    dup = {lb for lb in labels if labels.count(lb) > 1}
    return [f"{lb} [{r.path.name}]" if lb in dup else lb for lb, r in zip(labels, runs, strict=True)]


def _selectors(frames: list[pd.DataFrame]) -> list[str]:
    """Text columns that take several values for one (run, metric, layer, head)."""
    cols = list(
        dict.fromkeys(
            c
            for f in frames
            for c in f.columns
            if c not in SCORE_COLUMNS and c != "_run" and not pd.api.types.is_numeric_dtype(f[c])
        )
    )
    out = []
    for c in cols:
        for f in frames:
            if c not in f.columns:
                continue
            keys = ["metric", "layer"] + (["head"] if "head" in f.columns else [])
            if f.groupby(keys, dropna=False)[c].nunique(dropna=False).gt(1).any():
                out.append(c)
                break
    return out


def _relative_depth(s: pd.DataFrame, n_layers: int) -> pd.Series:
    layer = s["layer"].astype(float)
    if "hook" in s.columns:
        m = s["hook"].astype(str).str.extract(_HOOK)
        if m[0].notna().all():
            return (m[0].astype(float) + m[1].map(_HOOK_OFFSET)) / n_layers
    if layer.max() >= n_layers:  # layers 0..n_layers: residual positions between blocks
        return layer / n_layers
    return (layer + 0.5) / n_layers


def _syntax_baselines(run: Run) -> pd.DataFrame | None:
    path = run.path / "baselines.csv"
    if not path.is_file():
        return None
    try:
        b = pd.read_csv(path)
    except (OSError, ValueError):
        return None
    if not {"relation", "offset", "accuracy"} <= set(b.columns):
        return None
    b = b.assign(_key=list(zip(-b["accuracy"], b["offset"].abs(), b["offset"], strict=True))).sort_values(
        "_key", kind="stable"
    )
    best = b.groupby("relation", sort=False).head(1)
    return pd.DataFrame(
        {
            "relation": best["relation"].astype(str),
            "baseline": best["accuracy"].astype(float),
            "baseline_name": [f"offset {int(o):+d}" for o in best["offset"]],
        }
    )


def _coref_baselines(run: Run) -> pd.DataFrame | None:
    rows = [
        r
        for r in run.summary.get("summary") or []
        if isinstance(r, dict) and r.get("method") and r["method"] not in _NO_BASELINE_ROWS
    ]
    column = next((c for c in ("type", "gender") if c in run.scores.columns), None)
    if not rows or column is None:
        return None
    out = []
    for label in run.scores[column].dropna().astype(str).unique():
        vals = [
            (float(r[label]), r["method"])
            for r in rows
            if isinstance(r.get(label), (int, float)) and not isinstance(r.get(label), bool)
        ]
        if vals:
            value, name = max(vals, key=lambda v: v[0])  # first of equal baselines wins
            out.append({column: label, "baseline": value / 100.0, "baseline_name": name})
    return pd.DataFrame(out) if out else None


BASELINES = {"syntax": _syntax_baselines, "coref": _coref_baselines}


def _best(g: pd.DataFrame, lower: bool) -> tuple[float, Any, float, int]:
    """(best value, its head, mean over heads, number of heads) for one layer's rows."""
    v = g["value"].astype(float)
    if "head" not in g.columns or g["head"].isna().all():
        return float(v.mean()), None, float(v.mean()), 0
    has = g["head"].notna()
    per_head = v[has].groupby(g.loc[has, "head"].astype(int)).mean().sort_index().dropna()
    if per_head.empty:
        return float("nan"), None, float("nan"), 0
    head = per_head.idxmin() if lower else per_head.idxmax()
    return float(per_head[head]), int(head), float(per_head.mean()), len(per_head)


def _run_table(run: Run, label: str, selectors: list[str]) -> pd.DataFrame:
    s = run.scores.dropna(subset=["layer", "metric"])
    s = s.assign(layer=s["layer"].astype(int), value=pd.to_numeric(s["value"], errors="coerce"))
    s = s.assign(_rel=_relative_depth(s, run.n_layers).to_numpy())
    sel = [c for c in selectors if c in s.columns]
    for c in sel:
        s[c] = s[c].astype("string").fillna("")
    name = s["metric"].astype(str)
    for c in sel:
        name = name.str.cat(s[c], sep="/").str.rstrip("/")
    s = s.assign(_metric=name)
    rows = []
    for (metric, layer), g in s.groupby(["_metric", "layer"], sort=False):
        base = str(g["metric"].iloc[0])
        lower = better(base) == "lower"
        best, head, mean, heads = _best(g, lower)
        rows.append(
            {
                "task": run.task,
                "model": run.model,
                "label": label,
                "n_layers": run.n_layers,
                "d_model": run.d_model,
                "n_heads": run.n_heads,
                "layer": layer,
                "relative_depth": float(g["_rel"].iloc[0]),
                "metric": metric,
                **{_column(c): g[c].iloc[0] for c in sel},
                "better": "lower" if lower else "higher",
                "best_value": best,
                "best_head": head,
                "head_mean": mean,
                "heads": heads,
                "run": str(run.path),
            }
        )
    table = pd.DataFrame(rows)
    read_baselines = BASELINES.get(run.task)
    baselines = read_baselines(run) if read_baselines else None
    keys = [c for c in (baselines.columns if baselines is not None else []) if c not in ("baseline", "baseline_name")]
    if baselines is not None and keys and set(keys) <= set(table.columns):
        table = table.merge(baselines.astype({k: "string" for k in keys}), on=keys, how="left")
        sign = np.where(table["better"] == "lower", -1.0, 1.0)
        table["margin"] = sign * (table["best_value"] - table["baseline"])
    return table


def _pick_metrics(table: pd.DataFrame, metrics: Sequence[str]) -> pd.DataFrame:
    names = list(dict.fromkeys(table["metric"]))
    keep: list[str] = []
    for m in metrics:
        hit = [n for n in names if n == m or n.startswith(m + "/")]
        if not hit:
            bases = list(dict.fromkeys(n.split("/")[0] for n in names))
            shown = ", ".join(bases[:20]) + (", ..." if len(bases) > 20 else "")
            raise ProbeError(f"unknown metric {m!r}{suggest(m, [*bases, *names])}; the runs have: {shown}")
        keep += hit
    return table[table["metric"].isin(keep)]


def compare(
    runs: str | Path | Iterable[str | Path], metrics: Sequence[str] | None = None, task: str | None = None
) -> pd.DataFrame:
    """Tidy per-layer table of run folders of one task: one row per (model, layer, metric).

    ``runs``: run folders, or folders holding run folders (a study). ``metrics``: keep only these
    (a metric name, a full ``metric/selector`` name, or its prefix up to a ``/``). ``task``: keep
    only runs of this task (needed when a study folder holds runs of several tasks).
    Columns: see ``COLUMNS`` (plus the selector columns, e.g. relation and direction for syntax).
    """
    if isinstance(runs, (str, Path)):
        runs = [runs]
    read = _one_task([read_run(p) for p in find_runs(runs)], task)
    empty = [r.path / "scores.csv" for r in read if r.scores.dropna(subset=["layer", "metric"]).empty]
    if empty:  # refused, not dropped: a run missing from the table would pass unnoticed
        raise ProbeError(f"{empty[0]} has no rows (only a header); re-run that task or leave the run out")
    labels = _labels(read)
    selectors = _selectors([r.scores for r in read])
    table = pd.concat([_run_table(r, lb, selectors) for r, lb in zip(read, labels, strict=True)], ignore_index=True)
    if table.empty:
        raise ProbeError("the runs have no per-layer scores to compare; pass runs of a per-layer task")
    if metrics:
        table = _pick_metrics(table, metrics)
    for col in ("baseline", "baseline_name", "margin"):
        if col not in table.columns:
            table[col] = np.nan
    sel = [_column(c) for c in selectors if _column(c) in table.columns]
    cols = COLUMNS[: COLUMNS.index("better")] + sel + COLUMNS[COLUMNS.index("better") :]
    table = table[cols].astype({"best_head": "Int64", "n_heads": "Int64"})
    return table.sort_values(["n_layers", "d_model", "label", "metric", "layer"], kind="stable").reset_index(drop=True)


def peaks(table: pd.DataFrame) -> pd.DataFrame:
    """Per (model, metric): where the best-head value peaks (lowest layer on ties) and how sharply.

    ``sharpness`` = peak minus the mean over layers (mean minus peak for lower-is-better metrics),
    so it is never negative; 0 means flat across depth.
    """
    out = []
    for (label, metric), g in table.groupby(["label", "metric"], sort=False):
        g = g.sort_values("layer")
        v = g["best_value"].astype(float)
        if v.isna().all():
            continue
        lower = g["better"].iloc[0] == "lower"
        i = v.idxmin() if lower else v.idxmax()
        peak, mean = float(v[i]), float(v.mean())
        row = {
            "task": g["task"].iloc[0],
            "label": label,
            "n_layers": int(g["n_layers"].iloc[0]),
            "d_model": int(g["d_model"].iloc[0]),
            "metric": metric,
            "better": g["better"].iloc[0],
            "peak_layer": int(g.at[i, "layer"]),
            "peak_relative_depth": float(g.at[i, "relative_depth"]),
            "peak_head": g.at[i, "best_head"],
            "peak_value": peak,
            "layer_mean": mean,
            "sharpness": (mean - peak) if lower else (peak - mean),
            "first_value": float(v.iloc[0]),
            "last_value": float(v.iloc[-1]),
        }
        if "margin" in g.columns and pd.notna(g.at[i, "margin"]):
            row["margin_at_peak"] = float(g.at[i, "margin"])
        out.append(row)
    if not out:
        return pd.DataFrame(out)
    return (
        pd.DataFrame(out).sort_values(["metric", "n_layers", "d_model", "label"], kind="stable").reset_index(drop=True)
    )


# ----------------------------------------------------------------------------------------------
# writing
# ----------------------------------------------------------------------------------------------


def default_out(table: pd.DataFrame) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    task = str(table["task"].iloc[0]) if len(table) else "runs"
    return DEFAULT_ROOT / f"{stamp}-{task}-{os.getpid() % 10000:04d}"


def save(table: pd.DataFrame, out: str | Path | None = None) -> Path:
    """Write compare.csv, peaks.csv, compare.json and report.html into a new folder, atomically."""
    final = Path(out) if out else default_out(table)
    peak = peaks(table)
    with artifacts.atomic_dir(final) as tmp:
        table.to_csv(tmp / "compare.csv", index=False)
        peak.to_csv(tmp / "peaks.csv", index=False)
        artifacts.write_json(
            tmp / "compare.json",
            {
                "tool": "depthprobe",
                "created": datetime.now(UTC).isoformat(timespec="seconds"),
                "task": str(table["task"].iloc[0]) if len(table) else None,
                "runs": list(dict.fromkeys(table["run"])),
                "metrics": list(dict.fromkeys(table["metric"])),
                "git_commit": artifacts.git_commit(),
            },
        )
        (tmp / "report.html").write_text(render(table, peak), encoding="utf-8")
    return final
