"""Which members train together, and how many member processes a GPU holds: the runner's units.

A study's members are mapped as units (``engine.distributed.map_jobs``): a member job alone, or a
:class:`Batch` of members of one shape that a family trains as one batched model
(:func:`probes.training.batched.train_batched`; law families: :func:`.law_member.run_law_batch`). Each member of a
batch still gets its own folder, files and row, exactly as when trained alone.

``--batch-members`` (a law family's Config field ``batch_members``):

- ``off`` (or 1): every member alone, as before batching existed;
- ``N``: members of one shape (the same network but its seed: depth, width, heads, vocabulary,
  context; they differ in seed, task level, group) in batches of at most N, in plan order;
- ``auto`` (the default): on CUDA, batches of at most :data:`AUTO_CUDA` (the members are
  launch-bound there: issue #36 measured 10-12 ms a step on an H200 whatever the width); on a CPU,
  batches of at most :data:`AUTO_CPU` members of width at most :data:`AUTO_CPU_WIDTH`, where
  ``bench/bench_batched_members.py`` measured a gain on 2 shared cores (1.69x at width 16), and
  none at width 64 (0.94-1.05x, compute-bound), so wider members train alone. With ``--jobs P``
  ``auto`` cuts a shape's members into at least P batches where it can, so that the processes
  all have work.

``--jobs`` not given (:func:`auto_jobs`): on a CPU 1, as always; on CUDA as many member processes
as the GPU's free memory holds (each unit's estimated training memory plus a CUDA context), at most
the host's cores and :data:`MAX_AUTO_JOBS`. ``--jobs auto`` (:func:`cpu_jobs`): on a CPU, the
usable cores when the plan's estimated work (each member's training FLOPs plus its family's
``member_overhead_s``) gains more wall time from them than the member processes add
(:data:`PROCESS_START_S`), else 1 (members in the driver); on CUDA as when not given.

``--jobs N`` (N > 1, local): the fork server the member processes fork from starts before the
study plans (:func:`warm_members`), importing what a member needs (:data:`MEMBER_MODULES` and the
family's module: :func:`member_modules`) while the driver does the same.

Pure functions of their arguments (no torch), tested on given numbers (tests/experiments/test_batching.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from depthprobe.probes.base.errors import ProbeError

AUTO_CUDA = 8  # members per batch under auto on CUDA
AUTO_CPU = 4  # members per batch under auto on a CPU (the bench's 4)
AUTO_CPU_WIDTH = 32  # widest member batched under auto on a CPU (measured: a gain at 16, none at 64)
CUDA_CONTEXT_BYTES = 512 * 2**20  # a CUDA context per member process (about 300-500 MB)
MEMORY_SHARE = 0.8  # of the GPU's free memory that auto --jobs fills
# Wall seconds member processes add to a study: the fork server imports torch and the project on
# another core while the driver plans (and the driver's own first member would import them too),
# so what is left is forking, pipes and the imports not overlapped: measured 0.1-0.4 s on the law
# smoke presets (bench/bench_jobs.py --smoke-all); 1 s leaves a margin.
PROCESS_START_S = 1.0
MEMBER_MODULES = (  # what every built-in family's member imports on its first run (python -X importtime)
    "transformer_lens.model_bridge",
    "depthprobe.probes.experiments.batching",
    "depthprobe.probes.api.depth_usage",
    "depthprobe.tasks.depth_usage.task",
)
KIND_MODULES = {  # what the members of one kind of family import beyond those (petty, khop: -X importtime)
    "text": (
        "matplotlib.pyplot",
        "depthprobe.probes.models.variant_net",
        "depthprobe.probes.hooks.interventions",
        "depthprobe.tasks.induction.task",
        "depthprobe.tasks.kernels.task",
        "depthprobe.tasks.attention_stats",
    ),
    "law": ("depthprobe.probes.experiments.law_member", "depthprobe.probes.engine.inputs"),
}
KINDS = {"levine": "text", "petty": "text", "spa": "text", "khop": "law", "crasp": "law", "groups": "law"}
MAX_AUTO_JOBS = 4  # the issue measured 3 processes on one H200 (2.2x the throughput of 1); more is unmeasured


@dataclass(frozen=True)
class Batch:
    """Members of one shape trained as one batched model; the runner records each as its own."""

    jobs: tuple[Any, ...]

    @property
    def name(self) -> str:
        """The progress lines' label: the first member and how many more."""
        return f"{self.jobs[0].name}+{len(self.jobs) - 1}"


Outcome = tuple[Any, str | None]  # (a member's MemberOutput, or None and its one-line error)


def read_batch_members(text: str) -> str | int:
    """``--batch-members``' text: ``auto``, ``off`` or a number of members (1: off)."""
    word = text.strip().lower()
    if word in ("auto", "off"):
        return word
    try:
        return int(word)
    except ValueError:
        raise ProbeError(f"--batch-members must be auto, off or a number of members, got {text!r}") from None


def read_jobs(text: str | None) -> int | Literal["auto"] | None:
    """``--jobs`` as typed: a whole number (its range is checked with the other settings),
    ``auto``, or None when not given."""
    if text is None:
        return None
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise ProbeError(f"--jobs takes a whole number or auto, got {text!r}; e.g. --jobs 2") from None


def check_batch_members(value: Any) -> None:
    if value in ("auto", "off") or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return
    raise ProbeError(f"--batch-members must be auto, off or a number of members of 1 or more, got {value!r}")


def batch_size(mode: str | int, device_type: str, width: int) -> int:
    """Members per batch of one shape of ``width``: ``mode`` as given, ``auto`` by device and width."""
    if mode == "off":
        return 1
    if mode != "auto":
        return int(mode)
    if device_type == "cuda":
        return AUTO_CUDA
    return AUTO_CPU if device_type == "cpu" and width <= AUTO_CPU_WIDTH else 1


def plan_units(
    jobs: Sequence[Any], shape: Callable[[Any], Hashable], size: Callable[[Any], int], processes: int, auto: bool
) -> list[Any]:
    """The units to map: runs of members of one ``shape`` cut into batches of at most ``size(job)``
    (``auto``: and into at least ``processes`` batches per shape where it has that many members);
    a batch of one is the job itself. Members keep their plan order within a batch."""
    by_shape: dict[Hashable, list[Any]] = {}
    for job in jobs:
        by_shape.setdefault(shape(job), []).append(job)
    units: list[Any] = []
    for members in by_shape.values():
        cap = max(1, size(members[0]))
        if auto:
            cap = min(cap, math.ceil(len(members) / max(1, processes)))
        for start in range(0, len(members), cap):
            part = members[start : start + cap]
            units.append(part[0] if len(part) == 1 else Batch(tuple(part)))
    return units


def members(unit: Any) -> tuple[Any, ...]:
    """The member jobs of a unit."""
    return unit.jobs if isinstance(unit, Batch) else (unit,)


def run_unit(exp: Any, unit: Any) -> list[Outcome]:
    """One unit where it runs: a member alone (its failure raises, so the job map retries it), or
    a batch (:meth:`Experiment.run_batch`: a training failure raises for the whole batch; each
    member's own evaluation and files fail only that member)."""
    if isinstance(unit, Batch):
        return exp.run_batch(unit.jobs)
    return [(exp.run_member(unit), None)]


def longest_first(exp: Any, cfg: Any, units: Sequence[Any], context: Any) -> list[int] | None:
    """The order to hand ``units`` to member processes: the largest estimated work first (a unit's
    members' training FLOPs from :meth:`Experiment.plan_row`), ties in plan order, so that the
    longest member does not start last and run alone while the other processes idle (list
    scheduling, longest first). None when a member's FLOPs are not known (plan order)."""
    flops = [[exp.plan_row(cfg, job, context).get("flops") for job in members(unit)] for unit in units]
    if any(f is None for unit in flops for f in unit):
        return None
    work = [sum(float(f) for f in unit) for unit in flops]
    return sorted(range(len(units)), key=lambda i: (-work[i], i))


def auto_jobs(free_bytes: int | None, unit_bytes: int | None, cores: int, units: int) -> int:
    """Member processes on one GPU when ``--jobs`` is not given: what ``MEMORY_SHARE`` of the free
    memory holds at ``unit_bytes`` plus a CUDA context each, at most ``cores`` (each process keeps
    a core busy launching kernels), :data:`MAX_AUTO_JOBS` and the ``units`` to run; 1 when the
    memory or a unit's need is unknown."""
    if free_bytes is None or unit_bytes is None or units < 1:
        return 1
    by_memory = int(MEMORY_SHARE * free_bytes) // (unit_bytes + CUDA_CONTEXT_BYTES)
    return max(1, min(by_memory, cores, MAX_AUTO_JOBS, units))


def cpu_jobs(work_s: Sequence[float | None], cores: int, overhead_s: float = 2.0) -> int:
    """``--jobs auto`` on a CPU: ``cores`` slots (at most one per member) when the members'
    estimated CPU seconds (None: unknown, taken as large), each plus ``overhead_s`` (the family's
    ``member_overhead_s``), gain more wall time from them than the member processes add
    (:data:`PROCESS_START_S`); else 1."""
    n = max(1, min(cores, len(work_s)))
    if n == 1 or any(w is None for w in work_s):
        return n
    work = sum(float(w) + overhead_s for w in work_s if w is not None)
    return n if work * (1 - 1 / n) > PROCESS_START_S else 1


def warm_members(family: str, backend: str, jobs: Any) -> None:
    """``--jobs N`` (N > 1, local), and ``auto`` for a text family on a machine of 2 or more cores:
    start the fork server now, importing what the family's members need (:func:`member_modules`),
    so that it imports while the driver plans. ``auto`` chooses after planning, and a text study
    plans slowly (it reads and tokenizes its corpus): a server started after the choice made the
    petty smoke study's members wait for its imports (13.5-16.3 s against 9.6 s with ``--jobs 2``).
    A law family plans in a moment, so under ``auto`` it starts the server once it has chosen more
    than 1 (a server started early for a law smoke study, which then ran in the driver, cost 0.2 s
    and 4 CPU-s). Nothing for anything else (a bad ``--jobs`` is refused later)."""
    from depthprobe.probes.engine.distributed import local_slots

    if jobs == "auto":
        jobs = local_slots() if KINDS.get(family) == "text" else 1
    if backend != "local" or not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 2:
        return
    from depthprobe.probes.engine.processes import warm_up

    warm_up(member_modules(family))


def member_modules(family: str) -> tuple[str, ...]:
    """What the fork server preloads for ``family``'s members: :data:`MEMBER_MODULES`, those of
    its kind (:data:`KIND_MODULES`; a family of no known kind gets none) and its own module; no
    more, since a member waits until the server has imported them all."""
    return (*MEMBER_MODULES, *KIND_MODULES.get(KINDS.get(family, ""), ()), *family_module(family))


def family_module(family: str) -> tuple[str, ...]:
    """The module that defines a built-in family, or a registered one's (a plugin file's module is
    not importable by name: its members load it at setup), without importing it."""
    from depthprobe.probes.experiments.protocol import BUILT_IN, EXPERIMENTS

    if family in BUILT_IN:
        return (BUILT_IN[family].partition(":")[0],)
    try:
        module = type(EXPERIMENTS.get(family)).__module__
    except ProbeError:  # planning refuses it in one line
        return ()
    return () if module.startswith("depthprobe_plugin_") else (module,)


def chosen_jobs(exp: Any, cfg: Any, jobs: list[Any], context: Any, say: Callable[[str], None]) -> int | None:
    """``--jobs auto``: on a CPU :func:`cpu_jobs` of the plan's estimated CPU minutes, said in one
    line; on CUDA None (as when not given: :func:`default_jobs`)."""
    from depthprobe.probes.engine.distributed import local_slots
    from depthprobe.probes.models.device import resolve_device

    if resolve_device(getattr(cfg, "device", None)).type == "cuda":
        return None
    minutes = [exp.plan_row(cfg, job, context).get("cpu_minutes") for job in jobs]
    work = [None if m is None else 60.0 * float(m) for m in minutes]
    n = cpu_jobs(work, local_slots(), exp.member_overhead_s)
    known = sum(w + exp.member_overhead_s for w in work if w is not None)
    say(
        f"--jobs {n} (chosen: {len(jobs)} members of about {known:.1f} CPU-s estimated, member processes "
        f"add about {PROCESS_START_S:.0f} s, {local_slots()} cores; pass --jobs N to choose)"
    )
    warm_members(exp.name, "local", n)
    return n


def default_jobs(exp: Any, cfg: Any, units: list[Any], say: Callable[[str], None]) -> int:
    """``--jobs`` not given: 1 on a CPU (as always); on CUDA :func:`auto_jobs` of the GPU's free
    memory, the largest unit's estimated need (:meth:`Experiment.member_bytes` summed over its
    members) and the host's cores, said in one line."""
    from depthprobe.probes.engine.distributed import local_slots
    from depthprobe.probes.models.device import available_memory, resolve_device

    dev = resolve_device(cfg.device)
    if dev.type != "cuda" or not units:
        return 1
    needs = [[exp.member_bytes(cfg, job) for job in members(unit)] for unit in units]
    unit_bytes = None if any(n is None for need in needs for n in need) else max(sum(need) for need in needs)
    free, cores = available_memory(dev), local_slots()
    n = auto_jobs(free, unit_bytes, cores, len(units))
    gib = "unknown" if free is None else f"{free / 2**30:.1f} GiB"
    say(f"--jobs {n} (chosen: {gib} free on the GPU, {cores} cores, {len(units)} units; pass --jobs to choose)")
    return n


__all__ = [
    "AUTO_CPU",
    "AUTO_CPU_WIDTH",
    "AUTO_CUDA",
    "KIND_MODULES",
    "MEMBER_MODULES",
    "PROCESS_START_S",
    "Batch",
    "Outcome",
    "auto_jobs",
    "batch_size",
    "check_batch_members",
    "chosen_jobs",
    "cpu_jobs",
    "default_jobs",
    "family_module",
    "longest_first",
    "member_modules",
    "members",
    "plan_units",
    "read_batch_members",
    "read_jobs",
    "run_unit",
    "warm_members",
]
