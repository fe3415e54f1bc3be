"""Offline, self-contained attention views (circuitsvis) and the safe page assembly they need.

Every page is one HTML file that makes no network request:

- the circuitsvis JavaScript bundle (shipped inside the circuitsvis package) is inlined ONCE per
  page, however many views it holds;
- attention patterns travel as quantised integers (``round(value * 10^4)``, 10^3 for long views;
  uint16 when every value fits, else int32), deflated and base64-encoded, inside one
  ``<script type="application/json">`` block; a small loader inflates them in the browser
  (``DecompressionStream``) and draws the views one after another;
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
import re
import unicodedata
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from depthprobe.probes.base.artifacts import replace_file, write_error
from depthprobe.probes.base.errors import ProbeError

MAX_TOKENS = 512  # default token limit of a view; longer inputs are cut and the page says so
SCALE = 10_000  # pattern values are stored as round(value * SCALE): 4 decimals
LONG_SCALE = 1_000  # 3 decimals for views over HEADS_CELLS (halves a 512-token page)
MAX_TOKEN_CHARS = 100  # longer token labels are shortened for display (the page says by how much)
# above this many cells (heads x tokens^2) a view shows one head at a time instead of all
# thumbnails at once: circuitsvis draws every cell as a chart element (about 10 us each)
HEADS_CELLS = 12 * 64 * 64
# above this many tokens a head is drawn as one pixel per cell on a plain canvas (instant) instead
# of a circuitsvis chart, which takes seconds per head at 512 tokens
RASTER_TOKENS = 160

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


def plot_text(text: Any) -> str:
    """Text drawn by matplotlib, shown as written: ``$`` escaped so that no mathtext is parsed
    (model names and labels may hold ``$``, ``\\``, ``{``; mathtext would reject or mangle them)."""
    return str(text).replace("$", r"\$")


def figure_svg(fig: Any, tight: bool = False) -> str:
    """A matplotlib figure as SVG text: no date stamp (reruns are byte-identical), and the figure is
    closed if pyplot holds it. The one SVG writer for the plots of reports, tasks and comparisons."""
    import io
    import sys

    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None}, **({"bbox_inches": "tight"} if tight else {}))
    pyplot = sys.modules.get("matplotlib.pyplot")  # figures made with Figure() need no closing
    if pyplot is not None:
        pyplot.close(fig)
    return buf.getvalue()


def script_json(obj: Any) -> str:
    """JSON safe to place inside a ``<script>`` element.

    ``<``, ``>`` and ``&`` only occur inside JSON strings, where ``\\u003c`` etc. mean the same,
    so ``</script>`` and ``<!--`` cannot appear; U+2028/U+2029 are escaped for old JS parsers.
    """
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for ch, rep in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, rep)
    return text


def display_token(token: Any) -> str:
    """A token as it is shown in a view: controls visible, very long ones shortened."""
    s = clean(token)
    if len(s) > MAX_TOKEN_CHARS:
        s = f"{s[: MAX_TOKEN_CHARS - 12]}…(+{len(s) - MAX_TOKEN_CHARS + 12} chars)"
    return s


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


# ----------------------------------------------------------------------------------------------
# views: validation, cutting and compact encoding
# ----------------------------------------------------------------------------------------------


def encode_pattern(pattern: np.ndarray, scale: int = SCALE) -> dict[str, Any]:
    """[head, query, key] floats -> {"shape", "dtype", "scale", "data"} (deflated base64 ints)."""
    a = np.nan_to_num(np.asarray(pattern, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    q = np.round(a * scale)
    if q.size == 0 or (q.min() >= 0 and q.max() <= np.iinfo(np.uint16).max):
        raw, dtype = q.astype("<u2").tobytes(), "u2"
    else:
        info = np.iinfo(np.int32)
        raw, dtype = np.clip(q, info.min, info.max).astype("<i4").tobytes(), "i4"
    return {
        "shape": list(a.shape),
        "dtype": dtype,
        "scale": scale,
        "data": base64.b64encode(zlib.compress(raw, 9)).decode("ascii"),
    }


def decode_pattern(enc: dict[str, Any]) -> np.ndarray:
    """Inverse of :func:`encode_pattern` (what the browser loader does), for tests."""
    raw = zlib.decompress(base64.b64decode(enc["data"]))
    a = np.frombuffer(raw, dtype="<u2" if enc["dtype"] == "u2" else "<i4").astype(np.float64)
    return a.reshape(enc["shape"]) / enc["scale"]


@dataclass
class View:
    """One attention view ready for a page: [head, query, key] pattern over ``tokens``."""

    title: str
    tokens: list[str]
    pattern: np.ndarray  # [head, query, key]
    heads: list[str]
    causal: bool
    notes: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> View:
        """A view as tasks write it (views.json); shape errors raise ValueError with the reason."""
        tokens = [str(t) for t in d.get("tokens", [])]
        pattern = np.asarray(d.get("pattern", []), dtype=np.float64)
        if pattern.ndim == 2:  # a single head: [query, key] -> [1, query, key]
            pattern = pattern[None]
        if pattern.ndim != 3:
            raise ValueError(f"pattern must be head x query x key, got {pattern.ndim} dimension(s)")
        n_heads, n_q, n_k = pattern.shape
        if n_q != len(tokens) or n_k != len(tokens):
            raise ValueError(f"pattern is {n_q} x {n_k} but there are {len(tokens)} tokens")
        heads = [str(h) for h in d.get("heads") or [f"head {i}" for i in range(n_heads)]]
        if len(heads) != n_heads:
            raise ValueError(f"{len(heads)} head labels for {n_heads} heads")
        return cls(
            str(d.get("title", "")),
            tokens,
            pattern,
            heads,
            bool(d.get("causal", False)),
            [str(n) for n in d.get("notes", [])],
        )

    def cut(self, max_tokens: int) -> View:
        """The first ``max_tokens`` tokens only, with a note saying what was cut."""
        n = len(self.tokens)
        if n <= max_tokens:
            return self
        note = f"showing the first {max_tokens} of {n} tokens ({n - max_tokens} cut; limit {max_tokens})"
        return View(
            self.title,
            self.tokens[:max_tokens],
            self.pattern[:, :max_tokens, :max_tokens],
            self.heads,
            self.causal,
            [*self.notes, note],
        )

    def payload(self) -> dict[str, Any]:
        tokens = [display_token(t) for t in self.tokens]
        long = sum(len(clean(t)) > MAX_TOKEN_CHARS for t in self.tokens)
        notes = list(self.notes)
        if long:
            notes.append(f"{long} token label(s) longer than {MAX_TOKEN_CHARS} characters shortened")
        n = len(self.tokens)
        mode = "heads" if self.pattern.size <= HEADS_CELLS else "pattern" if n <= RASTER_TOKENS else "raster"
        if mode != "heads" and len(self.heads) > 1:
            notes.append("a long input: one head at a time (pick it with the buttons)")
        scale = SCALE if mode == "heads" else LONG_SCALE
        return {
            "tokens": tokens,
            "heads": [clean(h) for h in self.heads],
            "causal": self.causal,
            "mode": mode,
            "pattern": encode_pattern(self.pattern, scale),
            "notes": notes,
        }


# ----------------------------------------------------------------------------------------------
# heatmaps as direct SVG (no plotting library)
# ----------------------------------------------------------------------------------------------

# 33 evenly spaced colours of matplotlib's viridis and RdBu_r (x = 0, 1/32, ..., 1); colours in
# between are interpolated linearly in RGB (at most 6/255 from the 256-entry originals per channel).
COLORMAPS = {
    "viridis": (
        "440154 470d60 48186a 482374 472d7b 453781 424086 3e4989 3b528b 375b8d 33638d 2f6b8e "
        "2c728e 297a8e 26828e 23898e 21918c 1f988b 1fa088 22a785 28ae80 32b67a 3fbc73 4ec36b "
        "5ec962 70cf57 84d44b 98d83e addc30 c2df23 d8e219 ece51b fde725"
    ),
    "RdBu_r": (
        "053061 0e4179 175290 1f63a8 2a71b2 3480b9 3f8ec0 529dc8 6bacd1 84bcd9 9bc9e0 aed3e6 "
        "c2ddec d4e6f1 e0ecf3 ecf2f5 f7f6f6 f9eee7 fbe5d8 fddcc9 fbccb4 f8bb9e f5aa89 ee9677 "
        "e48066 db6b55 d05548 c53e3d ba2832 ab162a 930e26 7c0722 67001f"
    ),
}
NAN_FILL = "#e6e6e6"  # cells without a value


@functools.cache
def _anchors(name: str) -> np.ndarray:
    return np.array([[int(h[i : i + 2], 16) for i in (0, 2, 4)] for h in COLORMAPS[name].split()], dtype=np.float64)


def colormap_rgb(values: np.ndarray, name: str, lo: float, hi: float) -> np.ndarray:
    """[..., 3] uint8 colours of ``values`` on the colormap stretched over [lo, hi] (clipped)."""
    table = _anchors(name)
    x = np.clip((np.asarray(values, dtype=np.float64) - lo) / ((hi - lo) or 1.0), 0.0, 1.0)
    x = np.nan_to_num(x, nan=0.0) * (len(table) - 1)
    i = np.minimum(np.floor(x).astype(int), len(table) - 2)
    t = (x - i)[..., None]
    return np.round(table[i] * (1 - t) + table[i + 1] * t).astype(np.uint8)


def _hex(rgb: Sequence[int]) -> str:
    r, g, b = (int(c) for c in rgb)
    return f"#{r:02x}{g:02x}{b:02x}"


def _dark(rgb: Sequence[int]) -> bool:
    r, g, b = (int(c) for c in rgb)
    return 0.299 * r + 0.587 * g + 0.114 * b < 140


def heatmap_range(values: np.ndarray) -> tuple[float, float, str]:
    """Colour range and colormap of a heatmap: viridis over [min, max]; RdBu_r symmetric about 0
    when the values have both signs."""
    finite = values[np.isfinite(values)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    if lo < 0 < hi:
        m = max(-lo, hi)
        return -m, m, "RdBu_r"
    return lo, (hi if hi > lo else lo + 1e-9), "viridis"


def _fmt(v: float) -> str:
    return f"{v:.2f}" if abs(v) < 1000 else f"{v:.3g}"


def heatmap_svg(
    values: np.ndarray,
    rows: Sequence[Any],
    cols: Sequence[Any],
    *,
    row_title: str = "layer",
    col_title: str = "head",
    annotate: bool = True,
) -> str:
    """A [row, col] heatmap (row 0 at the top) with a colour bar, as standalone SVG text.

    Every label is escaped; cells without a finite value are grey and unlabelled. ``annotate``
    writes each cell's value (two decimals) in black or white, whichever reads on its colour.
    """
    values = np.asarray(values, dtype=np.float64)
    n_rows, n_cols = values.shape
    lo, hi, cmap = heatmap_range(values)
    cw, ch = (34, 20) if annotate else (max(4, min(34, 480 // max(n_cols, 1))), max(4, min(20, 400 // max(n_rows, 1))))
    left, top, gap, bar = 46, 10, 14, 14
    width, height = left + n_cols * cw + gap + bar + 52, top + n_rows * ch + 40
    colours = colormap_rgb(values, cmap, lo, hi)
    finite = np.isfinite(values)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Arial, sans-serif" font-size="10">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
    ]
    for i in range(n_rows):
        y = top + i * ch
        for j in range(n_cols):
            x = left + j * cw
            fill = _hex(colours[i, j]) if finite[i, j] else NAN_FILL
            out.append(f'<rect x="{x}" y="{y}" width="{cw}" height="{ch}" fill="{fill}"/>')
            if annotate and finite[i, j]:
                ink = "#ffffff" if _dark(colours[i, j]) else "#000000"
                out.append(
                    f'<text x="{x + cw / 2:g}" y="{y + ch / 2 + 3:g}" text-anchor="middle" font-size="8" '
                    f'fill="{ink}">{esc(_fmt(values[i, j]))}</text>'
                )
    step_r, step_c = max(1, n_rows // 24), max(1, n_cols // 24)
    for i in range(0, n_rows, step_r):
        out.append(f'<text x="{left - 4}" y="{top + i * ch + ch / 2 + 3:g}" text-anchor="end">{esc(rows[i])}</text>')
    base = top + n_rows * ch
    for j in range(0, n_cols, step_c):
        out.append(f'<text x="{left + j * cw + cw / 2:g}" y="{base + 12}" text-anchor="middle">{esc(cols[j])}</text>')
    out.append(f'<text x="{left + n_cols * cw / 2:g}" y="{base + 28}" text-anchor="middle">{esc(col_title)}</text>')
    out.append(
        f'<text transform="translate(12 {top + n_rows * ch / 2:g}) rotate(-90)" '
        f'text-anchor="middle">{esc(row_title)}</text>'
    )
    # colour bar: 32 bands from hi (top) to lo (bottom), labelled at both ends and the middle
    bx, bh = left + n_cols * cw + gap, n_rows * ch
    steps = 32
    band = colormap_rgb(np.linspace(hi, lo, steps), cmap, lo, hi)
    for k in range(steps):
        out.append(
            f'<rect x="{bx}" y="{top + k * bh / steps:.2f}" width="{bar}" height="{bh / steps + 0.5:.2f}" '
            f'fill="{_hex(band[k])}"/>'
        )
    for frac, v in ((0.0, hi), (0.5, (lo + hi) / 2), (1.0, lo)):
        out.append(f'<text x="{bx + bar + 3}" y="{top + frac * bh + 3:.2f}">{esc(f"{v:.3g}")}</text>')
    out.append("</svg>")
    return "".join(out)


def _asset(name: str) -> str:
    """The text of ``assets/NAME`` (shipped as package data)."""
    return (resources.files("depthprobe.probes.render") / "assets" / name).read_text(encoding="utf-8")


# ----------------------------------------------------------------------------------------------
# page assembly
# ----------------------------------------------------------------------------------------------

# The page's style sheet and the attention-view loader are asset files beside this module.
STYLE = _asset("page.css")
LOADER = _asset("attention.js")


def views_html(views: Sequence[View], max_tokens: int = MAX_TOKENS) -> tuple[str, list[dict[str, Any]]]:
    """Placeholders (title, notes, an empty div per view) and the JSON payloads for the loader."""
    parts, payloads = [], []
    for i, view in enumerate(views):
        view = view.cut(max_tokens)
        payload = view.payload()
        title = f"<h3>{esc(view.title)}</h3>" if view.title else ""
        notes = "".join(f"<p class='cut'>{esc(n)}</p>" for n in payload.pop("notes"))
        size = f"{len(view.heads)} head(s), {len(view.tokens)} tokens" + (
            ", causal" if view.causal else ", bidirectional (shown whole)"
        )
        toks = "".join(f"<span title='{k}'>{esc(t)}</span>" for k, t in enumerate(payload["tokens"]))
        parts.append(
            f"<section class='attention'>{title}<p class='meta'>{esc(size)}</p>{notes}"
            f"<div class='view' id='dp-view-{i}' data-index='{i}' data-state='waiting'></div>"
            f"<details class='tokens'><summary>tokens</summary><div class='toks'>{toks}</div></details>"
            "</section>"
        )
        payloads.append(payload)
    return "".join(parts), payloads


def page(title: str, body: str, payloads: Sequence[dict[str, Any]] = ()) -> str:
    """A complete, self-contained HTML document. ``body`` must already be escaped markup.

    With view payloads, the circuitsvis bundle and the loader are appended once.
    """
    scripts, hashes = "", []
    if payloads:
        bundle, loader = bundle_js(), LOADER
        hashes = [_sha256(bundle), _sha256(loader)]
        scripts = (
            f"<script type='application/json' id='dp-views-data'>{script_json(list(payloads))}</script>"
            f"<script>{bundle}</script><script>{loader}</script>"
        )
    script_src = " ".join(hashes) if hashes else "'none'"
    csp = (
        f"default-src 'none'; script-src {script_src}; style-src 'unsafe-inline'; img-src data:; "
        "font-src 'none'; connect-src 'none'; base-uri 'none'; form-action 'none'"
    )
    status = (
        (
            "<p id='dp-status' class='meta'><span id='dp-status-text' aria-live='polite'>"
            "attention views need JavaScript</span> <button type='button' id='dp-draw-all' hidden>"
            "draw all now</button></p>"
        )
        if payloads
        else ""
    )
    return (
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<meta http-equiv='Content-Security-Policy' content=\"{csp}\">"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<meta name='referrer' content='no-referrer'><title>{esc(title)}</title>"
        f"<style>{STYLE}</style></head>\n<body>{status}\n{body}\n{scripts}</body></html>\n"
    )


# ----------------------------------------------------------------------------------------------
# attention views of a model on a text (probe viz)
# ----------------------------------------------------------------------------------------------


def index_ranges(spec: str | None, what: str) -> list[tuple[int, int]]:
    """'0,3' / '0-2,5' -> [(0, 0), (3, 3)] / [(0, 2), (5, 5)], syntax checked, nothing expanded."""
    out: list[tuple[int, int]] = []
    for part in (p.strip() for p in str(spec or "").split(",")):
        if not part:
            continue
        try:
            if "-" in part[1:]:
                lo, hi = (int(x) for x in part.split("-", 1))
            else:
                lo = hi = int(part)
        except ValueError:
            raise ProbeError(f"--{what} expects 0-indexed numbers like 0,3 or 0-2, got {spec!r}") from None
        out.append((lo, hi))
    return out


def parse_indices(spec: str | None, n: int, what: str) -> list[int] | None:
    """'0,3' / '0-2,5' -> sorted unique indices in 0..n-1 (None: all). Raises ProbeError.

    Every number is checked against ``n`` before a range is expanded."""
    if spec is None or not str(spec).strip():
        return None
    ranges = index_ranges(spec, what)
    bad = [f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in ranges if lo <= hi and not (lo >= 0 and hi < n)]
    if bad:
        raise ProbeError(f"--{what} {', '.join(bad)} out of range: the model has {n} {what} (0-indexed: 0..{n - 1})")
    out = sorted({i for lo, hi in ranges for i in range(lo, hi + 1)})
    if not out:
        raise ProbeError(f"--{what} {spec!r} names no {what}; e.g. --{what} 0,3")
    return out


def write_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` via a temporary sibling file (never a half-written page)."""
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
    "MAX_TOKENS",
    "View",
    "bundle_js",
    "clean",
    "decode_pattern",
    "display_token",
    "encode_pattern",
    "esc",
    "index_ranges",
    "page",
    "parse_indices",
    "plot_text",
    "script_json",
    "views_html",
    "write_atomic",
]
