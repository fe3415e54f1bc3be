"""The measured-rate table (probes/training/rates.py): its arithmetic, and no row without a source."""

from __future__ import annotations

import pandas as pd
import pytest

from depthprobe.probes.experiments.runner import dry_run
from depthprobe.probes.training.rates import CPU, H200, RATES, device_label, estimate, rate, training_seconds


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


def test_devices_are_named_as_the_rates_name_them():
    assert device_label("cpu") == CPU
    assert device_label("cuda", "NVIDIA H200 NVL") == H200
    assert device_label("cuda", "NVIDIA A100-SXM4-80GB") is None


def test_one_member_estimate_says_its_source():
    seconds, source = estimate("khop", H200, 20_000)
    assert seconds == pytest.approx(250)  # 20,000 steps at 80 steps/s
    assert source.startswith("estimated from 80 steps/s on NVIDIA H200") and "issue #36" in source
    seconds, source = estimate("crasp", CPU, 100)
    assert seconds is None and source.startswith("not estimated: no measured rate of crasp members")


def test_dry_run_plan_carries_estimated_seconds_and_their_source(tmp_path):
    lines: list[str] = []
    table = dry_run("khop", "cpu", out=tmp_path / "plan", device="cpu", echo=lines.append)
    saved = pd.read_csv(tmp_path / "plan" / "plan.csv")
    assert list(saved.columns[-2:]) == ["est_seconds", "source"]
    assert saved.est_seconds.tolist() == pytest.approx([3000 / 13.2] * len(table))  # the slowest CPU rate
    assert saved.source.str.startswith("estimated from 13.2 steps/s on CPU").all()
    total = 12 * 3000 / 13.2 / 60
    assert f"estimated training: 12 members, at most {total:.1f} min one member at a time" in lines[-1]
    crasp = dry_run("crasp", "smoke", out=tmp_path / "crasp", device="cpu", echo=lines.append)
    assert crasp.est_seconds.isna().all() and crasp.source.str.startswith("not estimated").all()
