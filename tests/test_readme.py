"""The README's examples work as written: its Python blocks run, its commands parse."""

import itertools
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer
from typer._click import exceptions as click  # typer's own copy of click's exceptions

from depthprobe.cli.main import app

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]


def blocks(lang, files=(README,)):
    return [b for f in files for b in re.findall(rf"```{lang}\n(.*?)```", f.read_text(encoding="utf-8"), flags=re.S)]


@pytest.mark.slow
def test_python_blocks_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # result.save() writes artifacts/ here
    for code in blocks("python"):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    assert any((tmp_path / "artifacts" / "runs").iterdir())


def test_research_api_doc_python_blocks_run(tmp_path, monkeypatch):
    """docs/api.md's Python blocks run as written (tiny native models: seconds)."""
    monkeypatch.chdir(tmp_path)  # they may write files (sae.safetensors)
    codes = blocks("python", [ROOT / "docs" / "api.md"])
    assert len(codes) >= 2
    for code in codes:
        exec(compile(code, "docs/api.md", "exec"), {"__name__": "docs"})


def family_options(argv: list[str]) -> set[str]:
    """`probe study`'s family options: the fields (and aliases) of the named family's Config."""
    import dataclasses

    from depthprobe.probes.engine.plugins import load_plugin
    from depthprobe.probes.experiments.protocol import get_experiment

    if "--plugin" in argv:
        load_plugin(str(ROOT / argv[argv.index("--plugin") + 1]))
    exp = get_experiment(argv[argv.index("--family") + 1])
    names = [f.name for f in dataclasses.fields(exp.Config)] + list(exp.aliases)
    return {"--" + n.replace("_", "-") for n in names}


def doc_commands() -> list[str]:
    """Every `probe ...` command line of the README's and docs' bash and sh blocks."""
    commands = []
    for block in blocks("bash", DOCS) + blocks("sh", DOCS):
        text = block.replace("\\\n", " ")
        commands += [
            ln.split(" #")[0].strip()
            for ln in text.splitlines()
            if ln.strip().startswith((".venv/bin/probe ", "probe "))
        ]
    return commands


def leaf(argv: list[str]) -> tuple[Any, list[str]]:
    """The sub-command an argv names (probe list tasks, probe run, ...) and the arguments left."""
    command = typer.main.get_command(app)
    while argv and not argv[0].startswith("-") and hasattr(command, "commands"):
        command, argv = command.commands[argv[0]], argv[1:]
    return command, argv


def test_every_probe_command_parses_as_written():
    """Each command's arguments as the command line reads them (types, choices, counts), without
    running it; a line with a shell variable ($L in a loop) is skipped."""
    for cmd in doc_commands():
        argv = shlex.split(cmd)[1:]
        if any("$" in a for a in argv):
            continue
        command, rest = leaf(argv)
        try:
            command.make_context(command.name or "probe", list(rest), resilient_parsing=False)
        except click.UsageError as exc:
            raise AssertionError(f"{cmd}: {exc.format_message()}") from None


LAW_FAMILIES = ("khop", "groups", "crasp")  # their plans need no corpus: checked when parsed


@pytest.mark.slow
def test_every_study_command_plans_as_written(tmp_path, monkeypatch):
    """Each text `probe study` command of the docs, run as `--dry-run` (plans, refusals included,
    and trains nothing) in an empty folder: a planned study the command would refuse fails here.
    About a minute: each plan reads and tokenizes its corpus."""
    from typer.testing import CliRunner

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DEPTHPROBE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "my-corpus.txt").write_text((ROOT / "tasks/data/tinyshakespeare.txt").read_text()[:400_000])
    studies = [shlex.split(c)[1:] for c in doc_commands() if shlex.split(c)[1:2] == ["study"]]
    studies = [a for a in studies if not any(f in a for f in LAW_FAMILIES)]
    assert len(studies) > 10
    for i, argv in enumerate(studies):
        if "--out" not in argv and "-o" not in argv:
            argv = [*argv, "--out", f"plans/{i}"]
        argv = [*argv, "--dry-run"] if "--dry-run" not in argv else argv
        argv = [str(ROOT / a) if prev == "--plugin" else a for prev, a in zip(["", *argv[:-1]], argv, strict=True)]
        res = CliRunner().invoke(app, argv)  # the docs' commands run in the repository: its files by full path
        assert res.exit_code == 0, (" ".join(argv), res.output[-600:])


def test_every_probe_command_names_a_real_command_and_options():
    commands = doc_commands()
    assert len(commands) > 20, "the README and docs show probe commands"
    root = typer.main.get_command(app)
    for cmd in commands:
        argv = shlex.split(cmd)[1:]
        command = root
        for a in argv:  # walk the sub-command path: probe list tasks, probe run, ...
            if a.startswith("-") or not hasattr(command, "commands"):
                break
            assert a in command.commands, (cmd, a)
            command = command.commands[a]
        known = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
        known |= family_options(argv) if command.name == "study" else set()
        for opt in (a.split("=")[0] for a in argv if a.startswith("--")):
            assert opt in known, (cmd, opt)


def test_every_probe_command_is_the_full_command():
    """#47: the docs' commands run as pasted from the repository root (.venv/bin/probe, as the
    README installs it), not a bare `probe` that only an activated environment finds."""
    bare = [c for c in doc_commands() if not c.startswith(".venv/bin/probe ")]
    assert not bare, bare


def test_no_page_writes_into_another_pages_out():
    """#47: a training or run command that writes the --out folder another page's command writes
    is refused when both are run (the folder exists); each page names its own. A study's --out may
    be given again (a rerun continues it), and --resume continues a training on purpose."""
    owners: dict[str, set[str]] = {}
    for page in DOCS:
        for block in blocks("bash", [page]) + blocks("sh", [page]):
            for ln in block.replace("\\\n", " ").splitlines():
                argv = shlex.split(ln.split(" #")[0]) if ln.strip().startswith(".venv/bin/probe ") else []
                if len(argv) > 2 and argv[1] in ("train", "run", "compare", "sweep") and "--resume" not in argv:
                    out = next((b for a, b in itertools.pairwise(argv) if a in ("--out", "-o")), None)
                    if out is not None and "$" not in out:
                        owners.setdefault(out, set()).add(page.name)
    shared = {out: pages for out, pages in owners.items() if len(pages) > 1}
    assert not shared, shared
