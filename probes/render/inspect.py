"""Two views beyond circuitsvis, drawn on plain canvases by ``assets/inspect.js`` (no bundle):

- the **model view**: every layer x head pattern of one text at a glance (as bertviz's model
  view), a grid of small heatmaps; hover one to name it, click one to enlarge it with its tokens
  and values;
- the **neuron view**: for a layer, a head and a query position, the query vector q, every key
  vector k, their elementwise products q*k, the model's own score and attention weight per key
  (as bertviz's neuron view).

Arrays travel like attention patterns (``encode_pattern``: quantised, deflated, base64) in one
JSON block; the page is ``probes.render.html.canvas_page`` (its own hash-pinned script only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from depthprobe.probes.render.attention import display_token, encode_pattern
from depthprobe.probes.render.html import esc

SCRIPT = "inspect.js"
VECTOR_SCALE = 10_000  # q and k stored as round(value * 10^4)
MODEL_VIEW_TOKENS = 160  # a model view's thumbnails stay legible up to this many tokens
NEURON_ROWS = 32  # query rows a neuron view's page holds (scores and weights: [layer, head, row, key])


@dataclass
class ModelGrid:
    """Every chosen layer x head pattern of one sequence: ``pattern`` [layer, head, query, key]."""

    tokens: list[str]
    pattern: np.ndarray
    layers: list[int]
    heads: list[int]
    causal: bool
    notes: list[str] = field(default_factory=list)


@dataclass
class NeuronData:
    """What the neuron view draws, for the chosen layers and heads (all [layer, head, ...]):
    ``q`` and ``k`` [.., pos, d_head] as the model multiplies them, ``scores`` [.., query, key]
    the model's own attention scores (``hook_attn_scores``), ``pattern`` its weights,
    ``masked`` [.., query, key] where the model masked a score out; ``scale`` divides q.k."""

    tokens: list[str]
    q: np.ndarray
    k: np.ndarray
    scores: np.ndarray
    pattern: np.ndarray
    masked: np.ndarray
    layers: list[int]
    heads: list[int]
    scale: float
    query: int
    notes: list[str] = field(default_factory=list)


def _notes(notes: Sequence[str]) -> str:
    return "".join(f"<p class='cut'>{esc(n)}</p>" for n in notes)


def nonfinite_notes(what: str, values: np.ndarray, layers: Sequence[int], heads: Sequence[int]) -> list[str]:
    """One note per layer whose ``values`` [layer, head, ...] hold NaN or inf (drawn as 0), naming the heads."""
    bad = ~np.isfinite(values)
    out = []
    for i, layer in enumerate(layers):
        count = bad[i].reshape(len(heads), -1).sum(1)
        if count.any():
            named = ", ".join(f"{layer}-{heads[h]} ({int(c)})" for h, c in enumerate(count) if c)
            out.append(f"NaN or inf in the {what} of head {named}: drawn as 0, not a value the model gave")
    return out


def query_rows(n: int, query: int) -> tuple[int, int]:
    """The ``NEURON_ROWS`` query positions around ``query`` that a long text's page holds: [start, stop)."""
    if n <= NEURON_ROWS:
        return 0, n
    start = min(max(0, query - NEURON_ROWS // 2), n - NEURON_ROWS)
    return start, start + NEURON_ROWS


def model_view(grid: ModelGrid, title: str) -> tuple[str, dict]:
    """The model view's body (escaped markup) and its data block."""
    n = len(grid.tokens)
    notes = list(grid.notes)
    if n > MODEL_VIEW_TOKENS:
        notes.append(f"showing the first {MODEL_VIEW_TOKENS} of {n} tokens ({n - MODEL_VIEW_TOKENS} cut)")
        n = MODEL_VIEW_TOKENS
    pattern = grid.pattern[:, :, :n, :n]
    notes += nonfinite_notes("pattern", pattern, grid.layers, grid.heads)
    data = {
        "kind": "model",
        "tokens": [display_token(t) for t in grid.tokens[:n]],
        "layers": list(grid.layers),
        "heads": list(grid.heads),
        "causal": bool(grid.causal),
        "pattern": encode_pattern(pattern),
    }
    body = (
        f"<h1>{esc(title)}</h1>"
        f"<p class='meta'>{len(grid.layers)} layers x {len(grid.heads)} heads, {n} tokens; rows are layers, "
        "columns heads. Each thumbnail is one head's pattern (rows: queries, columns: keys; white 0 to dark "
        "the head's largest value, square-root scale). Hover a thumbnail to name it, click it to enlarge.</p>"
        f"{_notes(notes)}<div id='dp-inspect' class='inspect' data-state='waiting'></div>"
    )
    return body, data


def neuron_view(data: NeuronData, title: str) -> tuple[str, dict]:
    """The neuron view's body (escaped markup) and its data block: the q, score, weight and mask
    rows of at most ``NEURON_ROWS`` query positions around ``data.query`` (every key's k), so that
    a long text's page stays a few MB (every row of a 512-token text made minilm's page 91 MB)."""
    n = len(data.tokens)
    start, stop = query_rows(n, data.query)
    rows = slice(start, stop)
    scores = np.where(data.masked, 0.0, data.scores)
    notes = list(data.notes)
    if stop - start < n:
        notes.append(
            f"a long text: this page holds query positions {start}..{stop - 1} of {n} (every key of each); "
            f"pass query= (probe viz --query) to centre it on another position"
        )
    for what, values in (
        ("q and k", np.concatenate([data.q, data.k], 2)),
        ("scores", scores),
        ("weights", data.pattern),
    ):
        notes += nonfinite_notes(what, values, data.layers, data.heads)
    payload = {
        "kind": "neuron",
        "tokens": [display_token(t) for t in data.tokens],
        "layers": list(data.layers),
        "heads": list(data.heads),
        "scale": float(data.scale),
        "query": int(data.query),
        "rows": [start, stop],
        "q": encode_pattern(data.q[:, :, rows], VECTOR_SCALE),
        "k": encode_pattern(data.k, VECTOR_SCALE),
        "scores": encode_pattern(scores[:, :, rows], VECTOR_SCALE),
        "pattern": encode_pattern(data.pattern[:, :, rows]),
        "masked": encode_pattern(data.masked[:, :, rows].astype(np.float64), 1),
    }
    body = (
        f"<h1>{esc(title)}</h1>"
        f"<p class='meta'>For one query position (click a token on the left), per key position: the key "
        f"vector k, the products q*k element by element (blue positive, orange negative; they sum to q.k), "
        f"the model's score (q.k / {data.scale:.4g}, as its hook_attn_scores recorded it) and its attention "
        f"weight. d_head = {data.q.shape[-1]}.</p>"
        f"{_notes(notes)}<div id='dp-inspect' class='inspect' data-state='waiting'></div>"
    )
    return body, payload


__all__ = ["MODEL_VIEW_TOKENS", "NEURON_ROWS", "SCRIPT", "ModelGrid", "NeuronData", "model_view", "neuron_view"]
