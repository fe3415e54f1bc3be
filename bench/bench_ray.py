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

Where a member's time goes: for each mode the members' own wall time (`wall_s`, measured inside
the member, so without Ray's round trip) and training throughput (`tokens_per_s`) are printed,
and the torch threads a one-CPU Ray worker gets (Ray sets OMP_NUM_THREADS to the task's CPUs).
`--address HOST:PORT` (or auto) joins a running cluster (`ray start`) instead of starting an
instance; the CPUs are then the cluster's, and "one member at a time" reserves
a whole node per member (on a cluster of one-CPU nodes, that is one member per node).

    .venv/bin/python bench/bench_ray.py [--family levine] [--rounds 2] [--address 127.0.0.1:6379]
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

from depthprobe.probes.experiments.runner import study


def _noop(x: int) -> int:
    return x


def _threads(_: int) -> tuple[int, str]:
    import torch

    return torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS", "-")


def timed(family: str, **kwargs) -> tuple[float, list[float], list[float]]:
    """The study's wall time, its members' own wall times and training tokens per second."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        s = study(family, "smoke", out=Path(tmp) / "s", echo=lambda line: None, **kwargs)
        elapsed = time.perf_counter() - t0
        table = s.table
        bad = table[table.status != "ok"]
        if len(bad):
            raise SystemExit(f"members failed: {bad.error.tolist()}")
    return elapsed, [float(x) for x in table.wall_s], [float(x) for x in table.tokens_per_s]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="levine", choices=["levine", "petty", "spa"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--address", default=None, help="join this Ray cluster instead of starting an instance")
    args = ap.parse_args()
    import ray

    if args.address:
        ray.init(address=args.address, log_to_driver=False)
        cpus = int(ray.cluster_resources().get("CPU", 1))
    else:
        cpus = os.cpu_count() or 1
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    ray.get([ray.remote(_noop).remote(i) for i in range(cpus)])  # workers up before timing
    # a job must fit on one node: on a cluster of small nodes, "one at a time" is one per node
    node_cpus = max(int(n["Resources"].get("CPU", 1)) for n in ray.nodes() if n["Alive"])
    threads = ray.get(ray.remote(_threads).options(num_cpus=1).remote(0))
    modes = {
        "local": {},
        "ray, one member at a time": {"backend": "ray", "cpus_per_member": node_cpus},
        "ray, parallel members": {"backend": "ray", "cpus_per_member": 1},
    }
    best = {}
    for name, kwargs in modes.items():
        # one untimed run per mode: Ray keeps worker processes per resource shape, and a new worker
        # spends seconds importing torch and TransformerLens (a real study uses one shape throughout)
        timed(args.family, **kwargs)
        best[name] = min((timed(args.family, **kwargs) for _ in range(args.rounds)), key=lambda r: r[0])
    ray.shutdown()
    print(
        f"a one-CPU Ray worker runs torch with {threads[0]} thread(s) (OMP_NUM_THREADS={threads[1]}); "
        f"this process: {__import__('torch').get_num_threads()}"
    )
    for name, (t, walls, speeds) in best.items():
        members = ", ".join(f"{w:.1f} s" for w in walls)
        rate = sum(speeds) / len(speeds)
        print(f"{name:28s} {t:6.1f} s   members' own wall time: {members}; training {rate:,.0f} tokens/s")
    best = {name: r[0] for name, r in best.items()}
    print(
        f"smoke study ({args.family}) on Ray vs local, Ray start-up excluded: "
        f"{best['ray, one member at a time'] / best['local']:.2f}x overhead (target <= 1.15x); "
        f"parallel members on {cpus} CPUs: {best['ray, parallel members'] / best['local']:.2f}x"
    )


if __name__ == "__main__":
    main()
