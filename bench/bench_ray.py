"""Overhead of running a study on Ray: the smoke study locally and on a local Ray instance.

The Ray instance is started before the clock starts, and each mode gets one untimed run first,
so that Ray's start-up and its workers' imports of torch and TransformerLens (seconds per new
worker process) are excluded; Ray keeps its worker processes per resource shape, so a mode that
changes the shape pays those imports again. The Ray run reserves every CPU of the instance per
member (`cpus_per_member` = the instance's CPUs), so members run one after another exactly as
they do locally and the ratio is Ray's own overhead (task submission, shipping each member's
files back to the driver); a second Ray run with one CPU per member shows what parallel members
give on this machine. Each mode runs `--rounds` times after its warm-up; the best is kept.
Target: overhead at most 1.15x.

    .venv/bin/python bench/bench_ray.py [--family levine] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: F401  (offline environment)

from depthprobe.probes.api.study import study


def _noop(x: int) -> int:
    return x


def timed(family: str, **kwargs) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        s = study(family, "smoke", out=Path(tmp) / "s", echo=lambda line: None, **kwargs)
        elapsed = time.perf_counter() - t0
        bad = s.table[s.table.status != "ok"]
        if len(bad):
            raise SystemExit(f"members failed: {bad.error.tolist()}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="levine", choices=["levine", "petty", "spa"])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    import ray

    cpus = os.cpu_count() or 1
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    ray.get([ray.remote(_noop).remote(i) for i in range(cpus)])  # workers up before timing
    modes = {
        "local": {},
        "ray, one member at a time": {"backend": "ray", "cpus_per_member": cpus},
        "ray, parallel members": {"backend": "ray", "cpus_per_member": 1},
    }
    best = {}
    for name, kwargs in modes.items():
        # one untimed run per mode: Ray keeps worker processes per resource shape, and a new worker
        # spends seconds importing torch and TransformerLens (a real study uses one shape throughout)
        timed(args.family, **kwargs)
        best[name] = min(timed(args.family, **kwargs) for _ in range(args.rounds))
    ray.shutdown()
    for name, t in best.items():
        print(f"{name:28s} {t:6.1f} s")
    print(
        f"smoke study ({args.family}) on Ray vs local, Ray start-up excluded: "
        f"{best['ray, one member at a time'] / best['local']:.2f}x overhead (target <= 1.15x); "
        f"parallel members on {cpus} CPUs: {best['ray, parallel members'] / best['local']:.2f}x"
    )


if __name__ == "__main__":
    main()
