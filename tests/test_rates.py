"""The measured-rate table (probes/training/rates.py): its arithmetic, and no row without a source."""

from __future__ import annotations

import pytest

from depthprobe.probes.training.rates import H200, RATES, rate, training_seconds


def test_khop_gpu_preset_takes_about_three_hours_at_the_measured_h200_rate():
    # 45 members x 20,000 steps at the slowest measured rate, 80 steps/s one at a time: 11,250 s
    assert training_seconds("khop", H200, members=45, steps=20_000) == pytest.approx(11_250)
    # with --jobs 3 at 53 steps/s each: 900,000 / 159 s
    assert training_seconds("khop", H200, members=45, steps=20_000, jobs=3) == pytest.approx(900_000 / 159)


def test_an_unmeasured_device_or_family_has_no_estimate():
    assert training_seconds("groups", H200, members=1, steps=1) is None
    assert rate("khop", "NVIDIA A100") is None


def test_every_rate_names_its_device_and_source():
    for r in RATES:
        assert 0 < r.low <= r.high and r.jobs >= 1 and r.device and r.source and r.shapes
