"""Depth-width studies (DESIGN.md §3.7): train an equal-parameter family on text, probe every member.

``study(family, preset, out=..., **options)`` plans the members (:mod:`.config`, the family math in
``probes.models.families``), runs each as an independent job (:func:`.member.run_member`, in this
process or as Ray tasks), writes every finished member's folder atomically as soon as it
finishes, then ``study.csv`` and ``report.html``. Rerunning the same study on the same ``out``
keeps the finished members and runs the rest (failed ones again); a failed member is recorded with
its error while the others go on; an interrupt never leaves a member folder half-written.

The folder::

    OUT/study.json                 the resolved config (a rerun must match it) and the plan
    OUT/study.csv                  one row per member (member.COLUMNS)
    OUT/report.html                offline report (probes.api.study_report)
    OUT/members/<member>/          member.json, loss.csv, checkpoint/ (weights + tokenizer.json),
                                   runs/{kernels-init,induction,kernels,attention-stats}/ (probe run folders)
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from depthprobe.probes.api.study_config import COSTS, PRESETS, StudyConfig, resolve
from depthprobe.probes.api.study_member import COLUMNS, Job, MemberOutput, base_row, cached_corpus, plan, run_member
from depthprobe.probes.base import artifacts
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.models.families import FAMILIES

__all__ = ["COSTS", "FAMILIES", "PRESETS", "Study", "StudyConfig", "resolve", "study"]

STUDY_JSON = "study.json"
STUDY_CSV = "study.csv"
MEMBERS = "members"
DEFAULT_ROOT = Path("artifacts") / "studies"
RESUMABLE = ("device", "max_params")  # settings a rerun may change: they do not change what a member computes


@dataclass
class Study:
    """A study's folder and its table (one row per member that has run, ok or failed)."""

    config: StudyConfig
    folder: Path

    @property
    def table(self) -> pd.DataFrame:
        return read_table(self.folder)

    def save(self, directory: str | Path | None = None) -> Path:
        """The study's folder; with ``directory`` (another place), a copy written atomically there."""
        if directory is None or Path(directory).resolve() == self.folder.resolve():
            return self.folder
        with artifacts.atomic_dir(Path(directory)) as tmp:
            shutil.copytree(self.folder, tmp, dirs_exist_ok=True)
        return Path(directory)


def study(
    family: str,
    preset: str = "smoke",
    *,
    out: str | Path | None = None,
    backend: str = "local",
    address: str | None = None,
    cpus_per_member: float = 1,
    gpus_per_member: float = 0,
    retries: int = 0,
    echo: Callable[[str], None] | None = None,
    **options: Any,
) -> Study:
    """Run (or continue) a study; returns it. ``options`` override the preset (StudyConfig fields)."""
    cfg = resolve(family, preset, **options)
    jobs = plan(cfg)  # impossible budgets fail here, before anything is written
    cached_corpus(cfg)  # and a bad corpus (the tokenizer is trained here once, then cached)
    folder = Path(out) if out is not None else DEFAULT_ROOT / artifacts.run_id(f"study-{cfg.family}", cfg.preset)
    done = open_folder(folder, cfg, jobs)
    say = echo or (lambda line: print(line, file=sys.stderr))
    todo = [j for j in jobs if j.name not in done]
    if done:
        say(f"{len(done)} finished member(s) kept in {folder}; {len(todo)} to run")
    counter = {"n": len(done)}

    def finished(index: int, output: MemberOutput | None, error: str | None) -> None:
        job = todo[index]
        if output is not None:
            write_member(folder, output)
            row = output.row
            say(f"[{counter['n'] + 1}/{len(jobs)}] {job.name}: val_loss {row['val_loss']:.4f} nats/token "
                f"({row['val_bpb']:.4f} bits/byte), {row['wall_s']:.0f} s")  # fmt: skip
        else:
            write_failed(folder, job, error or "unknown error")
            say(f"[{counter['n'] + 1}/{len(jobs)}] {job.name}: failed: {error}")
        counter["n"] += 1
        write_table(folder)

    from depthprobe.probes.engine.distributed import map_jobs

    map_jobs(run_member, todo, backend=backend, address=address, cpus_per_job=cpus_per_member,
             gpus_per_job=gpus_per_member, retries=retries,
             on_done=lambda i, r: finished(i, r.value if r.ok else None, member_error(r.error)))  # fmt: skip
    write_table(folder)
    from depthprobe.probes.api.study_report import write_report

    write_report(folder)
    return Study(config=cfg, folder=folder)


def member_error(error: str | None) -> str | None:
    """The one line a failed member records, from the job map's ``Type: message``: a ProbeError's
    message as it is (it already names the fix), anything else marked as an internal error."""
    if error is None:
        return None
    kind, sep, message = error.partition(": ")
    probe_errors = {ProbeError.__name__, *(c.__name__ for c in ProbeError.__subclasses__())}
    return message if sep and kind in probe_errors else f"internal error: {error}"


def open_folder(folder: Path, cfg: StudyConfig, jobs: list[Job]) -> set[str]:
    """Create the study folder, or check that an existing one holds this study; returns the names
    of its finished (ok) members."""
    meta = folder / STUDY_JSON
    if folder.exists():
        if not folder.is_dir():
            raise ProbeError(f"--out {folder} is a file, not a folder; choose another --out")
        if not meta.exists():
            if any(folder.iterdir()):
                raise ProbeError(f"--out {folder} exists and holds no study ({STUDY_JSON}); pass a new --out")
        else:
            saved = _saved_config(meta)
            clash = [k for k, v in cfg.as_dict().items() if k not in RESUMABLE and _norm(saved.get(k)) != _norm(v)]
            if clash:
                what = ", ".join(f"{k} {saved.get(k)!r} (now {getattr(cfg, k)!r})" for k in clash[:3])
                raise ProbeError(
                    f"{folder} holds another study ({what}); rerun with the same options to continue it, "
                    "or pass a new --out"
                )
            return finished_members(folder)
    artifacts.check_out(folder, "--out", may_exist=True)
    folder.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] = {"family": cfg.family, "preset": cfg.preset, "config": cfg.as_dict(),
               "members": [j.name for j in jobs]}  # fmt: skip
    if cfg.family == "levine":
        payload["config"]["pairs"] = [[d, 2 * d] for d in cfg.depths]
    artifacts.replace_file(meta, lambda p: artifacts.write_json(p, payload))
    return set()


def _saved_config(meta: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(meta.read_text())["config"])
    except (OSError, ValueError, KeyError, TypeError):
        raise ProbeError(f"{meta} is unreadable; pass a new --out (or remove that folder)") from None


def _norm(v: Any) -> Any:
    return list(v) if isinstance(v, tuple | list) else v


def member_json(folder: Path, name: str) -> dict[str, Any] | None:
    try:
        return json.loads((folder / MEMBERS / name / "member.json").read_text())
    except (OSError, ValueError):
        return None


def finished_members(folder: Path) -> set[str]:
    root = folder / MEMBERS
    if not root.is_dir():
        return set()
    out = set()
    for d in root.iterdir():
        meta = member_json(folder, d.name) if d.is_dir() and not d.name.startswith(".") else None
        if meta is not None and meta.get("row", {}).get("status") == "ok":
            out.add(d.name)
    return out


def write_member(folder: Path, output: MemberOutput) -> Path:
    """A finished member's folder, written whole (replacing a failed attempt's)."""
    final = folder / MEMBERS / str(output.row["member"])
    if final.exists():
        shutil.rmtree(final)
    with artifacts.atomic_dir(final) as tmp:
        for rel, data in output.files.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    return final


def write_failed(folder: Path, job: Job, error: str) -> None:
    row = base_row(job)
    row.update(status="failed", error=" ".join(error.split()), device=str(job.config.device or "auto"))
    write_member(folder, MemberOutput(row=row, files={"member.json": json.dumps({"row": row}, indent=2).encode()}))


def read_table(folder: Path) -> pd.DataFrame:
    """study.csv's rows: one per member that has run, in plan order."""
    meta = json.loads((folder / STUDY_JSON).read_text())
    rows = [m["row"] for name in meta["members"] if (m := member_json(folder, name)) is not None]
    return pd.DataFrame(rows, columns=COLUMNS)


def write_table(folder: Path) -> None:
    table = read_table(folder)
    artifacts.replace_file(folder / STUDY_CSV, lambda p: table.to_csv(p, index=False))
