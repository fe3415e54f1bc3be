"""Signals as exceptions: SIGTERM and SIGHUP unwind like Ctrl-C, and a dropped signal is raised again.

Imports nothing heavy: the CLI wraps every command in :func:`sigterm_as_keyboardinterrupt`,
including ``probe list`` and ``probe --help``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class Terminated(KeyboardInterrupt):
    """SIGTERM (or SIGHUP) received: unwinds like Ctrl-C, so every ``except KeyboardInterrupt``
    and ``finally`` cleanup runs; ``signum`` gives the exit code 128 + signum."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by signal {signum}")
        self.signum = signum


_PENDING: list[int] = []  # signals received inside sigterm_as_keyboardinterrupt's block


@contextmanager
def sigterm_as_keyboardinterrupt() -> Iterator[None]:
    """Inside the block, SIGTERM and SIGHUP raise :class:`Terminated` (a KeyboardInterrupt) in
    the main thread, so a killed process cleans up its partial outputs as Ctrl-C does; SIGINT
    raises KeyboardInterrupt as usual. The previous handlers are restored on exit. Outside the
    main thread this does nothing.

    Python runs a signal handler between any two bytecodes, also inside a ``__del__`` method or a
    weakref callback, where an exception is printed as "ignored" and dropped. Every signal is
    therefore also recorded, and long loops call :func:`check_interrupt` once per step, which
    raises it again if it was dropped: the process always stops."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        _PENDING.append(signum)
        raise _exception(signum)

    wanted = [s for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None), signal.SIGINT) if s is not None]
    before = {s: signal.signal(s, handler) for s in wanted}
    try:
        yield
    finally:
        for s, h in before.items():
            signal.signal(s, h)
        _PENDING.clear()


def _exception(signum: int) -> KeyboardInterrupt:
    import signal

    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def check_interrupt() -> None:
    """Raise the interrupt of a signal received earlier whose exception was dropped (see
    :func:`sigterm_as_keyboardinterrupt`); a no-op otherwise."""
    if _PENDING:
        raise _exception(_PENDING[0])
