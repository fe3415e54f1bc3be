"""Start-up, side by side: `probe --help` and `probe list tasks` against `python -c pass`.

Each command runs as its own process, in interleaved rounds (other load hits all alike); the best
(least disturbed) wall time of each is printed, with its ratio to the bare interpreter and the
extra seconds over it. For reference, the import of torch alone is timed the same way (what
`probe --help` cost before the facade became lazy). This process imports neither torch nor depthprobe.

Usage: python bench/bench_startup.py [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
CASES = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "probe --help": [str(BIN / "probe"), "--help"],
    "probe list tasks": [str(BIN / "probe"), "list", "tasks"],
    "python -c 'import torch'": [sys.executable, "-c", "import torch"],
}


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    rounds = parser.parse_args().rounds
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for cmd in CASES.values():  # warm the file cache once
        timed(cmd)
    for _ in range(rounds):
        for name, cmd in CASES.items():
            times[name].append(timed(cmd))
    base = min(times["python -c pass"])
    print(f"{'command':28s} {'best s':>8s} {'x bare':>8s} {'+ s':>8s}   ({rounds} rounds, interleaved)")
    for name, ts in times.items():
        best = min(ts)
        print(f"{name:28s} {best:8.3f} {best / base:8.2f} {best - base:8.3f}")


if __name__ == "__main__":
    main()
