"""Count the plain code lines of the experiment layer: ``probes/experiments/`` and its pages.

A code line is a line of a module, as ``ruff format`` writes it with its ``# fmt: skip`` markers
removed (``scripts/check_sizes.py``), that holds a token other than a comment and is not part of a
docstring (the first string of a module, class or function). Blank lines, comment lines and
docstrings do not count; a statement split over five lines counts five. Every revision is formatted
with the tree's ``pyproject.toml``, so both sides are laid out by the same rules. No file is left
out and none is weighed: the count is of :data:`GLOBS` as they are.

    python scripts/count_layer.py              # the layer in the tree
    python scripts/count_layer.py --rev main   # the layer at a git revision
    python scripts/count_layer.py --files      # and each file's count
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import importlib.util
import io
import subprocess
import sys
import tempfile
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("check_sizes", ROOT / "scripts" / "check_sizes.py")
assert _spec and _spec.loader
check_sizes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_sizes)

GLOBS = ["probes/experiments/*.py", "probes/render/laws.py", "probes/render/study*.py"]
DOC_OWNERS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)  # what has a docstring


def code_lines(text: str) -> int:
    """The lines of ``text`` holding code: no blank, comment-only or docstring line."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None) if isinstance(node, DOC_OWNERS) else None
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    lines: set[int] = set()
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    skip |= {tokenize.ENCODING, tokenize.ENDMARKER}
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type not in skip:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout


def layer(rev: str) -> dict[str, int]:
    """Each file of the layer (:data:`GLOBS`) at ``rev`` (``tree``: the working tree) and its code lines."""
    if rev == "tree":
        listed = [str(p.relative_to(ROOT)) for g in GLOBS for p in ROOT.glob(g)]
    else:
        listed = _git("ls-tree", "-r", "--name-only", rev).split()
    paths = sorted(p for p in listed if any(fnmatch.fnmatchcase(p, g) for g in GLOBS))
    with tempfile.TemporaryDirectory(prefix="count-layer-") as tmp:
        root = Path(tmp)
        (root / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
        for path in paths:
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            text = (ROOT / path).read_text(encoding="utf-8") if rev == "tree" else _git("show", f"{rev}:{path}")
            (root / path).write_text(text, encoding="utf-8")
        texts = check_sizes.formatted(root, [root / path for path in paths])
        return {path: code_lines(texts[root / path]) for path in paths}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default="tree", help='a git revision ("tree": the working tree)')
    parser.add_argument("--files", action="store_true", help="print each file's count")
    args = parser.parse_args(argv)
    counts = layer(args.rev)
    for path, n in counts.items() if args.files else ():
        print(f"{n:5d}  {path}")
    print(f"{args.rev}: {sum(counts.values()):,} code lines in {len(counts)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
