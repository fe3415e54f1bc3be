"""The offline report of a depth study (``probe study``), from its folder: ``report.html``.

Everything is read from the study folder; no model is loaded:

- ``study.json`` and ``study.csv``, and each member's ``loss.csv`` (``probes.render.study_data``);
- ``members/<member>/runs/<task>/``: the member's probe run folders, compared here per task
  (``probes.api.compare``): one seed (the lowest) per configuration, the task's preferred
  per-layer metrics drawn and the others named in a note.

The page itself is drawn by ``probes.render.study.study_page``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from depthprobe.probes.api.compare import compare, is_run_dir, peaks
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.models.families import FAMILIES
from depthprobe.probes.render.html import write_atomic
from depthprobe.probes.render.study import study_page
from depthprobe.probes.render.study_data import StudyData, probe_members, read_study
from depthprobe.probes.render.study_sections import ProbeCurves

TASK_ORDER = ("induction", "kernels", "kernels-init", "attention-stats")
# the per-layer metric(s) drawn per task folder; the others are named in a note
PROBE_METRICS = {
    "induction": ("induction", "previous_token"),
    "kernels": ("mean_cosine",),
    "kernels-init": ("mean_cosine",),
    "attention-stats": ("entropy",),
}
MAX_PROBE_PLOTS = 4  # per task, when none of its preferred metrics is present


def probe_tasks(study: StudyData, members: Sequence[str]) -> dict[str, list[tuple[str, Path]]]:
    """task folder name -> [(member, run folder)] over ``members``, tasks in TASK_ORDER first."""
    found: dict[str, list[tuple[str, Path]]] = {}
    for m in members:
        runs = study.folder / "members" / m / "runs"
        for d in sorted(runs.iterdir()) if runs.is_dir() else []:
            if not d.name.startswith(".") and is_run_dir(d):
                found.setdefault(d.name, []).append((m, d))
    order = [t for t in TASK_ORDER if t in found] + sorted(t for t in found if t not in TASK_ORDER)
    return {t: found[t] for t in order}


def probe_curves(study: StudyData) -> list[ProbeCurves]:
    """Each probe task of the drawn members (``probe_members``), compared across depth; a task whose
    runs cannot be compared carries the reason instead."""
    out = []
    for task, runs in probe_tasks(study, probe_members(study)).items():
        title = "kernels (at init)" if task == "kernels-init" else task
        try:
            table = compare([p for _, p in runs])
        except ProbeError as exc:
            out.append(ProbeCurves(task, title, error=str(exc)))
            continue
        name = {str(p): m for m, p in runs}
        table = table.assign(label=table["run"].map(name).fillna(table["label"]))
        metrics = list(dict.fromkeys(table["metric"]))
        drawn = [m for m in PROBE_METRICS.get(task, ()) if m in metrics] or metrics[:MAX_PROBE_PLOTS]
        rest = [m for m in metrics if m not in drawn]
        peak = peaks(table[table["metric"].isin(drawn)])
        out.append(ProbeCurves(task, title, table, peak, tuple(drawn), tuple(rest)))
    return out


def render_study(folder: Path) -> str:
    """The study's report page (self-contained, offline) from the files of its folder."""
    study = read_study(folder, FAMILIES)
    return study_page(study, probe_curves(study) if len(study.ok) else [])


def write_report(folder: Path) -> Path:
    """Write ``folder/report.html`` (atomically: readers see the old page or the new one)."""
    folder = Path(folder)
    return write_atomic(folder / "report.html", render_study(folder))


__all__ = ["probe_curves", "render_study", "write_report"]
