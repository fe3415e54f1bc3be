"""The task protocol and the task registry.

A task is a small declarative object:

- ``name``, ``description`` and ``Options`` (a frozen dataclass of task-specific options,
  set from the CLI with ``--option key=value`` and from Python as keyword arguments);
- ``load(model, ctx)`` reads and validates the examples (bad input fails here, before any
  forward pass) and returns them as :class:`Examples`
  (a list that also counts what was skipped); ``memory_kinds`` names the in-memory data it reads
  instead of a file (``"lines"``, ``"tokens"``: :mod:`~depthprobe.probes.engine.inputs`);
- ``batches(model, examples, ctx)`` turns them into padded model inputs, batched by length
  (the default treats each example as a token-id sequence);
- ``hook_names(model, ctx)`` lists the TransformerLens hooks to capture;
- ``start(model, ctx, examples)`` returns a fresh state; ``accumulate(state, batch, acts)`` folds one
  batch's activations into running sums; ``finalize(state, ctx)`` returns a :class:`Output`;
- ``reducer(state, batch)`` (optional) returns ``reduce(name, tensor)``, applied to each captured
  activation as its hook fires: ``accumulate`` then gets what it returned, and the whole
  activation is freed during the pass (so a batch never holds every layer's attention maps);
- ``merge(a, b)`` combines two states for a sharded run (``probe run --backend ray``): both were
  started over the same examples (the whole run's) and each accumulated a disjoint, contiguous run
  of its batches, ``a``'s before ``b``'s. ``finalize(merge(a, b))`` must equal ``finalize`` of one
  state that accumulated every batch, to 1e-9: running sums are float64 and add, counts add,
  per-example lists concatenate in order (kept to their cap), and what a task computes once per
  run belongs in ``start`` (identical in both states: keep one) or ``finalize`` (runs once, on the
  merged state). It may update ``a`` in place and return it. The default refuses, so a task
  without it runs locally only.

``Task[OptionsT, StateT]`` is an abstract generic base: a task names its options dataclass and its
state type (``class Mine(Task[Options, State])``) and must define ``load``, ``hook_names``,
``start``, ``accumulate`` and ``finalize`` (a class that misses one cannot be instantiated, so it
cannot be registered); ``batches`` and ``wants_logits`` have defaults. The options dataclass named
in the base is the task's ``Options``.

Attention maps of a whole data set are never held at once: ``acts`` lives for one batch.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, NotRequired, TypedDict, TypeVar, get_args, get_origin

import pandas as pd

from depthprobe.probes.base.batching import Batch, length_batches
from depthprobe.probes.base.errors import ProbeError, suggest
from depthprobe.probes.base.options import check_ranges, coerce, field_types
from depthprobe.probes.base.registry import Registry
from depthprobe.probes.base.scores import SCORE_COLUMNS
from depthprobe.probes.engine.plugins import entry_point_origins, entry_point_tasks
from depthprobe.tasks import SWEEPS as SWEEP_LIBRARY
from depthprobe.tasks import TASKS as TASK_LIBRARY

if TYPE_CHECKING:  # only for annotations: loading models pulls in TransformerLens
    from depthprobe.probes.data.memory import InMemory
    from depthprobe.probes.hooks.capture import Captured, Reduce
    from depthprobe.probes.models.model import Model

OptionsT = TypeVar("OptionsT")  # a task's frozen Options dataclass
StateT = TypeVar("StateT")  # what start returns and accumulate folds batches into


@dataclass(frozen=True)
class NoOptions:
    pass


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines a run. Written into every artifact's manifest."""

    model: str
    task: str
    data: str | None = None
    limit: int | None = None
    batch_size: int = 32
    device: str | None = None
    seed: int = 0
    max_len: int = 128
    options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ProbeError(f"--batch-size must be at least 1, got {self.batch_size}")
        if self.limit is not None and self.limit < 1:
            raise ProbeError(f"--limit must be at least 1, got {self.limit}")
        if self.max_len < 4:
            raise ProbeError(f"--max-len must be at least 4, got {self.max_len}")

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["options"] = dict(self.options)
        return d


@dataclass(frozen=True)
class Context(Generic[OptionsT]):
    """What a task sees of the run: the config, its parsed options, and the data path or the
    data given in memory (``memory``; then ``data`` is None and ``config.data`` its label)."""

    config: RunConfig
    options: OptionsT
    memory: InMemory | None = None

    @property
    def data(self) -> Path | None:
        return None if self.config.data is None or self.memory is not None else Path(self.config.data)


class Examples(list):
    """A task's examples, plus how many inputs were skipped (over the length limit, ...)."""

    def __init__(self, items: Iterable[Any] = (), skipped: int = 0, why: str = "over --max-len") -> None:
        super().__init__(items)
        self.skipped = skipped
        self.why = why

    def head(self, n: int | None) -> Examples:
        return self if n is None else Examples(self[:n], self.skipped, self.why)


class HeatmapPanel(TypedDict):
    """A report panel: the layer x head heatmap of ``metric`` over the score rows matching ``where``."""

    title: str
    metric: str
    where: dict[str, Any]  # column -> value


class ViewPanel(TypedDict):
    """An attention view: ``pattern`` is [head, query, key] over ``tokens``; ``heads`` labels the heads."""

    title: str
    tokens: list[str]
    pattern: list[Any]  # nested lists of floats, [head][query][key]
    heads: list[str]
    causal: bool
    notes: NotRequired[list[str]]
    query: NotRequired[int]  # coref: the mention's word, whose row is the one read
    candidates: NotRequired[list[dict[str, Any]]]  # coref: the antecedent candidates with their attention


@dataclass
class Output:
    """What finalize returns: tidy scores, a short summary table and notes for the reader."""

    scores: pd.DataFrame
    summary: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    headline: dict[str, Any] = field(default_factory=dict)
    heatmaps: list[HeatmapPanel] = field(default_factory=list)  # pivoted from `scores`
    views: list[ViewPanel] = field(default_factory=list)
    plots: dict[str, str] = field(default_factory=dict)  # name -> SVG text
    files: dict[str, bytes] = field(default_factory=dict)  # extra artifact files


class Configurable:
    """A named plugin with a frozen ``Options`` dataclass, set with ``--option key=value``."""

    name: ClassVar[str]
    description: ClassVar[str]
    Options: ClassVar[type] = NoOptions

    def parse_options(self, options: dict[str, Any]) -> Any:
        fields = {f.name: f for f in dataclasses.fields(self.Options)}
        for key in options:
            if key not in fields:
                hint = suggest(key, fields)
                known = ", ".join(fields) or "none"
                raise ProbeError(f"task {self.name!r} has no option {key!r}{hint}; its options: {known}")
        where = f"task {self.name!r} option"
        types = field_types(self.Options)
        kwargs = {k: coerce(v, types[k], f"{where} {k}", key=k, flag="-O") for k, v in options.items()}
        return check_ranges(self.Options(**kwargs), f"{self.name}: option")


class Task(Configurable, ABC, Generic[OptionsT, StateT]):
    """A task: read examples, capture hooks batch by batch into a state, finish into an Output."""

    needs_text: ClassVar[bool] = True
    memory_kinds: ClassVar[frozenset[str]] = frozenset()  # in-memory data it reads: "lines", "tokens"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """``class Mine(Task[Options, State])`` also sets ``Mine.Options = Options`` (the options
        dataclass is named once); a class that sets ``Options`` itself keeps its own."""
        super().__init_subclass__(**kwargs)
        if "Options" in cls.__dict__:
            return
        for base in cls.__dict__.get("__orig_bases__", ()):
            args = get_args(base)
            if get_origin(base) is Task and args and isinstance(args[0], type) and dataclasses.is_dataclass(args[0]):
                cls.Options = args[0]

    def wants_logits(self, model: Model) -> bool:
        """Whether forward passes must run to the logits (else they stop at the last hook)."""
        return False

    @abstractmethod
    def load(self, model: Model, ctx: Context[OptionsT]) -> Examples:
        """The validated examples (bad input fails here, before any forward pass)."""

    def batches(self, model: Model, examples: list[Any], ctx: Context[OptionsT]) -> Iterator[Batch]:
        """Default: the examples are token-id sequences, padded and batched by length."""
        return length_batches(examples, examples, ctx.config.batch_size, model.pad_id)

    @abstractmethod
    def hook_names(self, model: Model, ctx: Context[OptionsT]) -> list[str]:
        """The TransformerLens hooks to capture."""

    @abstractmethod
    def start(self, model: Model, ctx: Context[OptionsT], examples: Examples) -> StateT:
        """A fresh state for a run over ``examples``."""

    def reducer(self, state: StateT, batch: Batch) -> Reduce | None:
        """``reduce(name, tensor)`` for this batch's captures (float32 copies of half-precision
        ones), kept in ``acts`` in place of the activation; None (the default) keeps them whole.
        It must return a hook it does not reduce unchanged (an ``ablation`` adds its own hooks)."""
        return None

    @abstractmethod
    def accumulate(self, state: StateT, batch: Batch, acts: Captured) -> None:
        """Fold one batch's captured activations into ``state`` (they live for this batch only)."""

    @abstractmethod
    def finalize(self, state: StateT, ctx: Context[OptionsT]) -> Output:
        """The run's output from the accumulated state."""

    def merge(self, a: StateT, b: StateT) -> StateT:
        """Combine two states over disjoint, contiguous runs of batches (``a``'s first); see the
        module docstring. The default refuses: such a task runs with the local backend only."""
        raise ProbeError(f"task {self.name!r} defines no merge step, so it cannot run sharded; use --backend local")

    @classmethod
    def can_merge(cls) -> bool:
        """Whether the task defines :meth:`merge` (a sharded run checks this before any work)."""
        return cls.merge is not Task.merge


TASKS: Registry[Task[Any, Any]] = Registry("task", Task)
# The task library's table (it imports nothing): a task's module is imported on first use; then
# installed packages' `depthprobe.tasks` entry points, the same way (probes/engine/plugins.py).
TASKS.register_lazy(TASK_LIBRARY)
_INSTALLED = entry_point_tasks(set(TASK_LIBRARY))
TASKS.register_lazy(_INSTALLED, entry_point_origins(_INSTALLED))
# @register on a Task subclass adds it to the library; registering the same name again from the
# same module (a re-run notebook cell, a reloaded module) replaces it
register = TASKS.register_class


def get_task(name: str) -> Task[Any, Any]:
    """The registered task ``name`` (its module imported on first use); an unknown name is a
    :class:`ProbeError` suggesting close matches."""
    return TASKS.get(name)


def task_names() -> list[str]:
    """Every registered task's name, sorted: the library's, installed packages' and the user's."""
    return TASKS.names()


@dataclass(frozen=True)
class SweepConfig:
    task: str
    depths: tuple[int, ...]
    seed: int = 0
    device: str | None = None
    options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if not self.depths:
            raise ProbeError("--depths needs at least one depth, e.g. --depths 1,2,4")
        if any(d < 1 for d in self.depths):
            raise ProbeError(f"--depths must be positive integers, got {list(self.depths)}")

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["options"] = dict(self.options)
        return d


class Sweep(Configurable, ABC):
    """A depth sweep (``probe sweep --task NAME``): one model per depth, identical settings and
    seeds, one table and plots.

    The members are independent jobs, so that a sweep can run them in this process or as Ray
    tasks (``probe sweep --backend ray``):

    - ``jobs(config, options)`` validates everything (bad input fails here, before any member
      runs) and returns one picklable description per member, in table order;
    - ``run_job(job)`` runs one member from its description alone (whatever members share is
      recomputed deterministically inside, or travels in the job) and returns a picklable
      result (rows, curves, CPU arrays);
    - ``combine(config, options, results)`` builds the sweep's :class:`Output` from the results,
      in job order.

    ``run`` is ``combine`` over ``run_job`` of each job in order, in this process.
    """

    @abstractmethod
    def jobs(self, config: SweepConfig, options: Any) -> list[Any]:
        """One picklable job per member, validated up front."""

    @abstractmethod
    def run_job(self, job: Any, progress: bool = False) -> Any:
        """One member's picklable result."""

    @abstractmethod
    def combine(self, config: SweepConfig, options: Any, results: list[Any]) -> Output:
        """The sweep's table and plots from every member's result (in job order)."""

    def job_name(self, job: Any) -> str:
        """How errors name a member (a job's ``name`` attribute when it has one)."""
        return str(getattr(job, "name", job))

    def run(self, config: SweepConfig, options: Any, progress: bool) -> Output:
        """The sweep's table and plots, every member run here, one after another."""
        jobs = self.jobs(config, options)
        return self.combine(config, options, [self.run_job(job, progress) for job in jobs])


SWEEPS: Registry[Sweep] = Registry("sweep task", Sweep)
SWEEPS.register_lazy(SWEEP_LIBRARY)
register_sweep = SWEEPS.register_class  # @register_sweep on a Sweep subclass


def get_sweep(name: str) -> Sweep:
    return SWEEPS.get(name)


def parse_depths(text: str) -> tuple[int, ...]:
    try:
        depths = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise ProbeError(f"--depths expects comma-separated integers like 1,2,4, got {text!r}") from None
    return depths


def add_sums(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two dicts of running sums (tensors or numbers) added key by key; a key in one only is kept."""
    return {k: a[k] + b[k] if k in a and k in b else a.get(k, b.get(k)) for k in {**a, **b}}


def tidy(rows: Iterable[dict[str, Any]] | pd.DataFrame, model: str, task: str) -> pd.DataFrame:
    """Rows (or a frame) -> the tidy score table with the standard columns first.

    Each row is a dict with ``layer``, ``head`` (0-indexed; missing or None for model-level
    numbers), ``metric`` and ``value``, plus any task columns; ``model`` and ``task`` are filled in
    when absent. This is the ``scores`` a task's :class:`Output` carries and ``scores.csv`` holds."""
    df = rows.copy() if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    if df.empty:
        return pd.DataFrame(columns=SCORE_COLUMNS)
    if "model" not in df:
        df.insert(0, "model", model)
    if "task" not in df:
        df.insert(1, "task", task)
    rest = [c for c in df.columns if c not in SCORE_COLUMNS]
    return df[[c for c in SCORE_COLUMNS if c in df.columns] + rest]
