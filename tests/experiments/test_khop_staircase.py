"""The khop law table beside the four staircases (floor, ceil, linear, the authors' 4- and 8-head
runs), budget-limited members on planted learning curves, and the staircase preset's plan."""

from __future__ import annotations

import pandas as pd
import pytest

from depthprobe.probes.experiments.khop import (
    AUTHORS_DEPTHS,
    ceil_depth,
    curve_gains,
    linear_depth,
    outcomes,
    predicted_depth,
)
from tests.helpers import law_table, plan, resolve


def curve(member: str, k: int, points: dict[int, float]) -> list[dict[str, object]]:
    return [{"member": member, "step": s, "k": k, "accuracy": a, "accuracy_all": a} for s, a in points.items()]


def test_the_four_staircases_for_k_1_to_8():
    ks = range(1, 9)
    assert [predicted_depth(k) for k in ks] == [2, 3, 3, 4, 4, 4, 4, 5]
    assert [ceil_depth(k) for k in ks] == [2, 3, 4, 4, 5, 5, 5, 5]
    assert [linear_depth(k) for k in ks] == [2, 3, 4, 5, 6, 7, 8, 9]
    assert [AUTHORS_DEPTHS[8][k] for k in ks] == [2, 3, 3, 4, 4, 4, 4, 5]  # their errors.json, 8 heads
    assert [AUTHORS_DEPTHS[4][k] for k in ks] == [2, 3, 4, 5, 6, 6, 6, 6]  # 4 heads
    assert 11 not in AUTHORS_DEPTHS[4]  # no depth of 2-6 reached error 0.01 at k = 11 with 4 heads


def test_gain_over_the_last_2000_steps_on_planted_curves():
    rows = (
        curve("rising", 8, {5500: 0.90, 6000: 0.94, 7000: 0.96, 8000: 0.971})  # +0.031 since step 6,000
        + curve("flat", 8, {6000: 0.800, 7000: 0.805, 8000: 0.809})  # +0.009: not more than 0.01
        + curve("short", 8, {250: 0.5, 500: 0.9})  # no evaluation 2,000 steps before the last
        + curve("between", 8, {5750: 0.70, 6250: 0.75, 8000: 0.80})  # reference: 5,750, the last at or before 6,000
    )
    gains = curve_gains(pd.DataFrame(rows)).set_index("member")["gain"]
    assert gains["rising"] == pytest.approx(0.031) and gains["flat"] == pytest.approx(0.009)
    assert pd.isna(gains["short"]) and gains["between"] == pytest.approx(0.10)


def test_outcomes_and_budget_limited_depths_on_planted_members():
    # k = 8 at width 32: depth 5 solves in both seeds; depth 4 is below 0.99 in both, seed 0 still
    # rising (+0.031) and seed 1 solved; depth 3 is below in both, seed 0 rising and seed 1 flat
    # (failed, so depth 3 is not budget-limited). k = 7: nothing solves; depth 5 rising in both seeds.
    final = {(3, 0): 0.70, (3, 1): 0.60, (4, 0): 0.971, (4, 1): 0.995, (5, 0): 0.999, (5, 1): 0.998}
    rising = {(3, 0), (4, 0)}
    acc_rows, curve_rows = [], []
    for (depth, seed), a in final.items():
        for k in (7, 8):
            member = f"L{depth}-d32-s{seed}"
            last = a if k == 8 else 0.9
            up = (k == 8 and (depth, seed) in rising) or (k == 7 and depth == 5)
            acc_rows.append({"member": member, "depth": depth, "d_model": 32, "seed": seed, "control": False,
                             "k": k, "accuracy": last})  # fmt: skip
            curve_rows += curve(member, k, {6000: last - (0.031 if up else 0.005), 8000: last})
    acc = outcomes(pd.DataFrame(acc_rows), pd.DataFrame(curve_rows), threshold=0.99)
    got = acc.set_index(["member", "k"])["outcome"]
    assert got[("L4-d32-s0", 8)] == "budget-limited" and got[("L4-d32-s1", 8)] == "solved"
    assert got[("L3-d32-s0", 8)] == "budget-limited" and got[("L3-d32-s1", 8)] == "failed"
    assert got[("L5-d32-s0", 8)] == "solved" and got[("L3-d32-s0", 7)] == "failed"
    law = law_table(acc, "khop", 0.99, seeds=2).set_index("k")
    assert law.loc[8, "measured_depth"] == 5 and law.loc[8, "budget_limited"] == "4"  # depth 3: seed 1 failed
    assert pd.isna(law.loc[7, "measured_depth"]) and law.loc[7, "budget_limited"] == "5"
    assert law.loc[8, "ceil_depth"] == 5 and law.loc[8, "linear_depth"] == 9
    assert (law.loc[8, "authors_4_heads"], law.loc[8, "authors_8_heads"]) == (6, 5)
    # without outcomes (accuracy.csv of an older study) nothing is called budget-limited
    plain = law_table(pd.DataFrame(acc_rows), "khop", 0.99, seeds=2)
    assert (plain.budget_limited == "").all()


def test_staircase_preset_is_the_review_plan():
    cfg = resolve("khop", "staircase")
    assert cfg.ks == tuple(range(1, 9)) and cfg.depths == (2, 3, 4, 5) and cfg.d_models == (32, 64)
    assert (cfg.steps, cfg.seeds, cfg.control, cfg.length, cfg.heads) == (8000, 2, False, 48, 4)
    assert len(plan(cfg)) == 16
