"""`probe train`: build a native model of any depth and train it on synthetic data."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from depthprobe.cli.main import app, guarded, prepare_out


@app.command()
@guarded
def train(
    layers: int | None = typer.Option(None, "--layers", "-L", help="Number of blocks (default 2)."),
    d_model: int | None = typer.Option(None, "--d-model", "--width", help="Residual width (default 64)."),
    heads: int | None = typer.Option(None, "--heads", help="Attention heads per layer (default 4)."),
    attn_only: bool | None = typer.Option(
        None, "--attn-only/--mlp", help="Attention-only blocks (default) or with MLPs."
    ),
    norm: str | None = typer.Option(None, "--norm", help="ln (default) or none."),
    positional: str | None = typer.Option(None, "--positional", help="learned (default), rotary or none (NoPE)."),
    data: str | None = typer.Option(None, "--data", help="Synthetic data: induction (default) or random."),
    vocab: int | None = typer.Option(None, "--vocab", help="Vocabulary size incl. BOS=0 (default 64)."),
    seq_len: int | None = typer.Option(
        None, "--seq-len", help="Tokens per sequence incl. BOS; also the context (default 64)."
    ),
    steps: int | None = typer.Option(None, "--steps", help="Total optimiser steps (default 3000)."),
    batch_size: int | None = typer.Option(None, "--batch-size", "-b", help="Sequences per step (default 32)."),
    lr: float | None = typer.Option(None, "--lr", help="AdamW learning rate (default 1e-3)."),
    weight_decay: float | None = typer.Option(None, "--weight-decay", help="AdamW weight decay (default 0.01)."),
    warmup: int | None = typer.Option(None, "--warmup", help="Linear warm-up steps (default 100)."),
    seed: int | None = typer.Option(None, "--seed", help="Seed of the init and the data stream (default 0)."),
    save_every: int | None = typer.Option(None, "--save-every", help="Checkpoint period in steps (default 500)."),
    log_every: int | None = typer.Option(None, "--log-every", help="loss.csv row period in steps (default 50)."),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Model directory (default artifacts/models/native-L<layers>-d<d>-h<h>-s<seed>)."
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue the checkpoint in --out from its saved step."),
    threads: int | None = typer.Option(
        None, "--threads", help="CPU threads while training (default 1: fastest for toy models)."
    ),
    device: str | None = typer.Option(None, "--device", help="cpu, cuda, cuda:N (default: CUDA when present)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar (loss, steps/s)."),
    max_params: int | None = typer.Option(None, "--max-params", help="Refuse models with more parameters than this."),
) -> None:
    """Train a native TransformerLens model with AdamW; checkpoints load anywhere a model name is accepted."""
    from depthprobe.probes.models.device import resolve_device, size_limit

    if out is not None:
        prepare_out(out, may_exist=True)
    given = {
        k: v
        for k, v in {
            "layers": layers,
            "d_model": d_model,
            "heads": heads,
            "attn_only": attn_only,
            "norm": norm,
            "positional": positional,
            "data": data,
            "vocab": vocab,
            "seq_len": seq_len,
            "steps": steps,
            "batch_size": batch_size,
            "lr": lr,
            "weight_decay": weight_decay,
            "warmup": warmup,
            "seed": seed,
            "save_every": save_every,
            "log_every": log_every,
            "threads": threads,
        }.items()
        if v is not None
    }
    resolve_device(device)
    with size_limit(max_params):
        _train(given, out, resume, device, progress)


def _train(given: dict, out: Path | None, resume: bool, device: str | None, progress: bool) -> None:
    from depthprobe.probes.base.errors import ProbeError
    from depthprobe.probes.training.checkpoint import resume_configs
    from depthprobe.probes.training.config import build_configs
    from depthprobe.probes.training.train import train as api_train

    if resume:
        if out is None:
            raise ProbeError("--resume needs --out pointing at the checkpoint directory to continue")
        native, data_cfg, cfg = resume_configs(out, **given)
    else:
        native, data_cfg, cfg = build_configs(**given)
    if out is None:
        out = Path("artifacts/models") / f"native-L{native.layers}-d{native.d_model}-h{native.heads}-s{cfg.seed}"
        prepare_out(out, may_exist=True)
    if out.exists() and not out.is_dir():
        raise ProbeError(f"--out {out} is a file; give a directory")
    try:
        with sigterm_interrupts():
            done = api_train(
                native, data_cfg, cfg, out=out, resume=resume, device=device, progress=progress and sys.stderr.isatty()
            )
    except KeyboardInterrupt as exc:
        _interrupted(out, 128 + (exc.args[0] if exc.args and isinstance(exc.args[0], int) else signal.SIGINT))
    last = done.losses[-1] if done.losses else {}
    typer.echo(
        f"trained {native.layers}-layer model to step {done.step}: loss {last.get('loss', float('nan')):.4f}, "
        f"{last.get('steps_per_s', 0):.1f} steps/s, {done.seconds:.0f} s"
    )
    typer.echo(f"wrote {out} (depthprobe.json naming the checkpoint folder: weights, optimizer state, loss.csv)")
    typer.echo(f"next: probe run --model {out} --task induction")


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM interrupts like Ctrl-C (KeyboardInterrupt carrying the signal number)."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signum)

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave SIGTERM alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupted(out: Path, code: int = 130) -> None:
    """Ctrl-C or SIGTERM: say which checkpoint is intact and how to continue; exit 128 + signal."""
    import json

    try:
        step = json.loads((out / "depthprobe.json").read_text())["training"]["step"]
        typer.echo(
            f"error: interrupted; {out} holds the checkpoint of step {step}: continue with "
            f"probe train --out {out} --resume",
            err=True,
        )
    except (OSError, ValueError, KeyError):
        typer.echo(f"error: interrupted before the first checkpoint; no checkpoint was written to {out}", err=True)
    raise typer.Exit(code)
