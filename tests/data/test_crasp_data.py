"""C-RASP languages (probes/data/crasp.py) against a literal reading of the definition (a string is
in L_k iff it is k non-empty alternating blocks starting with a), their seeded streams and metrics,
and the depth-1 limit (probes/data/crasp_cap.py) against enumeration of every string."""

from __future__ import annotations

import itertools
import re
from fractions import Fraction
from math import comb

import numpy as np
import pytest
import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.data import crasp, streams
from depthprobe.probes.data import crasp_cap as cap


def in_language(s: str, k: int) -> bool:
    """L_k by its definition: a+ then k - 1 more non-empty blocks, alternating letters."""
    pattern = "".join("a+" if j % 2 == 0 else "b+" for j in range(k))
    return re.fullmatch(pattern, s) is not None


def literal_targets(s: str, k: int) -> list[int]:
    return [int(in_language(s[: t + 1], k)) for t in range(len(s))]


def letters(row: torch.Tensor) -> str:
    return "".join("ab"[v] for v in row.tolist() if v in (crasp.A, crasp.B))


@pytest.mark.parametrize("k", [1, 2, 3, 4, 6])
def test_strings_and_targets_match_the_definition(k):
    inputs, targets = crasp.train_batch(k, 64, 8, 20, seed=3, step=5)
    assert inputs.shape == targets.shape == (64, 21)
    assert (inputs[:, 0] == crasp.BOS).all() and (targets[:, 0] == crasp.IGNORE).all()
    for row, target in zip(inputs, targets, strict=True):
        s = letters(row[1:])
        assert max(8, k) <= len(s) <= 20 and in_language(s, k)
        assert (row[1 + len(s) :] == crasp.PAD).all() and (target[1 + len(s) :] == crasp.IGNORE).all()
        assert target[1 : 1 + len(s)].tolist() == literal_targets(s, k)


def test_switch_points_are_uniform_and_distinct():
    """n = 5, k = 3: the C(4, 2) = 6 pairs of switch points, each with probability 1/6."""
    gen = streams.generator(11)
    sw = crasp.switch_points(3, torch.full((6000,), 5), gen)
    assert (sw[:, 0] < sw[:, 1]).all() and sw.min() >= 1 and sw.max() <= 4
    counts = {pair: 0 for pair in itertools.combinations(range(1, 5), 2)}
    for a, b in sw.tolist():
        counts[(a, b)] += 1
    assert all(abs(c / 6000 - 1 / 6) < 0.02 for c in counts.values()), counts


def test_lengths_cover_the_training_range_and_k_raises_the_shortest():
    inputs, _ = crasp.train_batch(6, 512, 2, 9, seed=0, step=0)
    lengths = ((inputs == crasp.A) | (inputs == crasp.B)).sum(1)
    assert set(lengths.tolist()) == set(range(6, 10))  # {max(nmin, k)..nmax}


def test_streams_are_pure_and_disjoint():
    a = crasp.train_batch(4, 8, 32, 64, seed=1, step=7)
    assert all(torch.equal(x, y) for x, y in zip(a, crasp.train_batch(4, 8, 32, 64, seed=1, step=7), strict=True))
    assert not torch.equal(a[0], crasp.train_batch(4, 8, 32, 64, seed=1, step=8)[0])
    e1 = crasp.eval_batch(4, 8, 129, 256, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(e1, crasp.eval_batch(4, 8, 129, 256, seed=1), strict=True))
    assert e1[0].shape == (8, 257) and not torch.equal(e1[0], crasp.eval_batch(4, 8, 129, 256, seed=2)[0])


def test_scores_known_answers():
    targets = torch.tensor([[-100, 0, 0, 1, -100], [-100, 0, 1, 1, 1]])
    pred = torch.tensor([[1, 0, 0, 1, 0], [0, 0, 1, 0, 1]])  # row 0 right (BOS and PAD ignored), row 1 one wrong
    s = crasp.scores(pred, targets)
    assert s == pytest.approx({"exact_match": 0.5, "token_accuracy": 6 / 7, "majority_accuracy": 4 / 7})
    logits = torch.tensor([[[0.0, 1.0, 9.0, 9.0]]])  # BOS/PAD logits never chosen
    assert crasp.predictions(logits).tolist() == [[1]]


def test_bad_settings_are_one_line_errors():
    with pytest.raises(ProbeError, match="at least 6 letters"):
        crasp.train_batch(6, 4, 2, 5, seed=0, step=0)
    with pytest.raises(ProbeError, match=r"k .* at least 1"):
        crasp.batch(0, 4, 2, 5, streams.generator(0))
    with pytest.raises(ProbeError, match="do not match"):
        crasp.scores(torch.zeros(2, 3), torch.zeros(2, 4))


def enumerate_strings(k: int, lo: int, hi: int):
    """Every string of L_k with length in {lo..hi} and its exact probability."""
    for n in range(lo, hi + 1):
        for sw in itertools.combinations(range(1, n), k - 1):
            s, letter = [], 0
            for t in range(n):
                letter ^= t in sw
                s.append("ab"[letter])
            yield "".join(s), Fraction(1, (hi - lo + 1) * comb(n - 1, k - 1))


def literal_cells(k: int, lo: int, hi: int):
    cells: dict = {}
    for s, p in enumerate_strings(k, lo, hi):
        assert in_language(s, k)
        for t, y in enumerate(literal_targets(s, k)):
            cell = ("ab".index(s[t]), s[: t + 1].count("a"), s[: t + 1].count("b"))
            cells.setdefault(cell, [Fraction(0), Fraction(0)])[y] += p
    return cells


@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_cell_weights_equal_enumeration(k):
    want = literal_cells(k, k, 9)
    got = cap.cell_weights(k, k, 9)
    assert set(got) == set(want)
    for cell, (w0, w1) in got.items():
        assert w0 == pytest.approx(float(want[cell][0])) and w1 == pytest.approx(float(want[cell][1]))


def test_token_cap_known_answers():
    assert [cap.token_cap(k, 32, 64) for k in (1, 2, 3)] == [1.0, 1.0, 1.0]  # L_1..L_3: depth 1 decides them
    cells = literal_cells(4, 4, 9)  # below 1 for L_4: enumeration of every string of lengths 4..9
    want = sum(max(w) for w in cells.values()) / sum(sum(w) for w in cells.values())
    assert cap.token_cap(4, 4, 9) == pytest.approx(float(want))
    assert cap.token_cap(4, 32, 64) == pytest.approx(0.917787, abs=1e-6)  # from enumerating all 603,911 strings


def literal_string_accuracy(rule, k, lo, hi):
    total = Fraction(0)
    for s, p in enumerate_strings(k, lo, hi):
        cells = [("ab".index(s[t]), s[: t + 1].count("a"), s[: t + 1].count("b")) for t in range(len(s))]
        total += p * all(rule(*c) == y for c, y in zip(cells, literal_targets(s, k), strict=True))
    return float(total)


@pytest.mark.parametrize("k", [3, 4, 5])
def test_string_accuracy_equals_enumeration(k):
    rule = cap.token_rule(k, k, 9)
    assert cap.string_accuracy(lambda x, a, b: rule[(x, a, b)], k, k, 9) == pytest.approx(
        literal_string_accuracy(lambda x, a, b: rule[(x, a, b)], k, k, 9)
    )


def test_l4_string_cap_equals_the_exhaustive_optimum_on_short_strings():
    """Lengths 4..6: every rule on the b-cells (a-cells are always 0 on L_4), 2^15 of them."""
    lo, hi = 4, 6
    b_cells = sorted({c for c in literal_cells(4, lo, hi) if c[0] == 1})
    best = 0.0
    strings = list(enumerate_strings(4, lo, hi))
    for bits in itertools.product((0, 1), repeat=len(b_cells)):
        rule = dict(zip(b_cells, bits, strict=True))
        right = sum(
            p
            for s, p in strings
            if all(
                rule.get(("ab".index(s[t]), s[: t + 1].count("a"), s[: t + 1].count("b")), 0) == y
                for t, y in enumerate(literal_targets(s, 4))
            )
        )
        best = max(best, float(right))
    found, c = cap.string_cap_l4(lo, hi)
    assert found == pytest.approx(best)
    assert cap.string_accuracy(cap.threshold_rule(c), 4, lo, hi) == pytest.approx(found)


def test_l4_string_cap_at_the_training_lengths():
    found, c = cap.string_cap_l4(32, 64)
    assert found == pytest.approx(cap.string_accuracy(cap.threshold_rule(c), 4, 32, 64))
    assert found == pytest.approx(0.502786, abs=1e-6)
    token_rule = cap.token_rule(4, 32, 64)
    per_token_best = cap.string_accuracy(lambda x, a, b: token_rule[(x, a, b)], 4, 32, 64)
    assert per_token_best == pytest.approx(0.424231, abs=1e-6)
    assert per_token_best < found
    assert np.all(np.diff(c[1:33]) <= 0)  # thresholds fall as #a grows


def test_source_gives_the_stream_and_scores_two_classes():
    import math

    from depthprobe.probes.training.sources import CRaspSource

    src = CRaspSource(k=4, batch_size=4, nmin=8, nmax=12, seed=2)
    inputs, targets = src.batch(3)
    want = crasp.train_batch(4, 4, 8, 12, seed=2, step=3)
    assert torch.equal(inputs, want[0]) and torch.equal(targets, want[1])
    logits = torch.zeros(*inputs.shape, crasp.VOCAB)
    logits[..., crasp.BOS] = 50.0  # the BOS and PAD logits take no part in the loss
    assert float(src.loss(logits, targets)) == pytest.approx(math.log(2))
