"""HTML reports. (Minimal for now: the summary table and notes, every string escaped.)"""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import pandas as pd


def _table(df: pd.DataFrame) -> str:
    return df.to_html(index=False, escape=True, border=0, classes="summary")


def render(summary: dict[str, Any], scores: pd.DataFrame | None = None) -> str:
    title = f"depthprobe: {summary.get('task')} on {summary.get('model')}"
    notes = "".join(f"<li>{html.escape(str(n))}</li>" for n in summary.get("notes", []))
    table = _table(pd.DataFrame(summary.get("summary", [])))
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title></head><body>"
        f"<h1>{html.escape(title)}</h1><ul>{notes}</ul>{table}</body></html>"
    )


def write_report(run_dir: Path) -> Path:
    run_dir = Path(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    out = run_dir / "report.html"
    out.write_text(render(summary), encoding="utf-8")
    return out


def result_html(result: Any) -> str:
    return render({"task": result.task, "model": result.model_info["name"], "notes": result.notes,
                   "summary": result.summary.to_dict(orient="records")})
