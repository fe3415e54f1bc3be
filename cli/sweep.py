"""`probe sweep`: vary depth with everything else fixed."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from depthprobe.cli.main import (
    CPUS_PER_MEMBER,
    GPUS_PER_MEMBER,
    MEMBER_ADDRESS,
    MEMBER_BACKEND,
    app,
    check_names,
    guarded,
    parse_options,
    prepare_out,
    print_result,
)


@app.command()
@guarded
def sweep(
    task: str = typer.Option(..., "--task", "-t", help="Sweep task (induction, kernels)."),
    depths: str | None = typer.Option(None, "--depths", "--layers", help="Comma-separated depths, e.g. 1,2,4."),
    seed: int = typer.Option(0, "--seed", help="Random seed (identical for every depth)."),
    device: str | None = typer.Option(None, "--device", help="cpu, cuda, cuda:N (default: CUDA when present)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Run directory (default artifacts/runs/<run-id>)."),
    option: list[str] = typer.Option([], "--option", "-O", help="Sweep option key=value (repeatable)."),
    variants: str | None = typer.Option(None, "--variants", help="kernels: comma-separated architecture variants."),
    width: int | None = typer.Option(None, "--width", "--d-model", help="Model width d_model."),
    heads: int | None = typer.Option(None, "--heads", help="Attention heads per layer."),
    seq_len: int | None = typer.Option(None, "--seq-len", help="Tokens per sequence."),
    steps: int | None = typer.Option(None, "--steps", "--train-steps", help="Training steps per depth."),
    attn_only: bool | None = typer.Option(None, "--attn-only/--mlp", help="Attention-only blocks, or with MLPs."),
    mlp_kind: str | None = typer.Option(
        None, "--mlp-kind", help="kernels, with --mlp: relu (default) or tat (TAT leaky-ReLU MLPs, He et al.)."
    ),
    dtype: str | None = typer.Option(None, "--dtype", help="kernels: float32 or float64 (models built and run in it)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress."),
    max_params: int | None = typer.Option(None, "--max-params", help="Refuse models with more parameters than this."),
    backend: str = MEMBER_BACKEND,
    address: str | None = MEMBER_ADDRESS,
    cpus_per_member: float = CPUS_PER_MEMBER,
    gpus_per_member: float = GPUS_PER_MEMBER,
    retries: int = typer.Option(0, "--retries", help="Retries of a failed member before the sweep fails."),
    jobs: int | None = typer.Option(
        None, "--jobs", "-j", help="local: members at once in N processes (default 1); the results equal --jobs 1."
    ),
) -> None:
    """Train or build one model per depth with identical settings; write one table and plots."""
    check_names(sweep=task)
    from depthprobe.probes.api.sweep import get_sweep, parse_depths
    from depthprobe.probes.api.sweep import sweep as api_sweep

    prepare_out(out)
    get_sweep(task)
    if depths is None:
        from depthprobe.probes.base.errors import ProbeError

        raise ProbeError("probe sweep needs --depths (or --layers), e.g. --depths 1,2,4")
    explicit = {
        "variants": variants,
        "width": width,
        "heads": heads,
        "seq_len": seq_len,
        "steps": steps,
        "attn_only": attn_only,
        "mlp_kind": mlp_kind,
        "dtype": dtype,
    }
    options = {k: v for k, v in explicit.items() if v is not None}
    options.update(parse_options(option))
    from depthprobe.probes.models.device import size_limit

    with size_limit(max_params):
        result = api_sweep(
            task,
            parse_depths(depths),
            seed=seed,
            device=device,
            progress=progress and sys.stderr.isatty(),
            backend=backend,
            address=address,
            cpus_per_member=cpus_per_member,
            gpus_per_member=gpus_per_member,
            retries=retries,
            jobs=jobs,
            **options,
        )
    path = result.save(out)
    print_result(result)
    typer.echo(f"wrote {path}")
