"""`probe study`: train an equal-parameter family of decoders on text and probe every member."""

from __future__ import annotations

from pathlib import Path

import typer

from depthprobe.cli.main import CPUS_PER_MEMBER, GPUS_PER_MEMBER, MEMBER_ADDRESS, MEMBER_BACKEND, app, err, guarded
from depthprobe.probes.api.study_config import COSTS

MEMBERS_FAILED = 3  # the exit code of a study that ran with failed members (their errors in study.csv)
PRESET_HELP = " ".join(f"{name}: {cost}." for name, cost in COSTS.items())


@app.command(help=f"Train an equal-parameter family (levine, petty or spa) on text and probe every member. "
             f"Presets: {PRESET_HELP} Explicit options override the preset.")  # fmt: skip
@guarded
def study(
    family: str = typer.Option(
        ...,
        "--family",
        "-f",
        help="levine (depth pairs at budgets), petty (depths at one budget) or spa (skipless variants at fixed width).",
    ),
    preset: str = typer.Option("smoke", "--preset", "-p", help="smoke, cpu or gpu (see above)."),
    corpus: Path | None = typer.Option(
        None, "--corpus", help="UTF-8 text file or folder (default: built-in Tiny Shakespeare)."
    ),
    depths: str | None = typer.Option(
        None, "--depths", help="levine: shallow depths L (paired with 2L); petty, spa: the depths. Comma-separated."
    ),
    budgets: str | None = typer.Option(
        None, "--budgets", help="Non-embedding parameter budgets, e.g. 50k,200k,1.6M (petty: one)."
    ),
    shrink: str | None = typer.Option(None, "--shrink", help="petty: what shrinks with depth: d_ff, d_model, d_attn."),
    seeds: int | None = typer.Option(None, "--seeds", help="Seeds per member (init and data order)."),
    tokens_per_param: float | None = typer.Option(
        None, "--tokens-per-param", help="Training tokens per non-embedding parameter (with a floor, --min-tokens)."
    ),
    min_tokens: int | None = typer.Option(None, "--min-tokens", help="Floor on training tokens per member."),
    lr: str | None = typer.Option(
        None, "--lr", help="Learning rate, or a grid (1e-3,3e-3,1e-2) tried per member on --lr-fraction of the budget."
    ),
    lr_fraction: float | None = typer.Option(None, "--lr-fraction", help="Budget fraction of each grid trial."),
    d_model: int | None = typer.Option(None, "--d-model", "--width", help="petty: fixed width; spa: width."),
    d_head: int | None = typer.Option(None, "--d-head", help="Head width kept fixed as widths change."),
    variants: str | None = typer.Option(None, "--variants", help="spa: comma-separated variants."),
    vocab: int | None = typer.Option(None, "--vocab", help="BPE vocabulary size (default 1024)."),
    context: int | None = typer.Option(None, "--context", help="Tokens per training window."),
    batch_size: int | None = typer.Option(None, "--batch-size", "-b", help="Windows per step."),
    device: str | None = typer.Option(None, "--device", help="cpu, cuda, cuda:N (default: CUDA when present)."),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Study folder (default artifacts/studies/<id>); rerun on it to continue."
    ),
    backend: str = MEMBER_BACKEND,
    address: str | None = MEMBER_ADDRESS,
    cpus_per_member: float = CPUS_PER_MEMBER,
    gpus_per_member: float = GPUS_PER_MEMBER,
    retries: int = typer.Option(0, "--retries", help="Retries of a failed member before it is recorded failed."),
    jobs: int | None = typer.Option(
        None,
        "--jobs",
        "-j",
        help="local: members trained at once in separate processes, each with cores/N threads "
        "(default 1). The results equal --jobs 1.",
    ),
    max_params: int | None = typer.Option(
        None, "--max-params", help="Members with more parameters than this fail (the rest go on)."
    ),
) -> None:
    from depthprobe.probes.api.study import default_folder
    from depthprobe.probes.api.study import study as api_study
    from depthprobe.probes.api.study_config import parse_floats, parse_names
    from depthprobe.probes.api.sweep import parse_depths
    from depthprobe.probes.models.families import parse_budgets

    given = {
        "corpus": None if corpus is None else str(corpus),
        "depths": None if depths is None else parse_depths(depths),
        "budgets": None if budgets is None else parse_budgets(budgets),
        "shrink": shrink,
        "seeds": seeds,
        "tokens_per_param": tokens_per_param,
        "min_tokens": min_tokens,
        "lrs": None if lr is None else parse_floats(lr, "--lr"),
        "lr_fraction": lr_fraction,
        "d_model": d_model,
        "d_head": d_head,
        "variants": None if variants is None else parse_names(variants),
        "vocab": vocab,
        "context": context,
        "batch_size": batch_size,
        "device": device,
        "max_params": max_params,
    }
    folder = out if out is not None else default_folder(family, preset)
    try:
        result = api_study(family, preset, out=folder, backend=backend, address=address,
                           cpus_per_member=cpus_per_member, gpus_per_member=gpus_per_member, retries=retries,
                           jobs=jobs, echo=lambda line: typer.echo(line, err=True), **given)  # fmt: skip
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (signals.Terminated carries the signal)
        signum = getattr(exc, "signum", None)
        err(f"{'interrupted' if signum is None else f'terminated by signal {signum}'}; {_left_behind(folder)}")
        raise typer.Exit(130 if signum is None else 128 + signum) from None
    table = result.table
    cols = ["member", "depth", "d_model", "d_ff", "params_nonembed", "tokens", "val_loss", "val_bpb", "status"]
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_rows", 500):
        typer.echo(table[cols].to_string(index=False))
    typer.echo(f"wrote {result.folder}")
    failed = int((table.status == "failed").sum())
    if failed:
        typer.echo(f"{failed} member(s) failed; their errors are in study.csv", err=True)
        raise typer.Exit(MEMBERS_FAILED)


def _left_behind(folder: Path) -> str:
    """What an interrupted study leaves, as it is on disk."""
    from depthprobe.probes.api.study import STUDY_JSON, finished_members

    if not (folder / STUDY_JSON).exists():
        return "nothing was written"
    done, _ = finished_members(folder)
    return f"finished members are kept in {folder} ({len(done)} so far): rerun the same command to continue"
