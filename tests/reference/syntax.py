"""A straightforward implementation of the syntax protocol (docs/syntax.md), looping over
sentences and words."""

from collections import Counter, defaultdict

import numpy as np

from depthprobe.tasks.syntax import OFFSETS


def reference(items, patterns, baseline_root=True):
    """A straightforward implementation of docs/syntax.md, looping over sentences and words.

    items: (words, heads, rels, unit_of_piece) per sentence; patterns: [layer, head, T, T] arrays
    over the sentence's real positions. Returns (accuracy[rel] -> [2, L, H], baseline[rel] -> [6],
    count[rel]) with rel including "ALL".
    """
    correct: dict[str, np.ndarray] = {}
    base = defaultdict(lambda: np.zeros(len(OFFSETS)))
    count = Counter()
    for (words, heads, rels, units), att in zip(items, patterns, strict=True):
        n_layers, n_heads = att.shape[:2]
        n = len(words)
        pieces = [[p for p, u in enumerate(units) if u == k + 1] for k in range(n)]
        att = att.astype(np.float64)
        rows = np.stack([att[:, :, pieces[i], :].mean(2) for i in range(n)], 2)  # from word i: mean
        word = np.stack([rows[..., pieces[j]].sum(-1) for j in range(n)], -1)  # to word j: sum
        for i in range(n):
            for rel in (rels[i], "ALL"):
                correct.setdefault(rel, np.zeros((2, n_layers, n_heads)))
                count[rel] += 1
                for k, off in enumerate(OFFSETS):
                    guess = min(max(i + 1 + off, 0 if baseline_root else 1), n)
                    base[rel][k] += guess == heads[i]
        for layer in range(n_layers):
            for head in range(n_heads):
                for d, m in enumerate((word[layer, head], word[layer, head].T)):
                    m = m.copy()
                    np.fill_diagonal(m, 0.0)
                    for i in range(n):
                        guess = int(np.argmax(m[i])) + 1  # CoNLL-U numbering
                        if guess == heads[i]:
                            correct[rels[i]][d, layer, head] += 1
                            correct["ALL"][d, layer, head] += 1
    acc = {r: correct[r] / count[r] for r in count}
    return acc, {r: base[r] / count[r] for r in count}, count


def reference_best(acc, base):
    """Best (layer, head, direction) and baseline offset, by the documented tie rules, by loops."""
    out = {}
    for rel, a in acc.items():
        best, where = -1.0, None
        for layer in range(a.shape[1]):
            for head in range(a.shape[2]):
                for d in range(2):
                    if a[d, layer, head] > best:
                        best, where = a[d, layer, head], (layer, head, d)
        b = base[rel]
        k = min(range(len(OFFSETS)), key=lambda j: (-b[j], abs(OFFSETS[j]), OFFSETS[j]))
        out[rel] = (where, best, OFFSETS[k], b[k])
    return out
