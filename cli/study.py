"""`probe study`: run a study of any registered depth family; `probe list families`."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperCommand

from depthprobe.cli.main import (
    CPUS_PER_MEMBER,
    GPUS_PER_MEMBER,
    MEMBER_ADDRESS,
    MEMBER_BACKEND,
    app,
    err,
    guarded,
    list_app,
)
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.experiments.protocol import EXPERIMENTS

MEMBERS_FAILED = 3  # the exit code of a study that ran with failed members (their errors in members.csv)
FAMILY_HELP = (
    f"The depth family: {', '.join(EXPERIMENTS.names())}, or one a --plugin file or an installed package registers. "
    "`probe list families` shows each family's presets, costs and options."
)


class StudyCommand(TyperCommand):
    """``probe study --help`` ends with every registered family's options, read when the help
    is shown (a family's module is imported then, not on every command)."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self.epilog = family_options_help()
        super().format_help(ctx, formatter)


def family_options_help() -> str:
    """Each family's options (its Config's fields), a paragraph per family."""
    lines = ["Family options (--name value, after the options above; presets and costs: probe list families):"]
    for name in EXPERIMENTS.names():
        try:
            exp = EXPERIMENTS.get(name)
        except ProbeError:
            lines.append(f"{name}: broken (probe list families says why)")
            continue
        options = " ".join(f"--{f.name.replace('_', '-')}" for f in fields(exp.Config) if f.name != "preset")
        lines.append(f"{name}: {options}")
    return "\n\n".join(lines)


@app.command(
    cls=StudyCommand,
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    help="Train the members of a depth family and measure every one: one study folder (members.csv, the family's "
    f"tables, report.html), resumable. Families: {', '.join(EXPERIMENTS.names())}. Family options follow as "
    "--name value (the fields of the family's Config, e.g. --depths 1,2,4 --seeds 2; `probe list families`); "
    "they override the preset.",
)
@guarded
def study(
    ctx: typer.Context,
    family: str = typer.Option(..., "--family", "-f", help=FAMILY_HELP),
    preset: str = typer.Option(
        "smoke", "--preset", "-p", help="smoke, cpu or gpu; khop and crasp also demo (costs: probe list families)."
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Study folder (default artifacts/studies/<id>); rerun on it to continue."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Write OUT/plan.csv (every member with its estimated cost); train nothing."
    ),
    backend: str = MEMBER_BACKEND,
    address: str | None = MEMBER_ADDRESS,
    cpus_per_member: float = CPUS_PER_MEMBER,
    gpus_per_member: float = GPUS_PER_MEMBER,
    retries: int = typer.Option(0, "--retries", help="Retries of a failed member before it is recorded failed."),
    jobs: str | None = typer.Option(
        None,
        "--jobs",
        "-j",
        help="local: members trained at once in N member processes, each with cores/N threads, forked from one "
        "that has imported torch and the project (default: 1 on a CPU; on CUDA chosen from the GPU's free memory "
        "and the host's cores, said in one line; auto: on a CPU the cores when the plan's estimated work pays "
        "for the processes, else 1). The results equal --jobs 1.",
    ),
    plugin: list[str] = typer.Option(
        [], "--plugin", help="A Python file or module that registers families (@register_experiment), imported first."
    ),
) -> None:
    from depthprobe.probes.experiments.batching import read_jobs, warm_members

    n_jobs = read_jobs(jobs)
    if not dry_run:  # the member processes' fork server imports while this process does
        warm_members(family, backend, n_jobs)
    from depthprobe.probes.engine.plugins import load_plugin
    from depthprobe.probes.experiments.protocol import get_experiment

    if plugin and backend != "local":
        raise ProbeError("--plugin runs with --backend local only (Ray workers do not import it); drop --backend ray")
    for spec in plugin:
        load_plugin(spec)
    exp = get_experiment(family)
    given = family_options(ctx.args)
    if dry_run:
        _dry_run(family, preset, out, {**given, "jobs": n_jobs})
    else:
        where = {k: ctx.params[k] for k in ("backend", "address", "cpus_per_member", "gpus_per_member", "retries")}
        _run(exp, family, preset, out, {**given, **where, "jobs": n_jobs})


def family_options(args: list[str]) -> dict[str, str]:
    """``--name value`` (or ``--name=value``) pairs after the runner's options -> {field: text};
    the family's Config reads and checks them."""
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) < 3:
            raise ProbeError(f"unexpected argument {arg!r}; family options are --name value (probe list families)")
        name, eq, value = arg[2:].partition("=")
        if not eq:
            if i + 1 >= len(args) or args[i + 1].startswith("--"):
                raise ProbeError(f"--{name} needs a value, e.g. --{name} 1,2")
            value = args[i + 1]
            i += 1
        out[name.replace("-", "_")] = value
        i += 1
    return out


def _show(table: Any) -> None:
    import pandas as pd

    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.max_rows", 500):
        typer.echo(table.to_string(index=False, na_rep="-"))


def _run(exp: Any, family: str, preset: str, out: Path | None, options: dict[str, Any]) -> None:
    """Run the study; print its headline table; exit 3 when members failed, 130 (or 128 + the
    signal) when interrupted, saying what is kept."""
    from depthprobe.probes.experiments.folder import left_behind
    from depthprobe.probes.experiments.runner import default_folder
    from depthprobe.probes.experiments.runner import study as api_study

    folder = out if out is not None else default_folder(family, preset)
    try:
        result = api_study(family, preset, out=folder, echo=lambda line: typer.echo(line, err=True), **options)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (signals.Terminated carries the signal)
        signum = getattr(exc, "signum", None)
        err(f"{'interrupted' if signum is None else f'terminated by signal {signum}'}; {left_behind(folder)}")
        raise typer.Exit(130 if signum is None else 128 + signum) from None
    members = result.tables["members.csv"]
    shown = exp.headline(result.tables)
    _show(members if shown is None else shown)
    typer.echo(f"wrote {result.folder}")
    failed = int((members.status == "failed").sum())
    if failed:
        typer.echo(f"{failed} member(s) failed; their errors are in members.csv", err=True)
        raise typer.Exit(MEMBERS_FAILED)


def _dry_run(family: str, preset: str, out: Path | None, given: dict[str, Any]) -> None:
    """--dry-run: the plan, written to OUT/plan.csv and printed."""
    if out is None:
        raise ProbeError("--dry-run writes OUT/plan.csv: pass --out DIR")
    from depthprobe.probes.experiments.folder import PLAN_CSV
    from depthprobe.probes.experiments.runner import dry_run

    _show(dry_run(family, preset, out=out, echo=lambda line: typer.echo(line, err=True), **given))
    typer.echo(f"wrote {out / PLAN_CSV} (nothing trained)")


@list_app.command("families")
@guarded
def list_families(
    plugin: list[str] = typer.Option([], "--plugin", help="A file or module that registers families, imported first."),
) -> None:
    """The registered depth families: what each studies, its presets with their costs, its options."""
    from depthprobe.probes.engine.plugins import load_plugin

    for spec in plugin:
        load_plugin(spec)
    from depthprobe.probes.engine.plugins import IGNORED
    from depthprobe.probes.experiments.protocol import ENTRY_POINT_GROUP

    for name in EXPERIMENTS.names():
        try:
            exp = EXPERIMENTS.get(name)
        except ProbeError as exc:  # one broken installed family is listed as broken, the others as usual
            typer.echo(f"{name}: broken: {exc}")
            continue
        typer.echo(f"{name}: {exp.description}")
        for preset, cost in exp.costs.items():
            typer.echo(f"  --preset {preset}: {cost}")
        options = ", ".join(f"--{f.name.replace('_', '-')}" for f in fields(exp.Config) if f.name != "preset")
        typer.echo(f"  options: {options}")
    for line in IGNORED.get(ENTRY_POINT_GROUP, []):
        typer.echo(f"note: {line}")
