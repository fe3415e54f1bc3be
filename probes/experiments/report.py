"""The study's report: the runner's frame (``probes.render.study``) around the family's sections."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pandas as pd

from depthprobe.probes.experiments.folder import MEMBERS_CSV, REPORT
from depthprobe.probes.experiments.protocol import Experiment
from depthprobe.probes.render.html import write_atomic
from depthprobe.probes.render.study import study_page


def render(exp: Experiment, cfg: Any, tables: dict[str, pd.DataFrame], folder: Path) -> str:
    members = tables[MEMBERS_CSV]
    finished = bool((members["status"] == "ok").any()) if len(members) else False
    sections = exp.page(cfg, tables, folder) if finished else []
    return study_page(exp.name, getattr(cfg, "preset", None), members, sections, dataclasses.asdict(cfg),
                      exp.facts(cfg))  # fmt: skip


def write_report(exp: Experiment, cfg: Any, tables: dict[str, pd.DataFrame], folder: Path) -> Path:
    """Write ``folder/report.html`` (atomically: readers see the old page or the new one)."""
    return write_atomic(folder / REPORT, render(exp, cfg, tables, folder))
