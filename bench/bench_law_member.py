"""One law member at a cpu preset's shape, this checkout against a baseline checkout: wall time,
interleaved rounds, and whether the two wrote the same tables.

Each round runs ``probe study --jobs 1`` for one member (``--seeds 1 --control false``, fewer
steps than the preset's with ``--steps``) once with this checkout's ``probe`` and once with the
baseline's (``--baseline``: another checkout's installed ``probe``, e.g. main's), alternating which
goes first so that a change in the machine's load hits both. It prints per round the member's wall
seconds (members.csv ``wall_s``: training, every evaluation, probes and files; imports excluded)
and training seconds (``train_s``) of each and their ratio, the median ratios, the load average
before and after, and whether every CSV the two studies wrote (members' files included) is
identical once the timing columns are dropped.

    .venv/bin/python bench/bench_law_member.py --baseline ../main/.venv/bin/probe \\
        --family khop --depths 3 --ks 2 --steps 300 --rounds 2
    .venv/bin/python bench/bench_law_member.py --baseline ../main/.venv/bin/probe \\
        --family crasp --depths 2 --ks 4 --steps 300 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

TIMED = {"wall_s", "train_s", "steps_per_s", "tokens_per_s", "elapsed_s"}  # dropped before comparing
HERE = Path(sys.executable).parent / "probe"


def run(probe: str, args: argparse.Namespace, out: Path) -> dict[str, float]:
    """One single-member study with ``probe``: its members.csv wall_s and train_s."""
    cmd = [probe, "study", "--family", args.family, "--preset", "cpu", "--depths", args.depths, "--ks", args.ks]
    cmd += ["--seeds", "1", "--control", "false", "--jobs", "1", "--out", str(out)]
    cmd += ["--steps", str(args.steps)] if args.steps else []
    subprocess.run(cmd, check=True, capture_output=True)
    row = pd.read_csv(out / "members.csv").iloc[0]
    if row["status"] != "ok":
        raise SystemExit(f"{probe}: the member did not finish ({row['status']}: {row.get('error')})")
    return {"wall": float(row["wall_s"]), "train": float(row["train_s"])}


def differing(a: Path, b: Path) -> list[str]:
    """The CSV files (relative paths) that differ between two study folders, timing columns dropped."""
    files = sorted({p.relative_to(a) for p in a.rglob("*.csv")} | {p.relative_to(b) for p in b.rglob("*.csv")})
    bad = []
    for rel in files:
        if not (a / rel).exists() or not (b / rel).exists():
            bad.append(f"{rel} (in one only)")
            continue
        x, y = (pd.read_csv(d / rel, dtype=str, keep_default_na=False) for d in (a, b))
        x, y = (t.drop(columns=[c for c in t.columns if c in TIMED]) for t in (x, y))
        if not x.equals(y):
            bad.append(str(rel))
    return bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, help="another checkout's probe executable")
    ap.add_argument("--family", default="khop", choices=["khop", "crasp"])
    ap.add_argument("--depths", default="3")
    ap.add_argument("--ks", default="2")
    ap.add_argument("--steps", type=int, default=None, help="fewer steps than the preset's")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    print(f"{args.family} cpu member: --depths {args.depths} --ks {args.ks} --steps {args.steps or 'preset'}")
    print(f"load average before: {os.getloadavg()}")
    sides = {"baseline": args.baseline, "this": str(HERE)}
    ratios, train_ratios, identical = [], [], True
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            got = {side: run(sides[side], args, Path(tmp) / f"{side}{r}") for side in order}
            bad = differing(Path(tmp) / f"baseline{r}", Path(tmp) / f"this{r}")
            identical &= not bad
            ratios.append(got["this"]["wall"] / got["baseline"]["wall"])
            train_ratios.append(got["this"]["train"] / got["baseline"]["train"])
            print(
                f"round {r + 1} ({order[0]} first): member wall baseline {got['baseline']['wall']:.1f} s, this "
                f"{got['this']['wall']:.1f} s (ratio {ratios[-1]:.2f}); train_s baseline "
                f"{got['baseline']['train']:.1f} s, this {got['this']['train']:.1f} s (ratio {train_ratios[-1]:.2f}); "
                f"load {os.getloadavg()[0]:.1f}; tables {'identical' if not bad else 'DIFFER: ' + ', '.join(bad)}"
            )
    print(f"median ratio this/baseline: member wall {statistics.median(ratios):.2f}, train_s "
          f"{statistics.median(train_ratios):.2f}; every table identical: {identical}")  # fmt: skip
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
