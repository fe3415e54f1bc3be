"""Progress lines of long jobs on stderr.

The job path names the job that runs in this process (:func:`job_label`: a study member, a sweep
member); the training loop, while a job is named, prints where its training stands every
``every_s`` seconds (default :data:`EVERY_S`): steps done, steps per second and an estimate of
the training time left (evaluations and probes not counted). Nothing is printed outside a named
job (``probe train`` prints its own log windows) or for a job shorter than ``every_s``.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

EVERY_S = 30.0
_JOB: ContextVar[tuple[str, float] | None] = ContextVar("depthprobe_job", default=None)


@contextmanager
def job_label(name: str | None, every_s: float = EVERY_S) -> Iterator[None]:
    """Name the job running in this block (None: no progress lines)."""
    token = _JOB.set(None if name is None else (name, every_s))
    try:
        yield
    finally:
        _JOB.reset(token)


def duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class TrainingProgress:
    """Called with the steps done and the training seconds so far; prints a line when a job is
    named and ``every_s`` seconds have passed since the last one."""

    def __init__(self, start: int, total: int) -> None:
        self.job = _JOB.get()
        self.start, self.total = start, total
        self.last = time.monotonic()

    def __call__(self, done: int, seconds: float) -> None:
        if self.job is None:
            return
        name, every_s = self.job
        now = time.monotonic()
        if now - self.last < every_s or done >= self.total:
            return
        self.last = now
        rate = (done - self.start) / seconds if seconds > 0 else math.nan
        left = (self.total - done) / rate if rate > 0 else math.nan
        print(
            f"  {name}: step {done:,}/{self.total:,}, {rate:.1f} steps/s, about {duration(left)} of training left",
            file=sys.stderr,
            flush=True,
        )
