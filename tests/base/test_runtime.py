"""Scoped torch thread settings are restored, also on errors."""

import pytest
import torch

from depthprobe.probes.base.runtime import torch_threads


def test_threads_set_inside_and_restored_after_an_error():
    before = torch.get_num_threads()
    target = 1 if before != 1 else 2
    with pytest.raises(ValueError), torch_threads(target):
        assert torch.get_num_threads() == target
        raise ValueError
    assert torch.get_num_threads() == before
    with torch_threads(None):
        assert torch.get_num_threads() == before


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_signal_dropped_by_a_finalizer_is_raised_again():
    """A SIGTERM whose exception lands in a __del__ is printed as "ignored" by Python and dropped;
    check_interrupt raises it again at the loop's next step, so the process still stops."""
    import gc
    import os
    import signal

    from depthprobe.probes.base.signals import Terminated, check_interrupt, sigterm_as_keyboardinterrupt

    class Finalizer:
        def __del__(self) -> None:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, inside __del__
            for _ in range(1000):  # bytecodes for the pending handler to run on
                pass

    with sigterm_as_keyboardinterrupt():
        check_interrupt()  # nothing pending: a no-op
        Finalizer()  # collected at once: its exception is dropped
        gc.collect()
        with pytest.raises(Terminated) as info:
            check_interrupt()
        assert info.value.signum == signal.SIGTERM
    check_interrupt()  # cleared when the block ends
