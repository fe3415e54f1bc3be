"""Depth sweeps: one model per depth, identical settings and seeds, one table and plots.

A sweep is registered by name like a task (``probe sweep --task NAME``). Its ``run`` gets the
depths and its parsed options and returns an :class:`~probes.task.Output`; the result is saved
like any run (scores.csv, summary, manifest, report.html).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from depthprobe.probes import artifacts
from depthprobe.probes.api import Result, seed_everything
from depthprobe.probes.errors import ProbeError
from depthprobe.probes.registry import Registry
from depthprobe.probes.task import NoOptions, Output, Task


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


class Sweep:
    name: ClassVar[str]
    description: ClassVar[str]
    Options: ClassVar[type] = NoOptions

    parse_options = Task.parse_options

    def run(self, config: SweepConfig, options: Any, progress: bool) -> Output:
        raise NotImplementedError


SWEEPS: Registry[Sweep] = Registry("sweep task")
register_sweep = SWEEPS.register_class  # @register_sweep on a Sweep subclass


def get_sweep(name: str) -> Sweep:
    from depthprobe import tasks  # noqa: F401  (tasks register their sweeps)

    return SWEEPS.get(name)


def parse_depths(text: str) -> tuple[int, ...]:
    try:
        depths = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise ProbeError(f"--depths expects comma-separated integers like 1,2,4, got {text!r}") from None
    return depths


def sweep(task: str, depths: tuple[int, ...] | list[int], *, seed: int = 0, device: str | None = None,
          progress: bool = False, **options: Any) -> Result:
    """Run the sweep registered as ``task`` over ``depths``; returns a Result (``.save()`` it)."""
    sw = get_sweep(task)
    config = SweepConfig(task=task, depths=tuple(depths), seed=seed, device=device,
                         options=tuple(sorted(options.items())))
    parsed = sw.parse_options(options)
    seed_everything(seed)
    timer = artifacts.Timer()
    with timer("sweep"):
        out = sw.run(config, parsed, progress)
    info = {"name": f"sweep-{task}", "source": "sweep", "depths": list(config.depths)}
    return Result(scores=out.scores, summary=out.summary, notes=out.notes, headline=out.headline,
                  config={**config.as_dict(), "kind": "sweep"}, model_info=info,
                  device=str(device or "auto"), timings=timer.times, counts={"depths": len(config.depths)},
                  heatmaps=out.heatmaps, views=out.views, plots=out.plots, files=out.files)
