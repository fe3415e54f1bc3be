"""Probing a study member with a registered task, its tables kept in the member's folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from depthprobe.probes.api.run import Result
from depthprobe.probes.api.run import run as run_task
from depthprobe.probes.models.model import Model


def probe(
    model: Model, task: str, out: Path, data: list[str] | None = None, max_len: int = 128, **options: Any
) -> Result:
    """Run a probe and write its tables into ``out`` (no HTML report: the study's report draws them):
    the files that ``probe compare`` and the study report read (scores, summary, manifest), its views."""
    result = run_task(model, task, data, max_len=max_len, progress=False, **options)
    out.mkdir(parents=True)
    result.write_tables(out)
    return result


def mean_metric(result: Result, metric: str) -> float | None:
    """The mean of one metric over a run's scores (None when it has none)."""
    s = result.scores
    values = s.loc[s.metric == metric, "value"]
    return float(values.mean()) if len(values) else None
