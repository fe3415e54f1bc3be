"""`--jobs N` member processes fork from one fork server (probes/engine/processes.py): they are its
children, it serves every pool of a driver, it has imported what it was asked to preload, members
see the driver's environment as it is when their pool starts; `--jobs auto` on a CPU (batching.py)
from the plan's estimated work; `--jobs` read as typed."""

from __future__ import annotations

import multiprocessing
import os
import sys

import pytest

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.engine.distributed import local_slots, map_jobs
from depthprobe.probes.experiments.batching import (
    PROCESS_START_S,
    cpu_jobs,
    family_module,
    read_jobs,
)
from tests.helpers import cli_error, run_python

FORKSERVER = "forkserver" in multiprocessing.get_all_start_methods()


def parent_pid(_: object) -> int:
    return os.getppid()


def env_value(name: str) -> str | None:
    return os.environ.get(name)


@pytest.mark.skipif(not FORKSERVER, reason="members are spawned where there is no fork server")
def test_members_of_every_pool_fork_from_one_server_not_the_driver():
    first = {r.value for r in map_jobs(parent_pid, range(4), processes=2)}
    second = {r.value for r in map_jobs(parent_pid, range(3), processes=3)}
    assert len(first) == 1 and first == second  # one parent for every member of both pools
    assert first != {os.getpid()}  # the fork server, not this process


@pytest.mark.skipif(not FORKSERVER, reason="members are spawned where there is no fork server")
def test_a_started_server_imports_its_preload_before_any_member_asks():
    code = """
import sys
from depthprobe.probes.engine.processes import warm_up
from depthprobe.probes.engine.distributed import map_jobs
from tests.engine.test_fork_server import imported
warm_up(["xml.dom.minidom"])
print(sorted(set(r.value for r in map_jobs(imported, ["xml.dom.minidom", "wave"], processes=2))))
print("xml.dom.minidom" in sys.modules)
"""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = run_python(code, cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    # the member found the preloaded module already imported, and not one nobody preloaded; the
    # driver itself never imported it
    assert out.stdout.split("\n")[:2] == ["[('wave', False), ('xml.dom.minidom', True)]", "False"]


def imported(name: str) -> tuple[str, bool]:
    return name, name in sys.modules


def test_members_see_the_driver_environment_as_their_pool_starts(monkeypatch):
    map_jobs(parent_pid, range(2), processes=2)  # the server (if any) runs before the variable is set
    monkeypatch.setenv("DEPTHPROBE_TEST_FORK_ENV", "set after the server started")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    names = ["DEPTHPROBE_TEST_FORK_ENV", "HF_HUB_OFFLINE"]
    assert [r.value for r in map_jobs(env_value, names, processes=2)] == ["set after the server started", None]


def test_auto_runs_small_plans_in_process_and_large_ones_on_every_core():
    # a law smoke study: 3 members of 0.1 s training and 0.3 s besides; half of 1.2 s saved on 2
    # cores is less than the processes add
    assert PROCESS_START_S > (3 * (0.1 + 0.3)) / 2
    assert cpu_jobs([0.1, 0.1, 0.1], cores=2, overhead_s=0.3) == 1
    # the petty smoke study at depths 1-4: 4 text members of about 2 s each, 4.5 s saved
    assert cpu_jobs([0.25] * 4, cores=2, overhead_s=2.0) == 2
    assert cpu_jobs([60.0, 60.0, 60.0], cores=2) == 2  # 186 s of work: half of it saved
    assert cpu_jobs([60.0, 60.0, 60.0], cores=8) == 3  # at most one slot per member
    assert cpu_jobs([600.0], cores=8) == 1  # one member: nothing to run beside it
    assert cpu_jobs([0.1, None], cores=2, overhead_s=0.3) == 2  # an unknown cost counts as large
    assert cpu_jobs([], cores=4) == 1


def test_jobs_read_as_typed():
    assert read_jobs(None) is None
    assert read_jobs("auto") == "auto" and read_jobs(" AUTO ") == "auto"
    assert read_jobs("3") == 3
    with pytest.raises(ProbeError, match=r"--jobs takes a whole number or auto, got 'two'; e\.g\. --jobs 2"):
        read_jobs("two")


def test_bad_jobs_on_the_command_line_is_one_line(tmp_path):
    cli_error(["study", "--family", "petty", "--jobs", "two", "--out", tmp_path / "s"], "--jobs takes a whole number")
    cli_error(["study", "--family", "petty", "--jobs", "0", "--out", tmp_path / "s"], "--jobs must be at least 1")
    assert not (tmp_path / "s").exists()


def test_a_built_in_family_module_is_named_without_importing_it():
    out = run_python(
        "import sys; from depthprobe.probes.experiments.batching import family_module; "
        "print(family_module('crasp'), 'depthprobe.probes.experiments.crasp' in sys.modules)"
    )
    assert out.stdout.strip() == "('depthprobe.probes.experiments.crasp',) False", out.stderr[-2000:]
    assert family_module("no-such-family") == ()


def test_auto_on_a_small_study_says_it_runs_members_here(tmp_path):
    from depthprobe.probes.experiments.runner import study

    lines: list[str] = []
    s = study("crasp", "smoke", out=tmp_path / "s", jobs="auto", echo=lines.append)
    assert (s.table.status == "ok").all(), s.table.error.tolist()
    chosen = [ln for ln in lines if ln.startswith("--jobs ")]
    assert len(chosen) == 1 and chosen[0].startswith("--jobs 1 (chosen: 3 members of about"), lines


@pytest.mark.skipif(local_slots() < 2, reason="one usable core: auto has nothing to choose")
def test_auto_on_the_petty_smoke_study_runs_member_processes(tmp_path):
    # --jobs 2 measured 0.71x --jobs 1 here (docs/study.md); auto chooses it, tables as with 1
    from depthprobe.probes.experiments.runner import study

    lines: list[str] = []
    s = study("petty", "smoke", out=tmp_path / "s", jobs="auto", depths=(1, 2, 3, 4), echo=lines.append)
    assert (s.table.status == "ok").all(), s.table.error.tolist()
    chosen = [ln for ln in lines if ln.startswith("--jobs ")]
    assert len(chosen) == 1 and chosen[0].startswith("--jobs 2 (chosen: 4 members of about"), lines
