"""Issue #38's study defects fixed in the one runner: a study folder held by one run at a time
(item 1), law settings refused up front with nothing written (item 6), bounded planning (item 2),
and no law control equal to a member (item 11)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from depthprobe.cli.main import app
from depthprobe.probes.experiments.folder import LOCK
from tests.helpers import plan, resolve

TOY = str(Path(__file__).parent / "fixtures" / "toy_family.py")
runner = CliRunner()


def toy(out: Path, *more: str):
    return runner.invoke(app, ["study", "--plugin", TOY, "--family", "toy", "--out", str(out), *more])


HOLD = (
    "import fcntl, os, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
    "f.write(f'{os.getpid()}\\n'); f.flush(); print('held', flush=True); time.sleep(60)"
)


def test_a_folder_held_by_a_live_run_is_refused_and_left_alone(tmp_path):
    assert toy(tmp_path / "s").exit_code == 0
    before = (tmp_path / "s" / "members.csv").read_text()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path / "s" / LOCK)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        res = toy(tmp_path / "s")
        assert res.exit_code == 2 and f"in use by another probe study (pid {holder.pid})" in res.output
        assert (tmp_path / "s" / "members.csv").read_text() == before
    finally:
        holder.kill()
        holder.wait()
    res = toy(tmp_path / "s")  # the holder is gone: its lock went with it (a killed run leaves none)
    assert res.exit_code == 0, res.output
    assert not (tmp_path / "s" / LOCK).exists()


def test_a_lock_file_left_behind_holds_nothing(tmp_path):
    """A lock file without a live holder (a copied folder, an old version's file) is no lock."""
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / LOCK).write_text("12345\n")
    res = toy(tmp_path / "s")
    assert res.exit_code == 0, res.output
    assert not (tmp_path / "s" / LOCK).exists()
    assert len(pd.read_csv(tmp_path / "s" / "members.csv")) == 3


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
    ],
)
def test_impossible_settings_are_refused_up_front_with_nothing_written(tmp_path, args, fragment):
    res = runner.invoke(app, ["study", *args, "--out", str(tmp_path / "s")])
    assert res.exit_code == 2 and fragment in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()


def test_no_law_control_equals_a_member():
    for family in ("khop", "groups"):
        jobs = plan(resolve(family, "smoke"))  # deepest depth 2 at width 16: the control would be L2-d16
        shapes = [(j.group, j.depth, j.d_model, j.seed) for j in jobs]
        assert len(shapes) == len(set(shapes)), shapes
        assert not any(j.control for j in jobs)
    wider = plan(resolve("khop", "smoke", depths=(1, 2, 3)))
    control = [j for j in wider if j.control]
    assert len(control) == 1 and control[0].depth == 2 and control[0].d_model > 16


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
