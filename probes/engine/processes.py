"""One job's call, its outcome as data, and jobs in local member processes (``--jobs N``).

Each member process is a fresh spawned interpreter (no forked torch or OpenMP state) that takes
one job at a time over its own pipe. It pays its imports and first calls once (about 7 s on a
loaded 2-core machine): worth it for members that train for tens of seconds, not for the smoke
preset's 3-second members.

- A member process that dies (killed, out of memory) costs only the job it held: the driver sees
  its exit, starts a new process in its place and reports the job as crashed (the retry loop in
  :mod:`.distributed` runs it again under ``--retries``); the other processes keep their jobs.
- A member process never outlives its driver: on Linux it asks the kernel for SIGKILL when the
  driver goes (``PR_SET_PDEATHSIG``), and everywhere it checks that its driver is still its
  parent before it takes a job, and exits when the driver's end of the pipe closes.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import signal
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.progress import job_label

__all__ = ["LocalProcesses", "Outcome", "call", "one_line", "start_process"]

PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclass(frozen=True)
class Outcome:
    """What one call of a job sends back across the job boundary: plain data, never an exception,
    so that whether it was a user error survives pickling and the driver decides about retries.
    ``crashed``: the worker itself died (Ray retries those itself; the retry loop retries a
    local member process that died)."""

    ok: bool
    value: Any = None
    error: str | None = None
    user_error: bool = False
    crashed: bool = False


def one_line(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def call(fn: Callable[[Any], Any], job: Any) -> Outcome:
    """Run one job where it runs (this process, a pool process or a Ray worker); a job with a
    ``name`` names the progress lines of its training."""
    name = getattr(job, "name", None)
    try:
        with job_label(name if isinstance(name, str) else None):
            return Outcome(True, fn(job))
    except ProbeError as exc:
        return Outcome(False, error=(str(exc).strip().splitlines() or [type(exc).__name__])[0], user_error=True)
    except Exception as exc:
        return Outcome(False, error=one_line(exc))


def start_process(threads: int, setup: Callable[[], None] | None) -> None:
    """Prepare a member process: its torch threads, then ``setup()``."""
    torch.set_num_threads(threads)
    if setup is not None:
        setup()


def die_with_parent(parent: int) -> None:
    """In a member process: be killed when the driver dies, and exit now if it already has."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):  # no prctl: the parent checks still hold
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the driver died before the signal was armed
        os._exit(0)


def serve(conn: Any, parent: int, threads: int, setup: Callable[[], None] | None, fn_bytes: bytes) -> None:
    """A member process's loop: take a job, run it, send back its outcome; stop when told, when
    the pipe closes, or when the driver is no longer this process's parent. ``fn`` arrives pickled
    and is read after ``setup()``, which may load the module it comes from (a plugin file)."""
    die_with_parent(parent)
    try:
        start_process(threads, setup)
        fn = pickle.loads(fn_bytes)
        while (job := take(conn, parent)) is not None:
            outcome = call(fn, job[1])
            try:
                conn.send((job[0], outcome))
            except Exception as exc:  # a value that cannot be pickled: its job fails, the process goes on
                conn.send((job[0], Outcome(False, error=f"its result cannot be sent back ({one_line(exc)})")))
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: the driver reports it
        return


def take(conn: Any, parent: int) -> Any:
    """The next job, or None when told to stop, when the pipe closed or when the driver is gone."""
    try:
        job = conn.recv()
    except (EOFError, OSError):
        return None
    return job if os.getppid() == parent else None


def death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


@dataclass
class Member:
    process: Any
    conn: Any
    job: tuple[int, int] | None = None  # (handle, job index) while it runs one


@dataclass
class LocalProcesses:
    """A runner for the retry loop: ``submit(i)`` queues job ``i`` and returns its handle;
    ``next_done`` waits for the next outcome (a crashed process included)."""

    retries_crashes: ClassVar[bool] = False  # a dead process's job is the retry loop's to retry

    fn: Callable[[Any], Any]
    jobs: Sequence[Any]
    processes: int
    threads: int
    setup: Callable[[], None] | None = None
    queue: deque[tuple[int, int]] = field(default_factory=deque)
    members: list[Member] = field(default_factory=list)
    count: Any = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        import multiprocessing

        self.context = multiprocessing.get_context("spawn")
        self.members = [self._start() for _ in range(self.processes)]

    def _start(self) -> Member:
        ours, theirs = self.context.Pipe()
        args = (theirs, os.getpid(), self.threads, self.setup, pickle.dumps(self.fn))
        process = self.context.Process(target=serve, args=args, daemon=True)
        process.start()
        theirs.close()
        return Member(process, ours)

    def __enter__(self) -> LocalProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        for m in self.members:
            with contextlib.suppress(OSError):
                m.conn.send(None)
        for m in self.members:
            m.process.join(10)
        self.cancel([])

    def submit(self, i: int) -> int:
        handle = next(self.count)
        self.queue.append((handle, i))
        self._dispatch()
        return handle

    def _dispatch(self) -> None:
        for m in self.members:
            if m.job is None and self.queue:
                m.job = self.queue.popleft()
                m.conn.send((m.job[0], self.jobs[m.job[1]]))

    def next_done(self, pending: dict[Any, tuple[int, int]]) -> tuple[Any, Any]:
        from multiprocessing.connection import wait

        busy = [m for m in self.members if m.job is not None]
        ready = set(wait([m.conn for m in busy] + [m.process.sentinel for m in busy]))
        m = next(m for m in busy if m.conn in ready or m.process.sentinel in ready)
        handle = m.job[0] if m.job else None
        try:
            _, outcome = m.conn.recv()
        except (EOFError, OSError):  # the process died with the job
            m.process.join()
            outcome = Outcome(False, error=f"the job's process died ({death(m.process.exitcode)})", crashed=True)
            m.conn.close()
            self.members[self.members.index(m)] = m = self._start()
        m.job = None
        self._dispatch()
        return handle, outcome

    def cancel(self, handles: list[Any]) -> None:
        """Stop every member process, running jobs included, and wait until they are gone."""
        self.queue.clear()
        for m in self.members:
            if m.process.is_alive():
                m.process.terminate()
        for m in self.members:
            m.process.join(10)
            m.conn.close()
