"""Running work on a Ray cluster: sharded task runs and a job map with retries.

Ray is an optional dependency (``pip install 'depthprobe[ray]'``): it is imported only inside the
functions here that need it, so the local backend never imports it.

- :func:`run_sharded` runs one task over its examples on N Ray workers. The driver has loaded the
  model and the examples (bad input fails there, before any work) and plans the task's batches
  exactly as a local run would; each worker loads the model by name, starts a state over all the
  examples, accumulates one contiguous run of the batches and sends back its state (tensors on the
  CPU; the model reference stays behind). The driver merges the states in batch order
  (:meth:`Task.merge`) and finalizes once. No attention map leaves a worker.
- :func:`map_jobs` runs ``fn(job)`` for every job, locally in order or as Ray tasks with the given
  resources, retrying failures, and reports each one to ``on_done`` as it finishes.

Joining Ray (a local instance or a cluster) and checking a job's resources against the cluster
are in :mod:`.ray_cluster`.
"""

from __future__ import annotations

import io
import itertools
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any

import torch

from depthprobe.probes.base.errors import ProbeError, suggest
from depthprobe.probes.engine.execute import accumulate, batch_costs
from depthprobe.probes.engine.ray_cluster import check_feasible, cluster_cpus, ray_session, require_ray
from depthprobe.probes.engine.task import Context, Examples, Output, Task
from depthprobe.probes.models.model import Model

__all__ = ["BACKENDS", "JobResult", "check_backend", "check_member_backend", "map_jobs", "run_sharded"]

BACKENDS = ("local", "ray")


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ProbeError(f"unknown backend {backend!r}{suggest(backend, BACKENDS)}; use --backend local or ray")


def check_member_backend(backend: str, address: str | None, cpus: float, gpus: float, retries: int) -> None:
    """The member-job options of `probe study` and `probe sweep`, checked before anything is written."""
    check_backend(backend)
    if retries < 0:
        raise ProbeError(f"--retries must be 0 or more, got {retries}")
    if cpus < 0 or gpus < 0:
        raise ProbeError("--cpus-per-member and --gpus-per-member must be 0 or more")
    if backend == "local":
        if address is not None:
            raise ProbeError("--address applies to --backend ray; add --backend ray or drop it")
        return
    require_ray()  # an unreachable address is refused when the session opens (ray_session)


# ----------------------------------------------------------------------------- the job map


@dataclass(frozen=True)
class JobResult:
    """One job's outcome: ``value`` when ``ok``, else ``error`` (one line); ``attempts`` counts the
    calls of ``fn`` made for it (a node that died is retried by Ray within one attempt)."""

    index: int
    ok: bool
    value: Any
    error: str | None
    attempts: int


def one_line(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _call(fn: Callable[[Any], Any], job: Any) -> tuple[bool, Any]:
    """Run one job; an exception comes back as (False, its one-line message), so that the driver
    decides about retries and the message stays one line."""
    try:
        return True, fn(job)
    except Exception as exc:
        return False, one_line(exc)


def map_jobs(
    fn: Callable[[Any], Any],
    jobs: Sequence[Any],
    *,
    backend: str = "local",
    address: str | None = None,
    cpus_per_job: float = 1,
    gpus_per_job: float = 0,
    retries: int = 0,
    on_done: Callable[[int, JobResult], None] | None = None,
) -> list[JobResult]:
    """``fn(job)`` for every job, as :class:`JobResult` in job order.

    ``fn`` is a picklable top-level function. ``local``: in order, in this process (Ray is not
    imported). ``ray``: each job is a Ray task with ``cpus_per_job`` CPUs and ``gpus_per_job``
    GPUs; a job whose ``fn`` raises is run again up to ``retries`` times, and a job whose worker
    or node dies is resubmitted by Ray up to ``retries`` times. A job that still fails is
    ``ok=False`` with its error; the others go on. ``on_done(index, result)`` runs here, on the
    driver, as each job finishes (in completion order). Ctrl-C cancels the outstanding jobs and
    re-raises."""
    check_backend(backend)
    if retries < 0:
        raise ProbeError(f"--retries must be 0 or more, got {retries}")
    if cpus_per_job < 0 or gpus_per_job < 0:
        raise ProbeError("CPUs and GPUs per job must be 0 or more")
    if backend == "local":
        return _local_map(fn, jobs, retries, on_done)
    if not jobs:  # nothing to run: no Ray session (joining a cluster takes seconds)
        return []
    with ray_session(address) as ray:
        check_feasible(
            ray, cpus_per_job, gpus_per_job, "lower --cpus-per-member / --gpus-per-member or add a node that has them"
        )
        return _ray_map(ray, fn, jobs, cpus_per_job, gpus_per_job, retries, on_done)


def _local_map(
    fn: Callable[[Any], Any], jobs: Sequence[Any], retries: int, on_done: Callable[[int, JobResult], None] | None
) -> list[JobResult]:
    results = []
    for i, job in enumerate(jobs):
        ok, value, attempt = False, None, 0
        while not ok and attempt <= retries:
            ok, value = _call(fn, job)
            attempt += 1
        result = JobResult(i, ok, value if ok else None, None if ok else value, attempt)
        if on_done is not None:
            on_done(i, result)
        results.append(result)
    return results


def _ray_map(
    ray: Any,
    fn: Callable[[Any], Any],
    jobs: Sequence[Any],
    cpus: float,
    gpus: float,
    retries: int,
    on_done: Callable[[int, JobResult], None] | None,
) -> list[JobResult]:
    from ray.exceptions import RayError

    remote = ray.remote(_call).options(num_cpus=cpus, num_gpus=gpus, max_retries=retries, retry_exceptions=False)
    fn_ref = ray.put(fn)
    pending: dict[Any, tuple[int, int]] = {}  # ref -> (job index, attempt)
    for i, job in enumerate(jobs):
        pending[remote.remote(fn_ref, job)] = (i, 1)
    results: list[JobResult | None] = [None] * len(jobs)
    try:
        while pending:
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            i, attempt = pending.pop(ref)
            try:
                ok, value = ray.get(ref)
                crashed = False
            except RayError as exc:  # the worker or its node died more often than Ray retries
                ok, value, crashed = False, one_line(exc), True
            if not ok and not crashed and attempt <= retries:
                pending[remote.remote(fn_ref, jobs[i])] = (i, attempt + 1)
                continue
            result = JobResult(i, ok, value if ok else None, None if ok else value, attempt)
            results[i] = result
            if on_done is not None:
                on_done(i, result)
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    return [r for r in results if r is not None]


# ----------------------------------------------------------------------------- sharded runs


@dataclass(frozen=True)
class Shard:
    """What one worker needs: the task, the model to load, the run's context, the examples (a
    Ray object reference, fetched by the worker) and which of the task's batches to run."""

    task: Task
    model: str
    dtype: torch.dtype
    ctx: Context
    examples: Any
    batches: range


def plan_shards(costs: Sequence[int], workers: int) -> list[range]:
    """Contiguous runs of batch indices, one per worker (fewer when there are fewer batches),
    with about equal total cost each; together they cover every batch once, in order."""
    total, n = sum(costs), len(costs)
    bounds, run, k = [0], 0, 1
    for i, c in enumerate(costs):
        run += c
        while k < workers and run >= total * k / workers:
            bounds.append(i + 1)
            k += 1
    bounds.append(n)
    return [range(a, b) for a, b in itertools.pairwise(bounds) if b > a]


class _StatePickler(pickle.Pickler):
    """Pickles a state without its model (the driver has its own) and with every tensor on the CPU."""

    def __init__(self, file: io.BytesIO, model: Model) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.model = model

    def persistent_id(self, obj: Any) -> Any:
        if obj is self.model:
            return "model"
        if isinstance(obj, torch.Tensor) and obj.device.type != "cpu":
            return ("tensor", obj.cpu())
        return None


class _StateUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, model: Model) -> None:
        super().__init__(file)
        self.model = model

    def persistent_load(self, pid: Any) -> Any:
        if pid == "model":
            return self.model
        if isinstance(pid, tuple) and pid[0] == "tensor":
            return pid[1]
        raise pickle.UnpicklingError(f"unknown reference {pid!r} in a shard's state")


def pack_state(state: Any, model: Model) -> bytes:
    buf = io.BytesIO()
    _StatePickler(buf, model).dump(state)
    return buf.getvalue()


def unpack_state(data: bytes, model: Model) -> Any:
    return _StateUnpickler(io.BytesIO(data), model).load()


def run_shard(shard: Shard) -> tuple[bytes, int]:
    """On a worker: load the model, accumulate this shard's batches; the packed state and its batch count."""
    import ray

    from depthprobe.probes.base.runtime import seed_everything
    from depthprobe.probes.models.loading import load

    examples = ray.get(shard.examples) if isinstance(shard.examples, ray.ObjectRef) else shard.examples
    seed_everything(shard.ctx.config.seed)
    model = load(shard.model, device=shard.ctx.config.device, dtype=shard.dtype)
    with torch.no_grad():
        state, n = accumulate(shard.task, model, shard.ctx, examples, batches=shard.batches)
    return pack_state(state, model), n


def run_sharded(
    task: Task,
    model: Model,
    ctx: Context,
    examples: Examples,
    *,
    spec: str,
    dtype: torch.dtype,
    workers: int | None = None,
    address: str | None = None,
    on_examples: Callable[[int], None] | None = None,
) -> tuple[Output, int, int]:
    """``task`` over ``examples`` on Ray workers; returns its output, the batch count and the
    number of workers used. ``model`` is the driver's copy (it finalizes); ``spec`` is what each
    worker loads. A worker gets one GPU when the driver's model is on CUDA, else one CPU."""
    if not type(task).can_merge():
        raise ProbeError(f"task {task.name!r} defines no merge step, so it cannot run sharded; use --backend local")
    if workers is not None and workers < 1:
        raise ProbeError(f"--workers must be at least 1, got {workers}")
    batches = list(task.batches(model, examples, ctx))
    costs, sizes = batch_costs(batches), [len(b.items) for b in batches]
    del batches
    with ray_session(address) as ray:
        n_workers = workers or cluster_cpus(ray)
        shards = plan_shards(costs, n_workers)
        if not shards:  # a task whose work is all in finalize (no batches): nothing to shard
            return task.finalize(task.start(model, ctx, examples), ctx), 0, 0
        ref = ray.put(examples)
        jobs = [Shard(task, spec, dtype, ctx, ref, r) for r in shards]

        def done(i: int, result: JobResult) -> None:
            if on_examples is not None and result.ok:
                on_examples(sum(sizes[j] for j in shards[i]))

        gpus = 1 if model.device.type == "cuda" else 0
        check_feasible(ray, 1, gpus, "run with --device cpu or add a node with a GPU")
        results = _ray_map(ray, run_shard, jobs, 1, gpus, 0, done)
    for r in results:
        if not r.ok:
            raise ProbeError(f"shard {r.index + 1} of {len(shards)} failed on its worker: {r.error}")
    states = [unpack_state(r.value[0], model) for r in results]
    state = reduce(task.merge, states)
    return task.finalize(state, ctx), sum(r.value[1] for r in results), len(shards)
