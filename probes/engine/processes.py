"""One job's call, its outcome as data, and jobs in local member processes (``--jobs N``).

Each member process takes one job at a time over its own pipe and serves every job of its pool.
Where the platform has it (Linux, macOS), a member process is forked from a fork server
(multiprocessing's ``forkserver``): one helper process, started once per driver by
:func:`warm_up` (a study starts it before it plans, so that its imports overlap the driver's own),
that imports torch and the modules a member needs (:func:`warm_up`'s ``preload``) and has run no
torch operation, so each member starts with them already imported and no forked OpenMP or thread
state (forking the driver itself after a torch operation can hang the child). Elsewhere a member
is a freshly spawned interpreter that pays those imports itself. A member process gets the
driver's environment variables as they are when its pool starts.

- A member process that dies (killed, out of memory) costs only the job it held: the driver sees
  its exit, starts a new process in its place and reports the job as crashed (the retry loop in
  :mod:`.distributed` runs it again under ``--retries``); the other processes keep their jobs.
- A member process never outlives its driver: on Linux it asks the kernel for SIGKILL when its
  parent goes (``PR_SET_PDEATHSIG``; the fork server exits when the driver does), and everywhere
  it checks that its parent is still the one it started under before it takes a job, and exits
  when the driver's end of the pipe closes.
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

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.progress import job_label

__all__ = ["LocalProcesses", "Outcome", "call", "member_context", "one_line", "start_process", "warm_up"]

PR_SET_PDEATHSIG = 1  # linux/prctl.h
_PRELOAD = dict.fromkeys(("depthprobe.probes.engine.fork_server", "torch"))  # what the fork server imports


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


def start_method() -> str:
    """``forkserver`` where the platform has it, else ``spawn``."""
    import multiprocessing

    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def member_context() -> Any:
    """The multiprocessing context member processes start in (:func:`start_method`)."""
    import multiprocessing

    return multiprocessing.get_context(start_method())


def warm_up(preload: Sequence[str] = ()) -> None:
    """Start the fork server now, if it is not running, importing torch, :mod:`.fork_server` and
    ``preload`` (module names; one that fails to import is skipped, and a member imports it when
    it needs it): it imports while the caller goes on, and every member process of this driver
    forks from it. Nothing where members are spawned."""
    if start_method() != "forkserver":
        return
    from multiprocessing import forkserver

    _PRELOAD.update(dict.fromkeys(preload))  # a fork server started again imports all asked for so far
    member_context().set_forkserver_preload(list(_PRELOAD))
    forkserver.ensure_running()


def start_process(threads: int, setup: Callable[[], None] | None, environ: dict[str, str] | None = None) -> None:
    """Prepare a member process: the driver's environment variables (``environ``), its torch
    threads, then ``setup()``."""
    import torch  # the fork server imported it already

    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    torch.set_num_threads(threads)
    if setup is not None:
        setup()


def die_with_parent(parent: int) -> None:
    """In a member process: be killed when ``parent`` (the driver, or the fork server that exits
    with it) dies, and exit now if it already has."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):  # no prctl: the parent checks still hold
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the driver died before the signal was armed
        os._exit(0)


def serve(
    conn: Any,
    parent: int | None,
    threads: int,
    setup: Callable[[], None] | None,
    fn_bytes: bytes,
    environ: dict[str, str] | None = None,
) -> None:
    """A member process's loop: take a job, run it, send back its outcome; stop when told, when
    the pipe closes, or when its parent (``parent``: the driver's pid when spawned; None: the
    fork server it was forked from) is no longer its parent. ``fn`` arrives pickled and is read
    after ``setup()``, which may load the module it comes from (a plugin file)."""
    parent = os.getppid() if parent is None else parent
    die_with_parent(parent)
    try:
        start_process(threads, setup, environ)
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
        warm_up()  # the fork server, if no study started it with more to preload
        self.context = member_context()
        self.members = [self._start() for _ in range(self.processes)]

    def _start(self) -> Member:
        ours, theirs = self.context.Pipe()
        parent = os.getpid() if self.context.get_start_method() == "spawn" else None
        args = (theirs, parent, self.threads, self.setup, pickle.dumps(self.fn), dict(os.environ))
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
