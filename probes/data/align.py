"""Wordpiece <-> word alignment and word-level attention (Clark et al. 2019, §4.1).

An input is ``[CLS] pieces [SEP]`` for encoders and ``BOS pieces`` for decoders. Units are the
leading special token, then one unit per word, then (encoders) the trailing [SEP]:
unit ``k + 1`` is word ``k``. Attention TO a unit is the SUM over its pieces' columns;
attention FROM a unit is the MEAN over its pieces' rows. Sums and means are in float64.

Words are aligned from the tokenizer's own offsets: the words are joined with single spaces into
running text, as the sentence would be written, the text is tokenised once with
``return_offsets_mapping``, and every piece goes to the word whose characters it covers. A piece
that covers only the space between two words (a lone ``\u2581`` or ``\u0120``) goes to the word after it.
This holds for every fast tokenizer (WordPiece, byte-level BPE with or without a prefix space,
SentencePiece-style ``\u2581`` pieces), so no tokenizer family is guessed from its class name.
A piece that spans two words (a merge across the space) is refused with one line, and so are slow
(Python) tokenizers, which report no offsets (the message says how to save a fast one).
A word that yields no pieces (e.g. a lone control character) is given the tokenizer's unknown
token (or, without one, the piece of a single space) so that every word has a position.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from depthprobe.probes.base.errors import ProbeError

if TYPE_CHECKING:  # annotations only: data sits below models
    from depthprobe.probes.models.model import Model


@dataclass(frozen=True)
class Encoded:
    """One word sequence as model input."""

    ids: tuple[int, ...]
    unit_of_piece: tuple[int, ...]  # unit index of every position (specials are their own unit)
    n_words: int

    @property
    def n_units(self) -> int:
        return max(self.unit_of_piece) + 1

    def __len__(self) -> int:
        return len(self.ids)


def running_text(words: Sequence[str]) -> tuple[str, list[tuple[int, int]]]:
    """The words joined with single spaces, and each word's ``(start, end)`` character span."""
    spans, pos = [], 0
    for w in words:
        spans.append((pos, pos + len(w)))
        pos += len(w) + 1
    return " ".join(words), spans


def _fast(tok: Any, model: Model) -> Any:
    if not getattr(tok, "is_fast", False):
        raise ProbeError(
            f"model {model.name!r} has a slow tokenizer ({type(tok).__name__}), which gives no character "
            "offsets for word alignment; save a fast one beside the model (tokenizer.json: "
            "AutoTokenizer.from_pretrained(PATH).save_pretrained(PATH) with the tokenizers package installed)"
        )
    return tok


def pieces_of_words(
    offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]], text: str = ""
) -> list[list[int]]:
    """Piece indices per word from piece ``offsets`` and word ``spans`` (character ranges, in order).

    A piece belongs to the word whose characters it overlaps; a piece overlapping no word (only the
    space between words) belongs to the next word, or to the last word at the end of the text. A
    piece overlapping two words is refused: the words would share it.
    """
    starts = [s for s, _ in spans]
    out: list[list[int]] = [[] for _ in spans]
    pending: list[int] = []  # space-only pieces waiting for the next word
    n = len(spans)
    for i, (a, b) in enumerate(offsets):
        j = max(bisect_right(starts, a) - 1, 0)  # words before j end before a
        hits = []
        while j < n and starts[j] < b:  # words from the first starting at or after b start too late
            if a < spans[j][1]:
                hits.append(j)
            j += 1
        if len(hits) > 1:
            first, second = (text[spans[j][0] : spans[j][1]] for j in hits[:2])
            raise ProbeError(
                f"word alignment: the tokenizer merges {text[a:b]!r} into one piece across a space, "
                f"so the words {first!r} and {second!r} would share it; this tokenizer cannot be "
                "used for word-level tasks (syntax, coref)"
            )
        if not hits:
            pending.append(i)
            continue
        out[hits[0]].extend([*pending, i])
        pending = []
    if pending and out:
        out[-1].extend(pending)
    return out


def word_pieces(model: Model, words: Sequence[str]) -> list[list[int]]:
    """Piece ids per word, from tokenising the running text once (see the module's docstring)."""
    return word_pieces_many(model, [words])[0]


def word_pieces_many(model: Model, word_lists: Sequence[Sequence[str]]) -> list[list[list[int]]]:
    """:func:`word_pieces` of many word sequences, tokenised in one batched tokenizer call (the
    same pieces as one call per sequence, without the per-call overhead)."""
    tok = _fast(model.require_tokenizer("word alignment"), model)
    texts = [running_text(words) for words in word_lists]
    todo = [k for k, words in enumerate(word_lists) if words]
    out: list[list[list[int]]] = [[] for _ in word_lists]
    if not todo:
        return out
    enc = tok([texts[k][0] for k in todo], add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    fallback = tok.unk_token_id
    for row, k in enumerate(todo):
        text, spans = texts[k]
        ids, offsets = enc["input_ids"][row], [tuple(o) for o in enc["offset_mapping"][row]]
        for idx in pieces_of_words(offsets, spans, text):
            p = [ids[i] for i in idx]
            if not p:
                p = [fallback] if fallback is not None else tok(" ", add_special_tokens=False)["input_ids"][:1]
            out[k].append(p)
    return out


def encode_words(model: Model, words: Sequence[str]) -> Encoded:
    """``[CLS] pieces [SEP]`` (encoder) or ``BOS pieces`` (decoder) with each piece's unit."""
    return encode_pieces(model, word_pieces(model, words))


def encode_pieces(model: Model, pieces: Sequence[Sequence[int]]) -> Encoded:
    """Per-word piece ids -> model input with the special tokens and each position's unit."""
    if model.cls_id is None:
        raise ProbeError(
            f"model {model.name!r} has no [CLS], BOS or EOS token to start the input with, which "
            "word-level tasks (syntax, coref) need; use attention-stats or induction on it"
        )
    ids: list[int] = [model.cls_id]
    units: list[int] = [0]
    for k, p in enumerate(pieces):
        ids.extend(p)
        units.extend([k + 1] * len(p))
    if model.sep_id is not None:
        ids.append(model.sep_id)
        units.append(len(pieces) + 1)
    return Encoded(tuple(ids), tuple(units), len(pieces))


def unit_matrix(batch: Sequence[Encoded], n_pos: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """M[b, u, t] = 1 when position t belongs to unit u. Shape [batch, max_units, n_pos], float64."""
    n_units = max(e.n_units for e in batch)
    m = torch.zeros(len(batch), n_units, n_pos, dtype=torch.float64)
    for b, e in enumerate(batch):
        pos = torch.arange(len(e))
        m[b, torch.tensor(e.unit_of_piece), pos] = 1.0
    return m.to(device)


def word_attention(pattern: torch.Tensor, units: torch.Tensor) -> torch.Tensor:
    """Word-level attention from wordpiece attention.

    pattern: [batch, (layer,) head, query_pos, key_pos]; units: [batch, unit, pos] (0/1, each
    position in at most one unit). Returns [batch, (layer,) head, from_unit, to_unit] in float64:
    rows are the mean over the from-unit's pieces, columns the sum over the to-unit's pieces
    (exact float64 sums, then one division). Padding units get 0.
    """
    m = units.to(torch.float64)
    b, n_units, n_pos = m.shape
    # unit of every position; positions in no unit (padding) go to an extra bin that is dropped
    unit = torch.where(m.sum(1) > 0, m.argmax(1), n_units)  # [b, t]
    size = m.sum(-1).clamp(min=1.0)  # [b, u] pieces per unit
    lead = pattern.shape[1:-2]
    a = pattern.to(torch.float64).reshape(b, -1, n_pos, n_pos)  # [b, (layer,) head, t, s] -> [b, g, t, s]
    g = a.shape[1]
    to_unit = torch.zeros(b, g, n_pos, n_units + 1, dtype=torch.float64, device=a.device)
    to_unit.scatter_add_(-1, unit[:, None, None, :].expand(b, g, n_pos, n_pos), a)  # sum over to-pieces
    both = torch.zeros(b, g, n_units + 1, n_units + 1, dtype=torch.float64, device=a.device)
    both.scatter_add_(-2, unit[:, None, :, None].expand(b, g, n_pos, n_units + 1), to_unit)
    out = both[:, :, :n_units, :n_units] / size[:, None, :, None]  # mean over from-pieces
    return out.reshape(b, *lead, n_units, n_units)
