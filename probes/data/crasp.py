"""The C-RASP depth hierarchy's languages (Yang, Cadilhac and Chiang 2025, "Knee-Deep in C-RASP: A
Transformer Depth Hierarchy", arXiv 2506.16055; code: github.com/pentagonalize/CRASP_depth).

Alphabet {a, b}. L_1 = a+; L_{j+1} = L_j b+ if j is odd, L_j a+ if j is even: L_k is k non-empty
alternating blocks, the first block a (L_4 = a+ b+ a+ b+). A string of L_k of length n: k - 1
distinct switch points drawn uniformly from {1, ..., n - 1}; x_0 = a, and x_t is the other letter
than x_{t-1} exactly when t is a switch point. The target at position t is 1 iff the prefix
x_0..x_t is in L_k, that is iff t is at or after the last switch point (the prefix has reached the
k-th block). C-RASP depth k - 2 recognises L_k and depth k - 3 does not (their Theorem; L_3 at
depth 1), so a fixed-precision transformer without positional encoding that length-generalises on
L_k needs depth k - 2.

Tokens: a = 0, b = 1, BOS = 2, PAD = 3 (:data:`VOCAB` = 4). The input is [BOS, x_0, ..., x_{n-1}]
right-padded with PAD; the targets are 0/1 at the x positions and -100 (PyTorch's ignore index) at
BOS and the padding; a model's prediction is the argmax of its first two logits
(:func:`predictions`), and its loss the cross-entropy over those two. Training strings have
lengths uniform in {max(nmin, k), ..., nmax} and are a pure function of ``(seed, step)``;
evaluation sets of ``(seed, range)``, in the evaluation seed space (:mod:`probes.data.streams`).
The exact limit of a depth-1 model without positions on these strings is in
:mod:`probes.data.crasp_cap`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.data.streams import eval_seed, generator, train_seed

A, B, BOS, PAD = 0, 1, 2, 3
VOCAB = 4  # a, b, BOS, PAD
IGNORE = -100  # BOS and padding are not scored
TRAIN_LENGTHS = (32, 64)  # nmin, nmax
EVAL_RANGES: tuple[tuple[int, int], ...] = ((32, 64), (65, 128), (129, 256), (257, 512))
MAX_EVAL_LENGTH = 1 << 16  # evaluation ranges are keyed by (lo, hi) below this


def check(k: int, lo: int, hi: int) -> None:
    """One-line errors for a language index or a length range the strings cannot have."""
    if k < 1:
        raise ProbeError(f"crasp: k (the number of blocks) must be at least 1, got {k}")
    if hi < k:
        raise ProbeError(f"crasp: a string of L_{k} needs at least {k} letters; raise the longest length {hi}")
    if lo < 1 or hi < lo:
        raise ProbeError(f"crasp: lengths must satisfy 1 <= lo <= hi, got {lo}..{hi}")


def train_range(k: int, nmin: int, nmax: int) -> tuple[int, int]:
    """The training lengths {max(nmin, k), ..., nmax}."""
    check(k, max(nmin, k), nmax)
    return max(nmin, k), nmax


def switch_points(k: int, lengths: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """[n] lengths -> [n, k - 1] switch points, sorted, distinct and uniform in {1..length - 1}.

    Each candidate position gets a uniform key; positions at or past the row's length get the key
    2 (never chosen before a valid one); the k - 1 smallest keys are a uniform subset."""
    n, longest = lengths.shape[0], int(lengths.max())
    if int(lengths.min()) < k:
        raise ProbeError(f"crasp: a string of L_{k} needs at least {k} letters, got length {int(lengths.min())}")
    keys = torch.rand(n, max(longest - 1, 0), generator=gen)  # [n, longest - 1]: positions 1..longest-1
    candidates = torch.arange(1, longest)  # [longest - 1]
    keys = torch.where(candidates[None, :] < lengths[:, None], keys, 2.0)
    chosen = keys.topk(k - 1, dim=1, largest=False).indices + 1  # [n, k - 1]
    return chosen.sort(dim=1).values


def blocks(switches: torch.Tensor, width: int) -> torch.Tensor:
    """[n, k - 1] switch points -> [n, width]: the 0-based block of each position (the number of
    switch points at or before it)."""
    pos = torch.arange(width)
    return (pos[None, :, None] >= switches[:, None, :]).sum(-1)  # [n, width, k-1] -> [n, width]


def strings(
    k: int, lengths: torch.Tensor, gen: torch.Generator, width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)``, both [n, width] (default: the longest length): the letters of strings of L_k
    with the given lengths (PAD past each length) and the membership of each prefix (1 iff in the
    k-th block; IGNORE past each length)."""
    width = int(lengths.max()) if width is None else width
    block = blocks(switch_points(k, lengths, gen), width)  # [n, width]
    inside = torch.arange(width)[None, :] < lengths[:, None]
    x = torch.where(inside, block % 2, PAD)
    y = torch.where(inside, (block == k - 1).long(), IGNORE)
    return x, y


def batch(k: int, n: int, lo: int, hi: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, targets)``, both [n, 1 + hi]: BOS then a string of L_k of length uniform in
    {lo..hi}, right-padded; targets -100 at BOS and the padding. Draws the lengths, then the
    switch points, from ``gen``."""
    check(k, lo, hi)
    if n < 1:
        raise ProbeError(f"crasp: need at least 1 string, got {n}")
    lengths = torch.randint(lo, hi + 1, (n,), generator=gen)
    x, y = strings(k, lengths, gen, width=hi)
    inputs = torch.cat([torch.full((n, 1), BOS, dtype=torch.long), x], dim=1)
    targets = torch.cat([torch.full((n, 1), IGNORE, dtype=torch.long), y], dim=1)
    return inputs, targets


def train_batch(k: int, n: int, nmin: int, nmax: int, seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Training batch ``step`` of run ``seed``: lengths uniform in {max(nmin, k)..nmax}; a pure
    function of its arguments (fresh strings every step, the same batch on a resumed run)."""
    lo, hi = train_range(k, nmin, nmax)
    return batch(k, n, lo, hi, generator(train_seed(seed, step)))


def eval_batch(k: int, n: int, lo: int, hi: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed evaluation set of lengths {lo..hi} for run ``seed``: from the evaluation seed
    space (odd generator seeds; every training batch has an even one), one set per range."""
    if not 1 <= lo <= hi < MAX_EVAL_LENGTH:
        raise ProbeError(f"crasp: evaluation lengths must satisfy 1 <= lo <= hi < {MAX_EVAL_LENGTH}, got {lo}..{hi}")
    return batch(k, n, max(lo, k), hi, generator(eval_seed(seed, lo * MAX_EVAL_LENGTH + hi)))


def predictions(logits: torch.Tensor) -> torch.Tensor:
    """[..., vocab] logits -> [...] 0/1: the argmax of the two class logits (a, b double as 0, 1)."""
    return logits[..., :2].argmax(-1)


def scores(pred: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Exact-match string accuracy (every scored position right), token accuracy (pooled over the
    scored positions) and the majority-class token accuracy (the better constant answer), for
    predictions and targets [n, T] (-100: not scored)."""
    if pred.shape != targets.shape:
        raise ProbeError(f"crasp scores: predictions {tuple(pred.shape)} do not match targets {tuple(targets.shape)}")
    scored = targets != IGNORE
    if not scored.any():
        raise ProbeError("crasp scores: no scored position (every target is -100)")
    right = (pred.to(targets.device) == targets) | ~scored
    ones = float((targets[scored] == 1).float().mean())
    return {
        "exact_match": float(right.all(dim=1).float().mean()),
        "token_accuracy": float(right[scored].float().mean()),
        "majority_accuracy": max(ones, 1.0 - ones),
    }


def ranges_label(ranges: Sequence[tuple[int, int]]) -> list[str]:
    """``[(32, 64), ...]`` -> ``["32-64", ...]``: the column names of per-range tables."""
    return [f"{lo}-{hi}" for lo, hi in ranges]
