"""`probe atlas`: what depth buys, on one page (probes/experiments/atlas.py)."""

from __future__ import annotations

from pathlib import Path

import typer

from depthprobe.cli.main import app, err, guarded

DEFAULT_OUT = Path("artifacts") / "atlas"


@app.command(
    help="What depth buys, on one page: OUT/atlas.html and OUT/atlas.csv. It runs the demo presets of the depth "
    "laws (khop, crasp) and the one-pass measures (minilm's depth usage, induction at 2 layers and not 1, kernel "
    "collapse and E-SPA), each in its own folder under OUT, and puts each paper's prediction beside the "
    "measurement. Interrupted, rerun it on the same --out to continue.",
)
@guarded
def atlas(
    out: Path = typer.Option(DEFAULT_OUT, "--out", "-o", help="The atlas folder; rerun on it to continue."),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Members (and sweep depths) run at once in local processes."),
    device: str | None = typer.Option(None, "--device", help="cpu, cuda, cuda:N (default: CUDA when present)."),
    scale: str = typer.Option("demo", "--scale", hidden=True, help="demo, or smoke: the mechanics in seconds."),
) -> None:
    from depthprobe.probes.experiments.atlas import atlas as run_atlas

    try:
        result = run_atlas(out, jobs=jobs, device=device, scale=scale, echo=lambda line: typer.echo(line, err=True))
    except KeyboardInterrupt as exc:
        signum = getattr(exc, "signum", None)
        err(
            f"{'interrupted' if signum is None else f'terminated by signal {signum}'}; rerun on --out {out} to continue"
        )
        raise typer.Exit(130 if signum is None else 128 + signum) from None
    typer.echo(f"wrote {result.page}")
