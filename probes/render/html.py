"""The HTML kit: escaping, tables, ``data:`` images, the self-contained page and its atomic writer.

Every page is one HTML file that makes no network request:

- the circuitsvis JavaScript bundle (shipped inside the circuitsvis package) is inlined ONCE per
  page that holds attention views (``probes.render.attention``), however many views it holds,
  together with the small loader that draws them;
- a Content-Security-Policy allows only this page's own two scripts (by hash), inline styles
  and ``data:`` images, so even a page that somehow carried injected markup could neither run
  it nor fetch anything.

Token text is data, never markup: it reaches the browser only inside JSON whose ``<``, ``>``
and ``&`` (and U+2028/U+2029) are ``\\u`` escapes, so ``</script>`` or ``<!--`` can never
appear in a script block, and circuitsvis (React) writes it as text nodes or onto a canvas.
Control characters and bidirectional overrides are shown as visible ``<U+202E>`` marks.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html
import json
import math
import re
import sys
import unicodedata
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from depthprobe.probes.base.artifacts import replace_file, write_error
from depthprobe.probes.base.errors import ProbeError

_BIDI = {0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)}


# ----------------------------------------------------------------------------------------------
# escaping
# ----------------------------------------------------------------------------------------------


def _visible(ch: str) -> str:
    if ch == "\n":
        return "\\n"
    if ch == "\t":
        return "\\t"
    return f"<U+{ord(ch):04X}>"


def clean(text: Any) -> str:
    """Text with control characters and bidirectional overrides made visible (``<U+202E>``)."""
    s = str(text)
    return "".join(_visible(c) if (ord(c) in _BIDI or unicodedata.category(c) == "Cc") else c for c in s)


def esc(text: Any) -> str:
    """Text for HTML element content or a quoted attribute value."""
    return html.escape(clean(text), quote=True)


# an absolute path of two or more parts, not inside a word: POSIX or home-relative (parts split at
# "/" only: a POSIX name may hold a backslash), or Windows (split at "\\")
_ABSOLUTE = re.compile(
    r"(?<![\w.])(?:~?/[^\s,;()'\"<>/]+(?:/[^\s,;()'\"<>/]*)+|[A-Za-z]:\\[^\s,;()'\"<>\\]+(?:\\[^\s,;()'\"<>\\]*)*)"
)


def no_paths(text: Any) -> str:
    """``text`` with every absolute path shortened to its last two parts after an ellipsis
    (``/home/me/data/wiki.txt`` -> ``…/data/wiki.txt``): what a page header shows of a file or
    folder, so that no header carries the machine's layout. Relative paths and hub names
    (``org/model``) are kept."""

    def last(m: re.Match[str]) -> str:
        path = m.group(0)
        sep = "\\" if path[1:2] == ":" else "/"
        parts = [p for p in path.split(sep) if p]
        return "…" + sep + sep.join(parts[-2:])

    return _ABSOLUTE.sub(last, str(text))


def script_json(obj: Any) -> str:
    """JSON safe to place inside a ``<script>`` element.

    ``<``, ``>`` and ``&`` only occur inside JSON strings, where ``\\u003c`` etc. mean the same,
    so ``</script>`` and ``<!--`` cannot appear; U+2028/U+2029 are escaped for old JS parsers.
    """
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for ch, rep in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, rep)
    return text


# ----------------------------------------------------------------------------------------------
# tables and images
# ----------------------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, (float, np.floating)):
        return esc(f"{float(value):.4g}")
    if isinstance(value, (dict, list)):
        return esc(json.dumps(value, ensure_ascii=False))
    return esc(value)


def table(records: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """An HTML table of records; every header and cell escaped."""
    if not records:
        return "<p class='meta'>(empty)</p>"
    cols = list(columns) if columns else list(dict.fromkeys(k for r in records for k in r))
    head = "".join(f"<th>{esc(c)}</th>" for c in cols)
    rows = "".join("<tr>" + "".join(f"<td>{_cell(r.get(c))}</td>" for c in cols) + "</tr>" for r in records)
    return (
        f"<div class='tablewrap'><table class='data'><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>"
    )


def svg_img(svg: str, alt: str) -> str:
    """Standalone SVG text as an ``<img>`` with a ``data:`` source (it can neither run script nor fetch)."""
    data = base64.b64encode(svg.encode("utf-8")).decode("ascii")
    return f'<img alt="{esc(alt)}" src="data:image/svg+xml;base64,{data}">'


# ----------------------------------------------------------------------------------------------
# the page and the scripts it inlines
# ----------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def bundle_js() -> str:
    """circuitsvis's browser bundle, made safe to inline (no ``</script``, no source-map fetch)."""
    import circuitsvis

    path = Path(circuitsvis.__file__).parent / "dist" / "cdn" / "iife.js"
    try:
        js = path.read_text(encoding="utf-8")
    except OSError:
        raise ProbeError(
            f"circuitsvis bundle {path} is missing; reinstall it: pip install --force-reinstall circuitsvis"
        ) from None
    js = re.sub(r"^//# sourceMappingURL=.*$", "", js, flags=re.M)
    # both sequences occur (if at all) only inside JS string literals, where the escape is harmless
    js = re.sub(r"</(script)", r"<\\/\1", js, flags=re.I).replace("<!--", "<\\!--")
    return js


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode() + "'"


def _asset(name: str) -> str:
    """The text of ``assets/NAME`` (shipped as package data)."""
    return (resources.files("depthprobe.probes.render") / "assets" / name).read_text(encoding="utf-8")


# The page's style sheet and the attention-view loader are asset files beside this module.
STYLE = _asset("page.css")
LOADER = _asset("attention.js")


def page(title: str, body: str, payloads: Sequence[dict[str, Any]] = (), *, bundle: bool = True) -> str:
    """A complete, self-contained HTML document. ``body`` must already be escaped markup.

    With view payloads, the circuitsvis bundle and the loader are appended once (the views' status
    line is part of their markup, ``attention.views_html``, under the page's title). Without the
    bundle (``bundle=False``: a notebook output after the first, see :func:`notebook_bundle`), the
    page borrows it from an earlier page in a frame of the same host (its hash stays pinned).
    """
    scripts, hashes = "", []
    if payloads:
        code, loader = bundle_js(), LOADER
        hashes = [_sha256(code), _sha256(loader)]
        inline = f"<script id='dp-bundle'>{code}</script>" if bundle else ""
        scripts = (
            f"<script type='application/json' id='dp-views-data'>{script_json(list(payloads))}</script>"
            f"{inline}<script>{loader}</script>"
        )
    return _document(title, body, scripts, hashes)


def canvas_page(title: str, body: str, data: dict[str, Any], script: str) -> str:
    """A self-contained page drawn by one asset script of its own (``script``: its file name in
    ``assets/``) from ``data`` (a JSON block, ``dp-inspect-data``) on plain canvases and tables:
    no circuitsvis bundle, the same Content-Security-Policy (that one script, pinned by hash)."""
    code = _asset(script)
    scripts = (
        f"<script type='application/json' id='dp-inspect-data'>{script_json(data)}</script><script>{code}</script>"
    )
    return _document(title, body, scripts, [_sha256(code)])


def _document(title: str, body: str, scripts: str, hashes: Sequence[str]) -> str:
    script_src = " ".join(hashes) if hashes else "'none'"
    csp = (
        f"default-src 'none'; script-src {script_src}; style-src 'unsafe-inline'; img-src data:; "
        "font-src 'none'; connect-src 'none'; base-uri 'none'; form-action 'none'"
    )
    return (
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<meta http-equiv='Content-Security-Policy' content=\"{csp}\">"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<meta name='referrer' content='no-referrer'><title>{esc(title)}</title>"
        f"<style>{STYLE}</style></head>\n<body>{body}\n{scripts}</body></html>\n"
    )


# The notebook cell whose output carries the circuitsvis bundle: None until a display carries it,
# and again once that cell runs anew (its output, bundle and all, is replaced); "" outside a kernel.
_NOTEBOOK: dict[str, Any] = {"carrier": None, "watching": None}


def _running_cell() -> str | None:
    """The Jupyter cell running now, as the front end names it: its cell id (JupyterLab, Notebook 7
    and VS Code send one), else its code; None outside a Jupyter kernel. The first call in a kernel
    also starts watching for the carrier's cell to run again."""
    ipython = sys.modules.get("IPython")  # never imported here: a plain script has no cells
    shell = ipython.get_ipython() if ipython is not None else None
    try:
        parent = shell.kernel.get_parent()  # type: ignore[union-attr]  # the execute request
        cell = parent["metadata"].get("cellId") or parent["content"]["code"]
    except (AttributeError, KeyError, TypeError):
        return None
    if _NOTEBOOK["watching"] is not shell:
        shell.events.register("pre_run_cell", _on_cell_run)  # type: ignore[union-attr]
        _NOTEBOOK["watching"] = shell
    return str(cell)


def _on_cell_run(info: Any) -> None:
    if _NOTEBOOK["carrier"] is not None and _NOTEBOOK["carrier"] == (getattr(info, "cell_id", None) or info.raw_cell):
        _NOTEBOOK["carrier"] = None  # the carrier's output is about to be replaced: the next display carries it


def notebook_bundle(bundle: bool | None = None) -> bool:
    """Whether a notebook display carries the circuitsvis bundle (1.3 MB): always (True), never
    (False), or (None) when no output on the notebook holds it: the first display, and the first
    after the cell that carried it runs again (a re-run replaces that cell's output, so the saved
    notebook would hold no bundle and every view would fail on reload). Later displays borrow it."""
    cell = _running_cell()
    if bundle is None:
        bundle = _NOTEBOOK["carrier"] is None
    if bundle:
        _NOTEBOOK["carrier"] = "" if cell is None else cell
    return bundle


def write_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` via a temporary sibling file (never a half-written page): a text
    page over the one atomic writer, ``artifacts.replace_file``."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ProbeError(f"cannot write {path}: {exc.strerror}; choose another --out") from None
    try:
        return replace_file(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    except OSError as exc:
        raise write_error(exc, path) from None


__all__ = [
    "bundle_js",
    "canvas_page",
    "clean",
    "esc",
    "no_paths",
    "notebook_bundle",
    "page",
    "script_json",
    "svg_img",
    "table",
    "write_atomic",
]
