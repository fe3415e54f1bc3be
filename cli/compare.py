"""`probe compare`: per-layer behaviour of runs of one task across models, on one relative-depth axis."""

from __future__ import annotations

from pathlib import Path

import typer

from depthprobe.cli.main import app, guarded


@app.command()
@guarded
def compare(
    runs: list[Path] | None = typer.Argument(
        None, help="Run folders of one task, or folders holding run folders (a study): every run folder below is used."
    ),
    metric: list[str] = typer.Option(
        [],
        "--metric",
        "-M",
        help="Keep only this metric (repeatable): a name of scores.csv, or metric/selector (e.g. accuracy/nsubj).",
    ),
    task: str | None = typer.Option(
        None, "--task", "-t", help="Keep only runs of this task (for a study folder holding several tasks)."
    ),
    out: Path | None = typer.Option(None, "--out", "-o", help="Output folder (default artifacts/compare/<id>)."),
) -> None:
    """Compare runs across depth and width: compare.csv, peaks.csv and report.html."""
    import pandas as pd

    from depthprobe.probes.api.compare import compare as api_compare
    from depthprobe.probes.api.compare import peaks, save

    table = api_compare(runs or [], metrics=metric or None, task=task)
    path = save(table, out)
    peak = peaks(table)
    cols = ["metric", "label", "peak_layer", "peak_relative_depth", "peak_value", "layer_mean", "sharpness"]
    with pd.option_context(
        "display.max_rows",
        200,
        "display.width",
        200,
        "display.max_colwidth",
        60,
        "display.float_format",
        "{:.4g}".format,
    ):
        typer.echo(peak[cols].to_string(index=False) if len(peak) else "(no values to compare)")
    typer.echo(f"wrote {path}")
