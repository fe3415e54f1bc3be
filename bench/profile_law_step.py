"""What one training step of a law member costs, against its fixed cost: CPU milliseconds per
update (process time, one thread, as a member trains) at the member's batch shape, and the same
update on 1 sequence of 5 tokens (every op, the autograd engine, clipping, AdamW and the Python
around them, on almost no data: the step's fixed cost); also the batch source's milliseconds per
batch. Their gap is the kernels' arithmetic: what removing overhead cannot remove.

    .venv/bin/python bench/profile_law_step.py --family khop --depths 3 --ks 2
    .venv/bin/python bench/profile_law_step.py --family crasp --depths 2 --ks 4
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: F401  (offline environment)
import torch


class Cut:
    """The member's batches cut to ``rows`` sequences of ``width`` tokens."""

    def __init__(self, source, rows: int, width: int) -> None:
        self.source, self.rows, self.width = source, rows, width

    def batch(self, step: int):
        x, y = self.source.batch(step)
        return x[: self.rows, : self.width].contiguous(), y[: self.rows, : self.width].contiguous()

    def loss(self, logits, targets):
        return self.source.loss(logits, targets)


def cpu_ms(fn, steps: int) -> float:
    """Process CPU milliseconds per call of ``fn(step)`` over ``steps`` calls (after 3 warm-up calls)."""
    for s in range(3):
        fn(s)
    c0 = time.process_time()
    for s in range(steps):
        fn(s)
    return (time.process_time() - c0) / steps * 1e3


def member_setup(family: str, depth: int, ks: str):
    """One cpu-preset member of ``family`` at ``depth`` (``ks``: its k values), ready to train on
    one thread: ``(make_step, source)``, where ``make_step(src)`` is one update on ``src``'s batches."""
    from depthprobe.probes.experiments.law_member import BETAS
    from depthprobe.probes.experiments.runner import planned
    from depthprobe.probes.models.loading import load
    from depthprobe.probes.training.fast_forward import fast_logits
    from depthprobe.probes.training.lm import decay_adamw
    from depthprobe.probes.training.loop import _update

    options: dict = {"depths": (depth,), "seeds": 1, "control": False}
    if family != "groups":
        options["ks"] = tuple(int(k) for k in ks.split(","))
    exp, cfg, jobs = planned(family, "cpu", options)
    torch.set_num_threads(1)
    model = load(jobs[0].native(), device="cpu")
    net = model.bridge.original_model
    params = [p for p in net.parameters() if p.requires_grad]
    opt = decay_adamw(net, lr=cfg.lr, betas=BETAS, weight_decay=cfg.weight_decay)
    net.train()

    def make_step(src):
        return lambda s: _update(lambda x: fast_logits(model, x), src, opt, params, s, cfg.lr_at(s), 1.0,
                                 model.device, torch.nn.utils.clip_grad_norm_)  # fmt: skip

    return make_step, exp.source(jobs[0])


def member_step(family: str, depth: int, ks: str):
    """One update of the member at its own batch shape, and that shape."""
    make_step, source = member_setup(family, depth, ks)
    return make_step(source), tuple(source.batch(0)[0].shape)


def member_args(doc: str, steps: int) -> argparse.Namespace:
    """The command line of a law-member profiler: --family, --depths (one depth), --ks, --steps."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--family", default="khop", choices=["khop", "crasp", "groups"])
    ap.add_argument("--depths", default="3")
    ap.add_argument("--ks", default="2")
    ap.add_argument("--steps", type=int, default=steps)
    return ap.parse_args()


def main() -> None:
    args = member_args(__doc__, steps=40)
    step, source = member_setup(args.family, int(args.depths), args.ks)
    shape = tuple(source.batch(0)[0].shape)
    print(f"{args.family} L{args.depths}, batch {shape}; load average {os.getloadavg()}")
    full, fixed = cpu_ms(step(source), args.steps), cpu_ms(step(Cut(source, 1, 5)), args.steps)
    data = cpu_ms(source.batch, args.steps)
    print(f"update at the member's shape: {full:.1f} CPU-ms; on 1 x 5 tokens: {fixed:.1f} CPU-ms "
          f"({100 * fixed / full:.0f}%); the batch source alone: {data:.2f} CPU-ms")  # fmt: skip
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
