"""Helpers shared by the CLI tests (fixtures live in conftest.py)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from typer.testing import CliRunner


def one_line_error(result: Any, *fragments: str, code: int = 2) -> str:
    """A CLI result that failed with exit ``code`` and printed exactly one line, ``error: ...``,
    holding every fragment and no traceback; returns that line."""
    assert result.exit_code == code, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


def probe_cli(*args: Any) -> Any:
    """``probe ARGS`` through typer's runner (each argument as a string): the result to check."""
    from depthprobe.cli.main import app

    return CliRunner().invoke(app, [str(a) for a in args])


def cli_error(args: Sequence[Any], *fragments: str, code: int = 2) -> str:
    """Run ``probe ARGS`` and check it with :func:`one_line_error`; returns the error line."""
    from depthprobe.cli.main import app

    return one_line_error(CliRunner().invoke(app, [str(a) for a in args]), *fragments, code=code)


TOY_FAMILY = str(Path(__file__).resolve().parent / "fixtures" / "toy_family.py")  # docs/architecture.md's example


def toy_study(out: Path, *more: str) -> Any:
    """``probe study --plugin tests/fixtures/toy_family.py --family toy --out OUT MORE...`` through typer's runner."""
    from depthprobe.cli.main import app

    return CliRunner().invoke(app, ["study", "--plugin", TOY_FAMILY, "--family", "toy", "--out", str(out), *more])


def run_python(code: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``code`` run by this interpreter in a fresh process (a clean ``sys.modules``), output captured."""
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def resolve(family: str, preset: str = "smoke", **given: Any) -> Any:
    """A family's resolved Config (the preset, then ``given``)."""
    from depthprobe.probes.experiments.protocol import get_experiment

    return get_experiment(family).config(preset, **given)


def plan(cfg: Any) -> list[Any]:
    """The member jobs of a resolved Config, by the family whose Config it is."""
    from depthprobe.probes.experiments.protocol import EXPERIMENTS, get_experiment

    family = next(n for n in EXPERIMENTS.names() if type(cfg) is get_experiment(n).Config)
    return get_experiment(family).plan(cfg)


def law_table(accuracy: Any, family: str, threshold: float, seeds: int) -> Any:
    from depthprobe.probes.experiments.protocol import get_experiment

    return get_experiment(family).law(resolve(family, "smoke", threshold=threshold, seeds=seeds), accuracy)


class CountTokens:
    """The body of a tiny user task, mixed in before ``Task`` by the tests that define one: two
    examples of token ids (no tokenizer), one hook, and the number of tokens seen as its state."""

    needs_text = False

    def load(self, model: Any, ctx: Any) -> Any:
        from depthprobe.probes.engine.task import Examples

        return Examples([[1, 2, 3], [4, 5]])

    def hook_names(self, model: Any, ctx: Any) -> list[str]:
        return ["blocks.0.hook_resid_post"]

    def start(self, model: Any, ctx: Any, examples: Any) -> list[int]:
        return [0]

    def accumulate(self, state: list[int], batch: Any, acts: Any) -> None:
        state[0] += int(batch.attention_mask.sum())


class ReadsNothing:
    """The body of a task that reads nothing (one example, no hook, no state), mixed in before
    ``Task`` by the tests of what a task must or may define."""

    def load(self, model: Any, ctx: Any) -> Any:
        from depthprobe.probes.engine.task import Examples

        return Examples([[1, 2]])

    def hook_names(self, model: Any, ctx: Any) -> list[str]:
        return []

    def start(self, model: Any, ctx: Any, examples: Any) -> int:
        return 0

    def accumulate(self, state: int, batch: Any, acts: Any) -> None:
        pass


@contextlib.contextmanager
def tmpfs(folder: Path, options: str) -> Iterator[Path]:
    """A real tmpfs mounted at ``folder`` (made here) with mount ``options`` (``size=64k``,
    ``ro,size=16k``), unmounted afterwards; the test is skipped where mounting is not allowed
    (it needs root with CAP_SYS_ADMIN)."""
    import pytest

    folder.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {made.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)
