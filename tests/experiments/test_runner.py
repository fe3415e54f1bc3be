"""The one study runner (probes/experiments/runner.py, folder.py): a study folder held by one run
at a time (the lock never followed; folder, lock and disk failures one line each), law settings
refused up front with nothing written, bounded planning, no law control equal to a member, and
--dry-run's total for every family."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from depthprobe.cli.main import app
from depthprobe.probes.experiments.folder import LOCK
from tests.helpers import plan, resolve, tmpfs, toy_study

runner = CliRunner()


HOLD = (
    "import fcntl, os, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
    "f.write(f'{os.getpid()}\\n'); f.flush(); print('held', flush=True); time.sleep(60)"
)


@pytest.mark.study
def test_a_folder_held_by_a_live_run_is_refused_and_left_alone(tmp_path):
    assert toy_study(tmp_path / "s").exit_code == 0
    before = (tmp_path / "s" / "members.csv").read_text()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path / "s" / LOCK)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        res = toy_study(tmp_path / "s")
        assert res.exit_code == 2 and f"in use by another probe study (pid {holder.pid})" in res.output
        assert (tmp_path / "s" / "members.csv").read_text() == before
    finally:
        holder.kill()
        holder.wait()
    res = toy_study(tmp_path / "s")  # the holder is gone: its lock went with it (a killed run leaves none)
    assert res.exit_code == 0, res.output
    assert not (tmp_path / "s" / LOCK).exists()


@pytest.mark.study
def test_a_lock_file_left_behind_holds_nothing(tmp_path):
    """A lock file without a live holder (a copied folder, an old version's file) is no lock."""
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / LOCK).write_text("12345\n")
    res = toy_study(tmp_path / "s")
    assert res.exit_code == 0, res.output
    assert not (tmp_path / "s" / LOCK).exists()
    assert len(pd.read_csv(tmp_path / "s" / "members.csv")) == 3


@pytest.mark.study
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--family", "khop", "--length", "1000000000"], "needs about"),
        (["--family", "khop", "--letters", "1000000000"], "needs about"),
        (["--family", "khop", "--ks", "1,1000000000"], "above --length"),
        (["--family", "khop", "--d-model", "1000000000"], "needs about"),
        (["--family", "khop", "--batch-size", "1000000000"], "lower --batch-size"),
        (["--family", "khop", "--steps", "1000000000000"], "lower --steps"),
        (["--family", "groups", "--lengths", "4,1000000000"], "needs about"),
        (["--family", "khop", "--seeds", "4294967296"], "--seeds must be at most 1000"),
        (["--family", "khop", "--depths", "1000000000000"], "--depths must be integers from 1 to 1000"),
        (["--family", "levine", "--budgets", "1e30"], "--budgets must be at most"),
        (["--family", "levine", "--budgets", "1e30", "--dry-run"], "--budgets must be at most"),
        # #47 item 8: every size and rate option, ranges declared on the Config's fields, memory estimated
        (["-f", "khop", "--eval-sequences", "1000000000"], "--eval-sequences must be in [1, 10000000]"),
        (["-f", "khop", "--eval-sequences", "9000000", "--length", "4000"], "lower --eval-sequences"),
        (["-f", "khop", "--curve-sequences", "9000000", "--length", "4000"], "lower --curve-sequences"),
        (["-f", "khop", "--hop-sequences", "9000000", "--length", "4000"], "lower --hop-sequences"),
        (["-f", "groups", "--check-sequences", "9000000", "--lengths", "4,4000"], "lower --check-sequences"),
        (
            ["-f", "crasp", "--eval-sequences", "9000000", "--eval-lengths", "16,4000", "--solve-at", "16"],
            "needs about",
        ),
        (["-f", "khop", "--eval-sequences", "9000000", "--length", "4000", "--dry-run"], "lower --eval-sequences"),
        (["-f", "crasp", "--nmax", "100000000"], "--nmax 100000000 is above the longest --eval-lengths"),
        (["-f", "khop", "--weight-decay", "-1"], "--weight-decay must be in [0, 10], got -1.0"),
        (["-f", "groups", "--weight-decay", "nan"], "--weight-decay must be in [0, 10], got nan"),
        (["-f", "crasp", "--weight-decay", "inf"], "--weight-decay must be in [0, 10], got inf"),
        (["-f", "crasp", "--control-scale", "inf"], "--control-scale must be in (1, 100], got inf"),
        (["-f", "crasp", "--control-scale", "1"], "--control-scale must be in (1, 100], got 1.0"),
        (["-f", "crasp", "--control-scale", "1.01"], "it trains a member again"),
        (["-f", "levine", "--vocab", "100000000"], "--vocab must be in [1, 1000000], got 100000000"),
        (["-f", "petty", "--probe-lines", "1000000000"], "--probe-lines must be in [1, 100000]"),
        (["-f", "spa", "--icl-windows", "1000000000", "--dry-run"], "--icl-windows must be in [1, 100000]"),
        (["-f", "levine", "--d-head", "100000000"], "--d-head must be in [1, 4096]"),
    ],
)
def test_impossible_settings_are_refused_up_front_with_nothing_written(tmp_path, args, fragment):
    res = runner.invoke(app, ["study", *args, "--out", str(tmp_path / "s")])
    assert res.exit_code == 2 and fragment in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()


@pytest.mark.study
def test_no_law_control_equals_a_member():
    for family in ("khop", "groups"):
        jobs = plan(resolve(family, "smoke"))  # deepest depth 2 at width 16: the control would be L2-d16
        shapes = [(j.group, j.depth, j.d_model, j.seed) for j in jobs]
        assert len(shapes) == len(set(shapes)), shapes
        assert not any(j.control for j in jobs)
    wider = plan(resolve("khop", "smoke", depths=(1, 2, 3)))
    control = [j for j in wider if j.control]
    assert len(control) == 1 and control[0].depth == 2 and control[0].d_model > 16


@pytest.mark.study
def test_a_ray_cluster_that_refuses_the_run_at_join_time_leaves_no_folder(tmp_path):
    """#38.14: the runner wrote study.json before the member jobs joined the cluster; a cluster that
    is not there (refused at join time) left OUT/study.json behind."""
    pytest.importorskip("ray")
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "s"
    res = runner.invoke(
        app, ["study", "-f", "khop", "--backend", "ray", "--address", f"127.0.0.1:{port}", "-o", str(out)]
    )
    assert res.exit_code == 2 and "cannot reach a Ray cluster" in res.output, res.output
    assert not out.exists()


# -- the lock is never followed; folder, lock and disk failures are one line each ------------


def one_line_refusal(res, fragment: str) -> None:
    assert res.exit_code == 2 and fragment in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1, res.output


def test_a_lock_that_is_a_symlink_to_a_file_leaves_the_file_as_it_was(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / LOCK).symlink_to(victim)
    one_line_refusal(toy_study(tmp_path / "s"), "is a symbolic link")
    assert victim.read_text() == "precious\n"
    assert (tmp_path / "s" / LOCK).is_symlink() and sorted(p.name for p in (tmp_path / "s").iterdir()) == [LOCK]


def test_a_dangling_lock_symlink_creates_no_target(tmp_path):
    target = tmp_path / "elsewhere" / "planted"
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / LOCK).symlink_to(target)
    one_line_refusal(toy_study(tmp_path / "s"), "is a symbolic link")
    assert not os.path.lexists(target)


def test_a_lock_hard_linked_to_another_file_is_refused(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("1\n")
    (tmp_path / "s").mkdir()
    os.link(victim, tmp_path / "s" / LOCK)
    one_line_refusal(toy_study(tmp_path / "s"), "hard links")
    assert victim.read_text() == "1\n"


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_lock_that_is_a_folder_or_a_fifo_is_one_line(tmp_path, kind):
    assert toy_study(tmp_path / "s").exit_code == 0
    before = (tmp_path / "s" / "members.csv").read_text()
    lock = tmp_path / "s" / LOCK
    lock.mkdir() if kind == "folder" else os.mkfifo(lock)
    one_line_refusal(toy_study(tmp_path / "s"), "is not a regular file")
    assert (tmp_path / "s" / "members.csv").read_text() == before
    assert lock.is_dir() if kind == "folder" else stat.S_ISFIFO(lock.lstat().st_mode)


def test_enolck_is_one_line_and_leaves_no_folder(tmp_path, monkeypatch):
    """ENOLCK needs a file system without locks (NFS without a lock daemon), which this machine
    cannot mount: the one place where the error is injected, at flock itself."""
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    one_line_refusal(toy_study(tmp_path / "s"), "cannot lock files (ENOLCK")
    assert not (tmp_path / "s").exists()


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 256 KiB tmpfs (needs root that may mount; skipped elsewhere)."""
    with tmpfs(tmp_path / "disk", "size=256k") as disk:
        yield disk


def fill(disk: Path) -> Path:
    filler = disk / "filler"
    with contextlib.suppress(OSError), open(filler, "wb") as f:
        while True:
            f.write(b"x" * 4096)
            f.flush()
    return filler


def test_a_full_disk_before_the_study_is_one_line_and_leaves_nothing(tiny_disk):
    fill(tiny_disk)
    one_line_refusal(toy_study(tiny_disk / "s"), "the disk holding it is full")
    assert sorted(p.name for p in tiny_disk.iterdir()) == ["filler"]


def test_an_existing_study_on_a_read_only_disk_is_one_line_and_untouched(tiny_disk):
    assert toy_study(tiny_disk / "s", "--depths", "1,2").exit_code == 0
    before = {p: p.read_bytes() for p in (tiny_disk / "s").rglob("*") if p.is_file()}
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_disk)], check=True)
    one_line_refusal(toy_study(tiny_disk / "s", "--depths", "1,2"), "cannot create files in")
    assert {p: p.read_bytes() for p in (tiny_disk / "s").rglob("*") if p.is_file()} == before


FILLER = '''
from dataclasses import dataclass

import pandas as pd

from depthprobe.probes import Experiment, register_experiment
from depthprobe.probes.base.artifacts import write_csv
from depthprobe.probes.experiments.protocol import StudyConfig


@dataclass(frozen=True)
class Config(StudyConfig):
    preset: str = "smoke"
    depths: tuple = (1, 2, 4)


@dataclass(frozen=True)
class Job:
    depth: int
    dest: str | None = None

    @property
    def name(self):
        return f"L{self.depth}"


@register_experiment
class Filler(Experiment):
    """Its tables fill the disk first when OUT/../fill-me exists."""

    name = "filler"
    Config = Config
    presets = {"smoke": {}}
    costs = {"smoke": "instant"}
    columns = ["family", "member", "depth", "wall_s", "device", "status", "error"]

    def plan(self, config):
        return [Job(d) for d in config.depths]

    def measure(self, job, folder, row):
        write_csv(folder / "value.csv", pd.DataFrame([{"depth": job.depth}]))
        return {}

    def tables(self, config, members, folder):
        if (folder.parent / "fill-me").exists():
            with open(folder.parent / "filler", "wb") as f:
                try:
                    while True:
                        f.write(b"x" * 4096)
                        f.flush()
                except OSError:
                    pass
        return {"big.csv": pd.DataFrame({"x": range(20000)})}
'''


@pytest.mark.study
def test_a_disk_that_fills_while_the_tables_are_written_is_one_line_and_loses_no_member(tiny_disk, tmp_path):
    plugin = tmp_path / "filler.py"
    plugin.write_text(FILLER)
    (tiny_disk / "fill-me").touch()
    args = ["study", "--plugin", str(plugin), "--family", "filler", "--out", str(tiny_disk / "s")]
    res = runner.invoke(app, args)  # the members' progress lines, then the one error line
    assert res.exit_code == 2 and res.output.strip().splitlines()[-1].startswith("error: --out"), res.output
    assert "the disk holding it is full" in res.output and res.output.count("error") == 1, res.output
    members = sorted(p.name for p in (tiny_disk / "s" / "members").iterdir())
    assert members == ["L1", "L2", "L4"]
    assert not [p for p in (tiny_disk / "s").rglob(".*") if p.name != LOCK], "a temporary file was left"
    assert not (tiny_disk / "s" / LOCK).exists()
    (tiny_disk / "fill-me").unlink()
    (tiny_disk / "filler").unlink()
    res = runner.invoke(app, args)
    assert res.exit_code == 0 and "3 finished member(s) kept" in res.output, res.output


# -- --dry-run's total, for every family and --jobs ------------------------------------------------


@pytest.mark.parametrize(("family", "jobs"), [("levine", 1), ("spa", 2), ("khop", 1), ("crasp", 3)])
def test_a_dry_run_says_its_total_for_every_family_and_jobs(tmp_path, family, jobs):
    res = runner.invoke(app, ["study", "-f", family, "--dry-run", "--jobs", str(jobs), "--out", str(tmp_path / "d")])
    assert res.exit_code == 0, res.output
    table = pd.read_csv(tmp_path / "d" / "plan.csv")
    measured = "est_seconds" in table and table.est_seconds.notna().any()
    total = table.est_seconds.sum() / 60 if measured else table.cpu_minutes.sum()
    line = next(ln for ln in res.output.splitlines() if ln.startswith("estimated"))
    assert f"{len(table)} members" in line and f"{total:.3g}" in line, line
    assert (f"with --jobs {jobs}: at least {total / jobs:.3g} min wall" in line) == (jobs > 1), line


def test_flags_show_no_value_in_help():
    """--dry-run takes no value: its help shows no <bool> (which read as --dry-run true)."""
    res = runner.invoke(app, ["study", "--help"], terminal_width=200)
    line = next(ln for ln in res.output.splitlines() if "--dry-run" in ln)
    assert "<bool>" not in line and "<bool>" not in res.output, line


@pytest.mark.study
def test_study_help_lists_every_familys_options():
    res = runner.invoke(app, ["study", "--help"], terminal_width=400)
    assert res.exit_code == 0
    text = " ".join(res.output.split())
    assert "Family options (--name value" in text and "probe list families" in text
    common = "--depths --seeds --device --depth-usage"  # every family's (StudyConfig) first, then its own
    assert f"khop: {common} --d-models" in text and "--hop-sequences" in text
    assert f"crasp: {common}" in text and "--control-scale" in text and f"spa: {common} --corpus" in text
