"""Depth sweeps: one model per depth, identical settings and seeds, one table and plots.

A sweep is registered by name like a task (``probe sweep --task NAME``; the protocol is
:class:`~depthprobe.probes.engine.task.Sweep`). :func:`sweep` runs one and returns a
:class:`~depthprobe.probes.api.run.Result`, saved like any run (scores.csv, summary, manifest,
report.html). Its members (one model per depth; kernels: per variant and depth) are independent
jobs: ``backend="local"`` runs them here one after another, ``backend="ray"`` as Ray tasks
(:func:`~depthprobe.probes.engine.distributed.map_jobs`); the driver combines their results into
the same table either way.
"""

from __future__ import annotations

import sys
from functools import partial
from typing import Any

from depthprobe.probes.api.run import Result, seed_everything
from depthprobe.probes.base import artifacts
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.engine.task import SWEEPS, Sweep, SweepConfig, get_sweep, parse_depths, register_sweep

__all__ = [
    "SWEEPS",
    "Sweep",
    "SweepConfig",
    "get_sweep",
    "parse_depths",
    "register_sweep",
    "run_sweep_job",
    "sweep",
]


def sweep(
    task: str,
    depths: tuple[int, ...] | list[int],
    *,
    seed: int = 0,
    device: str | None = None,
    progress: bool = False,
    backend: str = "local",
    address: str | None = None,
    cpus_per_member: float = 1,
    gpus_per_member: float = 0,
    retries: int = 0,
    **options: Any,
) -> Result:
    """Run the sweep registered as ``task`` over ``depths``; returns a Result (``.save()`` it).

    ``backend="ray"`` runs each member as a Ray task with ``cpus_per_member`` CPUs and
    ``gpus_per_member`` GPUs on the cluster at ``address`` (``auto``, ``HOST:PORT``, or None: a
    local instance), retrying a failed member ``retries`` times; a member that still fails fails
    the sweep with one line naming it."""
    from depthprobe.probes.engine.distributed import check_member_backend

    check_member_backend(backend, address, cpus_per_member, gpus_per_member, retries)
    sw = get_sweep(task)
    config = SweepConfig(
        task=task, depths=tuple(depths), seed=seed, device=device, options=tuple(sorted(options.items()))
    )
    parsed = sw.parse_options(options)
    seed_everything(seed)
    timer = artifacts.Timer()
    with timer("sweep"):
        jobs = sw.jobs(config, parsed)  # bad input fails here, before any member runs
        if backend == "local":
            results = [_local_member(sw, job, retries, progress) for job in jobs]
        else:
            results = _ray_members(sw, task, jobs, address, cpus_per_member, gpus_per_member, retries, progress)
        out = sw.combine(config, parsed, results)
    info = {"name": f"sweep-{task}", "source": "sweep", "depths": list(config.depths)}
    return Result.from_output(
        out,
        config={
            **config.as_dict(),
            "kind": "sweep",
            "backend": backend,
            "workers": 1 if backend == "local" else len(jobs),
        },
        model_info=info,
        device=str(device or "auto"),
        timings=timer.times,
        counts={"depths": len(config.depths)},
    )


def run_sweep_job(task: str, job: Any) -> Any:
    """One member of the sweep registered as ``task`` (what a Ray worker runs)."""
    return get_sweep(task).run_job(job)


def _local_member(sw: Sweep, job: Any, retries: int, progress: bool) -> Any:
    """One member in this process (what ``Sweep.run`` does), run again up to ``retries`` times
    when it raises; the last error propagates."""
    for attempt in range(retries + 1):
        try:
            return sw.run_job(job, progress)
        except Exception:
            if attempt == retries:
                raise
    raise AssertionError("unreachable")


def _ray_members(
    sw: Sweep,
    task: str,
    jobs: list[Any],
    address: str | None,
    cpus: float,
    gpus: float,
    retries: int,
    progress: bool,
) -> list[Any]:
    from depthprobe.probes.engine.distributed import JobResult, map_jobs

    def done(i: int, result: JobResult) -> None:
        if progress:
            state = "done" if result.ok else f"failed: {result.error}"
            print(f"sweep {task}: {sw.job_name(jobs[i])} {state}", file=sys.stderr, flush=True)

    results = map_jobs(
        partial(run_sweep_job, task), jobs, backend="ray", address=address, cpus_per_job=cpus,
        gpus_per_job=gpus, retries=retries, on_done=done,
    )  # fmt: skip
    for r in results:
        if not r.ok:
            tries = f" after {r.attempts} attempts" if r.attempts > 1 else ""
            error = (r.error or "unknown error").removeprefix("ProbeError: ")
            raise ProbeError(f"sweep {task}: member {sw.job_name(jobs[r.index])} failed{tries}: {error}")
    return [r.value for r in results]
