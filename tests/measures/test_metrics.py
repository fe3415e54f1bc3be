"""Attention-statistics metrics on hand-built attention patterns with known answers."""

import math

import torch

from depthprobe.probes.measures.metrics import attention_stat_sums, diagonal


def _one_hot_rows(targets, n):
    a = torch.zeros(n, n)
    a[torch.arange(n), torch.tensor(targets)] = 1.0
    return a


def test_diagonal_offsets_pad_with_zero():
    a = torch.arange(16.0).view(4, 4)
    assert diagonal(a, 0).tolist() == [0, 5, 10, 15]
    assert diagonal(a, -1).tolist() == [0, 4, 9, 14]  # A[i, i-1]; row 0 has none
    assert diagonal(a, 1).tolist() == [1, 6, 11, 0]  # A[i, i+1]; last row has none


def _stats(pattern, mask, first, sep, punct):
    sums = attention_stat_sums(
        pattern[None, None, None], mask[None], first[None], None if sep is None else sep[None], punct[None]
    )
    n = mask.sum()
    return {k: float(v[0, 0] / n) for k, v in sums.items()}


def test_previous_token_head_scores_one_on_prev_and_zero_elsewhere():
    n = 5
    # row 0 attends to itself (nothing before it), every other row to the previous token
    a = _one_hot_rows([0, 0, 1, 2, 3], n)
    mask = torch.ones(n, dtype=torch.bool)
    first = torch.tensor([1, 0, 0, 0, 0], dtype=torch.bool)
    sep = torch.tensor([0, 0, 0, 0, 1], dtype=torch.bool)
    punct = torch.tensor([0, 0, 1, 0, 0], dtype=torch.bool)
    s = _stats(a, mask, first, sep, punct)
    assert s["to_prev"] == 4 / 5
    assert s["to_self"] == 1 / 5
    assert s["to_next"] == 0.0
    assert s["to_first"] == 2 / 5  # rows 0 and 1 look at position 0
    assert s["to_sep"] == 0.0
    assert s["to_punct"] == 1 / 5  # row 3 looks at the punctuation at position 2
    assert s["entropy"] == 0.0


def test_padding_rows_and_columns_do_not_count():
    # 3 real tokens + 2 padding; the padding rows are garbage and must be ignored
    a = torch.zeros(5, 5)
    a[0, 1] = a[1, 2] = a[2, 2] = 1.0
    a[3:, :] = 0.2
    mask = torch.tensor([1, 1, 1, 0, 0], dtype=torch.bool)
    none = torch.zeros(5, dtype=torch.bool)
    s = _stats(a, mask, none, None, none)
    assert s["to_next"] == 2 / 3  # the last real token has no next token
    assert s["to_self"] == 1 / 3
    assert "to_sep" not in s


def test_uniform_attention_entropy_is_log_length():
    n = 8
    a = torch.full((n, n), 1 / n)
    mask = torch.ones(n, dtype=torch.bool)
    none = torch.zeros(n, dtype=torch.bool)
    s = _stats(a, mask, none, None, none)
    assert abs(s["entropy"] - math.log(n)) < 1e-6  # float32 rows
    assert abs(s["to_prev"] - (n - 1) / n / n) < 1e-12
