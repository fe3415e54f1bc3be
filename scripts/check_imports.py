"""Check that imports run one way between folders (floors), with no cycles between modules.

Floors, top to bottom; a module may import its own folder and any folder on a lower floor, never a
folder beside it or above it (imports under ``if TYPE_CHECKING:`` are annotations, not edges):

    9  cli/                       typer app, thin; never imports a task module
    8  probes/experiments/        the depth families (one module each) and the one study runner
    7  probes/api/, probes/__init__.py   one module per verb; the lazy facade
    6  tasks/                     one module or package per task; never another task (a task package's
                               own modules import each other), never the API
    5  probes/engine/             task protocol, streaming loop, distributed execution
    4  probes/hooks/, probes/training/   capture and edits; the training loops
    3  probes/models/             loading, model types, families, checkpoints
    2  probes/data/               readers, alignment, corpora, synthetic data
    1  probes/render/, probes/measures/  HTML/SVG from data (imports only probes/base/); tensor maths
    0  probes/base/               errors, options, registry, runtime, artifacts, batching

``depthprobe.tasks`` (tasks/__init__.py, the task table) imports nothing, and
``depthprobe.tasks.cards`` (each task's description and options) only probes/base/: the engine's
registry, the tasks and the CLI's ``probe list tasks`` read them, so they sit outside the floors.

Run from anywhere: ``python scripts/check_imports.py``; prints each violation and exits 1.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("probes", "tasks", "cli")
TASK_TABLE = "depthprobe.tasks"
TASK_CARDS = "depthprobe.tasks.cards"
FLOORS = {
    "probes.base": 0,
    "probes.render": 1,
    "probes.measures": 1,
    "probes.data": 2,
    "probes.models": 3,
    "probes.hooks": 4,
    "probes.training": 4,
    "probes.engine": 5,
    "tasks": 6,
    "probes.api": 7,
    "probes": 7,  # the facade, probes/__init__.py
    "probes.experiments": 8,
    "cli": 9,
}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["depthprobe", *parts])


def folder(module: str) -> str:
    """The floor's folder of a module: ``depthprobe.probes.models.loading`` -> ``probes.models``."""
    parts = module.split(".")[1:]
    if parts[0] == "probes" and len(parts) > 1 and f"probes.{parts[1]}" in FLOORS:
        return f"probes.{parts[1]}"
    return parts[0]


def _type_only(tree: ast.AST) -> set[int]:
    """ids of import nodes under ``if TYPE_CHECKING:`` (annotations, not run)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def imports(path: Path, known: set[str]) -> set[str]:
    """The package's modules imported by ``path`` (``from pkg import mod`` counts as ``pkg.mod``)."""
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    skip = _type_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
            names = [n if n in known else node.module for n in names]
        else:
            continue
        found.update(n for n in names if n in known)
    return found


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    files = {module_name(p, root): p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))}
    known = set(files) | {"depthprobe"}
    return {m: imports(p, known) - {m} for m, p in files.items()}


def problem(src: str, dst: str) -> str | None:
    """Why the edge src -> dst breaks the floor plan, or None."""
    if dst == "depthprobe":
        return f"{src} imports the bare namespace 'depthprobe'; import a module of it"
    if src == TASK_TABLE:
        return f"{src} (the task table) imports {dst}; it must import nothing"
    if src == TASK_CARDS and folder(dst) != "probes.base":
        return f"{src} (the task cards) imports {dst}; it may import only probes/base/"
    if dst in (TASK_TABLE, TASK_CARDS):
        return None
    a, b = folder(src), folder(dst)
    if a == "tasks" and b == "tasks" and src.split(".")[:3] != dst.split(".")[:3]:
        return f"task {src} imports task {dst}; move what they share into the core"
    if a == b:
        return None
    if a == "cli" and b == "tasks":
        return f"{src} imports task {dst}; the CLI goes through the API"
    if a == "probes.render" and b != "probes.base":
        return f"{src} imports {dst}; render/ turns data into HTML and imports only probes/base/"
    if FLOORS[b] >= FLOORS[a] and not (a == "probes" and b == "probes.api"):
        where = "beside" if FLOORS[b] == FLOORS[a] else "above"
        return f"{src} ({a}) imports {dst} ({b}), a folder {where} it; see scripts/check_imports.py for the floors"
    return None


def violations(edges: dict[str, set[str]]) -> list[str]:
    out = [p for src, targets in sorted(edges.items()) for dst in sorted(targets) if (p := problem(src, dst))]
    out += [f"import cycle among: {', '.join(c)}" for c in cycles(edges)]
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in edges:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def main() -> int:
    edges = graph()
    problems = violations(edges)
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"imports: {sum(map(len, edges.values()))} edges between {len(edges)} modules, floors one way, no cycles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
