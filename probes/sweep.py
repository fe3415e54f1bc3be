"""Depth sweeps: one model per depth, identical settings and seeds, one table and plots.

A sweep is registered by name like a task (``probe sweep --task NAME``; the protocol is
:class:`~depthprobe.probes.engine.task.Sweep`). :func:`sweep` runs one and returns a
:class:`~depthprobe.probes.api.Result`, saved like any run (scores.csv, summary, manifest,
report.html).
"""

from __future__ import annotations

from typing import Any

from depthprobe.probes.api import Result, seed_everything
from depthprobe.probes.engine import artifacts
from depthprobe.probes.engine.task import SWEEPS, Sweep, SweepConfig, get_sweep, parse_depths, register_sweep

__all__ = ["SWEEPS", "Sweep", "SweepConfig", "get_sweep", "parse_depths", "register_sweep", "sweep"]


def sweep(
    task: str,
    depths: tuple[int, ...] | list[int],
    *,
    seed: int = 0,
    device: str | None = None,
    progress: bool = False,
    **options: Any,
) -> Result:
    """Run the sweep registered as ``task`` over ``depths``; returns a Result (``.save()`` it)."""
    sw = get_sweep(task)
    config = SweepConfig(
        task=task, depths=tuple(depths), seed=seed, device=device, options=tuple(sorted(options.items()))
    )
    parsed = sw.parse_options(options)
    seed_everything(seed)
    timer = artifacts.Timer()
    with timer("sweep"):
        out = sw.run(config, parsed, progress)
    info = {"name": f"sweep-{task}", "source": "sweep", "depths": list(config.depths)}
    return Result.from_output(
        out,
        config={**config.as_dict(), "kind": "sweep"},
        model_info=info,
        device=str(device or "auto"),
        timings=timer.times,
        counts={"depths": len(config.depths)},
    )
