"""List modules over 500 lines and functions over 60 lines in probes/, tasks/ and cli/.

A function's length runs from its ``def`` (decorators excluded) to its last line, docstring
included. Typer commands are the one exception the style allows: their signature declares every
option, so in cli/ only the body (from the first statement after the docstring) is counted.

Sizes are measured on formatted code: each module with its ``# fmt: skip`` markers removed, as
``ruff format`` (the project's settings) writes it, so packing lines by hand does not make a module
or a function shorter.

Run from anywhere: ``python scripts/check_sizes.py``; prints each offender and exits 1.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("probes", "tasks", "cli")
MAX_MODULE = 500
MAX_FUNCTION = 60


def _is_command(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A typer command: decorated with ``@app.command(...)`` or ``@something_app.command(...)``."""
    for d in node.decorator_list:
        call = d.func if isinstance(d, ast.Call) else d
        if isinstance(call, ast.Attribute) and call.attr == "command":
            return True
    return False


def _length(node: ast.FunctionDef | ast.AsyncFunctionDef, in_cli: bool) -> int:
    end = node.end_lineno or node.lineno
    if in_cli and _is_command(node):
        body = node.body[1:] if ast.get_docstring(node) and len(node.body) > 1 else node.body
        return end - body[0].lineno + 1
    return end - node.lineno + 1


SKIP = re.compile(r"[ \t]*# fmt: skip\b")


def formatted(root: Path, paths: list[Path]) -> dict[Path, str]:
    """Each module as ``ruff format`` writes it once its ``# fmt: skip`` markers are gone."""
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    with tempfile.TemporaryDirectory(prefix="check-sizes-") as tmp:
        for path in paths:
            copy = Path(tmp) / path.relative_to(root)
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_text(SKIP.sub("", path.read_text(encoding="utf-8")), encoding="utf-8")
        config = ["--config", str(root / "pyproject.toml")] if (root / "pyproject.toml").is_file() else []
        subprocess.run([ruff, "format", "--quiet", *config, tmp], check=True)
        return {path: (Path(tmp) / path.relative_to(root)).read_text(encoding="utf-8") for path in paths}


def offenders(root: Path = ROOT) -> list[str]:
    found = []
    paths = [path for pkg in PACKAGES for path in sorted((root / pkg).rglob("*.py"))]
    texts = formatted(root, paths)
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            text = texts[path]
            rel = path.relative_to(root)
            n_lines = len(text.splitlines())
            if n_lines > MAX_MODULE:
                found.append(f"{rel}: {n_lines} lines (at most {MAX_MODULE}); split it by concern")
            for node in ast.walk(ast.parse(text, str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = _length(node, pkg == "cli")
                    if n > MAX_FUNCTION:
                        found.append(f"{rel}:{node.lineno} {node.name}: {n} lines (at most {MAX_FUNCTION})")
    return found


def main() -> int:
    found = offenders()
    for line in found:
        print(line)
    if found:
        return 1
    where = ", ".join(PACKAGES)
    print(f"sizes: every module of {where} within {MAX_MODULE} lines, every function within {MAX_FUNCTION}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
