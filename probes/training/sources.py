"""Batch sources of the one training loop (:mod:`probes.training.loop`): what a model trains on.

- :class:`SyntheticSource`: ``probe train``'s repeated-token (or random) sequences, next-token loss.
- :class:`CorpusSource`: a study member's windows of a text corpus, next-token loss.
- :class:`CopySource`: the kernels sweep's copy task, loss on the repeated half only.
- :class:`KHopSource`, :class:`GroupSource`, :class:`CurriculumSource`, :class:`CRaspSource`: the
  depth-law families' k-hop induction, group word problems (one length, or Merrill and Sabharwal's
  length curriculum) and C-RASP languages, loss at every scored position.

Every source but :class:`CopySource` and :class:`CurriculumSource` is a pure function of the step;
the copy task draws from one generator in order, as the kernels sweep always has (it never
resumes); the curriculum's batch is a pure function of the step and its stage.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from depthprobe.probes.data import corpus as corpora
from depthprobe.probes.data import crasp, groups, khop, synthetic
from depthprobe.probes.data.synthetic import DataConfig
from depthprobe.probes.training.fast_forward import lm_loss
from depthprobe.probes.training.loop import target_loss


@dataclass(frozen=True)
class SyntheticSource:
    """``probe train``'s batches: :func:`probes.data.synthetic.batch_at` of ``(seed, step)``."""

    data: DataConfig
    seed: int
    batch_size: int

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = synthetic.batch_at(self.data, self.seed, step, self.batch_size)
        return tokens, tokens

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return lm_loss(logits, targets)


@dataclass(frozen=True)
class CorpusSource:
    """A study member's batches: BOS then ``context - 1`` corpus tokens per row
    (:func:`probes.data.corpus.train_batch` of ``(seed, step)``)."""

    corpus: corpora.Corpus
    seed: int
    batch_size: int
    context: int

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.corpus
        tokens = corpora.train_batch(c.train_ids, self.seed, step, self.batch_size, self.context, c.bos)
        return tokens, tokens

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return lm_loss(logits, targets)


def copy_batch(batch: int, t: int, d_vocab: int, gen: torch.Generator) -> torch.Tensor:
    """The copy (induction) task: a random first half repeated. [batch, t]."""
    half = (t + 1) // 2
    first = torch.randint(0, d_vocab, (batch, half), generator=gen)
    return torch.cat([first, first], 1)[:, :t]


@dataclass
class CopySource:
    """The kernels sweep's training data: copy sequences of length ``t`` from one generator
    seeded with ``seed + 1``; the loss scores only the repeated half."""

    batch_size: int
    t: int
    d_vocab: int
    seed: int
    gen: torch.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.gen = torch.Generator().manual_seed(self.seed + 1)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = copy_batch(self.batch_size, self.t, self.d_vocab, self.gen)
        return ids, ids

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        half = (self.t + 1) // 2
        pred, target = logits[:, half - 1 : -1], targets[:, half:]
        return F.cross_entropy(pred.reshape(-1, pred.shape[-1]), target.reshape(-1))


@dataclass(frozen=True)
class KHopSource:
    """A ``khop`` law member's batches: :func:`probes.data.khop.train_batch` of ``(seed, step)``,
    each row's hop count drawn from ``ks`` (the multi-task mix); loss at every position of X."""

    ks: tuple[int, ...]
    batch_size: int
    length: int
    letters: int
    max_k: int
    seed: int

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return khop.train_batch(self.ks, self.batch_size, self.length, self.letters, self.max_k, self.seed, step)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return target_loss(logits, targets)


@dataclass(frozen=True)
class GroupSource:
    """A ``groups`` law member's batches: :func:`probes.data.groups.train_batch` of ``(seed, step)``
    (running products of ``length`` elements of the group ``group``); loss at every position."""

    group: str
    batch_size: int
    length: int
    seed: int

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return groups.train_batch(groups.get_group(self.group), self.batch_size, self.length, self.seed, step)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return target_loss(logits, targets)


@dataclass
class CurriculumSource:
    """A ``groups`` member's batches under Merrill and Sabharwal's length curriculum: batch ``step``
    is :func:`probes.data.groups.train_batch` at the current stage's length (``lengths[stage]``);
    every ``check_every`` updates :meth:`check` evaluates that length on ``check_sequences``
    sequences and moves on (:meth:`advance`) once their accuracy reaches ``threshold``."""

    group: str
    batch_size: int
    lengths: tuple[int, ...]
    seed: int
    stage: int = 0
    moves: list[tuple[int, int]] = field(default_factory=list)  # (step, the length trained from there on)
    check_every: int = 1
    check_sequences: int = 1
    threshold: float = 1.0

    @property
    def length(self) -> int:
        return self.lengths[self.stage]

    def advance(self, accuracy: float, threshold: float, step: int = 0) -> bool:
        """Move to the next length once the current one is solved (recorded in ``moves`` at
        ``step``); whether the stage moved."""
        before = self.stage
        self.stage = groups.advance(self.stage, self.lengths, accuracy, threshold)
        if self.stage != before:
            self.moves.append((step, self.length))
        return self.stage != before

    @property
    def finished(self) -> bool:
        """At the last length: nothing left to check."""
        return self.stage == len(self.lengths) - 1

    def check(self, predict: Callable[[torch.Tensor], torch.Tensor], done: int) -> bool:
        """After update ``done``, every ``check_every`` updates: the accuracy over every position of
        the current length on its check set (:func:`probes.data.groups.check_batch`) of the model's
        predictions ``predict(inputs)``; solved moves on. True when it used the model."""
        if self.finished or done % self.check_every:
            return False
        inputs, targets = groups.check_batch(groups.get_group(self.group), self.check_sequences, self.length, self.seed)
        self.advance(float((predict(inputs) == targets).float().mean()), self.threshold, step=done)
        return True

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return groups.train_batch(groups.get_group(self.group), self.batch_size, self.length, self.seed, step)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return target_loss(logits, targets)


@dataclass(frozen=True)
class CRaspSource:
    """A ``crasp`` member's batches: :func:`probes.data.crasp.train_batch` of ``(seed, step)``
    (strings of L_k, lengths uniform in {max(nmin, k)..nmax}); loss at the x positions only."""

    k: int
    batch_size: int
    nmin: int
    nmax: int
    seed: int

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return crasp.train_batch(self.k, self.batch_size, self.nmin, self.nmax, self.seed, step)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return target_loss(logits[..., :2], targets)  # two classes, as crasp.predictions reads them
