"""What an installed package's task entry point names, read from its source without importing it
(``probe list tasks`` runs no plugin code): a class, a function, or unknown."""

from __future__ import annotations

import ast
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Literal

Kind = Literal["class", "function", "unknown"]


def _source(module: str) -> Path | None:
    """The file of ``module`` found along sys.path, no package's ``__init__`` run."""
    path = None
    spec = None
    parts = module.split(".")
    for i in range(len(parts)):
        spec = PathFinder.find_spec(".".join(parts[: i + 1]), path)
        if spec is None:
            return None
        path = list(spec.submodule_search_locations or [])
    origin = getattr(spec, "origin", None)
    return Path(origin) if origin and origin.endswith(".py") else None


def entry_kind(ref: str) -> Kind:
    """``"module:object"`` -> whether the module defines ``object`` at top level as a class or a
    function; "unknown" when it cannot tell (assigned, imported, compiled, not found)."""
    module, _, attr = ref.partition(":")
    try:
        source = _source(module)
        tree = ast.parse(source.read_text(encoding="utf-8")) if source is not None else None
    except (OSError, SyntaxError, ValueError, ImportError):
        return "unknown"
    for node in tree.body if tree is not None else []:
        if isinstance(node, ast.ClassDef) and node.name == attr:
            return "class"
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == attr:
            return "function"
    return "unknown"
