"""Write docs/reference.md, the API reference, from the docstrings of the stable names.

The stable names are the ones ``from depthprobe import probes`` exposes (the facade's ``_NAMES``
table): each gets its signature and docstring, and a class its public methods and properties.
Everything else is internal and may change. ``--check`` writes nothing and exits 1 when the
committed page differs from the generated one (the test suite runs it).

    .venv/bin/python scripts/api_reference.py           # regenerate after changing a docstring
    .venv/bin/python scripts/api_reference.py --check
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path
from typing import Any

PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference.md"
HEADER = """# API reference

Generated from the docstrings by `scripts/api_reference.py` (do not edit by hand: change the
docstring and rerun it; the test suite checks that this page is current). The **stable names** are
the ones `from depthprobe import probes` exposes, listed here; anything imported from deeper modules
is internal and may change. Guides: the README, [api.md](api.md) (capture, caches, interventions),
[plugins.md](plugins.md) (writing a task) and the notebooks in `examples/`.
"""


def _doc(obj: Any) -> str:
    return inspect.cleandoc(obj.__doc__) if obj.__doc__ else "(no docstring)"


def _first(obj: Any) -> str:
    return _doc(obj).split("\n\n")[0].replace("\n", " ")


def _signature(obj: Any) -> str:
    try:
        sig = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""
    return re.sub(r" at 0x[0-9a-f]+", "", sig)  # no memory addresses in defaults


def _kind(obj: Any) -> str:
    if inspect.isclass(obj):
        return "class"
    return "function" if callable(obj) else type(obj).__name__


def _members(cls: type) -> list[str]:
    """A class's public methods and properties, defined on it or a depthprobe base."""
    out = []
    for name in sorted(n for n in dir(cls) if not n.startswith("_")):
        owner = next((k for k in cls.__mro__ if name in k.__dict__), None)
        if owner is None or not owner.__module__.startswith("depthprobe"):
            continue
        attr = owner.__dict__[name]
        if inspect.isclass(attr):  # Options and other class attributes
            continue
        if isinstance(attr, property):
            out.append(f"- `.{name}` (property): {_first(attr) if attr.__doc__ else ''}".rstrip(": "))
        elif callable(attr) or isinstance(attr, (classmethod, staticmethod)):
            fn = attr.__func__ if isinstance(attr, (classmethod, staticmethod)) else attr
            if fn.__doc__:
                out.append(f"- `.{name}{_signature(fn)}`: {_first(fn)}")
    return out


def _entry(name: str, obj: Any, where: str) -> str:
    title = f"### `{name}{_signature(obj) if callable(obj) and not inspect.isclass(obj) else ''}`"
    lines = [f'<a id="{name}"></a>', title, "", f"*{_kind(obj)}, from `depthprobe.probes.{where}`*", ""]
    if inspect.isclass(obj) or callable(obj):
        lines += [_doc(obj), ""]
        if inspect.isclass(obj):
            sig = _signature(obj)
            if sig and sig != "()":
                lines[5:5] = [f"`{name}{sig}`", ""]
            lines += _members(obj) + ([""] if _members(obj) else [])
    else:
        short = len(repr(obj)) < 200 and " at 0x" not in repr(obj)
        lines += [f"`{obj!r}`" if short else f"a `{type(obj).__name__}`", ""]
    return "\n".join(lines)


def render() -> str:
    from depthprobe import probes

    table = probes._NAMES
    rows = ["| name | kind | what |", "|---|---|---|"]
    entries = []
    for name in sorted(table, key=str.lower):
        obj = getattr(probes, name)
        what = _first(obj) if (inspect.isclass(obj) or callable(obj)) else f"`{type(obj).__name__}`"
        rows.append(f"| [`{name}`](#{name}) | {_kind(obj)} | {what.replace('|', '/')} |")
        entries.append(_entry(name, obj, table[name].split(":")[0]))
    return "\n".join([HEADER, "## Stable names", "", *rows, "", "## Reference", "", *entries]).rstrip() + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not PAGE.exists() or PAGE.read_text(encoding="utf-8") != text:
            print(f"{PAGE} is out of date; run .venv/bin/python scripts/api_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
