"""Process-wide torch settings, changed only inside a scope and always restored."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's random generators (a run's ``--seed``)."""
    import random

    import numpy as np

    from depthprobe.probes.base.options import check_seed

    check_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` intra-op CPU threads (None: leave the setting alone).

    Small ops (toy-model training steps, scoring on gathered tensors, 128 x 128 LAPACK calls)
    gain nothing from a second thread, and OpenMP threads that wait for each other at every op
    stall badly when other processes share the cores."""
    before = torch.get_num_threads()
    if n is None or n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
