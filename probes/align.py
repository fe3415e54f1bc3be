"""Wordpiece <-> word alignment and word-level attention (Clark et al. 2019, §4.1).

An input is ``[CLS] pieces [SEP]`` for encoders and ``BOS pieces`` for decoders. Units are the
leading special token, then one unit per word, then (encoders) the trailing [SEP]:
unit ``k + 1`` is word ``k``. Attention TO a unit is the SUM over its pieces' columns;
attention FROM a unit is the MEAN over its pieces' rows. Sums and means are in float64.

Words are tokenised one at a time (batched through the fast tokenizer); byte-level BPE
tokenizers (GPT-2) get a leading space on every word but the first, as in running text.
A word that yields no pieces (e.g. a lone control character) is given the tokenizer's unknown
token (or, without one, the piece of a single space) so that every word has a position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from depthprobe.probes.models import Model


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


def _needs_prefix_space(tokenizer) -> bool:
    name = type(tokenizer).__name__.lower()
    return any(k in name for k in ("gpt2", "roberta", "bart", "codegen", "gptneox", "bloom")) or bool(
        getattr(tokenizer, "add_prefix_space", False)
    )


def word_pieces(model: Model, words: Sequence[str]) -> list[list[int]]:
    tok = model.require_tokenizer("word alignment")
    prefix = _needs_prefix_space(tok)
    texts = [(" " + w if prefix and i else w) for i, w in enumerate(words)]
    pieces = tok(texts, add_special_tokens=False)["input_ids"] if texts else []
    fallback = tok.unk_token_id
    out = []
    for p in pieces:
        if not p:
            p = [fallback] if fallback is not None else tok(" ", add_special_tokens=False)["input_ids"][:1]
        out.append(list(p))
    return out


def encode_words(model: Model, words: Sequence[str]) -> Encoded:
    """``[CLS] pieces [SEP]`` (encoder) or ``BOS pieces`` (decoder) with each piece's unit."""
    return encode_pieces(model, word_pieces(model, words))


def encode_pieces(model: Model, pieces: Sequence[Sequence[int]]) -> Encoded:
    """Per-word piece ids -> model input with the special tokens and each position's unit."""
    if model.cls_id is None:
        raise ValueError(f"encode_pieces needs a model with a tokenizer; {model.name} has none")
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
