"""coref (Clark et al. 2019, Table 2; GAP): which heads attend from a mention to its antecedent.

Chains (CoNLL-U ``Entity=`` / CoNLL-2012, docs/coref.md): documents are cut into windows of
consecutive whole sentences (greedy, at most ``--max-len`` pieces with specials; a longer
sentence is skipped and ends the window), one forward pass per window. A mention M of a window
(whole span inside) is evaluated when an earlier mention of its chain (strictly earlier start)
starts in the window. Candidates are the window's mentions ending before M starts (start before
M, no overlap), ordered nearest first: start descending, then end descending. Per head the
prediction is the candidate whose head word gets the most word-level attention from M's head
word (ties: the nearer); correct when the candidate's span belongs to M's chain.

GAP (``--data file.tsv``, detected by extension or header): one pass over the whole text,
attention from the pronoun to A and to B (pieces by character overlap), the larger wins.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from depthprobe.probes.base.batching import by_length, pad
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.options import ranged
from depthprobe.probes.base.runtime import torch_threads
from depthprobe.probes.data import coref as coref_data
from depthprobe.probes.data.align import (
    Encoded,
    encode_pieces,
    unit_matrix,
    word_attention,
    word_pieces,
)
from depthprobe.probes.engine.task import Batch, Context, Examples, HeatmapPanel, Output, Task, ViewPanel, tidy
from depthprobe.probes.hooks.capture import Captured, pattern_names
from depthprobe.probes.models.loading import Model

SAMPLE = Path(__file__).parent / "data" / "sample_coref.conllu"
TYPES = ("pronoun", "proper", "nominal")
GENDERS = ("masculine", "feminine", "other")
BASELINES = ("nearest", "head match", "rule-based")
# Clark et al. 2019 Table 2, BERT-base on CoNLL-2012: All / Pronoun / Proper / Nominal (%)
CLARK = {
    "head 5-4": (65, 64, 73, 58),
    "nearest": (27, 29, 29, 19),
    "head match": (52, 47, 67, 40),
    "rule-based": (69, 70, 77, 60),
}
PATTERN_BUDGET = 1 << 30  # bytes of float32 attention patterns held for one batch


@dataclass(frozen=True)
class Options:
    format: str = "auto"  # auto | conllu | conll2012 | gap
    views: int = ranged(4, min=0)  # evaluated mentions (or GAP examples) shown with the best head's attention
    gap_max_len: int = ranged(512, min=3)  # GAP texts longer than this many pieces (incl. specials) are skipped


class CorefExamples(Examples):
    """Examples that remember their format ('chains' or 'gap') and counts through ``head``."""

    def __init__(self, items, skipped: int, why: str, kind: str, counts: dict) -> None:
        super().__init__(items, skipped, why)
        self.kind, self.counts = kind, counts

    def head(self, n: int | None) -> CorefExamples:
        return self if n is None else CorefExamples(self[:n], self.skipped, self.why, self.kind, self.counts)


# ---------------------------------------------------------------- chains: queries and baselines


@dataclass(frozen=True)
class Cand:
    start: int  # window word indices, inclusive
    end: int
    head: int
    chains: frozenset[str]


@dataclass(frozen=True)
class Query:
    """One evaluated mention with its candidates (nearest first) and the baselines' answers."""

    start: int
    end: int
    head: int  # window word index of M's head word
    kind: int  # index into TYPES
    cands: tuple[Cand, ...]
    correct: tuple[bool, ...]  # per candidate: in M's chain
    baselines: tuple[bool, ...]  # nearest, head match, rule-based: correct


@dataclass(frozen=True)
class Window:
    doc: str
    words: tuple[str, ...]
    encoded: Encoded
    queries: tuple[Query, ...]


def mention_type(upos: str) -> int:
    return 0 if upos == "PRON" else 1 if upos == "PROPN" else 2


def agreement(token) -> tuple[str, str, str]:
    """(Number, Gender, Person) of a head word: the pronoun table for pronouns it lists, else the
    token's morphology; non-pronouns are third person. '' = unknown (agrees with anything)."""
    if token.pos_ == "PRON" and token.text.lower() in coref_data.PRONOUNS:
        return coref_data.PRONOUNS[token.text.lower()]
    m = token.morph

    def first(key: str) -> str:
        v = m.get(key)
        return v[0] if v else ""

    person = first("Person") or ("" if token.pos_ == "PRON" else "3")
    return first("Number"), first("Gender"), person


def compatible(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    return all(x == "" or y == "" or x == y for x, y in zip(a, b, strict=False))


def nearest_first(cands: Sequence[Cand]) -> list[Cand]:
    return sorted(cands, key=lambda c: (-c.start, -c.end))


def baseline_picks(
    doc, lo: int, m: coref_data.Mention, cands: Sequence[Cand]
) -> tuple[int | None, int | None, int | None]:
    """Indices (into the nearest-first candidates) chosen by nearest, head match and the sieve."""
    if not cands:
        return None, None, None

    def words(s: int, e: int) -> tuple[str, ...]:
        return tuple(t.text.lower() for t in doc[lo + s : lo + e + 1])

    head = doc[m.head].text.lower()
    same_head = next((i for i, c in enumerate(cands) if doc[lo + c.head].text.lower() == head), None)
    text = words(m.start - lo, m.end - lo)
    exact = next((i for i, c in enumerate(cands) if words(c.start, c.end) == text), None)
    agree = agreement(doc[m.head])
    compat = next((i for i, c in enumerate(cands) if compatible(agree, agreement(doc[lo + c.head]))), None)
    head_match = same_head if same_head is not None else 0
    sieve = next((i for i in (exact, same_head, compat) if i is not None), 0)
    return 0, head_match, sieve


def window_queries(doc, ms: Sequence[coref_data.Mention], lo: int, hi: int) -> tuple[Query, ...]:
    """Evaluated mentions of the window of words [lo, hi)."""
    inside = [m for m in ms if lo <= m.start and m.end < hi]
    spans: dict[tuple[int, int], set[str]] = {}
    for m in inside:
        spans.setdefault((m.start, m.end), set()).add(m.chain)
    all_cands = [
        Cand(s - lo, e - lo, doc.user_data["coref_heads"][(s, e + 1)] - lo, frozenset(ch))
        for (s, e), ch in spans.items()
    ]
    out = []
    for m in inside:
        if not any(o.chain == m.chain and lo <= o.start < m.start for o in ms):
            continue
        cands = nearest_first([c for c in all_cands if c.end < m.start - lo])
        picks = baseline_picks(doc, lo, m, cands)
        correct = tuple(m.chain in c.chains for c in cands)
        base = tuple(p is not None and correct[p] for p in picks)
        out.append(
            Query(m.start - lo, m.end - lo, m.head - lo, mention_type(doc[m.head].pos_), tuple(cands), correct, base)
        )
    return tuple(out)


def doc_windows(sent_pieces: Sequence[int], n_special: int, limit: int) -> tuple[list[tuple[int, int]], int]:
    """Greedy packing of sentences (their piece counts) into windows of at most ``limit`` pieces
    with specials. Returns [(first sentence, end sentence exclusive)] and the skipped count."""
    windows, skipped, first, size = [], 0, None, n_special
    for i, n in enumerate(sent_pieces):
        if n + n_special > limit:
            skipped += 1
            if first is not None:
                windows.append((first, i))
            first, size = None, n_special
            continue
        if first is not None and size + n > limit:
            windows.append((first, i))
            first, size = None, n_special
        if first is None:
            first = i
        size += n
    if first is not None:
        windows.append((first, len(sent_pieces)))
    return windows, skipped


def chain_windows(model, docs, limit: int) -> tuple[list[Window], dict[str, int]]:
    """Windows holding at least one evaluated mention, and counts for the notes."""
    n_special = 1 + (model.sep_id is not None)
    out, counts = [], {"windows": 0, "sentences_skipped": 0, "mentions": 0}
    for doc in docs:
        ms = coref_data.mentions(doc)
        counts["mentions"] += len(ms)
        pieces = word_pieces(model, [t.text for t in doc])
        bounds = coref_data.sentence_bounds(doc)
        spans, skipped = doc_windows([sum(len(p) for p in pieces[s:e]) for s, e in bounds], n_special, limit)
        counts["sentences_skipped"] += skipped
        counts["windows"] += len(spans)
        name = doc.user_data.get("doc_id") or doc.user_data.get("source") or "doc"
        for a, b in spans:
            lo, hi = bounds[a][0], bounds[b - 1][1]
            queries = window_queries(doc, ms, lo, hi)
            if queries:
                out.append(
                    Window(str(name), tuple(t.text for t in doc[lo:hi]), encode_pieces(model, pieces[lo:hi]), queries)
                )
    return out, counts


# ---------------------------------------------------------------- GAP examples


@dataclass(frozen=True)
class GapItem:
    id: str
    names: tuple[str, str, str]  # pronoun, A, B
    ids: tuple[int, ...]
    pronoun: tuple[int, ...]  # piece positions (in ids)
    a: tuple[int, ...]
    b: tuple[int, ...]
    label: int  # 0 = A, 1 = B
    gender: int  # index into GENDERS
    nearest: int  # the nearest baseline's pick
    line: int


def gap_nearest(ex: coref_data.GapExample) -> int:
    """0 (A) or 1 (B): the candidate whose span boundary is closer to the pronoun's; ties -> the
    candidate appearing first in the text."""
    sp = ex.spans()
    p0, p1 = sp["pronoun"]

    def gap(s: int, e: int) -> int:
        return p0 - e if e <= p0 else s - p1 if s >= p1 else 0

    da, db = gap(*sp["A"]), gap(*sp["B"])
    if da != db:
        return 0 if da < db else 1
    return 0 if ex.a_offset <= ex.b_offset else 1


def gap_items(
    model, examples: Sequence[coref_data.GapExample], limit: int, path: Path
) -> tuple[list[GapItem], dict[str, int]]:
    tok = model.require_tokenizer("coref (GAP)")
    if not getattr(tok, "is_fast", False):
        raise ProbeError("GAP needs a fast tokenizer (character offsets); use a model with tokenizer.json")
    usable = [ex for ex in examples if ex.answerable]
    enc = tok([ex.text for ex in usable], add_special_tokens=False, return_offsets_mapping=True)
    n_head = 0 if model.cls_id is None else 1  # [CLS] or BOS before the text
    items, too_long = [], 0
    for ex, ids, offsets in zip(usable, enc["input_ids"], enc["offset_mapping"], strict=True):
        seq = model.frame(ids)
        if len(seq) > limit:
            too_long += 1
            continue
        pos = {}
        for key, (s, e) in ex.spans().items():
            pos[key] = tuple(n_head + t for t, (ps, pe) in enumerate(offsets) if ps < e and pe > s)
            if not pos[key]:
                raise ProbeError(f"{ex.path or path}:{ex.line}: {key} span [{s}, {e}) covers no token of the text")
        items.append(
            GapItem(
                ex.id,
                (ex.pronoun, ex.a, ex.b),
                seq,
                pos["pronoun"],
                pos["A"],
                pos["B"],
                0 if ex.a_coref else 1,
                GENDERS.index(ex.gender),
                gap_nearest(ex),
                ex.line,
            )
        )
    return items, {"rows": len(examples), "unanswerable": len(examples) - len(usable), "too_long": too_long}


# ---------------------------------------------------------------- batching


def budget_batches(
    items: Sequence, seqs: Sequence[Sequence[int]], batch_size: int, pad_id: int, per_token_pair: int
) -> Iterator[Batch]:
    """Length-sorted batches of at most ``batch_size`` rows whose attention patterns
    (rows x T x T x ``per_token_pair`` bytes) fit in PATTERN_BUDGET."""
    order = [i for group in by_length([len(s) for s in seqs], len(seqs) or 1) for i in group]
    k = 0
    while k < len(order):
        t = len(seqs[order[k]])  # longest of this batch (sorted longest first)
        rows = max(1, min(batch_size, PATTERN_BUDGET // max(1, t * t * per_token_pair)))
        idx = order[k : k + rows]
        ids, mask = pad([seqs[i] for i in idx], pad_id)
        yield Batch(ids, mask, [items[i] for i in idx])
        k += rows


# ---------------------------------------------------------------- state


@dataclass
class ChainState:
    n_layers: int
    n_heads: int
    views_wanted: int
    counts: dict[str, Any] = field(default_factory=dict)  # what loading counted
    kind: str = "chains"
    correct: torch.Tensor = field(init=False)  # [type, layer, head] int64
    n_windows: int = 0
    n: list[int] = field(default_factory=lambda: [0, 0, 0])
    base: list[list[int]] = field(default_factory=lambda: [[0, 0, 0] for _ in BASELINES])  # [baseline][type]
    views: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.correct = torch.zeros(len(TYPES), self.n_layers, self.n_heads, dtype=torch.long)


@dataclass
class GapState:
    n_layers: int
    n_heads: int
    views_wanted: int
    counts: dict[str, Any] = field(default_factory=dict)  # what loading counted
    kind: str = "gap"
    correct: torch.Tensor = field(init=False)  # [gender, layer, head]
    n: list[int] = field(default_factory=lambda: [0, 0, 0])
    base: list[list[int]] = field(default_factory=lambda: [[0, 0, 0], [0, 0, 0]])  # nearest, first
    views: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.correct = torch.zeros(len(GENDERS), self.n_layers, self.n_heads, dtype=torch.long)


# ---------------------------------------------------------------- scoring one batch


def query_index(windows: Sequence[Window], n_pos: int) -> dict[str, Any]:
    """Index tensors over every query of a batch. Each window's distinct query head words get a
    slot; ``pieces`` [batch, r] are those words' piece positions, ``slot_of`` [batch, r] their
    slot and ``weight`` [batch, r] 1/(pieces of the word) (0 for padding); ``unit_of`` [batch, pos]
    is every position's word unit (padding -> an extra unit). Candidates are padded to the widest query."""
    qs = [(b, q) for b, w in enumerate(windows) for q in w.queries]
    slots = [list(dict.fromkeys(q.head + 1 for q in w.queries)) for w in windows]
    n_units = max(w.encoded.n_units for w in windows)
    unit_of = torch.full((len(windows), n_pos), n_units, dtype=torch.long)
    picked = []
    for b, (w, s) in enumerate(zip(windows, slots, strict=True)):
        unit_of[b, : len(w.encoded)] = torch.tensor(w.encoded.unit_of_piece)
        pos = [[p for p, u in enumerate(w.encoded.unit_of_piece) if u == unit] for unit in s]
        picked.append([(p, k, 1.0 / len(ps)) for k, ps in enumerate(pos) for p in ps])
    n_r = max(len(p) for p in picked)
    pieces = torch.zeros(len(windows), n_r, dtype=torch.long)
    slot_of = torch.zeros(len(windows), n_r, dtype=torch.long)
    weight = torch.zeros(len(windows), n_r, dtype=torch.float64)
    for b, picks in enumerate(picked):
        for r, (p, k, wt) in enumerate(picks):
            pieces[b, r], slot_of[b, r], weight[b, r] = p, k, wt
    width = max([len(q.cands) for _, q in qs] + [1])
    rows, slot, cands, valid, correct, kind = [], [], [], [], [], []
    for b, q in qs:
        pad_n = width - len(q.cands)
        rows.append(b)
        slot.append(slots[b].index(q.head + 1))
        cands.append([c.head + 1 for c in q.cands] + [0] * pad_n)
        valid.append([True] * len(q.cands) + [False] * pad_n)
        correct.append(list(q.correct) + [False] * pad_n)
        kind.append(q.kind)
    return {
        "row": torch.tensor(rows),
        "slot": torch.tensor(slot),
        "cands": torch.tensor(cands),
        "valid": torch.tensor(valid),
        "correct": torch.tensor(correct),
        "kind": torch.tensor(kind),
        "pieces": pieces,
        "slot_of": slot_of,
        "weight": weight,
        "unit_of": unit_of,
        "n_slots": max(len(s) for s in slots),
        "n_units": n_units,
    }


def query_attention(patterns: Sequence[torch.Tensor], ix: dict) -> torch.Tensor:
    """Word-level attention (docs/syntax.md, float64) from the query head words only.
    patterns: per layer [batch, head, q, k]. Returns [batch, layer, head, slot, unit]: rows are
    the mean over the word's pieces, columns the sum over the word's pieces (padding dropped)."""
    b, h, _, k = patterns[0].shape
    r = ix["pieces"].shape[1]
    idx = ix["pieces"][:, None, :, None].expand(b, h, r, k)  # [batch, head, r, k]
    rows = torch.stack([p.gather(2, idx) for p in patterns], 1)  # [batch, layer, head, r, k]
    n_l = rows.shape[1]
    rows = rows.to(torch.float64) * ix["weight"][:, None, None, :, None]
    frm = rows.new_zeros(b, n_l, h, ix["n_slots"], k)
    frm.scatter_add_(3, ix["slot_of"][:, None, None, :, None].expand(b, n_l, h, r, k), rows)  # mean rows
    out = rows.new_zeros(b, n_l, h, ix["n_slots"], ix["n_units"] + 1)
    out.scatter_add_(4, ix["unit_of"][:, None, None, None, :].expand(b, n_l, h, ix["n_slots"], k), frm)
    return out[..., :-1]  # [batch, layer, head, slot, unit]


def head_predictions(qa: torch.Tensor, ix: dict[str, torch.Tensor]) -> torch.Tensor:
    """qa: [batch, layer, head, slot, unit] -> predicted candidate index per (query, layer, head),
    [query, layer, head]; ties go to the lower index (the nearer candidate)."""
    rows = qa[ix["row"], :, :, ix["slot"]]  # [query, layer, head, unit]
    q, n_l, h, _ = rows.shape
    idx = ix["cands"][:, None, None, :].expand(q, n_l, h, -1)  # [query, layer, head, cand]
    scores = rows.gather(-1, idx).masked_fill(~ix["valid"][:, None, None, :], float("-inf"))
    return scores.argmax(-1)  # first maximum = nearest among ties


def chain_accumulate(state: ChainState, batch: Batch, acts, names: list[str]) -> None:
    windows: list[Window] = list(batch.items)
    n_pos = batch.input_ids.shape[1]
    ix = query_index(windows, n_pos)
    patterns = [acts[name].cpu() for name in names]  # per layer [batch, head, q, k]
    pred = head_predictions(query_attention(patterns, ix), ix)  # [query, layer, head]
    q, n_l, h = pred.shape
    ok = ix["correct"].gather(1, pred.reshape(q, n_l * h)).reshape(q, n_l, h)  # [query, layer, head]
    ok &= ix["valid"].any(1)[:, None, None]
    state.correct.index_add_(0, ix["kind"], ok.long())
    for k in ix["kind"].tolist():
        state.n[k] += 1
    state.n_windows += len(windows)
    for w in windows:
        for qu in w.queries:
            for i, good in enumerate(qu.baselines):
                state.base[i][qu.kind] += int(good)
    view_rows = _view_targets(state, windows)
    if view_rows:
        vb = [b for b, _ in view_rows]
        units = unit_matrix([windows[b].encoded for b in vb], n_pos)  # [view, unit, pos]
        wa = torch.stack([word_attention(p[vb], units).float() for p in patterns], 1)  # [view, layer, head, u, u]
        for j, (b, qu) in enumerate(view_rows):
            state.views.append(_chain_view(windows[b], qu, wa[j]))


def _view_targets(state: ChainState, windows: Sequence[Window]) -> list[tuple[int, Query]]:
    """Up to the wanted number of (row, query) pairs: the first query with 2+ candidates per window."""
    out: list[tuple[int, Query]] = []
    for b, w in enumerate(windows):
        if len(state.views) + len(out) >= state.views_wanted:
            break
        q = next((q for q in w.queries if len(q.cands) >= 2), None)
        if q is not None:
            out.append((b, q))
    return out


def _chain_view(w: Window, q: Query, wa: torch.Tensor) -> dict:
    """Word-level attention of every head over the words from the first candidate to M; the best
    head is chosen in finalize. wa: [layer, head, unit, unit]."""
    lo = min(c.start for c in q.cands)
    hi = q.end + 1
    sub = wa[:, :, lo + 1 : hi + 1, lo + 1 : hi + 1]  # [layer, head, word, word] of words lo..hi-1
    return {
        "doc": w.doc,
        "tokens": list(w.words[lo:hi]),
        "query": q.head - lo,
        "mention": " ".join(w.words[q.start : q.end + 1]),
        "type": TYPES[q.kind],
        "candidates": [
            {"text": " ".join(w.words[c.start : c.end + 1]), "head": c.head - lo, "in_chain": ok}
            for c, ok in zip(q.cands, q.correct, strict=True)
        ],
        "_all": sub,
    }


def gap_scores(pattern: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor, to: torch.Tensor) -> torch.Tensor:
    """pattern: [batch, head, q, k] of one layer; rows/weights: [batch, r] the pronoun's piece
    positions and their mean weights (0 for padding); to: [batch, cand, k] 0/1 piece indicators.
    Returns float64 [batch, head, cand]: mean over pronoun rows, sum over candidate columns."""
    b, h, _, k = pattern.shape
    idx = rows[:, None, :, None].expand(b, h, rows.shape[1], k)  # [batch, head, r, k]
    picked = pattern.gather(2, idx).to(torch.float64)  # [batch, head, r, k]
    frm = (picked * weights[:, None, :, None]).sum(2)  # [batch, head, k]
    return frm @ to.transpose(1, 2)  # [batch, head, k] @ [batch, k, cand] -> [batch, head, cand]


def gap_accumulate(state: GapState, batch: Batch, acts, names: list[str]) -> None:
    items: list[GapItem] = list(batch.items)
    n_pos = batch.input_ids.shape[1]
    width = max(len(it.pronoun) for it in items)
    rows = torch.zeros(len(items), width, dtype=torch.long)
    weights = torch.zeros(len(items), width, dtype=torch.float64)
    to = torch.zeros(len(items), 2, n_pos, dtype=torch.float64)  # A, B piece indicators
    for b, it in enumerate(items):
        rows[b, : len(it.pronoun)] = torch.tensor(it.pronoun)
        weights[b, : len(it.pronoun)] = 1.0 / len(it.pronoun)
        to[b, 0, list(it.a)] = 1.0
        to[b, 1, list(it.b)] = 1.0
    att = torch.stack([gap_scores(acts[n].cpu(), rows, weights, to) for n in names], 1)  # [batch, layer, head, cand]
    label = torch.tensor([it.label for it in items])
    nearest = torch.tensor([it.nearest for it in items])
    pred = torch.where(
        att[..., 1] > att[..., 0], 1, torch.where(att[..., 0] > att[..., 1], 0, nearest[:, None, None])
    )  # [b, l, h]
    ok = (pred == label[:, None, None]).long()
    gender = torch.tensor([it.gender for it in items])
    state.correct.index_add_(0, gender, ok)
    for it in items:
        state.n[it.gender] += 1
        state.base[0][it.gender] += int(it.nearest == it.label)
        state.base[1][it.gender] += int(it.label == 0)
    for b, it in enumerate(items):
        if len(state.views) >= state.views_wanted:
            break
        state.views.append({"item": it, "att": att[b].float()})


# ---------------------------------------------------------------- finalize helpers


def best_head(correct: torch.Tensor) -> tuple[int, int]:
    """(layer, head) with the most correct answers; ties -> lowest layer, then lowest head."""
    flat = correct.reshape(-1)  # [layer * head], layer-major
    i = int(flat.argmax())
    return divmod(i, correct.shape[1])


def pct(k: int | float, n: int) -> float | None:
    return None if n == 0 else round(100.0 * k / n, 2)


def clark(layer_idx: int, h: int) -> str:
    return f"{layer_idx + 1}-{h + 1}"


def heatmap_rows(correct: torch.Tensor, n: Sequence[int], labels: Sequence[str], column: str) -> list[dict]:
    """Tidy rows: accuracy of every head overall and per group (type or gender)."""
    rows = []
    total, n_all = correct.sum(0), sum(n)
    groups = [("all", total, n_all)] + [(g, correct[i], n[i]) for i, g in enumerate(labels) if n[i]]
    for label, c, k in groups:
        for layer in range(c.shape[0]):
            for head in range(c.shape[1]):
                rows.append(
                    {
                        "layer": layer,
                        "head": head,
                        "metric": "accuracy",
                        "value": float(c[layer, head]) / k if k else float("nan"),
                        column: label,
                        "n": k,
                        "clark_head": clark(layer, head),
                    }
                )
    return rows


# ---------------------------------------------------------------- the task


class Coref(Task[Options, ChainState | GapState]):
    name = "coref"
    description = (
        "Antecedent selection by attention (Clark Table 2): CoNLL-U Entity chains, "
        "CoNLL-2012 *_conll, or GAP TSV; best head vs nearest / head-match / rule-based"
    )

    def _format(self, ctx: Context[Options]) -> str:
        fmt = ctx.options.format
        if fmt not in ("auto", "conllu", "conll2012", "gap"):
            raise ProbeError(f"coref: format={fmt!r}; use auto, conllu, conll2012 or gap")
        if fmt != "auto":
            return fmt
        if ctx.data is None:
            return "conllu"
        if ctx.data.is_dir():
            kinds = {
                coref_data.sniff(f)
                for f in ctx.data.iterdir()
                if f.is_file() and (f.suffix in (".conllu", ".tsv") or coref_data.is_conll2012(f))
            }
            if kinds == {"gap"}:
                return "gap"
            return "chains"
        return coref_data.sniff(ctx.data)

    def load(self, model: Model, ctx: Context[Options]) -> Examples:
        if ctx.options.views < 0:
            raise ProbeError(f"coref: views={ctx.options.views} must be 0 or more")
        fmt = self._format(ctx)
        if fmt == "gap":
            return self._load_gap(model, ctx)
        docs = coref_data.read_chain_docs(ctx.data or SAMPLE, kind=fmt if fmt in ("conllu", "conll2012") else None)
        limit = model.input_limit(ctx.config.max_len)
        windows, counts = chain_windows(model, docs, limit)
        if not windows:
            raise ProbeError(
                f"{ctx.data or SAMPLE}: no mention has an earlier mention of its chain within "
                f"one window of {limit} pieces; give documents with coreference chains"
            )
        return CorefExamples(
            windows,
            counts["sentences_skipped"],
            f"sentences longer than {limit} pieces",
            "chains",
            {**counts, "documents": len(docs)},
        )

    def _load_gap(self, model: Model, ctx: Context[Options]) -> Examples:
        path = ctx.data
        if path is None:
            raise ValueError("_load_gap needs a data path")
        files = sorted(f for f in path.iterdir() if f.suffix == ".tsv") if path.is_dir() else [path]
        rows = [ex for f in files for ex in coref_data.read_gap(f)]
        limit = model.input_limit(ctx.options.gap_max_len)
        items, counts = gap_items(model, rows, limit, path)
        if not items:
            raise ProbeError(f"{path}: no GAP example with exactly one true candidate fits in {limit} pieces")
        return CorefExamples(items, counts["too_long"], f"GAP texts longer than {limit} pieces", "gap", counts)

    def batches(self, model: Model, examples: list[Any], ctx: Context[Options]) -> Iterator[Batch]:
        seqs = [w.encoded.ids if isinstance(w, Window) else w.ids for w in examples]
        per_pair = 4 * model.info.n_layers * model.info.n_heads
        return budget_batches(examples, seqs, ctx.config.batch_size, model.pad_id, per_pair)

    def hook_names(self, model: Model, ctx: Context[Options]) -> list[str]:
        return pattern_names(model.info.n_layers)

    def start(self, model: Model, ctx: Context[Options], examples: Examples) -> ChainState | GapState:
        kind = getattr(examples, "kind", "chains")
        cls = GapState if kind == "gap" else ChainState
        return cls(model.info.n_layers, model.info.n_heads, ctx.options.views, getattr(examples, "counts", {}))

    def accumulate(self, state: ChainState | GapState, batch: Batch, acts: Captured) -> None:
        names = pattern_names(state.n_layers)
        with torch_threads(1):  # scoring: small gathered tensors, no gain from threads
            if isinstance(state, GapState):
                gap_accumulate(state, batch, acts, names)
            else:
                chain_accumulate(state, batch, acts, names)

    def merge(self, a: ChainState | GapState, b: ChainState | GapState) -> ChainState | GapState:
        if type(a) is not type(b):
            raise ValueError("coref: merge needs two states of the same format")
        a.correct += b.correct
        a.n = [x + y for x, y in zip(a.n, b.n, strict=True)]
        a.base = [[x + y for x, y in zip(ra, rb, strict=True)] for ra, rb in zip(a.base, b.base, strict=True)]
        a.views = (a.views + b.views)[: a.views_wanted]  # the first ones, as one run picks them
        if isinstance(a, ChainState) and isinstance(b, ChainState):
            a.n_windows += b.n_windows
        return a

    def finalize(self, state: ChainState | GapState, ctx: Context[Options]) -> Output:
        return gap_output(state, ctx) if isinstance(state, GapState) else chain_output(state, ctx)


# ---------------------------------------------------------------- outputs


def chain_output(state: ChainState, ctx: Context) -> Output:
    n, total = state.n, sum(state.n)
    layer, head = best_head(state.correct.sum(0))
    best = [int(state.correct.sum(0)[layer, head])] + [int(state.correct[k, layer, head]) for k in range(3)]
    rows = [
        {
            "method": "mentions evaluated",
            "head": "",
            "clark_head": "",
            "all": total,
            "pronoun": n[0],
            "proper": n[1],
            "nominal": n[2],
            "clark_et_al": "All/Pron/Prop/Nom",
        }
    ]
    rows.append(
        {
            "method": "best head",
            "head": f"{layer}-{head}",
            "clark_head": clark(layer, head),
            "all": pct(best[0], total),
            **{t: pct(best[k + 1], n[k]) for k, t in enumerate(TYPES)},
            "clark_et_al": "head 5-4: " + "/".join(map(str, CLARK["head 5-4"])),
        }
    )
    for i, name in enumerate(BASELINES):
        b = state.base[i]
        rows.append(
            {
                "method": name,
                "head": "",
                "clark_head": "",
                "all": pct(sum(b), total),
                **{t: pct(b[k], n[k]) for k, t in enumerate(TYPES)},
                "clark_et_al": "/".join(map(str, CLARK[name])),
            }
        )
    scores = tidy(heatmap_rows(state.correct, n, TYPES, "type"), ctx.config.model, "coref")
    c = state.counts
    notes = [
        f"{total} mentions evaluated ({n[0]} pronoun, {n[1]} proper, {n[2]} nominal) of "
        f"{c.get('mentions', 0)} in {c.get('documents', 0)} documents; {c.get('windows', 0)} windows, "
        f"{state.n_windows} of them with an evaluated mention (only those are run)",
        f"best head {layer}-{head} (0-indexed; Clark's 1-indexed layer-head {clark(layer, head)}): "
        f"{pct(best[0], total)}% vs nearest {pct(sum(state.base[0]), total)}%, head match "
        f"{pct(sum(state.base[1]), total)}%, rule-based {pct(sum(state.base[2]), total)}%",
        "Clark et al. 2019 (BERT-base, CoNLL-2012), All/Pronoun/Proper/Nominal: head 5-4 65/64/73/58; "
        "nearest 27/29/29/19; head match 52/47/67/40; rule-based 69/70/77/60",
    ]
    headline = {
        "n_mentions": total,
        "n_by_type": dict(zip(TYPES, n, strict=False)),
        "best_head": [layer, head],
        "best_head_clark": clark(layer, head),
        "accuracy": pct(best[0], total),
        "accuracy_by_type": {t: pct(best[k + 1], n[k]) for k, t in enumerate(TYPES)},
        "baselines": {
            name: {
                "all": pct(sum(state.base[i]), total),
                **{t: pct(state.base[i][k], n[k]) for k, t in enumerate(TYPES)},
            }
            for i, name in enumerate(BASELINES)
        },
        "clark_et_al": {k: dict(zip(("all", *TYPES), v, strict=False)) for k, v in CLARK.items()},
    }
    heatmaps: list[HeatmapPanel] = [
        {"title": "antecedent accuracy, all mentions", "metric": "accuracy", "where": {"type": "all"}}
    ]
    heatmaps += [
        {"title": f"antecedent accuracy, {t}s", "metric": "accuracy", "where": {"type": t}}
        for k, t in enumerate(TYPES)
        if n[k]
    ]
    views = [_finish_chain_view(v, layer, head) for v in state.views]
    return Output(
        scores=scores, summary=pd.DataFrame(rows), notes=notes, headline=headline, heatmaps=heatmaps, views=views
    )


def _finish_chain_view(v: dict, layer: int, head: int) -> ViewPanel:
    m = v["_all"][layer, head]  # [word, word]
    row = m[v["query"]]
    cands = [{**c, "attention": round(float(row[c["head"]]), 4)} for c in v["candidates"]]
    top = max(range(len(cands)), key=lambda i: (cands[i]["attention"], -i))
    pick = cands[top]
    return {
        "title": f'{v["doc"]}: "{v["mention"]}" ({v["type"]}) -> "{pick["text"]}" '
        f"({'correct' if pick['in_chain'] else 'wrong'}), head {layer}-{head}",
        "tokens": v["tokens"],
        "pattern": [m.tolist()],
        "heads": [f"{layer}-{head} (Clark {clark(layer, head)})"],
        "causal": False,
        "query": v["query"],
        "candidates": cands,
    }


def gap_output(state: GapState, ctx: Context) -> Output:
    n = state.n
    total = sum(n)
    tot = state.correct.sum(0)
    layer, head = best_head(tot)
    m_i, f_i = GENDERS.index("masculine"), GENDERS.index("feminine")

    def line(method: str, hd: str, all_k: int, by: Sequence[int]) -> dict:
        acc_m, acc_f = pct(by[m_i], n[m_i]), pct(by[f_i], n[f_i])
        return {
            "method": method,
            "head": hd,
            "clark_head": clark(layer, head) if hd else "",
            "all": pct(all_k, total),
            "masculine": acc_m,
            "feminine": acc_f,
            "F/M": round(acc_f / acc_m, 3) if acc_m and acc_f is not None else None,
        }

    rows = [
        {
            "method": "examples",
            "head": "",
            "clark_head": "",
            "all": total,
            "masculine": n[m_i],
            "feminine": n[f_i],
            "F/M": None,
        }
    ]
    rows.append(line("best head", f"{layer}-{head}", int(tot[layer, head]), state.correct[:, layer, head].tolist()))
    for i, name in enumerate(("nearest", "first candidate")):
        rows.append(line(name, "", sum(state.base[i]), state.base[i]))
    summary = pd.DataFrame(rows)
    scores = tidy(heatmap_rows(state.correct, n, GENDERS, "gender"), ctx.config.model, "coref")
    c = state.counts
    notes = [
        f"GAP: {total} examples with exactly one true candidate ({n[m_i]} masculine, {n[f_i]} feminine); "
        f"{c.get('unanswerable', 0)} of {c.get('rows', 0)} rows have no or two true candidates and are not used",
        f"best head {layer}-{head} (Clark {clark(layer, head)}): {pct(int(tot[layer, head]), total)}% vs "
        f"nearest {pct(sum(state.base[0]), total)}%, first candidate {pct(sum(state.base[1]), total)}%",
    ]
    headline = {
        "n_examples": total,
        "best_head": [layer, head],
        "best_head_clark": clark(layer, head),
        "gap": {r["method"]: {k: r[k] for k in ("all", "masculine", "feminine", "F/M")} for r in rows[1:]},
    }
    heatmaps: list[HeatmapPanel] = [{"title": "GAP accuracy, all", "metric": "accuracy", "where": {"gender": "all"}}]
    heatmaps += [
        {"title": f"GAP accuracy, {g}", "metric": "accuracy", "where": {"gender": g}}
        for k, g in enumerate(GENDERS)
        if n[k]
    ]
    views = [_gap_view(v, layer, head) for v in state.views]
    return Output(scores=scores, summary=summary, notes=notes, headline=headline, heatmaps=heatmaps, views=views)


def _gap_view(v: dict, layer: int, head: int) -> ViewPanel:
    it: GapItem = v["item"]
    att = v["att"][layer, head]
    return {
        "title": f"GAP {it.id}: pronoun -> A {att[0]:.3f}, B {att[1]:.3f}; true {'AB'[it.label]}",
        "tokens": [f"{it.names[0]} (pronoun)", f"{it.names[1]} (A)", f"{it.names[2]} (B)"],
        # one head; only the pronoun's row is meaningful: attention to A and to B
        "pattern": [[[0.0, float(att[0]), float(att[1])], [0.0] * 3, [0.0] * 3]],
        "heads": [f"{layer}-{head} (Clark {clark(layer, head)})"],
        "causal": False,
    }
