"""Where one law member's time goes, by phase: one member of a law family's preset, run in this
process (``--jobs 1``), its phases timed by wrapping the functions that do them (wall seconds).

Phases: training steps (the loop without its evaluations), the learning-curve evaluations every
``eval_every`` steps, building the evaluation sets, the final evaluation, the family's probe
(khop: hop attention), the checkpoint, the depth-usage probe, the skipped-block accuracy, and
writing the member's CSV files; the evaluations' forward passes are also split by sequence length.
The passes on the sets ``skipped_accuracy.csv`` reads (intact and each block skipped, from one
intact prefix: ``law_member.SkipPredictions``) run inside the final evaluation and are their own
line; "skipped-block accuracy" is then the scoring of their predictions.
What is left of the member's wall time (model build, counting, member.json) is printed as "rest".

    .venv/bin/python bench/profile_law_member.py --family khop --depths 3 --ks 2 --steps 300
    .venv/bin/python bench/profile_law_member.py --family crasp --depths 2 --ks 4 --steps 300
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: F401  (offline environment)

SPENT: dict[str, float] = defaultdict(float)
PHASE = ["other"]


@contextmanager
def phase(name: str):
    before, PHASE[0] = PHASE[0], name
    t0 = time.perf_counter()
    try:
        yield
    finally:
        SPENT[name] += time.perf_counter() - t0
        PHASE[0] = before
        if before != "other":  # nested: not counted twice
            SPENT[before] -= time.perf_counter() - t0


def timed(module, name: str, label: str) -> None:
    fn = getattr(module, name)

    def wrapper(*args, **kwargs):
        with phase(label):
            return fn(*args, **kwargs)

    setattr(module, name, wrapper)


def instrument(family: str) -> None:
    from depthprobe.probes.experiments import law_member, laws, member_depth
    from depthprobe.probes.experiments.protocol import get_experiment

    cls = type(get_experiment(family))
    timed(law_member, "save_checkpoint", "checkpoint")
    timed(law_member, "write_csv", "writing CSVs")
    timed(member_depth, "write_depth_usage", "depth-usage probe")
    timed(member_depth, "write_skipped_accuracy", "skipped-block accuracy")
    timed(cls, "eval_sets", "building evaluation sets")
    timed(cls, "probe", "family probe (khop: hop attention)")
    logits = law_member.member_logits

    def by_length(model, tokens, skip=()):
        t0 = time.perf_counter()
        out = logits(model, tokens, skip)
        SPENT[f"  of which forward passes at length {tokens.shape[1]} ({PHASE[0]})"] += time.perf_counter() - t0
        return out

    law_member.member_logits = by_length
    skipped = law_member.skipped_logits

    def skipped_by_length(model, tokens):
        with phase("intact and skipped-block passes on the sets skipped_accuracy.csv reads"):
            t0 = time.perf_counter()
            out = list(skipped(model, tokens))
            label = f"  of which forward passes at length {tokens.shape[1]} (skipped-block sets)"
            SPENT[label] += time.perf_counter() - t0
        return out

    law_member.skipped_logits = skipped_by_length
    hands = law_member.hands

    def hands_timed(*args, **kwargs):
        h = hands(*args, **kwargs)
        after = h.after_step

        def after_step(done):
            with phase("curriculum checks and learning-curve evaluations"):
                return after(done)

        h.after_step = after_step
        return h

    law_member.hands = hands_timed
    finish = law_member.finish

    def finish_timed(exp, job, folder, row, model, source, member, seconds, batch=1):
        scores = exp.scores

        def final_scores(*a, **k):
            with phase("final evaluation" if PHASE[0] == "other" else PHASE[0]):
                return scores(*a, **k)

        exp.scores = final_scores
        try:
            return finish(exp, job, folder, row, model, source, member, seconds, batch)
        finally:
            del exp.scores

    law_member.finish = finish_timed
    del laws


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="khop", choices=["khop", "crasp", "groups"])
    ap.add_argument("--preset", default="cpu")
    ap.add_argument("--depths", default="3")
    ap.add_argument("--ks", default="2")
    ap.add_argument("--steps", type=int, default=None, help="fewer steps than the preset's (said in the output)")
    args = ap.parse_args()
    from depthprobe.probes.experiments.runner import study

    instrument(args.family)
    options = {"depths": tuple(int(d) for d in args.depths.split(",")), "seeds": 1, "control": False}
    if args.family != "groups":
        options["ks"] = tuple(int(k) for k in args.ks.split(","))
    if args.steps is not None:
        options["steps"] = args.steps
    print(f"load average before: {os.getloadavg()}")
    c0, t0 = time.process_time(), time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        s = study(args.family, args.preset, out=Path(tmp) / "s", jobs=1, echo=lambda line: None, **options)
        table = s.table
    member_s, row = float(table["wall_s"].sum()), table.iloc[0].to_dict()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"{args.family} --preset {args.preset} {options}: member {row['member']}, {len(table)} member(s)")
    print(f"member wall {member_s:.1f} s (train_s {row.get('train_s', float('nan')):.1f} s, steps/s "
          f"{row.get('steps_per_s', float('nan')):.1f}); whole study {wall:.1f} s wall, {cpu:.1f} CPU-s")  # fmt: skip
    training = row.get("train_s") or 0.0
    print(f"{'training steps (the member row train_s)':62s} {training:7.1f} s  {100 * training / member_s:5.1f}%")
    for name, spent in sorted(SPENT.items(), key=lambda kv: (kv[0].startswith("  "), -kv[1])):
        print(f"{name:62s} {spent:7.1f} s  {100 * spent / member_s:5.1f}%")
    rest = member_s - training - sum(v for k, v in SPENT.items() if not k.startswith("  "))
    print(f"{'rest (model build, counting, member.json, ...)':62s} {rest:7.1f} s  {100 * rest / member_s:5.1f}%")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
