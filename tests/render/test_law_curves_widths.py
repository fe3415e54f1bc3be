"""Learning curves of a law study with members at several widths: one line per depth and width, so
seeds of different widths are never averaged together."""

from __future__ import annotations

import re

import pandas as pd

from depthprobe.probes.render.laws import curves


def _study(widths: tuple[int, ...]) -> tuple[pd.DataFrame, pd.DataFrame]:
    members, rows = [], []
    for width in widths:
        for seed in (0, 1):
            name = f"L2-d{width}-s{seed}"
            members.append({"member": name, "depth": 2, "control": False, "d_model": width})
            for step in (250, 500):  # width 32 learns to 0.2-0.3, width 64 to 0.9-1.0
                acc = (0.1 if width == 32 else 0.45) * step / 250 + 0.05 * seed
                rows.append({"member": name, "k": 8, "step": step, "accuracy": acc})
    members.append({"member": "C2-d104-s0", "depth": 2, "control": True, "d_model": 104})
    rows += [{"member": "C2-d104-s0", "k": 8, "step": s, "accuracy": 0.5} for s in (250, 500)]
    return pd.DataFrame(rows), pd.DataFrame(members)


def _labels(html: str) -> list[str]:
    return sorted(set(re.findall(r"(depth \d+(?:, d_model \d+)?|control L\d+)</text>", html)))


def test_two_widths_get_a_line_each() -> None:
    curve, members = _study((32, 64))
    html = curves("k", curve, members, 0.99)
    assert _labels(html) == ["control L2", "depth 2, d_model 32", "depth 2, d_model 64"]


def test_one_width_keeps_the_plain_labels() -> None:
    curve, members = _study((64,))
    html = curves("k", curve, members, 0.99)
    assert _labels(html) == ["control L2", "depth 2"]
