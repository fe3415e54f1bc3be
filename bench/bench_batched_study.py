"""A small khop study trained with batched members against the same study one member at a time, in one run.

The same study (``probe study --family khop --preset smoke`` with the options below) is run with
``--batch-members off`` and ``--batch-members N`` into fresh folders, rounds interleaved (the best
round of each kept, so load from other processes hurts both alike). Two figures per run:

- training: member-steps per training second (the members' ``train_s``; a batch's seconds are
  shared by its members, so a study's training seconds are the sum of ``train_s / batch``);
- wall: the whole study's seconds (training, learning-curve evaluations, final evaluations, the
  hop-attention and depth-usage probes, checkpoints and files; these do not batch).

It also checks that the two runs' accuracy tables are identical (tests/experiments/test_law_batch.py holds the
tolerances). What it shows: the gain a study gets from batching on this machine at this shape. Not
shown: other shapes (``bench/bench_batched_members.py`` times the training step alone at any shape),
nor a GPU unless ``--device cuda``.

    .venv/bin/python bench/bench_batched_study.py [--seeds 4] [--depths 1,2] [--width 16] [--steps 200]
        [--batch-members 4] [--rounds 2] [--device cpu|cuda] [--jobs 1]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: F401  (offline environment)

from depthprobe.probes.experiments.runner import study


def one_run(args: argparse.Namespace, mode: str | int, root: Path) -> tuple[float, float, Any]:
    """(training seconds, wall seconds, the study) of the study with ``--batch-members mode``."""
    out = root / f"study-{mode}"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    result = study(
        "khop",
        "smoke",
        out=out,
        echo=lambda _line: None,
        seeds=args.seeds,
        depths=tuple(int(d) for d in args.depths.split(",")),
        d_models=(args.width,),
        steps=args.steps,
        eval_every=args.steps,
        control=False,
        device=args.device,
        jobs=args.jobs,
        batch_members=mode,
    )
    wall = time.perf_counter() - t0
    members = result["members.csv"]
    if not (members.status == "ok").all():
        raise SystemExit(f"a member failed: {members.error.tolist()}")
    return float((members.train_s / members.batch).sum()), wall, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=4, help="members per shape")
    ap.add_argument("--depths", default="1,2")
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-members", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--jobs", type=int, default=1)
    args = ap.parse_args()
    n_members = args.seeds * len(args.depths.split(","))
    print(f"khop study: {n_members} members (depths {args.depths}, d_model {args.width}, {args.seeds} seeds), "
          f"{args.steps} steps each, batches of {args.batch_members}, --jobs {args.jobs}, {args.device}; "
          f"best of {args.rounds} rounds")  # fmt: skip
    best: dict[str, tuple[float, float]] = {}
    tables: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-batched-study-") as tmp:
        for _ in range(args.rounds):
            for label, mode in (("one by one", "off"), ("batched", args.batch_members)):
                train, wall, result = one_run(args, mode, Path(tmp))
                old = best.get(label, (float("inf"), float("inf")))
                best[label] = (min(old[0], train), min(old[1], wall))
                tables[label] = result["accuracy.csv"]
    same = tables["one by one"].equals(tables["batched"])
    steps = n_members * args.steps
    (t1, w1), (tb, wb) = best["one by one"], best["batched"]
    print(f"training: one by one {steps / t1:.0f} member-steps/s | batched {steps / tb:.0f} member-steps/s | "
          f"batched/one by one {t1 / tb:.2f}x")  # fmt: skip
    print(f"wall (whole study): one by one {w1:.1f} s | batched {wb:.1f} s | {w1 / wb:.2f}x")
    print(f"accuracy.csv identical: {same}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
