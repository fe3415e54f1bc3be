"""The ablation task against the task it wraps, as whole processes side by side.

``probe run --task ablation -O source=X`` runs the source task X once clean and once per ablated
head set (found and control), with the behaviour measured on the same forward passes; this
bench times it against ``probe run --task X`` on the same model, in interleaved rounds (so that
other load on the machine hits both alike), each command a fresh process.

Usage: python bench/bench_ablation.py [--rounds N] [--sources induction,attention-stats] [--model minilm]
Prints the best (least disturbed) wall time of each side, their ratio and the per-round ratios.
Target: ablation <= 3x its source.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SOURCES = ("induction", "syntax", "coref", "attention-stats")


def wall(cmd: list[str]) -> float:
    """Wall seconds of one child process; fails loudly if it fails."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sources", default="induction")
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--probe", default=str(Path(sys.executable).parent / "probe"), help="the probe command")
    args = ap.parse_args()
    sources = [s.strip() for s in args.sources.split(",") if s.strip()]
    unknown = [s for s in sources if s not in SOURCES]
    if unknown:
        sys.exit(f"unknown source(s) {unknown}; choose from {', '.join(SOURCES)}")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, {args.rounds} interleaved rounds, {args.model}")
    with tempfile.TemporaryDirectory(prefix="bench-ablation-") as work:
        for source in sources:
            base = [args.probe, "run", "--model", args.model, "--device", "cpu", "--no-progress"]
            plain = [*base, "--task", source]
            ablation = [*base, "--task", "ablation", "-O", f"source={source}"]
            times: dict[str, list[float]] = {"source": [], "ablation": []}
            for i in range(args.rounds):
                times["source"].append(wall([*plain, "--out", f"{work}/{source}-{i}"]))
                times["ablation"].append(wall([*ablation, "--out", f"{work}/ablation-{source}-{i}"]))
            s, a = min(times["source"]), min(times["ablation"])
            rounds = ", ".join(f"{x / y:.2f}" for x, y in zip(times["ablation"], times["source"], strict=True))
            print(f"{source}: {source} {s:.1f} s, ablation {a:.1f} s, ratio {a / s:.2f}x (rounds: {rounds})")


if __name__ == "__main__":
    main()
