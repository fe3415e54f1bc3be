"""The `probe` command line: a thin layer over the probes API.

Exit codes: 0 success, 2 bad input (one line on stderr naming the fix), 1 internal error,
130 interrupted. `probe --debug ...` shows tracebacks.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import typer
from typer._click import exceptions as click  # typer's own copy of click's exceptions
from typer.core import TyperGroup, TyperOption

_option_type = TyperOption.display_type_rich


def _flag_without_type(self: TyperOption, ctx: Any) -> str | None:
    """--help shows a flag (--dry-run, --progress/--no-progress) as a plain flag: typer writes
    ``<bool>`` beside it, which reads as if it took a value (``--dry-run true``)."""
    return None if self.is_flag else _option_type(self, ctx)


TyperOption.display_type_rich = _flag_without_type  # type: ignore[method-assign]


class OneLineErrors(TyperGroup):
    """The top-level group: usage errors (bad option values, unknown commands or options) print
    one line plus the --help hint, exit 2, like every other error."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        except click.NoArgsIsHelpError as exc:
            from typer import rich_utils

            rich_utils.rich_format_error(exc)
            sys.exit(exc.exit_code)
        except click.UsageError as exc:
            err(usage_line(exc, prog_name or "probe"))
            sys.exit(2)
        except click.ClickException as exc:
            err(exc.format_message())
            sys.exit(exc.exit_code)
        except typer.Abort:
            err("aborted")
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


_TYPE_WORDS = {
    "int_parsing": "an integer",
    "float_parsing": "a number",
    "bool_parsing": "true or false",
    "int_from_float": "a whole number",
}


def usage_line(exc: Any, prog: str = "probe") -> str:
    """click's usage error as one line: the message (with close matches) and the --help hint."""
    from depthprobe.probes.base.errors import suggest

    message = " ".join(exc.format_message().split())
    ctx = exc.ctx
    cause = getattr(exc, "__cause__", None)
    errors = cause.errors() if cause is not None and hasattr(cause, "errors") else []
    if isinstance(exc, click.BadParameter) and errors and exc.param is not None:
        first = errors[0]
        names = "/".join(getattr(exc.param, "opts", []) or [exc.param.name or "value"])
        what = _TYPE_WORDS.get(first.get("type", ""), "valid: " + str(first.get("msg", "")))
        message = f"Invalid value for '{names}': {first.get('input')!r} is not {what}"
    if message.startswith("No such command") and ctx and "did you mean" not in message.lower():
        group = ctx.command
        if hasattr(group, "list_commands"):
            name = message.split("'")[1] if message.count("'") >= 2 else ""
            message = message.rstrip(".") + suggest(name, group.list_commands(ctx))
    message = message[:1].lower() + message[1:]
    if not message.endswith((".", "?")):
        message += "."
    return message + f" Try '{ctx.command_path if ctx is not None else prog} --help'."


app = typer.Typer(
    cls=OneLineErrors,
    name="probe",
    help="depthprobe: per-layer, per-head probing of transformers (attention statistics, syntax, "
    "coreference, induction, signal-propagation kernels).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
list_app = typer.Typer(help="List tasks, models or architectures.", no_args_is_help=True)
app.add_typer(list_app, name="list")

_DEBUG = {"on": False}

# The Ray options that `probe study` and `probe sweep` share (member jobs; `probe run` shards batches).
MEMBER_BACKEND = typer.Option("local", "--backend", help="local (one member after another) or ray.")
MEMBER_ADDRESS = typer.Option(
    None, "--address", help="ray: auto (a running cluster) or HOST:PORT (default: a local instance)."
)
CPUS_PER_MEMBER = typer.Option(1, "--cpus-per-member", help="ray: CPUs reserved per member.")
GPUS_PER_MEMBER = typer.Option(0, "--gpus-per-member", help="ray: GPUs per member (fractions share).")


@app.callback()
def _main(debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors.")) -> None:
    _DEBUG["on"] = debug
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def err(message: str) -> None:
    typer.echo(f"error: {message}", err=True)


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn ProbeError into one line + exit 2, anything else into one line + exit 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from depthprobe.probes.base.errors import ProbeError
        from depthprobe.probes.base.signals import Terminated, sigterm_as_keyboardinterrupt

        try:
            with sigterm_as_keyboardinterrupt():
                return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except ProbeError as exc:
            if _DEBUG["on"]:
                raise
            err(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except Terminated as exc:
            err(f"terminated by signal {exc.signum}; nothing was written")
            raise typer.Exit(128 + exc.signum) from None
        except KeyboardInterrupt:
            err("interrupted; nothing was written")
            raise typer.Exit(130) from None
        except SystemExit as exc:  # a task's or plugin's code called sys.exit (the library raises typer.Exit)
            if _DEBUG["on"]:
                raise
            err(
                f"a task's code called sys.exit({exc.code!r}) during probe {fn.__name__}; it stopped there "
                "(a task must raise an exception, not exit)"
            )
            raise typer.Exit(2) from None
        except BrokenPipeError:  # the reader went away (`probe list tasks | head`): stop quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(0) from None
        except Exception as exc:  # internal error: keep it to one line unless --debug
            if _DEBUG["on"]:
                raise
            if isinstance(exc, (MemoryError, RuntimeError)):  # a failed allocation is the machine's size: exit 2
                from depthprobe.probes.models.device import out_of_memory_error

                oom = out_of_memory_error(exc, f"probe {fn.__name__}")
                if oom is not None:
                    err(str(oom))
                    raise typer.Exit(oom.exit_code) from None
            first = (str(exc).strip().splitlines() or [""])[0]
            err(f"internal error: {type(exc).__name__}: {first} (rerun with probe --debug ... for the traceback)")
            raise typer.Exit(1) from None

    return wrapper


def check_names(task: str | None = None, model: str | None = None, sweep: str | None = None) -> None:
    """Refuse a mistyped task, sweep or model alias in one line before torch is imported (the
    name lists need no heavy import): the same lines the registries and the model loader give
    later, a second sooner. Names a plugin may add are checked by the registry after it loads."""
    from depthprobe.probes.base.errors import ProbeError, suggest, unknown
    from depthprobe.tasks import SWEEPS, TASKS

    if task is not None:
        from depthprobe.probes.engine.plugins import entry_point_tasks

        names = {*TASKS, *entry_point_tasks(set(TASKS))}
        if task not in names:
            raise unknown("task", task, names)
    if sweep is not None and sweep not in SWEEPS:
        raise unknown("sweep task", sweep, SWEEPS)
    if model is not None and not any(c in model for c in "/:.~@") and not Path(model).expanduser().exists():
        from depthprobe.probes.models.architectures import ALIASES, DEFAULT_MODEL

        hint = suggest(model, ALIASES)
        known = {DEFAULT_MODEL, *ALIASES, *(v[0] for v in ALIASES.values())}  # as the loader reads them
        if model not in known and not model.startswith("native") and hint:
            raise ProbeError(f"unknown model {model!r}{hint}; `probe list models` shows the aliases")


def prepare_out(out: Path | None, flag: str = "--out", *, may_exist: bool = False, kind: str = "folder") -> None:
    """Check an output location before any work (exists, a parent is a file, not writable) and
    remove hidden partial folders that killed runs left there, saying so on stderr."""
    from depthprobe.probes.base import artifacts

    target = out if out is not None else artifacts.DEFAULT_ROOT / "run"
    artifacts.check_out(target, flag, may_exist=may_exist or out is None, kind=kind)
    if kind == "folder":
        for stale in artifacts.remove_stale_partials(target, any_name=out is None):
            typer.echo(f"note: removed {stale}, a partial folder left by an interrupted run", err=True)


def parse_options(pairs: list[str]) -> dict[str, str]:
    from depthprobe.probes.base.errors import ProbeError

    out: dict[str, str] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ProbeError(f"--option expects key=value, got {pair!r} (e.g. --option top=10)")
        key, value = pair.split("=", 1)
        out[key.strip().replace("-", "_")] = value.strip()
    return out


def print_result(result: Any) -> None:
    import pandas as pd

    with pd.option_context(
        "display.max_rows", 200, "display.max_columns", 20, "display.width", 200, "display.max_colwidth", 80
    ):
        typer.echo(result.summary.to_string(index=False))
    for note in result.notes:
        typer.echo(f"- {note}")


@app.command()
@guarded
def run(
    model: str = typer.Option(
        "minilm",
        "--model",
        "-m",
        help="Alias, Hugging Face id, local directory, native spec (native:layers=2,...) or checkpoint directory.",
    ),
    task: str = typer.Option("attention-stats", "--task", "-t", help="Task name (`probe list tasks`)."),
    data: Path | None = typer.Option(None, "--data", "-d", help="Input file or folder (default: built-in sample)."),
    limit: int | None = typer.Option(None, "--limit", help="Use only the first N examples."),
    batch_size: int | None = typer.Option(
        None, "--batch-size", "-b", help="Examples per forward pass (default 32; on CUDA chosen from free memory)."
    ),
    device: str | None = typer.Option(None, "--device", help="cpu, cuda, cuda:N (default: CUDA when present)."),
    dtype: str = typer.Option(
        "float32",
        "--dtype",
        help="Model weights and activations: float32, bfloat16 or float16 (metrics accumulate in float64 either way).",
    ),
    seed: int = typer.Option(0, "--seed", help="Random seed."),
    max_len: int = typer.Option(
        128, "--max-len", help="Longest input in pieces incl. specials; longer ones are skipped."
    ),
    out: Path | None = typer.Option(None, "--out", "-o", help="Run directory (default artifacts/runs/<run-id>)."),
    option: list[str] = typer.Option([], "--option", "-O", help="Task option key=value (repeatable)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar on long runs."),
    parser: str | None = typer.Option(
        None,
        "--parser",
        help="spaCy pipeline (name or directory) that parses raw-text --data (syntax); same as --option parser=NAME.",
    ),
    max_params: int | None = typer.Option(None, "--max-params", help="Refuse models with more parameters than this."),
    backend: str = typer.Option("local", "--backend", help="local, or ray: shard the batches over Ray workers."),
    workers: int | None = typer.Option(
        None, "--workers", help="Ray workers (--backend ray; default: as many as fit, each on this machine's threads)."
    ),
    address: str | None = typer.Option(
        None, "--address", help="Ray cluster: auto or HOST:PORT (--backend ray; default: start a local instance)."
    ),
    plugin: list[str] = typer.Option(
        [],
        "--plugin",
        help="A Python file or module that registers tasks (@probes.register), imported first (repeatable).",
    ),
) -> None:
    """Run a task on a model, print its summary and write a run directory."""
    from depthprobe.probes.base.errors import ProbeError

    check_names(task=None if plugin else task, model=model)
    from depthprobe.probes.api.run import run as api_run
    from depthprobe.probes.engine.plugins import load_plugin
    from depthprobe.probes.models.device import size_limit

    if plugin and backend != "local":
        raise ProbeError(
            "--plugin runs with --backend local only (Ray workers do not import it); "
            "install the plugin as a package with a depthprobe.tasks entry point to shard it"
        )
    prepare_out(out)
    for spec in plugin:
        load_plugin(spec)
    with size_limit(max_params):
        result = api_run(
            model,
            task,
            data,
            limit=limit,
            batch_size=batch_size,
            device=device,
            seed=seed,
            dtype=dtype,
            max_len=max_len,
            progress=progress and sys.stderr.isatty(),
            backend=backend,
            workers=workers,
            address=address,
            **parse_options(option) | ({"parser": parser} if parser else {}),
        )
    path = result.save(out)
    print_result(result)
    typer.echo(f"wrote {path}")


@list_app.command("tasks")
@guarded
def list_tasks() -> None:
    """Registered tasks with their options (from the task cards: no task module is imported)."""
    import dataclasses

    from depthprobe.tasks.cards import CARDS

    for name in sorted(CARDS):
        card = CARDS[name]
        opts = ", ".join(f"{f.name}={f.default}" for f in dataclasses.fields(card.options))
        typer.echo(f"{name:16s} {card.description}")
        if opts:
            typer.echo(f"{'':16s} options: {opts}")
    from depthprobe.probes.engine.entry_kinds import entry_kind
    from depthprobe.probes.engine.plugins import ENTRY_POINT_GROUP, IGNORED, entry_point_tasks

    for name, ref in sorted(entry_point_tasks(set(CARDS)).items()):  # installed packages' tasks
        if entry_kind(ref) == "function":  # read from the source: no plugin code runs
            typer.echo(f"{name:16s} not a task: {ref} is a function; its entry point must name a Task subclass")
            continue
        typer.echo(f"{name:16s} from an installed package ({ref}; its module is imported on first use)")
    for line in IGNORED.get(ENTRY_POINT_GROUP, []):
        typer.echo(f"note: {line}")


@list_app.command("models")
@guarded
def list_models() -> None:
    """Model aliases and whether each is available offline right now."""
    from depthprobe.probes.models.architectures import offline_models

    typer.echo(f"{'alias':18s} {'offline':8s} {'hugging face id':42s} what")
    for row in offline_models():
        typer.echo(f"{row['alias']:18s} {row['offline']:8s} {row['hf_id']:42s} {row['what']}")
    typer.echo(
        "Also accepted: any Hugging Face id in the local cache, a local HF-format directory, "
        "a native spec (native:layers=2,d_model=64,heads=4,attn_only=true) or a checkpoint "
        "directory written by probe train."
    )


@list_app.command("architectures")
@guarded
def list_architectures() -> None:
    """Model architectures that load, how, and which tasks and hooks work on them."""
    from depthprobe.probes.models.architectures import architecture_rows

    rows = architecture_rows()
    typer.echo(f"{'architecture':18s} {'model_type':12s} {'causal':10s} loaded by")
    for r in rows:
        typer.echo(f"{r['architecture']:18s} {r['model_type']:12s} {r['causal']:10s} {r['loaded_by']}")
    typer.echo(
        f"Tasks on every row: {rows[0]['tasks']}. Hooks: TransformerLens bridge: {rows[0]['hooks']}; "
        f"HF attentions: {rows[-1]['hooks']}. Other architectures TransformerLens supports load "
        "through the bridge untested; the rest are refused with one line."
    )


def entry() -> None:
    """The ``probe`` console script: run the app, then leave without the interpreter's teardown.

    Tearing down the modules torch, transformers and TransformerLens leave behind (freeing tens
    of thousands of objects one by one) takes about 1-1.5 s on a 2-core machine after the work is
    done and every output is on disk. :func:`leave` does what a normal exit does that matters
    (waits for non-daemon threads, runs ``atexit`` handlers, flushes stdout and stderr) and
    skips the rest. Only the console script leaves this way: ``app`` itself, as tests and other
    programs call it, exits normally.
    """
    try:
        app()
    except SystemExit as exc:
        leave(exit_code(exc.code))
    leave(0)


def exit_code(code: object) -> int:
    """``SystemExit.code`` as the process's exit status, as the interpreter maps it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)  # sys.exit("message"): printed, status 1
    return 1


def leave(code: int) -> NoReturn:
    import atexit
    import contextlib
    import threading

    main = threading.main_thread()
    for thread in threading.enumerate():
        if thread is not main and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (probe ... | head) or stream
            stream.flush()
    os._exit(code)
