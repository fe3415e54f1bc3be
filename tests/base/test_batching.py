"""The batch size chooser (probes/base/batching.py): pure arithmetic on given memory figures."""

import pytest

from depthprobe.probes.base.batching import auto_batch_size


def test_auto_batch_size():
    kw = dict(n_layers=12, n_heads=12, d_model=768, max_len=128, value_bytes=4)
    per = 12 * 12 * 128**2 * (4 + 4) + 12 * 128**2 * 8 + 12 * 128 * 768 * 16 * 4  # bytes per example
    assert auto_batch_size(per * 2 * 16, **kw) == 16  # exactly 16 examples in half the memory
    assert auto_batch_size(per * 2 * 16 - 1, **kw) == 8  # one byte short: the next power of two down
    assert auto_batch_size(per * 2 * 100, **kw) == 64
    assert auto_batch_size(0, **kw) == 1  # never less than one
    assert auto_batch_size(10**15, **kw) == 512  # capped
    assert auto_batch_size(10**15, **kw, cap=100) == 64
    # bfloat16 halves the pattern and activation bytes: more examples fit
    assert auto_batch_size(per * 2 * 16, **{**kw, "value_bytes": 2}) == 16
    assert auto_batch_size(per * 2 * 32, **{**kw, "value_bytes": 2}) == 32
    with pytest.raises(ValueError):
        auto_batch_size(10**9, **{**kw, "max_len": 0})
