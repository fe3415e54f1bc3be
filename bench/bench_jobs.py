"""`probe study --jobs N` (or `probe sweep --jobs N`) against `--jobs 1`: wall time, interleaved rounds.

Each round runs the study once with ``--jobs 1`` (members one after another in this process, with
every core's threads) and once with ``--jobs N`` (members at once in N spawned processes, cores/N
threads each), alternating which goes first so that a change in the machine's load hits both; the
corpus and its tokenizer are cached before the clock starts. It prints each round's times, the
median speed-up, the load average before and after (the machine may be shared), and checks that
both studies' members.csv agree in every column but the timed ones. With ``--sweep induction`` (or
kernels) it times a smoke-sized depth sweep instead (depths 1,2; ``SWEEP_SMOKE``) and compares the
sweeps' scores.

With ``--smoke-all`` it times whole ``probe study`` processes (imports and all, as a user waits for
them) for every smoke preset (petty at depths 1-4, the issue's bar; levine, spa, khop, crasp,
groups as preset), ``--jobs 1`` and ``--jobs N`` interleaved per preset, and prints per preset the
median wall of each, the ratio --jobs N / --jobs 1 (the bar: at most 0.8 on petty, at most 1 on
every preset), the CPU seconds of each (its member processes and fork server included), and
whether every table the two studies wrote (each top-level CSV, timed columns apart) is identical.

    .venv/bin/python bench/bench_jobs.py [--family levine] [--jobs 2] [--rounds 3]
    .venv/bin/python bench/bench_jobs.py --sweep induction [--jobs 2] [--rounds 1]
    .venv/bin/python bench/bench_jobs.py --smoke-all [--jobs 2|auto] [--rounds 1]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: F401  (offline environment)

from depthprobe.probes.api.sweep import sweep
from depthprobe.probes.experiments.runner import study

TIMED = ["wall_s", "tokens_per_s", "train_s", "steps_per_s", "elapsed_s"]  # timings: text and law members
SMOKE_ALL = {  # every smoke preset; petty at depths 1-4 (issue #45's bar)
    "petty": ["--depths", "1,2,3,4"],
    "levine": [],
    "spa": [],
    "khop": [],
    "crasp": [],
    "groups": [],
}
SWEEP_SMOKE = {  # depths 1,2: a few seconds to a minute per member on one core
    "induction": {"steps": 300, "eval_every": 100, "n_seqs": 8, "width": 32, "heads": 2},
    "kernels": {"variants": ("vanilla", "skip", "e-spa"), "width": 64, "seq_len": 32, "samples": 8, "steps": 30},
}


def timed(family: str, jobs: int, options: dict) -> tuple[float, object]:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        s = study(family, "smoke", out=Path(tmp) / "s", jobs=jobs, echo=lambda line: None, **options)
        elapsed = time.perf_counter() - t0
        table = s.table
    bad = table[table.status != "ok"]
    if len(bad):
        raise SystemExit(f"members failed: {bad.error.tolist()}")
    return elapsed, table.drop(columns=TIMED, errors="ignore")


def cpu_seconds() -> float:
    """CPU seconds of the child processes waited for so far (their own children included)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def adopt_orphans() -> None:
    """Linux: become the subreaper of every process a study starts, so that the fork server and
    the member processes it forks (orphaned when the driver exits) are waited for here and their
    CPU seconds counted (:func:`reap`)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def reap() -> None:
    """Wait for every descendant still running (a fork server exits just after its driver)."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def tables(folder: Path) -> dict[str, object]:
    """Every top-level CSV of a study folder, timed columns dropped."""
    import pandas as pd

    return {p.name: pd.read_csv(p).drop(columns=TIMED, errors="ignore") for p in sorted(folder.glob("*.csv"))}


def whole_study(family: str, extra: list[str], jobs: int | str) -> tuple[float, float, dict[str, object]]:
    """``probe study --preset smoke`` as its own process: (wall s, CPU s, its tables)."""
    probe = str(Path(sys.executable).parent / "probe")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "s"
        cmd = [probe, "study", "--family", family, "--preset", "smoke", "--out", str(out), "--jobs", str(jobs), *extra]
        t0, c0 = time.perf_counter(), cpu_seconds()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        reap()
        return wall, cpu_seconds() - c0, tables(out)


def same_tables(a: dict[str, object], b: dict[str, object]) -> bool:
    return a.keys() == b.keys() and all(a[k].equals(b[k]) for k in a)  # type: ignore[attr-defined]


def smoke_all(jobs: int | str, rounds: int, families: list[str]) -> None:
    """The smoke presets of ``families``, --jobs 1 against --jobs ``jobs`` (a number or auto), whole
    processes, interleaved."""
    print(f"whole `probe study` processes, {rounds} round(s) each, order alternating per round")
    print(f"{'preset':18s} {'--jobs 1':>9s} {f'--jobs {jobs}':>9s} {'ratio':>6s} {'CPU-s 1':>8s} "
          f"{f'CPU-s {jobs}':>8s}  tables equal  load")  # fmt: skip
    for family in families:
        extra = SMOKE_ALL[family]
        runs: dict[int | str, list[tuple[float, float, dict[str, object]]]] = {1: [], jobs: []}
        for r in range(rounds):
            for n in [1, jobs] if r % 2 == 0 else [jobs, 1]:
                runs[n].append(whole_study(family, extra, n))
        one, many = runs[1], runs[jobs]
        t1, tn = statistics.median(w for w, _, _ in one), statistics.median(w for w, _, _ in many)
        c1, cn = statistics.median(c for _, c, _ in one), statistics.median(c for _, c, _ in many)
        same = all(same_tables(a[2], b[2]) for a, b in zip(one, many, strict=True))
        name = f"{family} {' '.join(extra)}".strip()
        print(f"{name:18s} {t1:8.1f}s {tn:8.1f}s {tn / t1:5.2f}x {c1:8.1f} {cn:8.1f}  {same!s:12s}  "
              f"{os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip


def timed_sweep(task: str, jobs: int, options: dict) -> tuple[float, object]:
    t0 = time.perf_counter()
    res = sweep(task, (1, 2), jobs=jobs, **{**SWEEP_SMOKE[task], **options})
    return time.perf_counter() - t0, res.scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="levine", choices=["levine", "petty", "spa"])
    ap.add_argument("--jobs", default="2", help="a number; with --smoke-all also auto")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-tokens", type=int, default=None, help="override the preset's training tokens")
    ap.add_argument("--sweep", choices=sorted(SWEEP_SMOKE), default=None, help="time this sweep, not a study")
    ap.add_argument("--smoke-all", action="store_true", help="every smoke preset as whole `probe study` processes")
    ap.add_argument("--families", default=",".join(SMOKE_ALL), help="with --smoke-all: these families only")
    args = ap.parse_args()
    options = {} if args.min_tokens is None else {"min_tokens": args.min_tokens}
    if args.jobs == "auto" and not args.smoke_all:
        ap.error("--jobs auto is for --smoke-all; give a number")
    jobs: int | str = args.jobs if args.jobs == "auto" else int(args.jobs)
    cores = len(os.sched_getaffinity(0))
    print(f"{cores} usable cores; load average before: {os.getloadavg()}")
    if args.smoke_all:
        adopt_orphans()
        families = [f.strip() for f in args.families.split(",") if f.strip()]
        smoke_all(jobs, args.rounds, families)
        print(f"load average after: {os.getloadavg()}")
        return
    if args.sweep is not None:
        run = partial(timed_sweep, args.sweep)
        timed_sweep(args.sweep, 1, {"steps": 2, "eval_every": 1} if args.sweep == "induction" else {"steps": 1})
    else:
        run = partial(timed, args.family)
        timed(args.family, 1, {**options, "min_tokens": 4096})  # corpus and tokenizer cached, imports done
    one, many = [], []
    for r in range(args.rounds):
        for n in [1, jobs] if r % 2 == 0 else [jobs, 1]:
            t, table = run(n, options)
            (one if n == 1 else many).append((t, table))
            print(f"round {r + 1}: --jobs {n}: {t:.1f} s  (load {os.getloadavg()[0]:.2f})", flush=True)
    same = all(a[1].equals(b[1]) for a, b in zip(one, many, strict=True))
    speedups = [a[0] / b[0] for a, b in zip(one, many, strict=True)]
    print(f"--jobs 1: median {statistics.median(t for t, _ in one):.1f} s; "
          f"--jobs {jobs}: median {statistics.median(t for t, _ in many):.1f} s")  # fmt: skip
    print(f"speed-up per round: {', '.join(f'{s:.2f}x' for s in speedups)}; "
          f"median {statistics.median(speedups):.2f}x")  # fmt: skip
    what = "sweep scores" if args.sweep else f"members.csv apart from {', '.join(TIMED)}"
    print(f"{what} equal: {same}; load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
