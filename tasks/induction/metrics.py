"""Pure metrics of the induction task: head scores on repeated sequences and their chance
levels, next-token and copy losses, the ICL score from per-position losses, and the weight-based
copying and K-composition scores of native models. No model is run here.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch
import torch.nn.functional as F

from depthprobe.probes.measures.metrics import diagonal
from depthprobe.probes.models.model import Model

ICL_CONTEXT = 512  # Olsson et al.'s documents: at least 512 tokens
ICL_EARLY, ICL_LATE = 50, 500  # token positions compared at a 512-token context


def head_score_sums(a: torch.Tensor, repeat_len: int, prefix: int = 1) -> dict[str, torch.Tensor]:
    """Per-head sums over sequences of each sequence's mean score.

    a: attention [batch, layer, head, query, key] on ``prefix r r ...`` with |r| = repeat_len.
    Returns metric -> [layer, head] float64 sums; divide by the number of sequences.
    """
    s, p = repeat_len, prefix
    a = a.to(torch.float64)
    second = slice(p + s, p + 2 * s)  # query positions of the second copy
    copies = slice(p + 1, p + 2 * s)  # copy positions whose previous token is not a prefix token
    per_query = {
        "induction": diagonal(a, -(s - 1))[..., second],  # [b, l, h, S]
        "duplicate_token": diagonal(a, -s)[..., second],
        "previous_token": diagonal(a, -1)[..., copies],  # [b, l, h, 2S-1]
    }
    return {k: v.mean(-1).sum(0) for k, v in per_query.items()}


def chance_levels(repeat_len: int, prefix: int = 1, suffix: int = 0, causal: bool = True) -> dict[str, Fraction]:
    """Exact chance level of each attention score: the mean over its scored query positions of
    1 / (number of attendable positions).

    A causal query at position i (0-indexed) attends to positions 0..i, i + 1 of them; an
    encoder query attends to every real position, p + 2S + suffix of them. The query positions
    are those :func:`head_score_sums` averages over.
    """
    s, p = repeat_len, prefix
    queries = {
        "induction": range(p + s, p + 2 * s),
        "duplicate_token": range(p + s, p + 2 * s),
        "previous_token": range(p + 1, p + 2 * s),
    }
    total = p + 2 * s + suffix
    return {
        k: sum((Fraction(1, i + 1 if causal else total) for i in q), Fraction(0)) / len(q) for k, q in queries.items()
    }


def icl_positions(context: int) -> tuple[int, int]:
    """(early, late) window positions of the ICL score for a context of ``context`` tokens.

    At 512 tokens or more: (50, 500), Olsson et al.'s tokens. Shorter contexts n scale both:
    (floor(50n/512 + 1/2), floor(500n/512 + 1/2)), early at least 1 and late at most n - 1.
    """
    n = min(context, ICL_CONTEXT)
    early = max(1, math.floor(Fraction(ICL_EARLY * n, ICL_CONTEXT) + Fraction(1, 2)))
    late = min(n - 1, math.floor(Fraction(ICL_LATE * n, ICL_CONTEXT) + Fraction(1, 2)))
    return early, late


def icl_from_losses(losses: torch.Tensor, early: int, late: int) -> tuple[float, float, float, float]:
    """Olsson et al.'s ICL score from per-position losses [window, pos-1] (entry j: the loss
    predicting position j + 1, as :func:`token_losses` returns them).

    Returns (score, standard error over windows, mean loss at ``early``, mean loss at ``late``),
    score = mean over windows of loss(late) - loss(early).
    """
    loss = losses.double()
    a, b = loss[:, early - 1], loss[:, late - 1]
    diff = b - a
    se = float(diff.std(unbiased=True) / math.sqrt(len(diff))) if len(diff) > 1 else float("nan")
    return float(diff.mean()), se, float(a.mean()), float(b.mean())


def token_losses(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token loss at each position [batch, pos-1] (position t predicts token t+1)."""
    v = logits.shape[-1]
    flat = F.cross_entropy(logits[:, :-1].reshape(-1, v).float(), tokens[:, 1:].reshape(-1), reduction="none")
    return flat.view(tokens.shape[0], -1)  # [b * (t-1)] -> [b, t-1]


def copy_losses(
    logits: torch.Tensor, tokens: torch.Tensor, repeat_len: int, prefix: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence mean loss predicting r_1..r_{S-1} in the first copy and in the second. [batch] each."""
    s, p = repeat_len, prefix
    loss = token_losses(logits, tokens).double()
    return loss[:, p : p + s - 1].mean(-1), loss[:, p + s : p + 2 * s - 1].mean(-1)


def copying_scores(model: Model) -> torch.Tensor:
    """Elhage et al.'s copying score per head [layer, head] for W_E W_V W_O W_U.

    The non-zero eigenvalues of W_E W_V W_O W_U (vocab x vocab) are those of the small
    W_O W_U W_E W_V (d_head x d_head), so that is what is diagonalised.
    """
    b = model.bridge
    w_e, w_u = b.W_E.detach().double(), b.W_U.detach().double()  # [V, d], [d, V]
    w_v, w_o = b.W_V.detach().double(), b.W_O.detach().double()  # [L, H, d, dh], [L, H, dh, d]
    small = w_o @ (w_u @ w_e) @ w_v  # [L, H, dh, dh]
    eig = torch.linalg.eigvals(small)  # [L, H, dh] complex
    return eig.sum(-1).real / eig.abs().sum(-1).clamp_min(1e-30)


def k_composition(model: Model) -> torch.Tensor:
    """K-composition scores [layer, head, layer, head]: [l1, h1, l2, h2] for l1 < l2, else 0."""
    return model.bridge.all_composition_scores("K").scores.detach().double().cpu()
