"""The README's examples work as written: its Python blocks run, its commands parse."""

import re
import shlex
from pathlib import Path

import pytest
import typer

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


def test_every_probe_command_names_a_real_command_and_options():
    commands = []
    for block in blocks("bash", DOCS) + blocks("sh", DOCS):
        text = block.replace("\\\n", " ")
        commands += [
            ln.split(" #")[0].strip()
            for ln in text.splitlines()
            if ln.strip().startswith((".venv/bin/probe ", "probe "))
        ]
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
