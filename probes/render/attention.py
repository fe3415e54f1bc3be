"""Attention views: one [head, query, key] pattern over its tokens, cut, encoded and placed on a page.

Attention patterns travel as quantised integers (``round(value * 10^4)``, 10^3 for long views;
uint16 when every value fits, else int32), deflated and base64-encoded, inside one
``<script type="application/json">`` block of the page (``probes.render.html.page``, which inlines
the circuitsvis bundle once); a small loader inflates them in the browser
(``DecompressionStream``) and draws the views one after another. Also here: the ``--layers`` /
``--heads`` index syntax of ``probe viz``.
"""

from __future__ import annotations

import base64
import html
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.render.html import clean, esc

MAX_TOKENS = 512  # default token limit of a view; longer inputs are cut and the page says so
SCALE = 10_000  # pattern values are stored as round(value * SCALE): 4 decimals
LONG_SCALE = 1_000  # 3 decimals for views over HEADS_CELLS (halves a 512-token page)
_HEAD_ID = re.compile(r"\d+-\d+(?=\s|$)")  # "L-H" at the start of a head label
HEAD_LABEL_CHARS = 7  # longer head labels overlap in circuitsvis's head selector (see selector_labels)
MAX_TOKEN_CHARS = 100  # longer token labels are shortened for display (the page says by how much)
# above this many cells (heads x tokens^2) a view shows one head at a time instead of all
# thumbnails at once: circuitsvis draws every cell as a chart element (about 10 us each)
HEADS_CELLS = 12 * 64 * 64
# above this many tokens a head is drawn as one pixel per cell on a plain canvas (instant) instead
# of a circuitsvis chart, which takes seconds per head at 512 tokens
RASTER_TOKENS = 160


def display_token(token: Any) -> str:
    """A token as it is shown in a view: controls visible, very long ones shortened."""
    s = clean(token)
    if len(s) > MAX_TOKEN_CHARS:
        s = f"{s[: MAX_TOKEN_CHARS - 12]}…(+{len(s) - MAX_TOKEN_CHARS + 12} chars)"
    return s


# ----------------------------------------------------------------------------------------------
# views: validation, cutting and compact encoding
# ----------------------------------------------------------------------------------------------


def selector_labels(heads: Sequence[str]) -> tuple[list[str], list[str]]:
    """Head labels for circuitsvis's head selector, whose thumbnails fit about 7 characters: long
    labels that start with a head id ('1-2 best induction (0.90)') are cut to it when every label
    does and the ids are unique, and a note spells the whole labels out. Returns (labels, notes)."""
    labels = [clean(h) for h in heads]
    ids = [m.group(0) if (m := _HEAD_ID.match(h)) else "" for h in labels]
    long = max(map(len, labels), default=0) > HEAD_LABEL_CHARS
    if not long or not all(ids) or len(set(ids)) < len(ids):
        return labels, []
    return ids, ["heads: " + "; ".join(labels)]


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
        heads, spelled = selector_labels(self.heads)
        notes.extend(spelled)
        return {
            "tokens": tokens,
            "heads": heads,
            "causal": self.causal,
            "mode": mode,
            "pattern": encode_pattern(self.pattern, scale),
            "notes": notes,
        }


# the loader's status line (how many views are drawn) and its "draw all" button, above the views
STATUS = (
    "<p id='dp-status' class='meta'><span id='dp-status-text' aria-live='polite'>"
    "attention views need JavaScript</span> <button type='button' id='dp-draw-all' hidden>"
    "draw all now</button></p>"
)


def views_html(views: Sequence[View], max_tokens: int = MAX_TOKENS) -> tuple[str, list[dict[str, Any]]]:
    """The views' status line, placeholders (title, notes, an empty div per view) and the JSON
    payloads for the loader."""
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
    return (STATUS if parts else "") + "".join(parts), payloads


def inline_frame(page_html: str, title: str, height: int) -> str:
    """A whole page (``probes.render.html.page``) shown inside another one, as in a notebook: an
    iframe whose ``srcdoc`` holds the page, escaped, so the page keeps its own Content-Security-
    Policy (only its own hash-pinned scripts run; nothing is fetched) and is sandboxed (no forms,
    pop-ups or navigation of the host). circuitsvis needs the frame's storage, so the sandbox keeps
    the same origin: in a strict one (``allow-scripts`` only) the views stay blank."""
    srcdoc = html.escape(page_html, quote=True)
    return (
        f'<iframe sandbox="allow-scripts allow-same-origin" title="{esc(title)}" srcdoc="{srcdoc}" '
        f'style="width: 100%; height: {min(int(height), 2400)}px; border: 1px solid #ddd; resize: vertical"></iframe>'
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


__all__ = [
    "MAX_TOKENS",
    "View",
    "decode_pattern",
    "display_token",
    "encode_pattern",
    "index_ranges",
    "inline_frame",
    "parse_indices",
    "selector_labels",
    "views_html",
]
