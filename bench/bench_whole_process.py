"""Whole processes, side by side: `probe run` against the bare Hugging Face script (bare_hf.py).

For each case both commands run as separate processes, in interleaved rounds (so that other load
on the machine hits both alike); wall time and peak RSS (``ru_maxrss`` from ``os.wait4``) are taken
per process. Cases: syntax on all of EWT dev, coref on OntoGUM dev and attention-stats on the
text of the EWT dev sentences (one per line), each against the bare script fed the same texts in the same batches,
and the
built-in-sample runs of every text task against the bare script's fixed cost (imports, tokenizer
and model load, no forward pass).

This process imports neither torch nor depthprobe, and the batches are prepared in a child process:
on Linux a child's peak RSS starts from its parent's at fork, so a large parent would inflate both
sides' figures.

The bare script's batches are the texts of the probe run's own batches (decoded from its token
ids, specials dropped), written to a JSON file once before timing; the bare script tokenizes them
again. Its token count is printed next to the probe run's so that the work can be compared.

Usage: python bench/bench_whole_process.py [--rounds N] [--cases syntax,coref,...] [--model minilm]
Prints the best (least disturbed) wall time of each side, the ratio of the two, the per-round
ratios and the peak-RSS ratio. Targets: time <= 1.10x, RSS <= 1.15x, built-in samples within
the bare fixed cost + 0.5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# development data: ../shared/data next to the checkout (or two levels up, for a git worktree)
DATA = next(
    (p for p in (ROOT.parent / "shared" / "data", ROOT.parent.parent / "shared" / "data") if p.is_dir()),
    ROOT.parent / "shared" / "data",
)
sys.path.insert(0, str(ROOT))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# name -> (task, data or None); "sample-*" cases compare against the bare fixed cost
CASES = {
    "syntax": ("syntax", DATA / "ud-ewt-dev"),
    "coref": ("coref", DATA / "ontogum-dev"),
    "attention-stats": ("attention-stats", DATA / "ud-ewt-dev" / "en_ewt-ud-dev.conllu"),  # its "# text =" lines
    "sample-attention-stats": ("attention-stats", None),
    "sample-syntax": ("syntax", None),
    "sample-coref": ("coref", None),
}


def measure(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in MB) of one child process; fails loudly if it fails."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{err[-2000:]}")
    return wall, usage.ru_maxrss / 1024


def prepare(model: str, task: str, data: Path | None, path: Path, batch_size: int) -> tuple[int, str]:
    """Run ``dump_batches`` in a child process; (token count, model directory)."""
    cmd = [
        sys.executable,
        __file__,
        "--dump",
        json.dumps([model, task, None if data is None else str(data), str(path), batch_size]),
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    n_tokens, model_dir = json.loads(out)
    return n_tokens, model_dir


def dump_batches(model_name: str, task_name: str, data: str | None, path: str, batch_size: int) -> None:
    """Write the probe run's batches as texts; prints [token count, model directory]."""
    from depthprobe import probes
    from depthprobe.probes.engine.task import Context, RunConfig, get_task
    from depthprobe.probes.models.hub import minilm_path

    model = probes.load(model_name)
    task = get_task(task_name)
    ctx = Context(
        RunConfig(model=model_name, task=task_name, data=None if data is None else str(data), batch_size=batch_size),
        task.Options(),
    )
    examples = task.load(model, ctx)
    out, n_tokens = [], 0
    for b in task.batches(model, examples, ctx):
        rows = []
        for ids, mask in zip(b.input_ids.tolist(), b.attention_mask.tolist(), strict=True):
            kept = [i for i, m in zip(ids, mask, strict=True) if m]
            n_tokens += len(kept)
            rows.append(model.tokenizer.decode(kept, skip_special_tokens=True))
        out.append(rows)
    Path(path).write_text(json.dumps(out), encoding="utf-8")
    print(json.dumps([n_tokens, str(minilm_path())]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument(
        "--probe",
        default=str(Path(sys.executable).parent / "probe"),
        help="the probe command to measure (default: the one next to this python)",
    )
    ap.add_argument("--dump", default=None, help=argparse.SUPPRESS)  # internal: the child that prepares batches
    args = ap.parse_args()
    if args.dump:
        dump_batches(*json.loads(args.dump))
        return
    if args.model != "minilm":
        sys.exit("only --model minilm is supported: the bare script loads minilm's directory")
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        sys.exit(f"unknown case(s) {unknown}; choose from {', '.join(CASES)}")
    work = Path(tempfile.mkdtemp(prefix="bench-whole-"))
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, OMP_NUM_THREADS="
        f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, {args.rounds} interleaved rounds, probe = {args.probe}"
    )
    try:
        for case in cases:
            task, data = CASES[case]
            if data is not None and not data.exists():
                print(f"{case}: skipped, {data} is missing")
                continue
            fixed = case.startswith("sample-")
            if task == "attention-stats" and data is not None:  # raw text, one sentence per line
                lines = [
                    ln[len("# text = ") :]
                    for ln in data.read_text(encoding="utf-8").splitlines()
                    if ln.startswith("# text = ")
                ]
                data = work / "ewt-dev.txt"
                data.write_text("\n".join(lines) + "\n", encoding="utf-8")
            batches = work / f"{case}.json"
            n_tokens, model_dir = prepare(args.model, task, data, batches, args.batch_size)
            bare = [sys.executable, str(ROOT / "bench" / "bare_hf.py"), model_dir]
            bare_cmd = bare if fixed else [*bare, "--batches", str(batches)]
            t_bare, t_probe, m_bare, m_probe = [], [], [], []
            for r in range(args.rounds):
                out = work / f"run-{case}-{r}"
                probe_cmd = [
                    args.probe,
                    "run",
                    "--model",
                    args.model,
                    "--task",
                    task,
                    "--out",
                    str(out),
                    "--no-progress",
                    "--batch-size",
                    str(args.batch_size),
                ]
                if data is not None:
                    probe_cmd += ["--data", str(data)]
                order = [(bare_cmd, t_bare, m_bare), (probe_cmd, t_probe, m_probe)]
                for cmd, ts, ms in order if r % 2 == 0 else order[::-1]:
                    wall, rss = measure(cmd)
                    ts.append(wall)
                    ms.append(rss)
                shutil.rmtree(out, ignore_errors=True)
            what = "bare fixed cost (no forward)" if fixed else "bare HF script"
            print(
                f"\n== {case}: {task}"
                + (f" on {data.name}" if data else " on the built-in sample")
                + f", {n_tokens} tokens in the probe run's batches"
            )
            print(
                f"{what:30s} {min(t_bare):6.2f} s  peak RSS {max(m_bare):6.0f} MB   "
                f"(runs {', '.join(f'{t:.2f}' for t in t_bare)})"
            )
            print(
                f"{'probe run':30s} {min(t_probe):6.2f} s  peak RSS {max(m_probe):6.0f} MB   "
                f"(runs {', '.join(f'{t:.2f}' for t in t_probe)})"
            )
            if fixed:
                print(
                    f"probe run - bare fixed cost: {min(t_probe) - min(t_bare):+.2f} s (target <= +0.5 s); "
                    f"RSS ratio {max(m_probe) / max(m_bare):.2f}x"
                )
            else:
                rounds = ", ".join(f"{p / b:.2f}x" for p, b in zip(t_probe, t_bare, strict=True))
                print(
                    f"time ratio {min(t_probe) / min(t_bare):.2f}x (target <= 1.10x; per round {rounds}); "
                    f"peak RSS ratio {max(m_probe) / max(m_bare):.2f}x (target <= 1.15x)"
                )
            sys.stdout.flush()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
