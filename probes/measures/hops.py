"""Hop attention: does a head look where k-hop induction's pointer points?

For k-hop induction (Sanford, Hsu and Telgarsky 2024; :mod:`probes.data.khop`), p(i) = 1 + the
last position before i holding X_i, and the answer at i is X at p^k(i). Depth floor(log2 k) + 2
suffices because positions can hold pointers as well as answers: in a construction that reaches
it, layer 0 copies the previous letter (attends to i - 1), layer 1 is an induction step (attends
to p(i)), and layer l >= 2 attends to p^(2^(l-1))(i), one hop beyond the pointer it holds, reading
the pointer and answers held there, so L layers hold 2^(L-1) - 1 hops. So for each head and hop j
we read the attention from the query at sequence position offset + i to the key at offset +
p^j(i), averaged over the (sequence, i) where p^j(i) is defined; its chance level is the mean, over
the same (sequence, i), of 1 / (offset + i + 1), the number of keys a causal query at offset + i
sees. Two more targets (:data:`NEIGHBOURS`, :func:`neighbour_positions`) are read the same way:
the previous token i - 1 and the previous occurrence of X_i, p(i) - 1 (the last position before
i holding X_i; p(i) is the one after it).

A head **resolves** hop j when its mean attention to p^j(i) is at least ``threshold`` (0.5: most of
its attention on the one right key) and at least ``ratio`` (3) times chance. A layer's largest
resolved hop is the largest j that some head of the layer resolves (0: none).

Pure tensor maths: running sums (:func:`hop_attention_sums`, float64, they add across batches)
and the means and verdicts from them (:func:`hop_attention_from_sums`); :func:`hop_attention`
does both for one set of patterns.
"""

from __future__ import annotations

import torch

THRESHOLD = 0.5  # mean attention a resolving head puts on the hop's key
RATIO = 3.0  # ... and at least this many times the chance level
NEIGHBOURS = ("previous_token", "previous_occurrence")  # the targets of :func:`neighbour_positions`, in order


def neighbour_positions(pointer: torch.Tensor) -> torch.Tensor:
    """[n, N] p(i) (-1 where undefined) -> [2, n, N]: the previous token i - 1 (-1 at i = 0) and
    the previous occurrence of X_i, p(i) - 1 (-1 where p(i) is undefined), in :data:`NEIGHBOURS`'
    order; positions within X, like ``hops`` of :func:`hop_attention_sums`, which reads them."""
    n, N = pointer.shape
    previous = (torch.arange(N, device=pointer.device) - 1).expand(n, N)
    occurrence = torch.where(pointer >= 0, pointer - 1, -1)
    return torch.stack([previous, occurrence])


def target_means(sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Means from (added) :func:`hop_attention_sums` of any targets: ``attention`` [layers, heads,
    targets] and ``chance`` [targets] (nan for a target defined nowhere), ``count`` [targets]."""
    count = sums["count"]
    return {"attention": sums["attention"] / count, "chance": sums["chance"] / count, "count": count}


def hop_attention_sums(patterns: torch.Tensor, hops: torch.Tensor, offset: int = 1) -> dict[str, torch.Tensor]:
    """Running sums over (n, i) where p^j(i) is defined: ``attention`` [layers, heads, J] (attention
    from offset + i to offset + p^j(i)), ``chance`` [J] (1 / (offset + i + 1)) and ``count`` [J].

    patterns: [layers, heads, n, T, T] (query, key); hops: [J, n, N], hops[j - 1] = p^j(i) or -1,
    with offset + N <= T."""
    L, H, n, T, _ = patterns.shape
    J, n_h, N = hops.shape
    if n_h != n or offset + N > T:
        raise ValueError(f"hops {tuple(hops.shape)} do not fit patterns {tuple(patterns.shape)} at offset {offset}")
    hops = hops.to(patterns.device)
    rows = patterns[:, :, :, offset : offset + N, :]  # [L, H, n, N, T] the queries of X (a view)
    visible = 1.0 / (offset + torch.arange(N, device=patterns.device, dtype=torch.float64) + 1)  # [N]
    attention = torch.zeros(L, H, J, dtype=torch.float64, device=patterns.device)
    chance = torch.zeros(J, dtype=torch.float64, device=patterns.device)
    count = torch.zeros(J, dtype=torch.float64, device=patterns.device)
    for j in range(J):
        defined = hops[j] >= 0  # [n, N]
        keys = (hops[j].clamp(min=0) + offset).expand(L, H, n, N)  # [L, H, n, N]
        on_key = rows.gather(-1, keys.unsqueeze(-1)).squeeze(-1).double()  # [L, H, n, N]
        attention[:, :, j] = (on_key * defined).sum(dim=(2, 3))
        chance[j] = (visible * defined).sum()
        count[j] = defined.sum()
    return {"attention": attention.cpu(), "chance": chance.cpu(), "count": count.cpu()}


def hop_attention_from_sums(
    sums: dict[str, torch.Tensor], threshold: float = THRESHOLD, ratio: float = RATIO
) -> dict[str, torch.Tensor]:
    """Means and verdicts from (added) sums: ``attention`` [layers, heads, J] and ``chance`` [J]
    (nan for a hop defined nowhere), ``count`` [J], ``resolved`` [layers, heads, J] (bool) and
    ``largest_hop`` [layers] (int64, 0 where no head of the layer resolves any hop)."""
    means = target_means(sums)  # count 0 -> nan (or inf * 0): marked unresolved below
    count, attention, chance = means["count"], means["attention"], means["chance"]
    resolved = (count > 0) & (attention >= threshold) & (attention >= ratio * chance)
    J = count.shape[0]
    hop_ids = torch.arange(1, J + 1)  # [J]
    largest = (resolved.any(dim=1) * hop_ids).amax(dim=1) if J else torch.zeros(attention.shape[0], dtype=torch.long)
    return {
        "attention": attention,
        "chance": chance,
        "count": count,
        "resolved": resolved,
        "largest_hop": largest.long(),
    }


def hop_attention(
    patterns: torch.Tensor,
    hops: torch.Tensor,
    offset: int = 1,
    threshold: float = THRESHOLD,
    ratio: float = RATIO,
) -> dict[str, torch.Tensor]:
    """For each layer, head and hop j = 1..J, the mean attention from offset + i to offset + p^j(i)
    over the (n, i) where p^j(i) is defined, with its chance level, whether the head resolves the
    hop, and per layer the largest hop some head resolves (see the module docstring).

    patterns: [layers, heads, n, T, T]; hops: [J, n, N] (hops[j - 1] = p^j(i), -1 if undefined)."""
    return hop_attention_from_sums(hop_attention_sums(patterns, hops, offset), threshold, ratio)
