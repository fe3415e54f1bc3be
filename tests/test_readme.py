"""The README's examples work as written: its Python blocks run, its commands parse."""

import itertools
import re
import shlex
import subprocess
import sys
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


FENCED = re.compile(r"^```.*?^```", flags=re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")  # [text](target) and ![alt](target)


def anchors(page: Path) -> set[str]:
    """The fragments a link may name on a page: its headings as GitHub slugs them (lower case,
    punctuation other than - and _ dropped, spaces to -, repeats numbered) and explicit ids."""
    text = FENCED.sub("", page.read_text(encoding="utf-8"))
    out = set(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", text))
    seen: dict[str, int] = {}
    for title in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = seen[slug] = seen.get(slug, -1) + 1
        out.add(f"{slug}-{n}" if n else slug)
    return out


def broken_links(page: Path) -> list[str]:
    """The markdown links of a page (outside code) to a file or heading that does not exist."""
    prose = re.sub(r"`[^`\n]*`", "", FENCED.sub("", page.read_text(encoding="utf-8")))
    bad = []
    for target in LINK.findall(prose):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or ROOT not in dest.parents:
            bad.append(f"{page.relative_to(ROOT)}: {target} (no such file in the repository)")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            bad.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    return bad


def test_doc_links_resolve_to_files_and_headings_of_the_repository():
    assert len(DOCS) > 10
    bad = [b for page in DOCS for b in broken_links(page)]
    assert not bad, "\n".join(bad)


def test_broken_links_are_found(tmp_path, monkeypatch):
    """The check above can fail: a missing file, a missing heading and a link out of the
    repository are each reported; a present heading, an id and a web address are not."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text('# B page\n\n## 3.1 Word-level attention\n<a id="x"></a>\n')
    page = tmp_path / "docs" / "a.md"
    page.write_text(
        "[ok](b.md#31-word-level-attention) [ok](b.md#x) [web](https://example.org/c.md) `[code](c.md)`\n"
        "[gone](c.md) [heading](b.md#3-9) [outside](../../elsewhere.md)\n```\n[fenced](d.md)\n```\n"
    )
    assert [b.split(": ", 1)[1] for b in broken_links(page)] == [
        "c.md (no such file in the repository)",
        "b.md#3-9 (no such heading)",
        "../../elsewhere.md (no such file in the repository)",
    ]


# Design and style texts kept outside the repository, cited by name or as "<name> §k" (the pattern
# is written so that this module does not match it).
NOT_IN_REPO = re.compile(r"\b(?:DESIGN|STYLE)\.md\b|\bDESIGN\s§")


def test_no_tracked_file_cites_a_design_text_the_repository_does_not_hold():
    """The protocols the code cites are docs/protocols.md: no tracked file points at a design or
    style text (NOT_IN_REPO) that the repository does not hold."""
    try:
        files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    names = [n for n in files.decode().split("\0") if n]
    assert len(names) > 100
    held = {Path(n).name for n in names}
    bad = []
    for name in names:
        raw = (ROOT / name).read_bytes() if (ROOT / name).is_file() else b""
        for no, line in enumerate(raw.decode("utf-8", "replace").splitlines(), 1):
            bad += [f"{name}:{no}: {m}" for m in NOT_IN_REPO.findall(line) if m.split()[0] not in held]
    assert not bad, "cite docs/protocols.md instead:\n" + "\n".join(bad)


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
