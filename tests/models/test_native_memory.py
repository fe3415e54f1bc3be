"""The size check of a native model counts what building it takes at its peak (about twice its
float32 weights: measured 957 MB for 120M parameters, 865 MB for 106M), so that a model the
memory cannot build is refused before the build rather than failing in it."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import resource
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.models.device import _field
from depthprobe.probes.models.loading import load
from depthprobe.probes.models.model import NativeConfig

spec = "native:layers=2,d_model=512,heads=8,d_vocab=50000,n_ctx=64"
weights = 4 * NativeConfig.parse(spec).n_params()
load("native:layers=1,d_model=16,heads=2,d_vocab=8,n_ctx=8")  # imports and first calls paid before the limit
room = int(1.1 * weights)  # more than the weights, less than the build's peak (1.17x measured)
mapped = _field("/proc/self/status", "VmSize:") * 1024
resource.setrlimit(resource.RLIMIT_AS, (mapped + room, resource.getrlimit(resource.RLIMIT_AS)[1]))
try:
    load(spec)
    print("built")
except ProbeError as exc:
    print(exc)
"""


def test_a_native_model_whose_build_peak_does_not_fit_is_refused_before_the_build():
    res = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    said = res.stdout.strip()
    assert said.startswith("native model native:layers=2,d_model=512") and "needs about" in said, said
