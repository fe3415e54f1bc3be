"""What a depth family is: one :class:`Experiment` subclass, registered by name.

A family says what its study is (``Config``: a frozen dataclass, ``Literal`` choices checked by
:func:`~depthprobe.probes.base.options.check_choices`, its own ranges in ``__post_init__``), what its
presets set and cost, how a config becomes member jobs (:meth:`Experiment.plan`), what one member
computes (:meth:`Experiment.measure`: its files and its row, run in its folder by the default
:meth:`Experiment.run_member`), how finished members become the
study's tables (:meth:`Experiment.tables`) and which report sections those tables draw
(:meth:`Experiment.page`). Everything else (the study folder, ``study.json``, resume, damaged
members, failure rows, ``members.csv``, ``plan.csv``, ``--jobs``, Ray, the page's frame) is the
runner's (:mod:`.runner`), the same for every family.

A member's row holds what the tables group by (depth, width, seed, control, group...) as columns;
nothing is parsed back from a member's name. A job is a frozen dataclass with a ``name`` (the
member's folder under ``members/``) and a ``dest`` (set by the runner: where a local member writes
its own folder; None on Ray, where the files come back as bytes).

Families join :data:`EXPERIMENTS` like tasks join theirs: the built-in ones lazily by module
reference (listing names imports nothing), a user's with :func:`register_experiment` (a plugin
file given to ``probe study --plugin``) or an installed package's ``depthprobe.experiments``
entry point. This module imports neither torch nor pandas.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from depthprobe.probes.base.errors import ProbeError, suggest
from depthprobe.probes.base.options import (
    check_choices,
    check_seed,
    coerce,
    field_types,
    out_of_range,
    range_text,
)
from depthprobe.probes.base.registry import Registry
from depthprobe.probes.engine.plugins import entry_point_origins, entry_point_tasks
from depthprobe.probes.experiments.folder import MemberOutput, measure_member

if TYPE_CHECKING:
    import pandas as pd

ENTRY_POINT_GROUP = "depthprobe.experiments"
FAMILY_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")  # what --family takes
RUN_COLUMNS = ["wall_s", "device", "status", "error"]  # members.csv's last columns: how each member ran
MAX_DEPTH = 1000  # layers of a member
MAX_SEEDS = 1000  # seeds per study (a plan of more members is refused, not built)


@dataclasses.dataclass(frozen=True)
class StudyConfig:
    """The settings every family's Config has (a family's Config derives from it and adds its
    own): the preset it started from, the depths, the seeds 0..seeds-1, the device (None: the
    best available) and whether members run the depth-usage probe (``--depth-usage``)."""

    preset: str = "smoke"
    depths: tuple[int, ...] = (1, 2)
    seeds: int = 1
    device: str | None = None
    depth_usage: bool = True  # each member's depth_usage.csv (law members: skipped_accuracy.csv too)


@dataclasses.dataclass(frozen=True)
class Preset:
    """One row of a family's preset table: what the preset costs (measured or estimated) and the
    Config fields it sets."""

    cost: str
    fields: dict[str, Any]


def preset_table(rows: dict[str, Preset]) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """A family's ``presets`` and ``costs`` from its one preset table."""
    return {name: row.fields for name, row in rows.items()}, {name: row.cost for name, row in rows.items()}


class Experiment:
    """One depth family: its Config, presets and costs (class attributes), and plan, measure (or
    run_member), tables and page; the other methods have defaults a family may override."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    Config: ClassVar[type[StudyConfig]]  # a frozen StudyConfig; every field has a default (the presets fill them)
    presets: ClassVar[dict[str, dict[str, Any]]]  # preset -> the Config fields it sets
    costs: ClassVar[dict[str, str]]  # preset -> what it is and what it costs (measured or estimated)
    columns: ClassVar[list[str]]  # members.csv's columns (a failed member's row has them too)
    resumable: ClassVar[tuple[str, ...]] = ("device",)  # settings a rerun may change (results do not depend on them)
    aliases: ClassVar[dict[str, str]] = {}  # option name -> Config field (``lr`` -> ``lrs``)
    parsers: ClassVar[dict[str, Callable[[str], Any]]] = {}  # field -> reader of its text form (``50k``)
    id_columns: ClassVar[tuple[str, ...]] = ("depth", "seed")  # members.csv's columns copied onto the depth tables
    members_note: ClassVar[str] = ""  # HTML the report shows above its member table (what the columns mean)
    member_overhead_s: ClassVar[float] = 2.0  # a member's CPU seconds beyond its training FLOPs (--jobs auto)

    # -- what a family must say ----------------------------------------------------------------
    def plan(self, config: Any) -> list[Any]:
        """Every member job, in a fixed order (the order of ``members.csv``)."""
        raise NotImplementedError

    def run_member(self, job: Any) -> MemberOutput:
        """Train and measure one member (a pure function of its job): its row and its files; by
        default :meth:`measure` in the member's folder (:func:`.folder.measure_member`)."""
        return measure_member(job, self.base_row(job), partial(self.measure, job))

    def measure(self, job: Any, folder: Path, row: dict[str, Any]) -> dict[str, Any]:
        """Train and measure one member, writing its files into ``folder`` and its results into
        ``row`` (its :meth:`base_row`); returns extra ``member.json`` entries."""
        raise NotImplementedError

    def tables(self, config: Any, members: pd.DataFrame, folder: Path) -> dict[str, pd.DataFrame]:
        """The study's tables (file name -> table) from its finished members (rows and folders);
        ``members.csv`` itself is the runner's."""
        return {}

    def page(self, config: Any, tables: dict[str, pd.DataFrame], folder: Path) -> list[str]:
        """The family's report sections (HTML fragments), drawn from ``tables``."""
        return []

    # -- what a family may add -----------------------------------------------------------------
    def base_row(self, job: Any) -> dict[str, Any]:
        """The row of a member before it runs (a failed member's row): its plan columns."""
        row: dict[str, Any] = dict.fromkeys(self.columns)
        row.update(family=self.name, member=job.name)
        return row

    def plan_row(self, config: Any, job: Any, context: Any) -> dict[str, Any]:
        """A member's row of ``plan.csv`` (``--dry-run``): its plan columns and, where the family
        can say, ``flops`` and ``cpu_minutes`` (an estimate)."""
        return {**self.base_row(job), "flops": None, "cpu_minutes": None}

    def prepare(self, config: Any, jobs: list[Any], say: Callable[[str], None]) -> Any:
        """Expensive checks and shared inputs, before anything is written (a corpus read once);
        the returned context reaches :meth:`plan_row`, :meth:`record` and :meth:`bind`."""
        return None

    def bind(self, job: Any, context: Any, dest: str | None) -> Any:
        """The job as it runs: with its ``dest`` (and what the context adds)."""
        return dataclasses.replace(job, dest=dest)

    def record(self, config: Any, context: Any) -> dict[str, Any]:
        """Extra ``study.json`` entries (a corpus's digest); a rerun must match them (:meth:`check_same`)."""
        return {}

    def check_same(self, folder: Path, config: Any, context: Any, saved: dict[str, Any]) -> None:
        """Refuse continuing a folder whose recorded inputs differ from this run's."""

    def line(self, row: dict[str, Any]) -> str:
        """A finished member's progress line."""
        return f"{row.get('wall_s') or 0:.0f} s"

    def facts(self, config: Any) -> list[str]:
        """Header facts of the report beyond family, preset and member counts."""
        return []

    def headline(self, tables: dict[str, pd.DataFrame]) -> pd.DataFrame | None:
        """The table ``probe study`` prints (None: members.csv)."""
        return None

    def skipped_view(self, config: Any, tables: dict[str, pd.DataFrame]) -> tuple[str, float | None, Any]:
        """How the report reads ``skipped_accuracy.csv`` (members that skip blocks): its level's
        column, the accuracy that counts as solved (None: none) and the law table beside it (None)."""
        return "level", None, None

    def plan_total(self, table: pd.DataFrame, jobs: int) -> str:
        """``--dry-run``'s estimated total from ``plan.csv``: by default from FLOPs (``cpu_minutes``);
        the wall time with ``jobs`` member processes is at best the total over ``jobs``."""
        if "cpu_minutes" not in table or not table["cpu_minutes"].notna().any():
            return ""
        total = float(table["cpu_minutes"].sum())
        at_once = f"; with --jobs {jobs}: at least {total / jobs:.3g} min wall" if jobs > 1 else ""
        what = "CPU-minutes in all (plan.csv's cpu_minutes, from FLOPs)"
        return f"estimated: {len(table)} members, {total:.3g} {what}{at_once}"

    # -- batched members (experiments/batching.py): a family whose members can train together ---
    def batches(self, config: Any, jobs: list[Any], processes: int) -> list[Any]:
        """The units the runner maps (``processes`` at once): each job alone (the default), or
        :class:`~.batching.Batch` es of jobs that :meth:`run_batch` trains as one model."""
        return list(jobs)

    def run_batch(self, jobs: tuple[Any, ...]) -> list[tuple[MemberOutput | None, str | None]]:
        """Train ``jobs`` together; per member its output, or None and its one-line error."""
        raise NotImplementedError

    def member_bytes(self, config: Any, job: Any) -> int | None:
        """A member's estimated training memory (auto ``--jobs`` on CUDA); None: not known."""
        return None

    # -- the settings, the same for every family ------------------------------------------------
    def config(self, preset: str = "smoke", **given: Any) -> Any:
        """The preset's fields, then every given (not None) option: the family's Config."""
        if preset not in self.presets:
            raise ProbeError(
                f"unknown --preset {preset!r}{suggest(preset, self.presets)} for the {self.name} family; "
                f"choose from {', '.join(self.presets)}"
            )
        types = field_types(self.Config)
        settings = dict(self.presets[preset])
        for key, value in given.items():
            if value is None:
                continue
            name = self.aliases.get(key, key)
            if name not in types:
                raise refusal(self.name, key, list(types) + list(self.aliases))
            if isinstance(value, str) and name in self.parsers:
                value = self.parsers[name](value)
            settings[name] = coerce(value, types[name], f"--{key.replace('_', '-')}", name)
        if not (isinstance(self.Config, type) and issubclass(self.Config, StudyConfig)):
            raise ProbeError(
                f"the {self.name} family's Config must derive from depthprobe.probes.experiments.protocol."
                "StudyConfig (preset, depths, seeds, device, depth_usage); derive it and keep its own fields"
            )
        config = self.Config(**{"preset": preset, **settings})
        check_field_ranges(config)  # a plugin family's too (the built-in ones check first, in __post_init__)
        return check_choices(config, f"study {self.name}:")


def at_least(config: Any, minimum: int, *names: str) -> None:
    """Refuse a field of ``config`` below ``minimum``, naming its option."""
    for name in names:
        if getattr(config, name) < minimum:
            raise ProbeError(f"--{name.replace('_', '-')} must be at least {minimum}, got {getattr(config, name)}")


def positive(config: Any, *names: str) -> None:
    """Refuse a field of ``config`` that is not a positive finite number, naming its option."""
    for name in names:
        value = getattr(config, name)
        if not (value > 0 and math.isfinite(value)):
            raise ProbeError(f"--{name.replace('_', '-')} must be a positive number, got {value}")


def distinct(config: Any, *names: str, flag: str = "") -> None:
    """Refuse a tuple field of ``config`` that repeats a value (``--depths 1,1`` would plan one
    member twice), naming its option (``flag``, or the field's name as an option)."""
    for name in names:
        values = list(getattr(config, name))
        repeated = next((v for i, v in enumerate(values) if v in values[:i]), None)
        if repeated is not None:
            flag = flag or f"--{name.replace('_', '-')}"
            raise ProbeError(f"{flag} repeats {repeated}, got {values}; give each value once")


MAX_SEQUENCES = 10_000_000  # sequences of one evaluation set (each a tensor of sequences x tokens)


def check_field_ranges(config: Any) -> None:
    """Refuse a field of ``config`` outside its declared range (:func:`~depthprobe.probes.base.options.ranged`
    metadata on the Config's fields: the one place a family's ranges live), NaN and infinities
    included, naming its option; every value of a tuple field is checked."""
    bad = out_of_range(config)
    if bad is not None:
        f, v, each = bad
        flag = f"--{f.name.replace('_', '-')}"
        raise ProbeError(
            f"{'each value of ' if each else ''}{flag} must be {range_text(f.metadata['range'])}, got {v} "
            f"(default {f.default})"
        )


def check_members(config: Any) -> None:
    """The fields every built-in family's Config has: ``depths`` (layers, 1 to :data:`MAX_DEPTH`,
    each once) and ``seeds`` (1 to :data:`MAX_SEEDS`)."""
    at_least(config, 1, "seeds")
    check_seed(config.seeds - 1, "--seeds")
    if config.seeds > MAX_SEEDS:
        raise ProbeError(f"--seeds must be at most {MAX_SEEDS}, got {config.seeds}; run fewer seeds")
    if not config.depths or any(not 1 <= d <= MAX_DEPTH for d in config.depths):
        raise ProbeError(f"--depths must be integers from 1 to {MAX_DEPTH}, got {list(config.depths)}")
    distinct(config, "depths")


def refusal(family: str, key: str, own: list[str]) -> ProbeError:
    """One line for an option ``family`` does not take: which families take it, or a close match."""
    owners = [n for n in EXPERIMENTS.names() if n != family and key in _loaded_fields(n)]
    flag = f"--{key.replace('_', '-')}"
    if owners:
        return ProbeError(
            f"{flag} applies to the {', '.join(owners)} famil{'ies' if len(owners) > 1 else 'y'}, not {family}; drop it"
        )
    close = suggest(flag, [f"--{name.replace('_', '-')}" for name in own]).replace("'", "")
    return ProbeError(f"{flag} is not an option of the {family} family{close}; `probe list families` lists them")


def _loaded_fields(name: str) -> set[str]:
    try:
        exp = EXPERIMENTS.get(name)
    except (ProbeError, ImportError):
        return set()
    return {f.name for f in dataclasses.fields(exp.Config)} | set(exp.aliases)


EXPERIMENTS: Registry[Experiment] = Registry("study family", Experiment)
BUILT_IN = {
    "levine": "depthprobe.probes.experiments.levine:Levine",
    "petty": "depthprobe.probes.experiments.petty:Petty",
    "spa": "depthprobe.probes.experiments.spa:Spa",
    "khop": "depthprobe.probes.experiments.khop:KHop",
    "groups": "depthprobe.probes.experiments.groups:Groups",
    "crasp": "depthprobe.probes.experiments.crasp:Crasp",
}
EXPERIMENTS.register_lazy(BUILT_IN)
_INSTALLED = entry_point_tasks(set(BUILT_IN), group=ENTRY_POINT_GROUP)
EXPERIMENTS.register_lazy(_INSTALLED, entry_point_origins(_INSTALLED, group=ENTRY_POINT_GROUP))


def register_experiment(cls: type[Experiment]) -> type[Experiment]:
    """Class decorator: register a family under ``cls.name`` (a plugin file, a notebook)."""
    if not (isinstance(cls, type) and issubclass(cls, Experiment)):
        raise ProbeError(f"register_experiment takes an Experiment subclass, got {cls!r}")
    name = getattr(cls, "name", None)
    if not (isinstance(name, str) and FAMILY_NAME.fullmatch(name)):
        shown = repr(name) if len(repr(name)) <= 80 else f"{repr(name)[:60]}... ({len(repr(name))} characters)"
        raise ProbeError(
            f"register_experiment: {cls.__name__}.name must be a family name (letters, digits, -, _ or ., at most "
            f"64 characters, not starting with - or .), got {shown}"
        )
    EXPERIMENTS.register_class(cls)
    return cls


def get_experiment(name: str) -> Experiment:
    return EXPERIMENTS.get(name)


__all__ = [
    "EXPERIMENTS",
    "RUN_COLUMNS",
    "Experiment",
    "MemberOutput",
    "Preset",
    "StudyConfig",
    "at_least",
    "check_field_ranges",
    "check_members",
    "distinct",
    "get_experiment",
    "positive",
    "preset_table",
    "register_experiment",
]
