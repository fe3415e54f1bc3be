"""One thread at a time per model: hooks are attached to the model itself, so a capture open in
one thread would see (and an edit would change) every forward pass of that model in the process,
whichever thread runs it. :func:`hold` refuses a capture while another thread has one open on the
same model, before any hook is attached. Passes run on ``model.bridge`` directly, outside any
capture, cannot be checked: do not run them from another thread while a capture is open; load the
model once per thread instead.

The count :func:`hold` keeps is the one count of open captures on a bridge: :func:`open_count`
reads it (a capture inside another runs its pass to the end, for the outer one's hooks)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from depthprobe.probes.base.errors import ProbeError

_LOCK = threading.Lock()


def open_count(bridge: Any) -> int:
    """This thread's open captures on ``bridge`` (another thread's would have been refused)."""
    with _LOCK:
        return int(bridge.__dict__.get("_depthprobe_owners", {}).get(threading.get_ident(), 0))


@contextmanager
def hold(bridge: Any, name: str, editing: bool) -> Iterator[None]:
    """Count this thread's open captures on ``bridge``; refuse if another thread holds any."""
    me = threading.get_ident()
    with _LOCK:
        owners: dict[int, int] = bridge.__dict__.setdefault("_depthprobe_owners", {})
        others = [t for t, n in owners.items() if n > 0 and t != me]
        if others:
            what = "an edit" if editing else "a capture"
            raise ProbeError(
                f"{what} on {name} is refused: another thread has a capture open on the same model, and hooks "
                "act on every thread's passes; load the model once per thread, or wait for the other capture to end"
            )
        owners[me] = owners.get(me, 0) + 1
    try:
        yield
    finally:
        with _LOCK:
            owners[me] -= 1
            if owners[me] == 0:
                del owners[me]
