"""Joining a real Ray cluster (`ray start`, on loopback): each way it goes wrong is one line, quickly.

The clusters here are started with `ray start --block` in a process group of their own and torn
down by ending that group (not `ray stop`, which ends every Ray process of the machine, other
sessions' included). Every port is chosen free, so a second node fits on the same machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from depthprobe.probes.engine.distributed import map_jobs  # noqa: E402

BIN = Path(sys.executable).parent
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}  # what keeps Ray on 127.0.0.1 (docs/distributed.md)
SWEEP = ["sweep", "--task", "kernels", "--depths", "1", "--option", "variants=vanilla", "--option", "width=16",
         "--option", "seq_len=8", "--option", "samples=2", "--option", "steps=0"]  # fmt: skip


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports: every socket is held until all are chosen (ports chosen one at a
    time can repeat, and Ray refuses a node whose components share a port)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


def free_port() -> int:
    return free_ports(1)[0]


def node_ports() -> list[str]:
    names = ["node-manager-port", "object-manager-port", "metrics-export-port", "runtime-env-agent-port",
             "dashboard-agent-grpc-port", "dashboard-agent-listen-port"]  # fmt: skip
    return [f"--{name}={port}" for name, port in zip(names, free_ports(len(names)), strict=True)]


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    return {**env, "RAY_AUTH_MODE": "token", "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0", **extra}


class Cluster:
    """Nodes started with `ray start --block`, each in its own process group."""

    def __init__(self, cpus: int = 1, loopback: bool = True) -> None:
        # loopback: the nodes listen on 127.0.0.1 only (one node at most: Ray refuses a second one
        # there); else they use this machine's outward address, as `ray start` does by default
        self.env = base_env(**LOOPBACK) if loopback else base_env()
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.temp = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # short: Ray's socket paths are limited
        self.nodes: list[subprocess.Popen] = []
        self.start(["--head", f"--port={self.port}", f"--temp-dir={self.temp}", "--include-dashboard=false"], cpus)

    def start(self, role: list[str], cpus: int, extra: tuple[str, ...] = ()) -> None:
        args = [str(BIN / "ray"), "start", "--block", "--node-ip-address=127.0.0.1", f"--num-cpus={cpus}",
                "--disable-usage-stats", *role, *node_ports(), *extra]  # fmt: skip
        log = open(Path(self.temp) / f"node{len(self.nodes)}.log", "w")  # noqa: SIM115
        self.nodes.append(subprocess.Popen(args, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True))  # fmt: skip
        self.wait_for(len(self.nodes))

    def add_node(self, cpus: int, *extra: str) -> None:
        self.start([f"--address={self.address}"], cpus, extra)

    def wait_for(self, n_nodes: int, timeout: float = 90) -> None:
        code = f"import ray; ray.init(address={self.address!r}); print(sum(n['Alive'] for n in ray.nodes()))"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [p for p in self.nodes if p.poll() is not None]
            if dead:  # a node that failed to start: its log says why (ray.init would wait for it forever)
                log = (Path(self.temp) / f"node{self.nodes.index(dead[0])}.log").read_text()[-2000:]
                raise RuntimeError(f"a ray node exited with code {dead[0].returncode}:\n{log}")
            try:
                r = subprocess.run([sys.executable, "-c", code], env=self.env, capture_output=True, text=True,
                                   timeout=max(1.0, deadline - time.monotonic()))  # fmt: skip
            except subprocess.TimeoutExpired:
                break
            if r.returncode == 0 and r.stdout.strip().splitlines()[-1:] == [str(n_nodes)]:
                return
            time.sleep(1)
        raise RuntimeError(f"the cluster did not reach {n_nodes} node(s) in {timeout} s")

    def stop(self) -> None:
        for p in reversed(self.nodes):
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            except ProcessLookupError:
                pass
        shutil.rmtree(self.temp, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(cpus=1)
    try:
        yield c
    finally:
        c.stop()


def probe(args: list[str], timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "probe"), *args], env=base_env(**env), capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def one_line_exit_2(r: subprocess.CompletedProcess, *fragments: str) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def test_nothing_to_run_opens_no_ray_session():
    # a rerun of a finished study has no members left: it must not join (or start) Ray at all
    assert map_jobs(abs, [], backend="ray", address="127.0.0.1:1") == []


@pytest.mark.slow
def test_a_loopback_cluster_dialled_on_the_outward_address_is_one_line(cluster, tmp_path):
    # without RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 Ray dials this machine's outward address instead of
    # 127.0.0.1, where the cluster does not listen, and waited there silently
    r = probe([*SWEEP, "--backend", "ray", "--address", cluster.address, "--out", str(tmp_path / "s")], timeout=60)
    one_line_exit_2(r, cluster.address, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0")
    assert not (tmp_path / "s").exists()


@pytest.mark.slow
def test_gpus_the_cluster_lacks_are_refused_naming_what_it_has(cluster, tmp_path):
    out = tmp_path / "s"
    args = [*SWEEP, "--backend", "ray", "--address", cluster.address, "--gpus-per-member", "1", "--out", str(out)]
    one_line_exit_2(probe(args, timeout=90, **LOOPBACK), "1 GPU(s)", "1 node(s) with 1 CPUs and 0 GPUs")
    assert not out.exists()


@pytest.mark.slow
def test_a_refused_token_says_so_and_where_the_right_one_is(cluster, tmp_path):
    wrong = "0123456789abcdef0123456789abcdef"
    args = [*SWEEP, "--backend", "ray", "--address", cluster.address, "--out", str(tmp_path / "s")]
    line = one_line_exit_2(probe(args, RAY_AUTH_TOKEN=wrong, **LOOPBACK), "refused this machine's auth token")
    assert "RAY_AUTH_TOKEN" in line and "ray get-auth-token" in line and "set RAY_AUTH_MODE" not in line


@pytest.mark.slow
def test_a_sweep_on_the_cluster_records_its_workers(cluster, tmp_path):
    out = tmp_path / "s"
    r = probe([*SWEEP, "--backend", "ray", "--address", cluster.address, "--out", str(out)], timeout=300, **LOOPBACK)
    assert r.returncode == 0, r.stderr
    config = json.loads((out / "manifest.json").read_text())["config"]
    assert config["backend"] == "ray" and config["workers"] == 1


@pytest.mark.slow
def test_sigterm_in_a_ray_session_reaches_the_callers_handler(cluster):
    # ray.init installs Ray's own SIGTERM handler (an exit with a stack dump); the session puts ours back
    code = textwrap.dedent(
        f"""
        import os, signal, sys
        from depthprobe.probes.base.signals import sigterm_as_keyboardinterrupt
        from depthprobe.probes.engine.ray_cluster import ray_session
        with sigterm_as_keyboardinterrupt():
            try:
                with ray_session({cluster.address!r}):
                    os.kill(os.getpid(), signal.SIGTERM)
                    signal.pause()
            except KeyboardInterrupt as exc:
                print("stopped:", type(exc).__name__, file=sys.stderr)
                sys.exit(3)
        """
    )
    r = subprocess.run([sys.executable, "-c", code], env=base_env(**LOOPBACK), capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert r.returncode == 3 and r.stderr.strip() == "stopped: Terminated", r.stderr


def kill_my_raylet(_: int) -> str:
    """On a worker: end this node's raylet (the worker's parent), as a machine going down would."""
    os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(60)
    return "unreachable"


@pytest.mark.slow
def test_a_dead_node_is_one_line_on_the_driver(tmp_path):
    c = Cluster(cpus=1, loopback=False)
    try:
        c.add_node(1, '--resources={"doomed": 1}')
        code = textwrap.dedent(
            f"""
            import sys, time
            sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
            import ray
            from tests.engine.test_ray_cluster import kill_my_raylet
            from depthprobe.probes.engine.ray_cluster import ray_session
            with ray_session({c.address!r}):
                ray.cloudpickle.register_pickle_by_value(sys.modules["tests.engine.test_ray_cluster"])
                remote = ray.remote(kill_my_raylet).options(resources={{"doomed": 1}}, max_retries=0)
                try:
                    ray.get(remote.remote(0), timeout=120)
                except Exception as exc:
                    print("failed:", type(exc).__name__)
                time.sleep(5)  # errors the cluster pushes arrive after the task's failure
            """
        )
        r = subprocess.run([sys.executable, "-c", code], env=c.env, capture_output=True, text=True,
                           timeout=240)  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip().startswith("failed:"), r.stdout
        assert len(r.stdout.strip().splitlines()) == 1, r.stdout
        assert len(r.stderr.strip().splitlines()) <= 2, r.stderr
    finally:
        c.stop()


VANISHING = """
import sys, time
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.engine.distributed import map_jobs

def job(i):
    time.sleep(1 if i == 0 else 600)
    return i

try:
    map_jobs(job, [0, 1], backend="ray", address={address!r}, on_done=lambda i, r: print("done", i, r.ok, flush=True))
except ProbeError as exc:
    print("refused", exc.exit_code, exc, flush=True)
"""


@pytest.mark.slow
def test_a_cluster_that_vanishes_mid_run_is_one_line_keeping_the_finished_members(tmp_path):
    """The whole cluster goes while a member runs: one line naming it, saying what finished is
    kept, exit code 3 (before: Ray's "Failed to connect to GCS within 60 seconds" and exit 1)."""
    c = Cluster(cpus=2)
    try:
        code = VANISHING.format(address=c.address)
        driver = subprocess.Popen([sys.executable, "-c", code], env=c.env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)  # fmt: skip
        assert driver.stdout is not None
        assert driver.stdout.readline().strip() == "done 0 True"
        c.stop()
        out, err = driver.communicate(timeout=180)
    finally:
        c.stop()
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 0, err[-3000:]
    assert out.strip() == (
        f"refused 3 lost the Ray cluster at {c.address}: its head has not answered for 15 s; the 1 of 2 "
        "members that finished are kept (rerun the same command when the cluster is back to run the rest)"
    ), out
    assert len(err.strip().splitlines()) <= 2, err[-3000:]
