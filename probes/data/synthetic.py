"""Seeded, deterministic synthetic token data for training and probing native models.

Token 0 is BOS for native models (they have no tokenizer); ordinary tokens are 1..vocab-1.
Every sequence starts with BOS.

- :func:`induction`: random tokens with one repeated segment ``r r`` at a random offset and
  a random repeat length drawn from the training lengths. Varying both keeps a positional
  shortcut from passing for induction (docs/induction.md).
- :func:`random_tokens`: plain uniform random tokens (nothing to copy).
- :func:`repeated`: ``prefix r r suffix`` with ``r`` drawn without replacement from a given id
  list: the probe input of the induction task (``[BOS] r r`` / ``[CLS] r r [SEP]``).

Training data (:func:`induction`) draws its tokens, the repeated segment included, with
replacement: it is unchanged so that a resumed run sees the very batches it would have seen,
and tokens recurring inside a segment are part of what a model meets in text. Only the probe
input, whose scores assume one correct target per query, is drawn without replacement.

Batches are a pure function of ``(seed, step)`` (:func:`batch_at`), so a resumed run sees
exactly the data an uninterrupted one would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple

import numpy as np
import torch

from depthprobe.probes.base.errors import ProbeError, unknown

if TYPE_CHECKING:
    from depthprobe.probes.models.model import Model

BOS = 0  # the first token of every native-model sequence


@dataclass(frozen=True)
class DataConfig:
    """What a training run sees. ``held_out`` repeat lengths never occur in training data."""

    kind: Literal["induction", "random"] = "induction"
    seq_len: int = 64  # tokens per sequence, BOS included
    vocab: int = 64  # BOS + vocab-1 ordinary tokens
    min_repeat: int = 4
    held_out: tuple[int, ...] = (5, 10, 15, 20, 25, 30)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise unknown("data kind", self.kind, KINDS)
        if self.vocab < 3:
            raise ProbeError(f"data: vocab must be at least 3 (BOS + 2 tokens), got {self.vocab}")
        if self.seq_len < 2:
            raise ProbeError(f"data: seq_len must be at least 2, got {self.seq_len}")
        if self.min_repeat < 1:
            raise ProbeError(f"data: min_repeat must be at least 1, got {self.min_repeat}")
        if self.kind == "induction" and not self.train_lengths:
            raise ProbeError(
                f"data: no training repeat length left between min_repeat={self.min_repeat} and "
                f"{self.max_repeat} (= (seq_len-1)//2) after removing held_out={list(self.held_out)}; "
                f"raise --seq-len (at least {2 * self.min_repeat + 1})"
            )

    @property
    def max_repeat(self) -> int:
        """Longest repeat that fits twice after BOS."""
        return (self.seq_len - 1) // 2

    @property
    def train_lengths(self) -> tuple[int, ...]:
        return tuple(s for s in range(self.min_repeat, self.max_repeat + 1) if s not in self.held_out)

    @property
    def eval_lengths(self) -> tuple[int, ...]:
        """Held-out lengths that fit as ``[BOS] r r`` in seq_len tokens."""
        return tuple(s for s in self.held_out if 2 * s + 1 <= self.seq_len)


class Induction(NamedTuple):
    tokens: torch.Tensor  # [batch, seq_len] long, tokens[:, 0] == BOS
    length: torch.Tensor  # [batch] repeat length S
    offset: torch.Tensor  # [batch] position of the first copy; the second starts at offset + S


def generator(seed: int, step: int = 0) -> torch.Generator:
    """A CPU generator seeded from (seed, step) through numpy's SeedSequence (no collisions)."""
    state = np.random.SeedSequence([int(seed) % 2**63, int(step)]).generate_state(2, np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def random_tokens(batch: int, seq_len: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """[batch, seq_len] uniform tokens from 1..vocab-1 after a BOS column."""
    tokens = torch.randint(1, vocab, (batch, seq_len), generator=gen)
    tokens[:, 0] = BOS
    return tokens


def induction(batch: int, seq_len: int, vocab: int, lengths: Sequence[int], gen: torch.Generator) -> Induction:
    """Random tokens with one segment repeated back to back at a random offset.

    Each row draws its repeat length S uniformly from ``lengths`` and the first copy's start
    uniformly from 1..seq_len-2S, so the copy can sit anywhere after BOS.
    """
    lengths_t = torch.as_tensor(list(lengths), dtype=torch.long)
    if lengths_t.numel() == 0 or int(lengths_t.min()) < 1 or 2 * int(lengths_t.max()) + 1 > seq_len:
        raise ProbeError(
            f"induction data: repeat lengths {list(lengths)} must be >= 1 and fit twice "
            f"after BOS in seq_len={seq_len} (at most {(seq_len - 1) // 2})"
        )
    tokens = random_tokens(batch, seq_len, vocab, gen)
    length = lengths_t[torch.randint(0, len(lengths_t), (batch,), generator=gen)]
    room = seq_len - 2 * length  # number of possible starts: 1..room
    offset = 1 + (torch.rand(batch, generator=gen) * room).long().clamp(max=room - 1)
    pos = torch.arange(seq_len)[None, :]  # [1, T]
    second = (pos >= (offset + length)[:, None]) & (pos < (offset + 2 * length)[:, None])  # [B, T]
    src = (pos - length[:, None]).clamp(min=0)  # [B, T] where each second-copy token comes from
    tokens = torch.where(second, tokens.gather(1, src), tokens)
    return Induction(tokens, length, offset)


def repeated(
    n: int,
    length: int,
    token_ids: Sequence[int] | torch.Tensor,
    gen: torch.Generator,
    prefix: Sequence[int] = (BOS,),
    suffix: Sequence[int] = (),
) -> torch.Tensor:
    """[n, len(prefix) + 2*length + len(suffix)]: ``prefix r r suffix``.

    Each row's r is drawn uniformly WITHOUT replacement from token_ids (no token twice in r), so
    every induction query has exactly one correct target. Deterministic for a generator state.
    """
    ids = torch.as_tensor(list(token_ids) if not torch.is_tensor(token_ids) else token_ids, dtype=torch.long)
    if ids.numel() < 2:
        raise ProbeError("repeated tokens need at least 2 ordinary token ids to draw from")
    if length > ids.numel():
        raise ProbeError(
            f"a repeated segment of {length} distinct tokens needs at least {length} ordinary "
            f"token ids, there are {ids.numel()}; use a repeat length of {ids.numel()} or less"
        )
    keys = torch.rand(n, ids.numel(), generator=gen)  # a uniform random permutation per row
    r = ids[keys.argsort(dim=1)[:, :length]]  # [n, S], distinct within each row
    pre = torch.tensor(list(prefix), dtype=torch.long).expand(n, len(prefix))
    suf = torch.tensor(list(suffix), dtype=torch.long).expand(n, len(suffix))
    return torch.cat([pre, r, r, suf], dim=1)


def batch_at(data: DataConfig, seed: int, step: int, batch: int) -> torch.Tensor:
    """The training batch of ``step``: a pure function of (data, seed, step, batch)."""
    gen = generator(seed, step)
    if data.kind == "random":
        return random_tokens(batch, data.seq_len, data.vocab, gen)
    return induction(batch, data.seq_len, data.vocab, data.train_lengths, gen).tokens


KINDS = ("induction", "random")


# ----------------------------------------------------------------------------- repeated sequences for a model


def ordinary_ids(model: Model) -> torch.Tensor:
    """Token ids r is drawn from: the vocabulary minus special tokens (native: 1..d_vocab-1)."""
    vocab = int(model.bridge.cfg.d_vocab)
    if model.tokenizer is None:
        return torch.arange(1, vocab)
    n = min(vocab, len(model.tokenizer))
    special = torch.tensor(sorted(i for i in model.special_ids if i < n), dtype=torch.long)
    ids = torch.arange(n)
    return ids[~torch.isin(ids, special)]


def frame(model: Model) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(prefix, suffix) around ``r r``: ([BOS],) for decoders, ([CLS], [SEP]) for encoders."""
    if model.tokenizer is None:
        return (BOS,), ()
    first = model.cls_id
    if first is None:
        raise ProbeError(f"model {model.name!r} has no BOS/[CLS] token to start the repeated sequences with")
    return (first,), (() if model.sep_id is None else (model.sep_id,))


def sequences(model: Model, repeat_len: int, n: int, seed: int) -> torch.Tensor:
    """[n, p + 2S + suffix] repeated sequences for ``model``, seeded by (seed, S)."""
    prefix, suffix = frame(model)
    return repeated(n, repeat_len, ordinary_ids(model), generator(seed, repeat_len), prefix, suffix)
