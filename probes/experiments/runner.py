"""``study(family, preset, **options)``: the one runner of every depth family (docs/protocols.md §3.7, §3.9).

It resolves the family's Config (:meth:`Experiment.config`), plans the members, checks the settings,
``out`` and the family's inputs before anything is written, then opens the study folder
(:mod:`.folder`: ``study.json``; a rerun keeps finished members whose files are intact, trains
damaged ones again and runs failed ones again), runs the members still to do as independent jobs
(``engine.distributed.map_jobs``: in this process, ``jobs`` spawned processes, or Ray tasks),
records each as it finishes (its folder, its row in ``members.csv``; a failed one with its one-line
error while the others go on; members of one shape may train together as one batched model:
:mod:`.batching`), then writes the family's tables and ``report.html``. ``dry_run``
writes ``plan.csv`` (every member with its estimated cost) and trains nothing.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from depthprobe.probes.base import artifacts
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.engine.backend import Backend
from depthprobe.probes.experiments import folder as folders
from depthprobe.probes.experiments.protocol import Experiment, get_experiment

if TYPE_CHECKING:
    import pandas as pd


DEFAULT_ROOT = Path("artifacts") / "studies"
MAX_MEMBERS = 10_000  # members of one study


@dataclass
class Study:
    """A study's folder, its family and config; its tables are read from the folder."""

    family: str
    config: Any
    folder: Path
    tables: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def table(self) -> pd.DataFrame:
        """members.csv: one row per member that has run, ok or failed."""
        return folders.read_members(self.folder, get_experiment(self.family).columns)

    def __getitem__(self, name: str) -> pd.DataFrame:
        """One of the study's tables by file name (``study["law.csv"]``)."""
        import pandas as pd

        return self.tables[name] if name in self.tables else pd.read_csv(self.folder / name)

    def save(self, directory: str | Path | None = None) -> Path:
        """The study's folder; with ``directory`` (another place), a copy written atomically there."""
        if directory is None or Path(directory).resolve() == self.folder.resolve():
            return self.folder
        with artifacts.atomic_dir(Path(directory)) as tmp:
            shutil.copytree(self.folder, tmp, dirs_exist_ok=True)
        return Path(directory)


def default_folder(family: str, preset: str) -> Path:
    """Where a study without ``out`` goes: ``artifacts/studies/<id>``."""
    return DEFAULT_ROOT / artifacts.run_id(f"study-{family}", preset)


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
    jobs: int | Literal["auto"] | None = None,
    echo: Callable[[str], None] | None = None,
    **options: Any,
) -> Study:
    """Run (or continue) a study of ``family``; returns it. ``options`` override the preset (the
    family's Config fields). ``jobs`` (local backend): members at once in spawned processes, each
    with ``cores // jobs`` threads; the numbers and files equal ``jobs=1``; None: 1 on a CPU, on
    CUDA chosen from the GPU's free memory (:func:`.batching.default_jobs`); ``"auto"``: on a CPU
    from the plan's estimated work (:func:`.batching.cpu_jobs`)."""
    from depthprobe.probes.experiments import batching

    batching.warm_members(family, backend, jobs)  # the member processes' fork server imports meanwhile
    exp, cfg, jobs_ = planned(family, preset, options)
    where = Backend(backend, address, cpus_per_member, gpus_per_member, retries, jobs)
    where.check()
    folder = Path(out) if out is not None else default_folder(family, preset)
    saved = folders.check_folder(folder, family, cfg, exp.resumable)
    if backend == "local":  # Ray workers may have devices the driver lacks
        from depthprobe.probes.models.device import resolve_device

        resolve_device(cfg.device)
    say = echo or (lambda line: print(line, file=sys.stderr))
    context = exp.prepare(cfg, jobs_, say)  # refusals here write nothing
    if jobs == "auto":
        where = replace(where, jobs=batching.chosen_jobs(exp, cfg, jobs_, context, say))
    with folders.locked(folder), folders.disk_errors(folder):
        saved = folders.check_folder(folder, family, cfg, exp.resumable)  # again, now that this run holds it
        done = open_study(exp, folder, cfg, jobs_, context, saved, say)
        dest = None if backend == "ray" else folder / folders.MEMBERS  # local members write their own folders
        bound = [exp.bind(j, context, None if dest is None else str(dest / j.name)) for j in jobs_]
        todo = units_to_run(exp, cfg, bound, done, where)
        if done:
            say(f"{len(done)} finished member(s) kept in {folder}; {len(jobs_) - len(done)} to run")
        try:
            run_jobs(exp, cfg, folder, todo, (len(done), len(jobs_)), say, where, context)
        except ProbeError:  # refused before any member ran (a Ray cluster at join time): no new study.json
            if saved is None:
                folders.forget_new_study(folder)
            raise
        tables = write_tables(exp, cfg, folder)
        from depthprobe.probes.experiments.report import write_report

        write_report(exp, cfg, tables, folder)
    return Study(family=family, config=cfg, folder=folder, tables=tables)


def planned(family: str, preset: str, options: dict[str, Any]) -> tuple[Experiment, Any, list[Any]]:
    """The family, its Config and its member jobs; impossible plans fail here, before anything is written."""
    exp = get_experiment(family)
    cfg = exp.config(preset, **options)
    jobs = exp.plan(cfg)
    if len(jobs) > MAX_MEMBERS:
        raise ProbeError(
            f"the study plans {len(jobs):,} members, more than {MAX_MEMBERS:,}; plan fewer (depths, widths, seeds)"
        )
    check_member_names(family, [j.name for j in jobs])
    return exp, cfg, jobs


def check_member_names(family: str, names: list[Any]) -> None:
    """Every member's name is its folder under ``members/``: one plain folder name (no ``/``, no
    ``..``, no leading dot: hidden folders are members being written; no control characters; at
    most :data:`.folder.MAX_NAME` characters), and no two members share one (they would collapse into
    one folder). A family's plan that breaks this is refused before anything is written."""
    seen: set[str] = set()
    for name in names:
        why = folders.member_name_problem(name)
        if why is None and name in seen:
            why = "is planned twice; each member needs its own name (a level given twice, e.g. --depths 1,1?)"
        if why is not None:
            raise ProbeError(f"the {family} family's plan: member name {name!r} {why}")
        seen.add(name)


def open_study(
    exp: Experiment,
    folder: Path,
    cfg: Any,
    jobs: list[Any],
    context: Any,
    saved: dict[str, Any] | None,
    say: Callable[[str], None],
) -> set[str]:
    """Create the study folder (``saved`` None), or continue it after the family checked that its
    recorded inputs are this run's; returns the finished members whose files are intact."""

    if saved is not None:
        exp.check_same(folder, cfg, context, saved)
        done, damaged = folders.finished_members(folder)
        for name, why in sorted(damaged.items()):
            say(f"{name}: damaged ({why}); training it again")
        return done
    payload = {
        "family": exp.name,
        "preset": cfg.preset,
        "config": dataclasses.asdict(cfg),
        **exp.record(cfg, context),
        "members": [j.name for j in jobs],
    }
    folders.write_study_json(folder, payload)
    return set()


def units_to_run(exp: Experiment, cfg: Any, jobs: list[Any], done: set[str], where: Backend) -> list[Any]:
    """The units still to run: the whole plan's units (a member alone, or a batch trained as one
    model: :meth:`Experiment.batches`) less the finished members, so that a resumed study trains
    its remaining members in the batches an uninterrupted run gives them (members of one batch
    finish together; a batch's failed members run again as what is left of it). Ray: one member
    a unit."""
    from depthprobe.probes.experiments import batching

    if where.backend == "ray":
        return [j for j in jobs if j.name not in done]
    units = []
    for unit in exp.batches(cfg, jobs, where.jobs if isinstance(where.jobs, int) else 1):
        left = [j for j in batching.members(unit) if j.name not in done]
        if left:
            units.append(left[0] if len(left) == 1 else batching.Batch(tuple(left)))
    return units


def run_jobs(
    exp: Experiment,
    cfg: Any,
    folder: Path,
    units: list[Any],
    counts: tuple[int, int],
    say: Callable[[str], None],
    where: Backend,
    context: Any = None,
) -> None:
    """Run the units still to do (:func:`units_to_run`), recording each member as it finishes:
    its folder (a Ray member's files; a local member wrote its own), its line, members.csv (after
    each unit: a member alone or a batch); a failed one with its error. ``counts``: the members
    finished before and in the whole plan (the progress lines' numbers). Member processes and Ray
    take the units longest first (:func:`.batching.longest_first`, from the plan's rows for
    ``context``); in this process they run in plan order."""
    from depthprobe.probes.engine.distributed import map_jobs
    from depthprobe.probes.experiments import batching

    done, total = counts
    counter = {"n": done}
    device = cfg.device
    jobs = where.jobs if isinstance(where.jobs, int) else None  # study() resolved "auto"
    if jobs is None and where.backend == "local":
        jobs = batching.default_jobs(exp, cfg, units, say)  # 1 on a CPU; on CUDA from its memory

    def unit_done(index: int, result: Any) -> None:
        unit = batching.members(units[index])
        outcomes = result.value if result.ok else [(None, result.failure())] * len(unit)
        for job, (output, error) in zip(unit, outcomes, strict=True):
            counter["n"] += 1
            if output is None:
                folders.write_failed(folder, exp.base_row(job), error or "unknown error", device)
            elif output.files:
                folders.write_member(folder, output)
            say(f"[{counter['n']}/{total}] {job.name}: {exp.line(output.row) if output else f'failed: {error}'}")
        write_members(exp, folder)

    placing = replace(where, jobs=jobs).placing(len(units))
    alone = placing["backend"] == "local" and placing["processes"] == 1
    order = None if alone else batching.longest_first(exp, cfg, units, context)
    try:
        run = partial(batching.run_unit, exp)
        map_jobs(run, units, setup=plugin_setup(exp), on_done=unit_done, order=order, **placing)
    except BaseException:  # members stopped mid-write (their processes are gone) leave no hidden folder
        artifacts.remove_stale_partials(folder / folders.MEMBERS / "any", any_name=True)
        raise


def plugin_setup(exp: Experiment) -> Callable[[], Any] | None:
    """A family from a plugin file is not importable by name in a spawned process: load the file
    there first."""
    module = sys.modules.get(type(exp).__module__)
    path = getattr(module, "__file__", None)
    if not type(exp).__module__.startswith("depthprobe_plugin_") or path is None:
        return None
    from depthprobe.probes.engine.plugins import load_plugin

    return partial(load_plugin, str(path))


def write_members(exp: Experiment, folder: Path) -> pd.DataFrame:
    table = folders.read_members(folder, exp.columns)
    folders.write_table(folder, folders.MEMBERS_CSV, table)
    return table


def write_tables(exp: Experiment, cfg: Any, folder: Path) -> dict[str, pd.DataFrame]:
    """members.csv, the family's tables and the depth tables of its members (member_depth.py),
    written and returned."""
    from depthprobe.probes.experiments.member_depth import study_tables

    members = write_members(exp, folder)
    tables = {**study_tables(members, folder, exp.id_columns), **exp.tables(cfg, members, folder)}
    for name, table in tables.items():
        folders.write_table(folder, name, table)
    return {folders.MEMBERS_CSV: members, **tables}


def dry_run(
    family: str,
    preset: str = "smoke",
    *,
    out: str | Path,
    jobs: int | Literal["auto"] | None = None,
    echo: Callable[[str], None] | None = None,
    **options: Any,
) -> pd.DataFrame:
    """Plan the study (the same checks as a run), write ``out/plan.csv`` and return it; nothing
    is trained. A check a run would refuse after planning (the family's ``prepare``) is reported.
    Says the estimated total (:func:`plan_total`) for ``jobs`` member processes."""
    import pandas as pd

    Backend(jobs=jobs).check()
    exp, cfg, members = planned(family, preset, options)
    folder = Path(out)
    artifacts.check_out(folder, "--out", may_exist=True)
    say = echo or print
    try:
        context = exp.prepare(cfg, members, say)
    except ProbeError as exc:
        context = getattr(exc, "context", None)
        if context is None:
            raise
        say(f"a run would be refused: {exc}")
    rows = [exp.plan_row(cfg, j, context) for j in members]
    table = pd.DataFrame(rows, columns=list(dict.fromkeys(k for r in rows for k in r)))
    folder.mkdir(parents=True, exist_ok=True)
    folders.write_table(folder, folders.PLAN_CSV, table)
    line = exp.plan_total(table, jobs if isinstance(jobs, int) else 1)
    if line:
        say(line)
    return table


__all__ = ["Backend", "Study", "default_folder", "dry_run", "study"]
