"""Local member processes (`--jobs N`): a killed member process costs only its own job, which is
retried under ``retries``; a killed driver takes its member processes with it, and no member
process takes a job without a driver."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from depthprobe.probes.engine.distributed import map_jobs

REPO = Path(__file__).resolve().parents[2]


def die_once(path: str) -> str:
    """Kills its own process the first time (a file marks it), succeeds afterwards."""
    mark = Path(path)
    if mark.name.startswith("die") and not mark.exists():
        mark.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)  # long enough that the healthy jobs are running when the other process dies
    return mark.name


@pytest.mark.parametrize("retries", [0, 1])
def test_a_killed_member_process_costs_only_its_own_job(tmp_path, retries):
    jobs = [str(tmp_path / name) for name in ("ok-a", "die-b", "ok-c", "ok-d")]
    results = map_jobs(die_once, jobs, processes=2, retries=retries)
    by_name = {Path(j).name: r for j, r in zip(jobs, results, strict=True)}
    for name in ("ok-a", "ok-c", "ok-d"):
        assert by_name[name].ok and by_name[name].value == name and by_name[name].attempts == 1, by_name[name]
    dead = by_name["die-b"]
    if retries:
        assert dead.ok and dead.value == "die-b" and dead.attempts == 2
    else:
        assert not dead.ok and dead.attempts == 1 and not dead.user_error
        assert dead.error == "the job's process died (killed by SIGKILL)" and dead.crashed
        assert dead.failure() == "the job's process died (killed by SIGKILL)"  # not an internal error


DRIVER = """
import sys
sys.path.insert(0, {repo!r})
from depthprobe.probes.engine.distributed import map_jobs
from tests.engine.test_job_processes import slow_job
map_jobs(slow_job, [{folder!r} + "/" + str(i) for i in range(6)], processes=2)
"""


def slow_job(path: str) -> None:
    Path(path + ".start").write_text(str(os.getpid()))
    time.sleep(4)
    Path(path + ".done").write_text("")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def _wait(condition, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_member_processes_exit_with_a_killed_driver_and_take_no_job(tmp_path):
    code = DRIVER.format(repo=str(REPO), folder=str(tmp_path))
    driver = subprocess.Popen([sys.executable, "-c", code])
    try:
        assert _wait(lambda: len(list(tmp_path.glob("*.start"))) == 2, 120), "the member processes never started"
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        members = [int(p.read_text()) for p in tmp_path.glob("*.start")]
        assert _wait(lambda: not any(_alive(pid) for pid in members), 10), "member processes outlived the driver"
        time.sleep(5)  # a member process still running would have finished its job and taken the next by now
        assert not list(tmp_path.glob("*.done")), "a member finished its job without a driver"
        assert len(list(tmp_path.glob("*.start"))) == 2, "a member process took a job without a driver"
    finally:
        driver.kill()
        for p in tmp_path.glob("*.start"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(p.read_text()), signal.SIGKILL)
