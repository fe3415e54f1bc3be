"""OntoNotes-style chains (CoNLL-U ``Entity=`` / CoNLL-2012): windows, candidates and baselines.

Documents are cut into windows of consecutive whole sentences (greedy, at most ``--max-len``
pieces with specials; a longer sentence is skipped and ends the window). A mention M of a window
(whole span inside) is evaluated when an earlier mention of its chain (strictly earlier start)
starts in the window. Candidates are the window's mentions ending before M starts (start before
M, no overlap), ordered nearest first: start descending, then end descending. The nearest,
head-match and rule-based baselines are answered here, once per query; the heads' answers are
scored in :mod:`.chain_scores`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from depthprobe.probes.data import coref_chains
from depthprobe.probes.data.align import Encoded, encode_pieces, word_pieces

TYPES = ("pronoun", "proper", "nominal")
BASELINES = ("nearest", "head match", "rule-based")


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
    if token.pos_ == "PRON" and token.text.lower() in coref_chains.PRONOUNS:
        return coref_chains.PRONOUNS[token.text.lower()]
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
    doc, lo: int, m: coref_chains.Mention, cands: Sequence[Cand]
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


def window_queries(doc, ms: Sequence[coref_chains.Mention], lo: int, hi: int) -> tuple[Query, ...]:
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
        ms = coref_chains.mentions(doc)
        counts["mentions"] += len(ms)
        pieces = word_pieces(model, [t.text for t in doc])
        bounds = coref_chains.sentence_bounds(doc)
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
