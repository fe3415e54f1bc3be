"""scripts/gpu-check.sh on a machine without CUDA: one line, exit status 0, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the check would run")
def test_gpu_check_without_cuda_says_so_in_one_line_and_exits_0(tmp_path):
    out = tmp_path / "gpu-check"
    env = {**os.environ, "PY": sys.executable}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-check.sh"), str(out)], env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0
    assert done.stdout.splitlines() == [
        "gpu-check: no CUDA device on this machine (torch.cuda.is_available() is False); nothing to check"
    ]
    assert done.stderr == "" and not out.exists()


def test_gpu_check_without_torch_names_the_fix(tmp_path):
    env = {**os.environ, "PY": "/bin/false"}  # a "Python" that cannot import torch
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-check.sh"), str(tmp_path / "x")], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == "gpu-check: /bin/false cannot import torch; set PY to a Python with torch installed"
