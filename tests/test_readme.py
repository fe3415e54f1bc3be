"""The README's examples work as written: its Python blocks run, its commands parse."""
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app

README = Path(__file__).resolve().parent.parent / "README.md"


def blocks(lang):
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


@pytest.mark.slow
def test_python_blocks_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # result.save() writes artifacts/ here
    for code in blocks("python"):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    assert any((tmp_path / "artifacts" / "runs").iterdir())


def test_every_probe_command_names_a_real_command_and_options():
    runner = CliRunner()
    commands = []
    for block in blocks("bash"):
        text = block.replace("\\\n", " ")
        commands += [ln.split("#")[0].strip() for ln in text.splitlines() if ln.strip().startswith(".venv/bin/probe")]
    assert commands, "the README shows probe commands"
    for cmd in commands:
        argv = shlex.split(cmd)[1:]
        # --help after the subcommand validates the command path without running it
        path = []
        for a in argv:
            if a.startswith("-"):
                break
            path.append(a)
        res = runner.invoke(app, path + ["--help"])
        assert res.exit_code == 0, (cmd, res.output)
        help_text = res.output
        for opt in (a for a in argv if a.startswith("--")):
            assert opt.split("=")[0] in help_text, (cmd, opt)
