"""Peak memory of a task run as the data grows: the same task on 1/8 of EWT dev and on all of it,
each in a fresh process, with the peak resident set size of each and their ratio. Running sums
mean the ratio stays near 1 (the model and the batch dominate; the data set is not held as maps).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EWT = ROOT.parent / "shared" / "data" / "ud-ewt-dev"

CHILD = """
import json, resource, sys
from depthprobe import probes
r = probes.run("minilm", sys.argv[1], sys.argv[2], limit=int(sys.argv[3]))
print(json.dumps({"examples": r.counts["examples"],
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def peak(task: str, data: Path, limit: int) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, task, str(data), str(limit)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    if not EWT.exists():
        sys.exit("bench_memory needs ../shared/data/ud-ewt-dev beside the repository")
    small, large = peak("syntax", EWT, 250), peak("syntax", EWT, 2001)
    print(f"syntax on {small['examples']} sentences: peak {small['peak_mb']:.0f} MB")
    print(f"syntax on {large['examples']} sentences: peak {large['peak_mb']:.0f} MB")
    print(f"ratio {large['peak_mb'] / small['peak_mb']:.2f}x for {large['examples'] / small['examples']:.1f}x the data")


if __name__ == "__main__":
    main()
