"""Depth sweeps: one model per depth, identical settings and seeds, one table and plots.

A sweep is registered by name like a task (``probe sweep --task NAME``; the protocol is
:class:`~depthprobe.probes.engine.task.Sweep`). :func:`sweep` runs one and returns a
:class:`~depthprobe.probes.api.run.Result`, saved like any run (scores.csv, summary, manifest,
report.html). Its members (one model per depth; kernels: per variant and depth) are independent
jobs: ``backend="local"`` runs them here one after another, or with ``jobs=N`` in N local
processes, ``backend="ray"`` as Ray tasks
(:func:`~depthprobe.probes.engine.distributed.map_jobs`); the driver combines their results into
the same table either way.
"""

from __future__ import annotations

import sys
from functools import partial
from typing import Any

from depthprobe.probes.api.run import Result, seed_everything
from depthprobe.probes.base import artifacts
from depthprobe.probes.base.errors import MembersFailed
from depthprobe.probes.engine.backend import Backend
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
    jobs: int | None = None,
    **options: Any,
) -> Result:
    """Run the sweep registered as ``task`` over ``depths``; returns a Result (``.save()`` it).

    ``backend="ray"`` runs each member as a Ray task with ``cpus_per_member`` CPUs and
    ``gpus_per_member`` GPUs on the cluster at ``address`` (``auto``, ``HOST:PORT``, or None: a
    local instance), retrying a failed member ``retries`` times; a member that still fails fails
    the sweep with one line naming it. ``jobs`` (local backend): members run at once in that many
    spawned processes, each with ``cores // jobs`` threads (None or 1: one after another in this
    process); the table is the same as with ``jobs=1``."""
    where = Backend(backend, address, cpus_per_member, gpus_per_member, retries, jobs)
    where.check()
    sw = get_sweep(task)
    config = SweepConfig(
        task=task, depths=tuple(depths), seed=seed, device=device, options=tuple(sorted(options.items()))
    )
    parsed = sw.parse_options(options)
    seed_everything(seed)
    timer = artifacts.Timer()
    with timer("sweep"):
        members = sw.jobs(config, parsed)  # bad input fails here, before any member runs
        placing = where.placing(len(members))
        results = _mapped_members(sw, task, members, placing, progress)
        out = sw.combine(config, parsed, results)
    info = {"name": f"sweep-{task}", "source": "sweep", "depths": list(config.depths)}
    return Result.from_output(
        out,
        config={
            **config.as_dict(),
            "kind": "sweep",
            "backend": backend,
            "workers": placing["processes"] if backend == "local" else len(members),
        },
        model_info=info,
        device=str(device or "auto"),
        timings=timer.times,
        counts={"depths": len(config.depths)},
    )


def run_sweep_job(task: str, job: Any, progress: bool = False) -> Any:
    """One member of the sweep registered as ``task`` (what a member process or Ray worker runs)."""
    return get_sweep(task).run_job(job, progress)


def _mapped_members(sw: Sweep, task: str, jobs: list[Any], placing: dict[str, Any], progress: bool) -> list[Any]:
    """The members as jobs of ``map_jobs`` (in this process, in local processes with ``--jobs``,
    or as Ray tasks: one job path, one retry loop), in job order; a member that still fails after
    its retries fails the sweep in one line (a user error as it is, anything else marked internal;
    exit code 3: :class:`MembersFailed`)."""
    from depthprobe.probes.engine.distributed import JobResult, map_jobs

    def done(i: int, result: JobResult) -> None:
        if progress:
            state = "done" if result.ok else f"failed: {result.error}"
            print(f"sweep {task}: {sw.job_name(jobs[i])} {state}", file=sys.stderr, flush=True)

    here = placing["backend"] == "local" and placing["processes"] == 1  # a progress bar only in this process
    results = map_jobs(partial(run_sweep_job, task, progress=progress and here), jobs, on_done=done, **placing)
    for r in results:
        if not r.ok:
            tries = f" after {r.attempts} attempts" if r.attempts > 1 else ""
            raise MembersFailed(f"sweep {task}: member {sw.job_name(jobs[r.index])} failed{tries}: {r.failure()}")
    return [r.value for r in results]
