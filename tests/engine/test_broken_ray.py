"""A Ray package that cannot be used (it raises on import, or it is not Ray) is refused in one
line, exit 2, naming the package, before any work (before: exit 1, "internal error")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

NATIVE = "native:layers=1,d_model=16,heads=2,d_vocab=8,n_ctx=8,attn_only=true"
OTHERS = ("remote", "get", "wait", "put", "shutdown")
NO_IS_INITIALIZED = "def init(*a, **k): pass\n" + "".join(f"{n} = init\n" for n in OTHERS)
PROBE = str(Path(sys.executable).parent / "probe")


@pytest.mark.parametrize(
    ("package", "says"),
    [
        ("raise RuntimeError('compiled for another CPU')\n", "RuntimeError: compiled for another CPU"),
        (NO_IS_INITIALIZED, "it has no is_initialized: not the Ray package"),
    ],
)
def test_an_unusable_ray_package_is_refused_in_one_line(tmp_path, package, says):
    site = tmp_path / "site"
    (site / "ray").mkdir(parents=True)
    (site / "ray" / "__init__.py").write_text(package)
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1"}
    args = [PROBE, "run", "--backend", "ray", "-t", "attention-stats", "-m", NATIVE, "-o", "r"]
    res = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, (res.returncode, res.stderr)
    assert lines[0].startswith("error: --backend ray cannot use the Ray installed at ") and says in lines[0], lines[0]
    assert "pip install" in lines[0] and not (tmp_path / "r").exists()
