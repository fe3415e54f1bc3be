"""The `probe viz` verb: run a model on a text and draw its attention (pieces or words).

The forward pass and word alignment happen here; ``probes.render.attention`` only draws the views.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from depthprobe.probes.api.inspect_views import check_kind, grid_of, neuron_data, neuron_from
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.render.attention import MAX_TOKENS, View, inline_frame, parse_indices, views_html
from depthprobe.probes.render.html import canvas_page, esc, no_paths, notebook_bundle, page
from depthprobe.probes.render.inspect import SCRIPT, model_view, neuron_view

_WORD = re.compile(r"\w+(?:['’]\w+)*|[^\w\s]", re.UNICODE)  # noqa: RUF001 (the typographic apostrophe)


def split_words(text: str) -> list[str]:
    """Words for --words: runs of letters/digits (with inner apostrophes), each other symbol alone."""
    return _WORD.findall(text)


@dataclass
class Input:
    """What goes through the model for a viz page."""

    ids: list[int]
    labels: list[str]  # one per unit shown (pieces, or specials + words)
    encoded: Any = None  # probes.data.align.Encoded for --words
    notes: list[str] = field(default_factory=list)


def _piece_labels(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Readable piece labels: WordPiece/SentencePiece as they are, byte-level BPE decoded."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if type(decoder).__name__ == "ByteLevel":
        return [tokenizer.decode([i]) for i in ids]
    return [str(t) for t in tokenizer.convert_ids_to_tokens(list(ids))]


def _specials(model: Any) -> tuple[list[int], list[int]]:
    head = [model.cls_id] if model.cls_id is not None else []
    tail = [model.sep_id] if model.sep_id is not None else []
    return head, tail


def _why(model: Any, limit: int) -> str:
    return "(the model's limit)" if limit == model.info.max_len else "(--max-tokens)"


def piece_input(model: Any, text: str, limit: int) -> Input:
    tok = model.tokenizer
    pieces = list(tok(text, add_special_tokens=False)["input_ids"])
    head, tail = _specials(model)
    room = limit - len(head) - len(tail)
    notes = []
    if len(pieces) > room:
        notes.append(
            f"the text has {len(pieces)} pieces; showing the first {room} ({len(pieces) - room} cut) "
            f"so that the input with its special tokens fits {limit} tokens {_why(model, limit)}"
        )
        pieces = pieces[:room]
    ids = head + pieces + tail
    return Input(ids, _piece_labels(tok, ids), None, notes)


def word_input(model: Any, text: str, limit: int) -> Input:
    from depthprobe.probes.data.align import encode_words, word_pieces

    words = split_words(text)
    head, tail = _specials(model)
    lengths = [len(p) for p in word_pieces(model, words)]
    used, keep = len(head) + len(tail), 0
    while keep < len(words) and used + lengths[keep] <= limit:
        used += lengths[keep]
        keep += 1
    notes = []
    if keep < len(words):
        notes.append(
            f"the text has {len(words)} words ({sum(lengths)} pieces); showing the first {keep} "
            f"({len(words) - keep} cut) so that the input fits {limit} tokens {_why(model, limit)}"
        )
    enc = encode_words(model, words[:keep])
    tok = model.tokenizer
    labels = (
        ([_piece_labels(tok, head)[0]] if head else []) + words[:keep] + ([_piece_labels(tok, tail)[0]] if tail else [])
    )
    return Input(list(enc.ids), labels, enc, notes)


def one_sequence(ids: Any) -> list[int]:
    """Token ids of one sequence: a flat list, or the batch of one (``[1, pos]``) that
    ``model.encode`` returns; a larger batch is refused in one line."""
    got = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    if got and isinstance(got[0], (list, tuple)):
        shape = [len(got), len(got[0])]
        if len(got) != 1 or any(isinstance(i, (list, tuple)) for i in got[0]):
            raise ProbeError(f"view shows one sequence; got ids shaped {shape}: pass one row (ids[0])")
        got = list(got[0])
    return [int(i) for i in got]


def id_input(model: Any, ids: Any, limit: int) -> Input:
    """Token ids as they are (any model, with or without a tokenizer), labelled by ``to_str_tokens``."""
    got = one_sequence(ids)
    vocab = model.bridge.cfg.d_vocab
    bad = [i for i in got if not 0 <= i < vocab]
    if not got or bad:
        raise ProbeError(f"view takes token ids below the vocabulary size {vocab}; got {bad[:5] or 'none'}")
    notes = []
    if len(got) > limit:
        notes.append(f"{len(got)} token ids; showing the first {limit} {_why(model, limit)}")
        got = got[:limit]
    return Input(got, [str(t) for t in model.to_str_tokens(got)], None, notes)


def _input(model: Any, text: Any, words: bool, limit: int) -> Input:
    if not isinstance(text, str):
        if words:
            raise ProbeError("word-level views need text, not token ids; pass a string or words=False")
        return id_input(model, text, limit)
    model.require_tokenizer("viz")
    if not text.strip():
        raise ProbeError('the text is empty; pass --text "..." or a non-empty --file')
    inp = word_input(model, text, limit) if words else piece_input(model, text, limit)
    if (words and inp.encoded.n_words == 0) or len(inp.labels) == len(_specials(model)[0] + _specials(model)[1]):
        raise ProbeError("the text yields no tokens to show; pass some words")
    return inp


def model_views(
    model: Any,
    text: Any,
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    words: bool = False,
    max_tokens: int = MAX_TOKENS,
) -> tuple[list[View], list[str]]:
    """One :class:`View` per layer (the chosen heads) of ``model`` on ``text`` (a string, or token
    ids for any model, with or without a tokenizer), plus page notes."""
    import torch

    from depthprobe.probes.data.align import unit_matrix, word_attention
    from depthprobe.probes.hooks.capture import forward

    info = model.info
    if max_tokens < 3:
        raise ProbeError(f"--max-tokens must be at least 3, got {max_tokens}")
    layers = list(range(info.n_layers)) if layers is None else list(layers)
    heads = list(range(info.n_heads)) if heads is None else list(heads)
    notes: list[str] = []
    limit = min(max_tokens, info.max_len) if info.max_len else max_tokens
    inp = _input(model, text, words, limit)
    notes.extend(inp.notes)
    ids = torch.tensor([inp.ids])  # [1, pos]
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in layers]
    acts = forward(model, ids, torch.ones_like(ids), names)
    views = []
    for layer, name in zip(layers, names, strict=True):
        pat = acts[name][:, heads].to(torch.float64).cpu()  # [1, head, query, key]
        if words:
            units = unit_matrix([inp.encoded], ids.shape[1])  # [1, unit, pos]
            pat = word_attention(pat, units)  # [1, head, unit, unit]
        unit = "word" if words else "piece"
        views.append(
            View(
                title=f"layer {layer} ({unit} level)",
                tokens=list(inp.labels),
                pattern=pat[0].numpy(),
                heads=[f"{layer}-{h}" for h in heads],
                causal=info.causal,
            )
        )
    if words:
        notes.append(
            "word level (Clark et al. 2019): attention TO a word is the sum over its pieces, "
            "FROM a word the mean over its pieces; special tokens stay separate"
        )
    return views, notes


@dataclass
class VizPage:
    """A `probe viz` page before it is written: its title, escaped body and view payloads."""

    title: str
    body: str
    payloads: list[dict[str, Any]]
    n_views: int
    inspect: dict[str, Any] | None = None  # a model or neuron view's data (drawn without circuitsvis)
    height: int | None = None  # its frame's height in a notebook

    def html(self, bundle: bool = True) -> str:
        if self.inspect is not None:
            return canvas_page(self.title, self.body, self.inspect, SCRIPT)
        return page(self.title, self.body, self.payloads, bundle=bundle)


def viz_parts(
    model: Any,
    text: Any,
    *,
    source: str,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    words: bool = False,
    max_tokens: int = MAX_TOKENS,
    kind: str = "layers",
    query: int | None = None,
) -> VizPage:
    """The `probe viz` page for ``model`` on ``text`` (``source`` says where it came from), in parts:
    ``kind`` "layers" (one circuitsvis view per layer), "model" (every layer x head at a glance)
    or "neuron" (q, k and q*k behind the scores of a query position, ``query``; default the last)."""
    if kind != "layers":
        return inspect_parts(
            model, text, kind=kind, layers=layers, heads=heads, words=words, max_tokens=max_tokens, query=query
        )
    views, notes = model_views(model, text, layers=layers, heads=heads, words=words, max_tokens=max_tokens)
    info = model.info
    kind = (
        "decoder (causal: the upper triangle is masked)"
        if info.causal
        else "encoder (bidirectional: patterns shown whole)"
    )
    meta = (
        f"model <b>{esc(no_paths(info.name))}</b> ({esc(no_paths(info.resolved))}), {info.n_layers} layers x "
        f"{info.n_heads} heads, {esc(kind)}; text from {esc(no_paths(source))}"
    )
    cuts = "".join(f"<p class='cut'>{esc(n)}</p>" for n in notes)
    body, payloads = views_html(views, max_tokens=max_tokens)
    text = text if isinstance(text, str) else " ".join(map(str, text.tolist() if hasattr(text, "tolist") else text))
    preview = text if len(text) <= 2000 else text[:2000] + f" … (+{len(text) - 2000} characters)"
    head = (
        f"<h1>Attention: {esc(no_paths(info.name))}</h1><p class='meta'>{meta}</p>{cuts}"
        f"<details><summary>text</summary><pre>{esc(preview)}</pre></details>"
        "<p class='meta'>Click a head thumbnail to enlarge it; hover a cell or a token to see "
        "the attention values. Rows are queries (attending from), columns keys (attended to).</p>"
    )
    return VizPage(f"depthprobe attention: {info.name}", head + body, list(payloads), len(views))


def viz_page(model: Any, text: Any, **kwargs: Any) -> str:
    """The whole `probe viz` page (see :func:`viz_parts` for the arguments)."""
    return viz_parts(model, text, **kwargs).html()


class InlineView:
    """A `probe viz` page that a notebook shows inline (an iframe holding the page, its CSP kept).
    The circuitsvis bundle goes with the display when no output on the notebook holds it
    (``bundle=None``: the first, and the first after the cell that carried it runs again), or
    always (True) or never (False); other displays borrow it from the one on the notebook page."""

    def __init__(self, parts: VizPage, bundle: bool | None = None) -> None:
        self.parts = parts
        self.bundle = bundle

    @property
    def page(self) -> str:
        """The whole standalone page (bundle included), e.g. to write to a file."""
        return self.parts.html()

    def __repr__(self) -> str:
        what = f"a {self.parts.inspect['kind']} view" if self.parts.inspect else f"{self.parts.n_views} attention views"
        return f"InlineView({what}: {self.parts.title!r}; shown inline in a notebook)"

    def _repr_html_(self) -> str:
        bundle = False if self.parts.inspect is not None else notebook_bundle(self.bundle)
        height = self.parts.height or 140 + 560 * self.parts.n_views
        return inline_frame(self.parts.html(bundle=bundle), "depthprobe attention views", height=height)


def _indices(chosen: Sequence[int] | None, n: int, what: str) -> list[int] | None:
    return None if chosen is None else parse_indices(",".join(str(int(i)) for i in chosen), n, what)


def pattern_views(
    tokens: Sequence[str],
    patterns: Any,
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    causal: bool | None = None,
) -> list[View]:
    """One :class:`View` per layer of ``patterns``: a Cache (its ``blocks.L.attn.hook_pattern``, first
    example), or an array [head, query, key] (one layer) or [layer, head, query, key]; any map of
    positions works (an edited or ablated pattern, attribution scores). ``causal`` None: the upper
    triangle is masked when it is all zero."""
    import numpy as np

    if isinstance(patterns, dict):
        names = sorted((k for k in patterns if re.fullmatch(r"blocks\.\d+\.attn\.hook_pattern", k)), key=_layer_of)
        if not names:
            raise ProbeError(
                "the cache holds no attention pattern; run_with_cache(..., names='blocks.*.attn.hook_pattern')"
            )
        stack = np.stack([_array(patterns[n])[0] for n in names])  # first example: [layer, head, q, k]
        numbers = [_layer_of(n) for n in names]
        notes = []
    else:
        arr = _array(patterns)
        if arr.ndim not in (3, 4):
            raise ProbeError(
                f"a pattern is [head, query, key] or [layer, head, query, key], got shape {list(arr.shape)}"
            )
        stack = arr[None] if arr.ndim == 3 else arr
        numbers = list(range(stack.shape[0]))
        stack, note = _unit_scale(stack)
        notes = [note] if note else []
    if stack.shape[-1] != len(tokens) or stack.shape[-2] != len(tokens):
        raise ProbeError(f"{len(tokens)} tokens for a pattern over {stack.shape[-2]} x {stack.shape[-1]} positions")
    chosen = range(stack.shape[1]) if heads is None else list(heads)
    out = []
    for i, layer in enumerate(numbers):
        if layers is not None and layer not in layers:
            continue
        pat = stack[i][list(chosen)]
        mask = bool(np.allclose(np.triu(pat, 1), 0)) if causal is None else causal
        title = f"layer {layer}" if isinstance(patterns, dict) or np.ndim(patterns) == 4 else "the given map"
        heads_of = [f"{layer}-{h}" for h in chosen]
        out.append(View(title, [str(t) for t in tokens], pat, heads_of, mask, list(notes)))
    return out


def _unit_scale(stack: Any) -> tuple[Any, str]:
    """A map that is not attention-like (negative values, values above 1, or all below 0.1: an
    attribution) divided by its largest |value|, so it runs from -1 to 1 and its colours show; and
    the note that says so. Attention-like maps are returned as they are."""
    import numpy as np

    finite = stack[np.isfinite(stack)]
    top = float(np.abs(finite).max()) if finite.size else 0.0
    if top == 0.0 or (finite.min() >= 0 and 0.1 <= top <= 1.0):
        return stack, ""
    signed = "negative values red, positive blue" if finite.min() < 0 else "positive values shaded"
    return stack / top, (
        f"not an attention pattern: every value is divided by the map's largest |value|, {top:.4g}, "
        f"so the colours run from -1 to 1 ({signed}); hover values are the divided ones"
    )


def _layer_of(name: str) -> int:
    return int(name.split(".")[1])


def _array(x: Any) -> Any:
    import numpy as np

    if hasattr(x, "detach"):
        x = x.detach().to("cpu").double().numpy()
    return np.asarray(x, dtype=np.float64)


def view(
    model: Any,
    text_or_ids: Any,
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    words: bool = False,
    max_tokens: int = MAX_TOKENS,
    bundle: bool | None = None,
    kind: Literal["layers", "model", "neuron"] = "layers",
    query: int | None = None,
) -> InlineView:
    """Attention views of ``model`` on a text or on token ids, shown inline in a notebook (or, given
    tokens and a pattern or a cache, ``view(tokens, pattern_or_cache)``, of that pattern: an edited,
    ablated or cached one, or any [head, query, key] map; see :func:`pattern_views`): the same
    self-contained, offline page as ``probe viz`` (escaping and Content-Security-Policy included)
    in a sandboxed iframe. Any model: without a tokenizer pass token ids (shown as numbers).
    ``layers`` and ``heads`` are 0-indexed (default: all). The circuitsvis bundle (1.3 MB) goes
    into the notebook once: with the first display (``bundle=None``), and again when the cell that
    carried it runs anew; other displays borrow it from that output (``bundle=True`` embeds it
    again, e.g. after clearing that output by hand).

    ``kind``: "layers" (the default: one circuitsvis view per layer, its heads side by side),
    "model" (every layer x head pattern at a glance, bertviz's model view: thumbnails, click one
    to enlarge it) or "neuron" (bertviz's neuron view: for a layer, a head and a query position,
    the model's q and k vectors, their products q*k per key, its score and weight; ``query`` is
    the first query position shown, default the last token before a closing [SEP]). Both draw on
    plain canvases without the circuitsvis bundle (a few kB). Given tokens and a cache, the neuron
    view reads ``hook_q``, ``hook_k``, ``hook_attn_scores`` and ``hook_pattern`` from the cache."""
    if kind != "layers" and not hasattr(model, "bridge"):
        return InlineView(inspect_given(model, text_or_ids, kind=kind, layers=layers, heads=heads, query=query), False)
    if not hasattr(model, "bridge"):  # tokens and a pattern (or a cache): no model runs
        views = pattern_views(model, text_or_ids, layers=layers, heads=heads)
        body, payloads = views_html(views, max_tokens=max_tokens)
        title = "depthprobe attention: given patterns"
        return InlineView(VizPage(title, f"<h1>{esc(title)}</h1>{body}", list(payloads), len(views)), bundle)
    layers = _indices(layers, model.info.n_layers, "layers")
    heads = _indices(heads, model.info.n_heads, "heads")
    source = "a text" if isinstance(text_or_ids, str) else "token ids"
    if not isinstance(text_or_ids, str):
        text_or_ids = one_sequence(text_or_ids)
    parts = viz_parts(
        model,
        text_or_ids,
        source=source,
        layers=layers,
        heads=heads,
        words=words,
        max_tokens=max_tokens,
        kind=kind,
        query=query,
    )
    return InlineView(parts, bundle)


# the model view and the neuron view (probes.api.inspect_views gathers their values)


def _page(kind: str, grid_or_data: Any, title: str) -> VizPage:
    if kind == "model":
        body, data = model_view(grid_or_data, title)
        return VizPage(title, body, [], 1, inspect=data, height=760 + 72 * len(grid_or_data.layers))
    body, data = neuron_view(grid_or_data, title)
    return VizPage(title, body, [], 1, inspect=data, height=260 + 26 * len(grid_or_data.tokens))


def inspect_parts(
    model: Any,
    text: Any,
    *,
    kind: str,
    layers: Sequence[int] | None,
    heads: Sequence[int] | None,
    words: bool,
    max_tokens: int,
    query: int | None,
) -> VizPage:
    """The model view or the neuron view of ``model`` on ``text`` (a string or token ids)."""
    name = model.info.name
    if check_kind(kind) == "model":
        views, notes = model_views(model, text, layers=layers, heads=heads, words=words, max_tokens=max_tokens)
        return _page(kind, grid_of(views, notes), f"Model view: {name}")
    if words:
        raise ProbeError("the neuron view shows tokens (q and k are per token); drop --words / words=True")
    limit = min(max_tokens, model.info.max_len) if model.info.max_len else max_tokens
    data = neuron_data(model, _input(model, text, False, limit), layers=layers, heads=heads, query=query)
    return _page(kind, data, f"Neuron view: {name}")


def inspect_given(
    tokens: Sequence[str],
    patterns: Any,
    *,
    kind: str,
    layers: Sequence[int] | None,
    heads: Sequence[int] | None,
    query: int | None,
) -> VizPage:
    """The model view of given patterns or a cache, or the neuron view of a cache holding q, k,
    scores and patterns (``probes.view(tokens, cache, kind=...)``): no model runs."""
    if check_kind(kind) == "model":
        return _page(
            kind, grid_of(pattern_views(tokens, patterns, layers=layers, heads=heads)), "Model view: given patterns"
        )
    if not isinstance(patterns, Mapping):
        raise ProbeError("the neuron view of given values needs a cache (q, k, scores, patterns), not an array")
    found = sorted({int(n.split(".")[1]) for n in patterns if re.match(r"blocks\.\d+\.attn\.", n)})
    if not found and layers is None:
        raise ProbeError("the cache holds no attention hook; run_with_cache(model, ids) keeps them all")
    data = neuron_from(tokens, patterns, found if layers is None else list(layers), heads, query)
    return _page(kind, data, "Neuron view: a cache")
