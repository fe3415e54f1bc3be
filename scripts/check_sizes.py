"""List modules over 500 lines and functions over 60 lines in probes/, tasks/ and cli/.

A function's length runs from its ``def`` (decorators excluded) to its last line, docstring
included. Typer commands are the one exception the style allows: their signature declares every
option, so in cli/ only the body (from the first statement after the docstring) is counted.

Run from anywhere: ``python scripts/check_sizes.py``; prints each offender and exits 1.
"""

from __future__ import annotations

import ast
import sys
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


def offenders(root: Path = ROOT) -> list[str]:
    found = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
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
