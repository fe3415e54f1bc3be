"""k-hop induction data (probes/data/khop.py) against a literal, loop-by-loop implementation of
Sanford, Hsu and Telgarsky's definition, and its seeded streams."""

from __future__ import annotations

import math

import pytest
import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.data import khop, streams


def literal_pointer(x: list[int]) -> list[int]:
    """p(i) = 1 + the position of the last occurrence of x[i] strictly before i, or -1."""
    out = []
    for i in range(len(x)):
        last = -1
        for j in range(i):
            if x[j] == x[i]:
                last = j
        out.append(last + 1 if last >= 0 else -1)
    return out


def literal_hop(x: list[int], k: int, none: int) -> list[int]:
    """hop_k(x)_i = x at p^k(i), or ``none`` if any step is undefined."""
    p = literal_pointer(x)
    out = []
    for i in range(len(x)):
        at = i
        for _ in range(k):
            if at == -1:
                break
            at = p[at]
        out.append(x[at] if at != -1 else none)
    return out


def test_pointer_on_a_hand_built_string():
    x = torch.tensor([[0, 1, 0, 2, 1, 0]])
    assert khop.pointer(x).tolist() == [[-1, -1, 1, -1, 2, 3]]
    assert khop.hop_positions(x, 2).tolist() == [[-1, -1, -1, -1, 1, -1]]  # p(p(4)) = p(2) = 1
    assert khop.hop_targets(x, 2, letters=3).tolist() == [[3, 3, 3, 3, 1, 3]]
    assert khop.hop_positions(x, 0).tolist() == [list(range(6))]


@pytest.mark.parametrize("k", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("seed", [0, 1, 7])
@pytest.mark.parametrize(("letters", "length"), [(2, 20), (3, 57), (4, 100)])
def test_targets_match_the_literal_definition(k, seed, letters, length):
    gen = torch.Generator().manual_seed(seed)
    inputs, targets, k_rows = khop.batch([k], 6, length, letters, 8, gen)
    assert (k_rows == k).all()
    assert (inputs[:, 0] == letters + k).all()
    assert (targets[:, 0] == -100).all()
    for row in range(len(inputs)):
        x = inputs[row, 1:].tolist()
        assert targets[row, 1:].tolist() == literal_hop(x, k, none=letters)
        assert khop.pointer(inputs[row : row + 1, 1:])[0].tolist() == literal_pointer(x)


def test_mixed_hop_counts_each_row_its_own_k():
    gen = torch.Generator().manual_seed(3)
    inputs, targets, k_rows = khop.batch([1, 2, 3, 4], 64, 48, 4, 4, gen)
    assert set(k_rows.tolist()) == {1, 2, 3, 4}
    assert (inputs[:, 0] == 4 + k_rows).all()
    for row in range(64):
        x = inputs[row, 1:].tolist()
        assert targets[row, 1:].tolist() == literal_hop(x, int(k_rows[row]), none=4)


@pytest.mark.parametrize("letters", [2, 3, 4, 10])
def test_no_letter_twice_in_a_row_and_every_letter_used(letters):
    x = khop.sample(200, 64, letters, torch.Generator().manual_seed(0))
    assert x.dtype == torch.int64 and x.shape == (200, 64)
    assert (x[:, 1:] != x[:, :-1]).all()
    assert set(x.unique().tolist()) == set(range(letters))
    assert set(x[:, 0].tolist()) == set(range(letters))  # the first letter is uniform over all A


def test_one_letter_is_refused_in_one_line():
    with pytest.raises(ProbeError, match="letters must be at least 2") as e:
        khop.sample(4, 10, 1, torch.Generator())
    assert "\n" not in str(e.value)
    with pytest.raises(ProbeError, match="between 1 and max_k=4"):
        khop.batch([5], 4, 10, 4, 4, torch.Generator())


def test_vocabulary_layout():
    assert khop.vocab_size(4, 4) == 9
    assert khop.none_id(4) == 4 == 4 + khop.NONE_OFFSET
    assert [khop.hop_token(4, k) for k in (1, 4)] == [5, 8]
    inputs, targets, _ = khop.batch([1, 2, 3, 4], 32, 48, 4, 4, torch.Generator().manual_seed(1))
    assert inputs.max() < khop.vocab_size(4, 4) and targets.max() <= khop.none_id(4)


def test_train_batches_are_a_pure_function_of_seed_and_step():
    args = ([1, 2, 3, 4], 16, 48, 4, 4)
    a = khop.train_batch(*args, seed=5, step=12)
    torch.randint(10, (100,))  # global random state plays no part
    b = khop.train_batch(*args, seed=5, step=12)
    assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    assert not torch.equal(a[0], khop.train_batch(*args, seed=5, step=13)[0])
    assert not torch.equal(a[0], khop.train_batch(*args, seed=6, step=12)[0])


def test_evaluation_and_training_streams_are_disjoint():
    train = {streams.train_seed(s, t) for s in range(4) for t in range(500)}
    evals = {streams.eval_seed(s, k) for s in range(4) for k in range(1, 17)}
    assert len(train) == 4 * 500 and len(evals) == 4 * 16 and not train & evals
    assert max(train | evals) < 2**32  # torch's CPU generator keeps only the low 32 bits of a seed
    # the data itself: short strings (many repeats possible), yet no evaluation row is a training row's twin
    ev, _ = khop.eval_batch(2, 200, 12, 2, 4, seed=0)
    assert torch.equal(ev, khop.eval_batch(2, 200, 12, 2, 4, seed=0)[0])
    first_train, _ = khop.train_batch([2], 200, 12, 2, 4, seed=0, step=0)
    assert not torch.equal(ev, first_train)
    with pytest.raises(ProbeError, match="step must be between 0"):
        khop.train_batch([2], 2, 12, 2, 4, seed=0, step=-1)


def test_accuracy_on_hand_built_cases():
    targets = torch.tensor([[-100, 1, 4, 2], [-100, 4, 4, 0]])  # letters = 4; 4 is "none"
    pred = torch.tensor([[7, 1, 4, 3], [0, 4, 1, 0]])
    # letter answers: (1 right), (2 wrong), (0 right) -> 2/3; all: 1, 4, 2, 4, 4, 0 -> right 1, 4, 4, 0 -> 4/6
    assert khop.accuracy(pred, targets, 4) == pytest.approx((2 / 3, 4 / 6))
    logits = torch.nn.functional.one_hot(pred.clamp(max=8), 9).float()
    assert khop.accuracy(logits, targets, 4) == pytest.approx((2 / 3, 4 / 6))
    letter, overall = khop.accuracy(torch.tensor([[0, 4]]), torch.tensor([[-100, 4]]), 4)
    assert math.isnan(letter) and overall == 1.0
