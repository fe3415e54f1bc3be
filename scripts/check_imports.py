"""Check that imports run one way: cli -> api -> tasks -> core, with no cycles.

Layers (every import inside the package, at any depth of a module, is an edge):

- core:  probes/** (engine, hooks, models, measures, data, render), except the API layer; imports only core modules;
- tasks: tasks/*; import core only, never the API, the CLI or another task
         (tasks/__init__.py is the task table and imports nothing);
- api:   probes/__init__.py, probes/api.py, probes/sweep.py, probes/study/*; import core and the task table;
- cli:   cli/*; imports api and core, never a task module.

Run from anywhere: ``python scripts/check_imports.py``; prints each violation and exits 1.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("probes", "tasks", "cli")
API = {"depthprobe.probes", "depthprobe.probes.api", "depthprobe.probes.sweep"}
API_PACKAGES = ("depthprobe.probes.study",)  # these packages and every module in them
TASK_TABLE = "depthprobe.tasks"
ORDER = {"core": 0, "tasks": 1, "api": 2, "cli": 3}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["depthprobe", *parts])


def layer(module: str) -> str:
    if module in API or any(module == p or module.startswith(p + ".") for p in API_PACKAGES):
        return "api"
    return {"probes": "core", "tasks": "tasks", "cli": "cli"}[module.split(".")[1]]


def imports(path: Path, known: set[str]) -> set[str]:
    """The package's modules imported by ``path`` (``from pkg import mod`` counts as ``pkg.mod``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
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


def violations(edges: dict[str, set[str]]) -> list[str]:
    out = []
    for src, targets in sorted(edges.items()):
        for dst in sorted(targets):
            if dst == "depthprobe":
                out.append(f"{src} imports the bare namespace 'depthprobe'; import a module of it")
                continue
            a, b = layer(src), layer(dst)
            if a == "tasks" and src == TASK_TABLE:
                out.append(f"{src} (the task table) imports {dst}; it must import nothing")
            elif a == "tasks" and b == "tasks":
                out.append(f"task {src} imports task {dst}; move what they share into the core")
            elif a == "cli" and b == "tasks":
                out.append(f"{src} imports task {dst}; the CLI goes through the API")
            elif a == "api" and b == "tasks" and dst != TASK_TABLE:
                out.append(f"{src} imports task {dst}; the API registers tasks through the table only")
            elif ORDER[b] > ORDER[a]:
                out.append(f"{a} module {src} imports {b} module {dst}; imports run cli -> api -> tasks -> core")
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
    problems = violations(graph())
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"imports: {sum(map(len, graph().values()))} edges between {len(graph())} modules, one way, no cycles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
