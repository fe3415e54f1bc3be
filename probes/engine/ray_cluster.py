"""Joining Ray: a session on a local instance or a cluster, and one line for each way joining goes wrong.

Ray is imported only inside these functions. Joining a cluster fails in ways Ray reports slowly
or not at all; each is checked here and said in one line naming the fix:

- an address that accepts no connection (Ray would retry it for minutes);
- a cluster on loopback (``ray start --head --node-ip-address=127.0.0.1``): Ray on this machine
  replaces a loopback address by the machine's outward one, where such a cluster does not listen,
  and waits there silently unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps it on loopback;
- token authentication: no ``RAY_AUTH_MODE=token`` here, or a token the cluster refuses;
- a job that asks for more CPUs or GPUs than any node of the cluster has (Ray would queue it forever).

During a session Ray's console output is kept short: its driver prints errors pushed by the
cluster (a dead node's raylet log, dozens of lines) as one line each, and a signal (Ctrl-C,
SIGTERM) reaches the handlers the caller installed, not the stack dump Ray installs.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from depthprobe.probes.base.errors import ProbeError

INSTALL = "pip install 'depthprobe[ray]'"
CONNECT_TIMEOUT_S = 5.0  # an address that does not answer a TCP connection within this is unreachable
LOOPBACK_FIX = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0"
_SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)


RAY_API = ("init", "is_initialized", "remote", "get", "wait", "put", "shutdown")  # what depthprobe calls


def require_ray() -> Any:
    """The ``ray`` module, or a one-line error saying how to install it (or why the Ray installed
    here cannot be used: it fails to import, or it is not Ray)."""
    try:
        import ray
    except ModuleNotFoundError as exc:
        if exc.name != "ray":
            raise _unusable(_ray_location(), f"it needs {exc.name}, which is missing") from None
        raise ProbeError(f"--backend ray needs Ray, which is not installed: {INSTALL}") from None
    except (Exception, SystemExit) as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise _unusable(_ray_location(), f"importing it raised {type(exc).__name__}: {first}") from None
    missing = [name for name in RAY_API if not callable(getattr(ray, name, None))]
    if missing:
        where = getattr(ray, "__file__", None) or "?"
        raise _unusable(where, f"it has no {', '.join(missing)}: not the Ray package")
    return ray


def _ray_location() -> str:
    import importlib.util

    try:
        spec = importlib.util.find_spec("ray")
    except (Exception, SystemExit):
        return "?"
    return (spec.origin if spec is not None else None) or "?"


def _unusable(where: str, why: str) -> ProbeError:
    return ProbeError(f"--backend ray cannot use the Ray installed at {where} ({why}); reinstall it: {INSTALL}")


LOST_AFTER_S = 15  # a head that refuses connections this long is gone (Ray's own core gives up at 60 s)
POLL_S = 2.0


class ClusterLost(ProbeError):
    """The Ray cluster went away during a run (its head stopped answering): exit code 3, as for
    failed members; what finished is on disk and a rerun takes it up."""

    exit_code = 3


class HeadWatch:
    """Whether the cluster's head (its GCS address) still accepts connections: :meth:`check`
    raises :class:`ClusterLost` once it has refused them for ``LOST_AFTER_S`` seconds."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.silent_since: float | None = None  # when the head first refused a connection
        host, _, port = address.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)

    def answers(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=POLL_S):
                return True
        except OSError:
            return False

    def check(self, wait_s: float = 0.0) -> None:
        """Raise :class:`ClusterLost` when the head is gone; with ``wait_s``, keep asking that
        long first (a node's death is often followed by its head's)."""
        import time

        deadline = time.monotonic() + wait_s
        while True:
            if self.answers():
                self.silent_since = None
                return
            now = time.monotonic()
            since = self.silent_since = self.silent_since or now
            if now - since >= LOST_AFTER_S:
                raise ClusterLost(
                    f"lost the Ray cluster at {self.address}: its head has not answered for {LOST_AFTER_S} s"
                )
            if now >= deadline:
                return
            time.sleep(POLL_S)


def check_reachable(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Refuse a ``HOST:PORT`` that is malformed or does not accept a TCP connection within
    ``timeout`` seconds (Ray itself keeps retrying an unreachable address for minutes)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ProbeError(f"--address {address!r} is not HOST:PORT or auto, e.g. --address 10.0.0.5:6379")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ProbeError(
            f"cannot reach a Ray cluster at {address} ({reason}); start one there with "
            f"`ray start --head --port={port}` or check the address"
        ) from None


def check_address(address: str) -> str:
    """The cluster address to join (``auto``: the one ``ray start`` recorded on this machine),
    checked: it accepts connections, and so does the address Ray will actually dial from here
    (Ray replaces a loopback host by this machine's outward address)."""
    from ray._private import services

    given = address
    if address == "auto":
        try:
            found = services.get_ray_address_from_environment("auto", None)
        except ConnectionError:  # Ray's way of saying it found none
            found = None
        if not found:
            raise ProbeError(
                "no running Ray cluster found for --address auto; start one with `ray start --head` or omit --address"
            )
        given = found
    check_reachable(given)
    dialled = services.canonicalize_bootstrap_address(given)
    if dialled and dialled != given:
        try:
            check_reachable(dialled, timeout=CONNECT_TIMEOUT_S)
        except ProbeError:
            raise ProbeError(
                f"the Ray cluster at {given} listens on loopback only, but Ray here dials this machine's address "
                f"{dialled} instead, where nothing listens; run with {LOOPBACK_FIX} in the environment to keep Ray "
                "on loopback (docs/distributed.md, single-machine clusters)"
            ) from None
    return given


def _quiet_ray_logging() -> None:
    for name in ("ray", "ray._private", "ray.data", "ray.tune"):
        logging.getLogger(name).setLevel(logging.ERROR)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")


@contextmanager
def _stderr_captured() -> Iterator[Any]:
    """File descriptor 2 goes to a temporary file in the block: Ray's C++ core writes its
    connection retries there directly (one warning a second while it cannot join a cluster).
    Yields the file; read it back for the reason a join failed."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as log:
        try:
            os.dup2(log.fileno(), 2)
            yield log
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _token_source() -> str:
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    return os.environ.get("RAY_AUTH_TOKEN_PATH") or "~/.ray/auth_token"


def join_error(address: str, first: str, log: str) -> ProbeError:
    """The one line for a failed join: what Ray's core logged (``log``) says why."""
    if "InvalidAuthToken" in log or "Unauthenticated" in log:
        if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
            return ProbeError(
                f"the Ray cluster at {address} uses token authentication; set RAY_AUTH_MODE=token here and give "
                "this machine the head's token (`ray get-auth-token` on the head prints it; put it in "
                "~/.ray/auth_token or RAY_AUTH_TOKEN)"
            )
        return ProbeError(
            f"the Ray cluster at {address} refused this machine's auth token (from {_token_source()}); the right "
            "one is on the head: `ray get-auth-token` there prints it (it is the head's ~/.ray/auth_token); "
            "put it in ~/.ray/auth_token here or in RAY_AUTH_TOKEN"
        )
    return ProbeError(
        f"cannot join the Ray cluster at {address} ({first}); check that it runs the same Ray version "
        "(`ray status` on the head) and, if it uses token authentication, that RAY_AUTH_MODE=token and its token "
        "are set here (docs/distributed.md)"
    )


def _init(ray: Any, address: str | None, num_cpus: int | None) -> None:
    common: dict[str, Any] = dict(log_to_driver=False, logging_level=logging.ERROR, ignore_reinit_error=True)
    if address is None:
        # "local": a new instance even when this machine runs a cluster (`ray start`)
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False, **common)
        return
    with _stderr_captured() as log:
        try:
            ray.init(address=address, **common)
        except ConnectionError as exc:
            log.seek(0)
            text = log.read().decode(errors="replace")
            first = (str(exc).strip().splitlines() or [""])[0]
            raise join_error(address, first, text) from None


@contextmanager
def _own_signal_handlers() -> Iterator[None]:
    """The Python signal handlers in place when the block starts are put back after ``ray.init``
    (which installs its own: SIGTERM would exit through Ray's handler with a stack dump)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.getsignal(s) for s in _SIGNALS}
    try:
        yield
    finally:
        for s, h in before.items():
            if h is not None:
                signal.signal(s, h)


def _short_pushed_errors(ray: Any) -> Any:
    """Errors the cluster pushes to this driver (a dead node's raylet log among them) are
    printed as their first line, on stderr; returns what to restore."""
    worker = ray._private.worker
    original = getattr(worker, "print_to_stdstream", None)
    if original is None:
        return None

    def first_line(data: dict[str, Any], ignore_prefix: bool) -> None:
        if data.get("pid") != "raylet":
            original(data, ignore_prefix)
            return
        lines = [ln.strip() for m in data.get("lines", []) for ln in str(m).splitlines() if ln.strip()]
        if lines:
            print(f"ray: {lines[0]}", file=sys.stderr, flush=True)

    worker.print_to_stdstream = first_line
    return original


@contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None) -> Iterator[Any]:
    """Ray, initialised for the block: a new local instance (``address`` None, with ``num_cpus``,
    default all of this machine's) or the cluster at ``address`` (``auto``: the one this machine
    belongs to; ``HOST:PORT``: its head). A session already open in this process is reused and
    left open; otherwise the driver disconnects at the end (a local instance stops)."""
    ray = require_ray()
    if address is not None and (address != "auto" or not ray.is_initialized()):
        address = check_address(address)  # a wrong address is refused even while a session is open
    if ray.is_initialized():
        yield ray
        return
    _quiet_ray_logging()
    with _own_signal_handlers():
        _init(ray, address, num_cpus)
    original = _short_pushed_errors(ray)
    try:
        yield ray
    finally:
        ray.shutdown()
        if original is not None:
            ray._private.worker.print_to_stdstream = original


def cluster_cpus(ray: Any) -> int:
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def _amount(x: float) -> str:
    return f"{x:g}"


def check_feasible(ray: Any, cpus: float, gpus: float, fix: str) -> None:
    """Refuse a job shape (``cpus`` CPUs and ``gpus`` GPUs on one node) that no live node of the
    cluster has: Ray would queue such jobs forever without a word. ``fix`` says what to change."""
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    if any(r.get("CPU", 0) >= cpus and r.get("GPU", 0) >= gpus for r in nodes):
        return
    total = ray.cluster_resources()
    has = f"{len(nodes)} node(s) with {_amount(total.get('CPU', 0))} CPUs and {_amount(total.get('GPU', 0))} GPUs"
    if len(nodes) > 1:
        big = max(nodes, key=lambda r: (r.get("GPU", 0), r.get("CPU", 0)))
        has += f" in all, at most {_amount(big.get('CPU', 0))} CPUs and {_amount(big.get('GPU', 0))} GPUs on one"
    raise ProbeError(
        f"each job needs {_amount(cpus)} CPU(s) and {_amount(gpus)} GPU(s) on one node, but the Ray cluster has "
        f"{has}; {fix}"
    )
