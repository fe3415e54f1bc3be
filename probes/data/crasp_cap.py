"""What a depth-1 model without positional encoding can reach on L_k (:mod:`probes.data.crasp`),
computed exactly from the string distribution, with no model.

Without positions, a one-layer decoder's output at t is a function of x_t and of the multiset of
tokens it attends to (BOS, x_0..x_t), that is of the cell (x_t, #a, #b) of the prefix: attention
averages over the prefix, and the MLP acts on one position. Any rule from cells to {0, 1} is such a
function, so the best rule bounds every depth-1 model at any width from above:

- per token (:func:`token_cap`): in each cell, the more frequent target. Exact for every k, from
  the counts below. It is 1 for k <= 3 (L_3 is decided by depth 1) and below 1 from k = 4 on.
- per string (:func:`string_cap_l4`, k = 4 only): a string is right only if every position is.
  On L_4 only the b-cells can be wrong, and in a b-column (fixed #a) a rule "1 iff #b > c(#a)"
  does at least as well as any other (a b-block's cells are an interval of #b: block 2's start at
  #b = 1 and must be 0, block 4's must be 1, so a rule that gets a string right also gets it right
  with c(#a) = the length of the column's first run of zeros); a string a^p b^q a^r b^s is then
  right iff c(p + r) <= q <= c(p). The thresholds are found by coordinate ascent: a rule that
  exists, so a lower bound of the cap (checked against the exhaustive optimum on short lengths).

Counting: a prefix of t + 1 letters inside block j (1-based; a-blocks are the odd ones) with
#a = A and #b = B arises from C(A - 1, ceil(j/2) - 1) * C(B - 1, floor(j/2) - 1) choices of its
j - 1 switch points (compositions of A and B into the blocks' lengths; the second factor is 1 when
j = 1 and B = 0), and the other k - j switch points lie in {t + 1..n - 1}: C(n - 1 - t, k - j) ways,
out of C(n - 1, k - 1) strings of length n. Lengths are uniform in {lo..hi}; token figures pool
every position of every string (as :func:`probes.data.crasp.scores` does).
"""

from __future__ import annotations

from collections.abc import Callable
from math import comb

import numpy as np

from depthprobe.probes.base.errors import ProbeError

Cell = tuple[int, int, int]  # (x_t: 0 = a, 1 = b; #a; #b) of the prefix x_0..x_t
Rule = Callable[[int, int, int], int]


def _check(k: int, lo: int, hi: int) -> None:
    if k < 1 or lo < max(k, 1) or hi < lo:
        raise ProbeError(f"crasp cap: need k >= 1 and k <= lo <= hi, got k={k}, lengths {lo}..{hi}")


def prefixes(j: int, a: int, b: int) -> int:
    """How many ways a prefix with ``a`` a's and ``b`` b's ends inside block ``j`` (1-based)."""
    na, nb = (j + 1) // 2, j // 2
    if a < na or b < nb:
        return 0
    return comb(a - 1, na - 1) * (comb(b - 1, nb - 1) if nb else int(b == 0))


def cell_weights(k: int, lo: int, hi: int) -> dict[Cell, tuple[float, float]]:
    """Per cell, (weight of target 0, weight of target 1): the expected number of positions of one
    string (length uniform in {lo..hi}) in that cell with that target."""
    _check(k, lo, hi)
    out: dict[Cell, list[float]] = {}
    for n in range(lo, hi + 1):
        per = 1.0 / ((hi - lo + 1) * comb(n - 1, k - 1))
        for t in range(n):
            for a in range(1, t + 2):
                b = t + 1 - a
                for j in range(1, k + 1):
                    ways = prefixes(j, a, b) * comb(n - 1 - t, k - j)
                    if ways:
                        out.setdefault(((j + 1) % 2, a, b), [0.0, 0.0])[int(j == k)] += ways * per
    return {cell: (w[0], w[1]) for cell, w in out.items()}


def token_rule(k: int, lo: int, hi: int) -> dict[Cell, int]:
    """The best per-token rule: in each cell the more frequent target (ties: 0)."""
    return {cell: int(w1 > w0) for cell, (w0, w1) in cell_weights(k, lo, hi).items()}


def token_cap(k: int, lo: int, hi: int) -> float:
    """The best token accuracy of a depth-1 model without positions on L_k, lengths {lo..hi}."""
    weights = cell_weights(k, lo, hi).values()
    return sum(max(w) for w in weights) / sum(sum(w) for w in weights)


def string_accuracy(rule: Rule, k: int, lo: int, hi: int) -> float:
    """The exact share of strings of L_k (lengths uniform in {lo..hi}) on which ``rule`` is right
    at every position. The letters form a Markov chain: inside block j at position t, the next
    position is a switch point with probability (k - j) / (n - 1 - t)."""
    _check(k, lo, hi)
    total = 0.0
    for n in range(lo, hi + 1):
        alive = {(1, 1): 1.0} if rule(0, 1, 0) == int(k == 1) else {}  # (#a, block j): mass right so far
        for t in range(1, n):
            nxt: dict[tuple[int, int], float] = {}
            for (a, j), mass in alive.items():
                switch = (k - j) / (n - t)
                for jj, p in ((j, 1.0 - switch), (j + 1, switch)):
                    aa = a + jj % 2
                    if p > 0 and rule(1 - jj % 2, aa, t + 1 - aa) == int(jj == k):
                        nxt[(aa, jj)] = nxt.get((aa, jj), 0.0) + mass * p
            alive = nxt
        total += sum(alive.values())
    return total / (hi - lo + 1)


def l4_weights(lo: int, hi: int) -> np.ndarray:
    """[hi + 1]^3: w[p, q, r] = probability of a^p b^q a^r b^s (s >= 1) among strings of L_4."""
    _check(4, lo, hi)
    idx = np.arange(hi + 1)
    p, q, r = np.meshgrid(idx, idx, idx, indexing="ij")
    positive = (p >= 1) & (q >= 1) & (r >= 1)
    w = np.zeros((hi + 1,) * 3)
    for n in range(lo, hi + 1):
        w += positive * (p + q + r <= n - 1) / ((hi - lo + 1) * comb(n - 1, 3))
    return w


def threshold_accuracy(w: np.ndarray, c: np.ndarray) -> float:
    """Share of L_4 strings right under "1 iff x_t = b and #b > c(#a)": c(p + r) <= q <= c(p)."""
    p, q, r = np.nonzero(w)
    return float((w[p, q, r] * ((c[p + r] <= q) & (q <= c[p]))).sum())


def _best_threshold(w: np.ndarray, c: np.ndarray, col: int) -> int:
    """The threshold of column ``col`` that maximises the accuracy with the others fixed (the
    current one unless another is strictly better)."""
    top = w.shape[0] - 1
    qs = np.arange(top + 1)
    rs = np.arange(1, top + 1 - col)  # strings with p = col: right iff c(col + r) <= q <= v
    low = (w[col][:, rs] * (c[col + rs][None, :] <= qs[:, None])).sum(1)  # [q]
    ps = np.arange(1, col)  # strings with p + r = col: right iff v <= q <= c(p)
    high = (w[ps, :, col - ps] * (qs[None, :] <= c[ps][:, None])).sum(0) if col > 1 else np.zeros(top + 1)
    gain = np.cumsum(low) + np.cumsum(high[::-1])[::-1]  # [v]
    best = int(np.argmax(gain))
    return best if gain[best] > gain[c[col]] + 1e-15 else int(c[col])


def string_cap_l4(lo: int, hi: int, sweeps: int = 100) -> tuple[float, np.ndarray]:
    """The best per-string accuracy found for a depth-1 model without positions on L_4 (lengths
    {lo..hi}) and its thresholds c[#a] (rule: 1 iff x_t = b and #b > c[#a]); coordinate ascent
    from c = hi (always 0) until no threshold changes."""
    w = l4_weights(lo, hi)
    c = np.full(hi + 1, hi)
    for _ in range(sweeps):
        changed = False
        for col in range(1, hi):
            best = _best_threshold(w, c, col)
            changed |= best != c[col]
            c[col] = best
        if not changed:
            break
    return threshold_accuracy(w, c), c


def threshold_rule(c: np.ndarray) -> Rule:
    """The rule of thresholds ``c``: 1 iff x_t = b and #b > c[#a]."""
    return lambda x, a, b: int(x == 1 and b > c[a])
