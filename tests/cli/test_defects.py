"""Defects found by adversarial testing, each reproduced: it failed before its fix and passes after."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from depthprobe.cli.main import app
from tests.helpers import one_line_error

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.mark.skipif(os.geteuid() != 0, reason="os.access says yes to root only: the defect needs root")
@pytest.mark.parametrize("where", ["/proc/depthprobe-out/run", "/sys/depthprobe-out"])
def test_out_where_nothing_can_be_created_is_refused_before_work_even_as_root(where, tmp_path):
    """As root, os.access passes under /proc and /sys; run, train and study now try to create a file
    first and refuse in one line (exit 2), before a model is loaded or a corpus read."""
    msg = "cannot create files in"
    one_line_error(invoke("run", "--model", tmp_path / "no-model", "--out", where), msg)
    one_line_error(invoke("train", "--steps", "1", "--out", where), msg)
    one_line_error(invoke("study", "--family", "petty", "--preset", "smoke", "--out", where), msg)
    assert not Path(where).exists()
