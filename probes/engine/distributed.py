"""Running work on a Ray cluster: sharded task runs and a job map with retries.

Ray is an optional dependency (``pip install 'depthprobe[ray]'``): it is imported only inside the
functions here that need it, so the local backend never imports it.

- :func:`run_sharded` runs one task over its examples on N Ray workers. The driver has loaded the
  model and the examples (bad input fails there, before any work) and plans the task's batches
  exactly as a local run would; each worker loads the model by name, starts a state over all the
  examples, accumulates one contiguous run of the batches and sends back its state (tensors on the
  CPU; the model reference stays behind). The driver merges the states in batch order
  (:meth:`Task.merge`) and finalizes once. No attention map leaves a worker. A worker runs torch on
  the driver's CPU thread count (:func:`shard_threads`), and reserves as many CPUs: torch splits
  large float32 reductions by thread, so another count would round them differently.
- :func:`map_jobs` runs ``fn(job)`` for every job: locally in order, locally in parallel spawned
  processes (``processes``), or as Ray tasks with the given resources; one retry loop serves all
  three, each job reports to ``on_done`` as it finishes, and a failure comes back as data (its one
  line and whether it was a user error, a :class:`ProbeError`), never as text to parse.

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
from depthprobe.probes.base.runtime import torch_threads
from depthprobe.probes.engine.execute import accumulate, batch_costs
from depthprobe.probes.engine.processes import LocalProcesses, Outcome, call, one_line
from depthprobe.probes.engine.ray_cluster import (
    LOST_AFTER_S,
    POLL_S,
    ClusterLost,
    HeadWatch,
    check_feasible,
    cluster_cpus,
    ray_session,
    require_ray,
)
from depthprobe.probes.engine.task import Context, Examples, Output, Task
from depthprobe.probes.models.model import Model

__all__ = [
    "BACKENDS", "JobResult", "check_backend", "check_jobs", "check_member_backend", "local_slots", "map_jobs",
    "run_sharded", "shard_threads",
]  # fmt: skip

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
    calls of ``fn`` made for it (a node that died is retried by Ray within one attempt).
    ``user_error``: the job raised a :class:`ProbeError` (``error`` is then its message, which
    names the fix); anything else is ``Type: message``. ``crashed``: its process, Ray worker or
    node died under it (the machine's fate, neither the user's error nor the library's)."""

    index: int
    ok: bool
    value: Any
    error: str | None
    attempts: int
    user_error: bool = False
    crashed: bool = False

    def failure(self) -> str | None:
        """The one line a failed job records: a user error as it is (it names the fix), a death
        of its process or node said as such, anything else marked as an internal error."""
        if self.ok:
            return None
        error = self.error or "unknown error"
        if self.user_error or self.crashed:
            return error
        return f"internal error: {error}"


def local_slots(threads_per_job: int = 1) -> int:
    """How many jobs this machine runs at once at ``threads_per_job`` threads each (its usable cores)."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, threads_per_job))


def check_jobs(processes: int) -> None:
    """A job count: a whole number, 1 or more."""
    if not isinstance(processes, int) or isinstance(processes, bool):
        raise ProbeError(f"--jobs takes a whole number or auto, got {processes!r}; e.g. --jobs 2")
    if processes < 1:
        raise ProbeError(f"--jobs must be at least 1, got {processes}")


def map_jobs(
    fn: Callable[[Any], Any],
    jobs: Sequence[Any],
    *,
    backend: str = "local",
    address: str | None = None,
    cpus_per_job: float = 1,
    gpus_per_job: float = 0,
    retries: int = 0,
    processes: int = 1,
    setup: Callable[[], None] | None = None,
    on_done: Callable[[int, JobResult], None] | None = None,
    order: Sequence[int] | None = None,
) -> list[JobResult]:
    """``fn(job)`` for every job, as :class:`JobResult` in job order.

    ``fn`` is a picklable top-level function. ``local``: with ``processes`` 1, in order in this
    process; with more, up to that many at once in member processes (forked from a fork server
    that has imported torch, or spawned: :mod:`.processes`), each with ``cores // processes``
    torch threads, after ``setup()`` (a picklable callable that prepares the process, e.g. hands
    it what the driver has already read); Ray is not imported either way. ``ray``: each job is a
    Ray task with ``cpus_per_job`` CPUs and ``gpus_per_job`` GPUs. A job whose ``fn`` raises is run
    again up to ``retries`` times (the same loop for every backend), and so is a job whose local
    process died (the other processes keep their jobs); a job whose Ray worker or node dies is
    resubmitted by Ray up to ``retries`` times. A job that still fails is ``ok=False`` with
    its error; the others go on. ``on_done(index, result)`` runs here, on the driver, as each job
    finishes (in completion order). ``order`` (a permutation of the job indices): the order jobs
    are handed to member processes or Ray, e.g. longest first, so that a long job started last does
    not run alone while the other processes idle; in this process jobs run in job order.
    Ctrl-C cancels the outstanding jobs and re-raises."""
    check_backend(backend)
    check_jobs(processes)
    _check_placing(len(jobs), retries, cpus_per_job, gpus_per_job, order)
    if backend == "local" and (processes == 1 or len(jobs) < 2):
        return _drive(_InProcess(fn, jobs), len(jobs), retries, on_done)
    if backend == "local":
        n = min(processes, len(jobs))
        with LocalProcesses(fn, jobs, n, max(1, local_slots() // n), setup) as pool:
            return _drive(pool, len(jobs), retries, on_done, order)
    if not jobs:  # nothing to run: no Ray session (joining a cluster takes seconds)
        return []
    with ray_session(address) as ray:
        check_feasible(
            ray, cpus_per_job, gpus_per_job, "lower --cpus-per-member / --gpus-per-member or add a node that has them"
        )
        finished = [0]

        def done(i: int, result: JobResult) -> None:
            finished[0] += 1
            if on_done is not None:
                on_done(i, result)

        try:
            ray_jobs = _OnRay(ray, fn, jobs, cpus_per_job, gpus_per_job, retries)
            return _drive(ray_jobs, len(jobs), retries, done, order)
        except ClusterLost as exc:
            raise ClusterLost(
                f"{exc}; the {finished[0]} of {len(jobs)} members that finished are kept "
                "(rerun the same command when the cluster is back to run the rest)"
            ) from None


def _check_placing(n: int, retries: int, cpus: float, gpus: float, order: Sequence[int] | None) -> None:
    if order is not None and sorted(order) != list(range(n)):
        raise ProbeError(f"order must be a permutation of the {n} job indices, got {list(order)}")
    if retries < 0:
        raise ProbeError(f"--retries must be 0 or more, got {retries}")
    if cpus < 0 or gpus < 0:
        raise ProbeError("CPUs and GPUs per job must be 0 or more")


def _drive(
    runner: Any,
    n: int,
    retries: int,
    on_done: Callable[[int, JobResult], None] | None,
    order: Sequence[int] | None = None,
) -> list[JobResult]:
    """The one retry loop: submit every job (in ``order``, default job order), take each outcome
    as it comes, resubmit a failed call or a crashed member process up to ``retries`` times (a
    crashed Ray worker Ray has already retried: ``runner.retries_crashes``), report each job once."""
    pending: dict[Any, tuple[int, int]] = {}  # handle -> (job index, attempt)
    results: list[JobResult | None] = [None] * n
    try:
        for i in range(n) if order is None else order:
            pending[runner.submit(i)] = (i, 1)
        while pending:
            handle, out = runner.next_done(pending)
            i, attempt = pending.pop(handle)
            if not out.ok and not (out.crashed and runner.retries_crashes) and attempt <= retries:
                pending[runner.submit(i)] = (i, attempt + 1)
                continue
            result = results[i] = JobResult(i, out.ok, out.value, out.error, attempt, out.user_error, out.crashed)
            if on_done is not None:
                on_done(i, result)
    except ClusterLost:  # nothing to cancel: the cluster took its jobs with it
        raise
    except BaseException:
        runner.cancel(list(pending))
        raise
    return [r for r in results if r is not None]


class _InProcess:
    """Jobs run here, one at a time, lowest index first (so a retry runs before the next job)."""

    retries_crashes = False

    def __init__(self, fn: Callable[[Any], Any], jobs: Sequence[Any]) -> None:
        self.fn, self.jobs, self.count = fn, jobs, itertools.count()

    def submit(self, i: int) -> tuple[int, int]:
        return (i, next(self.count))

    def next_done(self, pending: dict[Any, tuple[int, int]]) -> tuple[Any, Outcome]:
        handle = min(pending)
        return handle, call(self.fn, self.jobs[handle[0]])

    def cancel(self, handles: list[Any]) -> None:
        pass


class _OnRay:
    """Jobs as Ray tasks; a worker or node that dies is retried by Ray itself."""

    retries_crashes = True

    def __init__(
        self, ray: Any, fn: Callable[[Any], Any], jobs: Sequence[Any], cpus: float, gpus: float, retries: int
    ) -> None:
        self.ray, self.jobs = ray, jobs
        self.remote = ray.remote(call).options(
            num_cpus=cpus, num_gpus=gpus, max_retries=retries, retry_exceptions=False
        )
        self.fn_ref = ray.put(fn)
        self.watch = HeadWatch(ray.get_runtime_context().gcs_address)

    def submit(self, i: int) -> Any:
        return self.remote.remote(self.fn_ref, self.jobs[i])

    def next_done(self, pending: dict[Any, tuple[int, int]]) -> tuple[Any, Outcome]:
        """The next finished job; :class:`ClusterLost` when the cluster's head stops answering
        (checked while waiting, and when a job's worker or node dies)."""
        from ray.exceptions import GetTimeoutError, RayError

        ready: list[Any] = []
        while not ready:
            ready, _ = self.ray.wait(list(pending), num_returns=1, timeout=POLL_S)
            if not ready:
                self.watch.check()
        while True:  # a lost result may be rebuilt by resubmitting its task: never wait on it blindly
            try:
                return ready[0], self.ray.get(ready[0], timeout=POLL_S)
            except GetTimeoutError:
                self.watch.check()
            except RayError as exc:  # the worker or its node died more often than Ray retries
                self.watch.check(wait_s=LOST_AFTER_S + POLL_S)  # or the whole cluster went
                return ready[0], Outcome(False, error=f"its Ray worker or node died ({one_line(exc)})", crashed=True)

    def cancel(self, handles: list[Any]) -> None:
        for ref in handles:
            self.ray.cancel(ref, force=True)


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
    threads: int = 1  # torch CPU threads: the driver's (see shard_threads)


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
    with torch.no_grad(), torch_threads(shard.threads):
        state, n = accumulate(shard.task, model, shard.ctx, examples, batches=shard.batches)
    return pack_state(state, model), n


def shard_threads(ray: Any, gpus: float) -> int:
    """Torch threads for each worker of a sharded run, and the CPUs it reserves: the driver's own
    thread count (what a local run uses), so that every float32 sum of a batch splits across
    threads, and rounds, as in the local run; at most the CPUs of the largest live node with the
    GPUs a worker needs (on a smaller node the worker would never start)."""
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    largest = max((int(r.get("CPU", 0)) for r in nodes if r.get("GPU", 0) >= gpus), default=1)
    return max(1, min(torch.get_num_threads(), largest))


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
    worker loads. A worker gets one GPU when the driver's model is on CUDA, and the CPUs of
    :func:`shard_threads`; by default there are as many workers as such shares fit the cluster."""
    if not type(task).can_merge():
        raise ProbeError(f"task {task.name!r} defines no merge step, so it cannot run sharded; use --backend local")
    if workers is not None and workers < 1:
        raise ProbeError(f"--workers must be at least 1, got {workers}")
    batches = list(task.batches(model, examples, ctx))
    costs, sizes = batch_costs(batches), [len(b.items) for b in batches]
    del batches
    gpus = 1 if model.device.type == "cuda" else 0
    with ray_session(address) as ray:
        threads = shard_threads(ray, gpus)
        n_workers = workers or max(1, cluster_cpus(ray) // threads)
        shards = plan_shards(costs, n_workers)
        if not shards:  # a task whose work is all in finalize (no batches): nothing to shard
            return task.finalize(task.start(model, ctx, examples), ctx), 0, 0
        ref = ray.put(examples)
        jobs = [Shard(task, spec, dtype, ctx, ref, r, threads) for r in shards]

        def done(i: int, result: JobResult) -> None:
            if on_examples is not None and result.ok:
                on_examples(sum(sizes[j] for j in shards[i]))

        check_feasible(ray, threads, gpus, "run with --device cpu or add a node with a GPU")
        try:
            results = _drive(_OnRay(ray, run_shard, jobs, threads, gpus, 0), len(jobs), 0, done)
        except ClusterLost as exc:
            raise ClusterLost(
                f"{exc}; the run stopped and nothing was written (rerun it when the cluster is back)"
            ) from None
    for r in results:
        if not r.ok:
            raise ProbeError(f"shard {r.index + 1} of {len(shards)} failed on its worker: {r.error}")
    states = [unpack_state(r.value[0], model) for r in results]
    state = reduce(task.merge, states)
    return task.finalize(state, ctx), sum(r.value[1] for r in results), len(shards)
