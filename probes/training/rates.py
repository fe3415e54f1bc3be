"""Measured training speeds of depth-law members: what a cost estimate multiplies steps by.

Every row is a measurement (never an assumption): the device by name, the members' shapes, the
steps per second of one member (the lowest and highest measured over the shapes), how many
members shared the device (``jobs``) and where the figure comes from. A planner (``--dry-run``,
the presets' cost lines) turns a study into seconds with :func:`training_seconds`: member-steps
divided by the throughput ``jobs * steps_per_s`` of the slowest measured rate (an upper bound of
the training time; evaluations, probes and writing are not in it), and says which row it used.
Devices or shapes without a row have no estimate (None): say so rather than assume one.

Pure data and arithmetic (no torch), so ``probe --help`` can read it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rate:
    """Steps per second of one member of ``family`` on ``device``, ``jobs`` members at once."""

    family: str
    device: str
    shapes: str
    low: float  # steps/s of the slowest shape measured
    high: float  # of the fastest
    jobs: int
    source: str


H200 = "NVIDIA H200"
CPU = "CPU, 1 thread per member"
ISSUE_36 = ("issue #36: one NVIDIA H200, torch 2.11 + CUDA 13, depthprobe's wheel of main at the time; "
            "khop members of the gpu preset's shapes, one member at a time and with --jobs 3")  # fmt: skip
DEPTH_LAWS = ("docs/depth-laws.md: one member at OMP_NUM_THREADS=1 on the reference machine (2 cores, shared), "
              "150 steps each, in steps per CPU-second")  # fmt: skip

RATES: tuple[Rate, ...] = (
    Rate("khop", H200, "depth 6 at d_model 128 and 256, the 2-layer control at 444; N 100, batch 32", 80, 104, 1,
         ISSUE_36),
    Rate("khop", H200, "the same shapes, three members at once on the one GPU", 53, 65, 3, ISSUE_36),
    Rate("khop", CPU, "depths 1-5 at d_model 64 and the 2-layer control at 112; N 48, batch 32", 13.2, 53, 1,
         DEPTH_LAWS),
    Rate("groups", CPU, "depths 1-4 at d_model 64 and the control at 92; T 16, batch 32", 45, 142, 1, DEPTH_LAWS),
)  # fmt: skip


def rate(family: str, device: str, jobs: int = 1) -> Rate | None:
    """The measured rate of ``family`` on ``device`` with ``jobs`` members at once (None: not measured)."""
    return next((r for r in RATES if (r.family, r.device, r.jobs) == (family, device, jobs)), None)


def device_label(kind: str, name: str = "") -> str | None:
    """The rates' name of a device: ``cpu`` -> :data:`CPU`; a CUDA device by its name (``NVIDIA
    H200`` -> :data:`H200`); None for a device without measurements."""
    if kind == "cpu":
        return CPU
    return next((r.device for r in RATES if r.device != CPU and r.device.lower() in name.lower()), None)


def estimate(family: str, device: str | None, steps: int) -> tuple[float | None, str]:
    """One member's training seconds at the slowest measured rate, one member at a time, and
    where that figure comes from (or why there is none)."""
    found = rate(family, device) if device is not None else None
    if found is None:
        return None, f"not estimated: no measured rate of {family} members on {device or 'this device'}"
    return steps / found.low, f"estimated from {found.low:g} steps/s on {found.device} ({found.source})"


def training_seconds(family: str, device: str, members: int, steps: int, jobs: int = 1) -> float | None:
    """Training seconds of ``members`` members of ``steps`` steps each at the slowest measured rate
    (None: no measurement for this family, device and ``jobs``)."""
    found = rate(family, device, jobs)
    return None if found is None else members * steps / (found.jobs * found.low)


__all__ = ["RATES", "Rate", "device_label", "estimate", "rate", "training_seconds"]
