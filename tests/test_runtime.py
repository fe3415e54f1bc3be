"""Scoped torch thread settings are restored, also on errors."""

import pytest
import torch

from depthprobe.probes.engine.runtime import torch_threads


def test_threads_set_inside_and_restored_after_an_error():
    before = torch.get_num_threads()
    target = 1 if before != 1 else 2
    with pytest.raises(ValueError), torch_threads(target):
        assert torch.get_num_threads() == target
        raise ValueError
    assert torch.get_num_threads() == before
    with torch_threads(None):
        assert torch.get_num_threads() == before
