"""The study's report: the runner's frame (``probes.render.study``) around the family's sections."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, cast

import pandas as pd

from depthprobe.probes.experiments.folder import MEMBERS_CSV, REPORT
from depthprobe.probes.experiments.protocol import Experiment
from depthprobe.probes.render.html import write_atomic
from depthprobe.probes.render.study import study_page


def render(exp: Experiment, cfg: Any, tables: dict[str, pd.DataFrame], folder: Path) -> str:
    members = tables[MEMBERS_CSV]
    finished = bool((members["status"] == "ok").any()) if len(members) else False
    sections = [*exp.page(cfg, tables, folder), *depth_sections(exp, cfg, tables)] if finished else []
    config = dataclasses.asdict(cfg)
    return study_page(exp.name, cfg.preset, members, sections, config, exp.facts(cfg), exp.members_note)


def depth_sections(exp: Experiment, cfg: Any, tables: dict[str, pd.DataFrame]) -> list[str]:
    """The accuracy with each block skipped (read as the family says: :meth:`Experiment.skipped_view`),
    then the members' depth usage (experiments/member_depth.py's tables), after the family's sections."""
    from depthprobe.probes.experiments.member_depth import DEPTH_USAGE_CSV, SKIPPED_CSV
    from depthprobe.probes.render.study_depth import skipped_section, usage_section

    out = []
    if SKIPPED_CSV in tables and not tables[SKIPPED_CSV].empty:  # first: the nearer the law, the better
        key, threshold, law = exp.skipped_view(cfg, tables)
        out.append(skipped_section(tables[SKIPPED_CSV], key, threshold, law))
    if DEPTH_USAGE_CSV in tables and not tables[DEPTH_USAGE_CSV].empty:
        out.append(usage_section(tables[DEPTH_USAGE_CSV]))
    return out


def write_report(exp: Experiment, cfg: Any, tables: dict[str, pd.DataFrame], folder: Path) -> Path:
    """Write ``folder/report.html`` (atomically: readers see the old page or the new one)."""
    return write_atomic(folder / REPORT, render(exp, cfg, tables, folder))


def saved_config(exp: Experiment, saved: dict[str, Any]) -> Any:
    """The family's Config as ``study.json`` recorded it (lists back to tuples; fields added since
    it ran keep their defaults)."""
    fields, cls = {f.name for f in dataclasses.fields(exp.Config)}, cast(Any, exp.Config)
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in saved["config"].items() if k in fields})


def render_folder(folder: Path) -> str:
    """The report page of a study folder, from its files (study.json and the tables)."""
    import json

    from depthprobe.probes.base.errors import ProbeError
    from depthprobe.probes.experiments.folder import STUDY_JSON, read_members
    from depthprobe.probes.experiments.protocol import get_experiment

    try:
        saved = json.loads((Path(folder) / STUDY_JSON).read_text())
    except (OSError, ValueError):
        raise ProbeError(f"{folder} has no readable {STUDY_JSON}; pass a study folder written by probe study") from None
    exp = get_experiment(str(saved.get("family")))
    config = saved_config(exp, saved)
    path = Path(folder) / MEMBERS_CSV
    members = pd.read_csv(path, dtype={"member": str, "status": str, "error": str}) if path.is_file() else None
    tables = {MEMBERS_CSV: read_members(Path(folder), exp.columns) if members is None else members}
    for path in sorted(Path(folder).glob("*.csv")):
        if path.name not in tables and path.stat().st_size:
            tables[path.name] = pd.read_csv(path)
    return render(exp, config, tables, Path(folder))
