"""The ``crasp`` family's tables and report sections (:mod:`.crasp`).

- ``accuracy.csv``: per member and range (``max_length``): exact-match string accuracy
  (``accuracy``), token accuracy, ``step_reached``, with the member's ``k``.
- ``law.csv``: per width and k, the predicted first depth (k - 2), the measured one (the first
  depth whose exact-match accuracy on the deciding range is >= the threshold in every seed), their
  difference, the first depth that reaches it at the training lengths (in distribution), the
  control's exact-match accuracy on the deciding range, and depth 1 beside its exact limit without
  positions (:mod:`probes.data.crasp_cap`: per token for every k, per string for k <= 4).
- ``depths.csv``: per k, model and range: exact-match accuracy (mean and min over seeds), token
  accuracy and the majority-class token accuracy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import pandas as pd

from depthprobe.probes.experiments.laws import measured_depths

if TYPE_CHECKING:
    from depthprobe.probes.experiments.crasp import CraspConfig

DEPTH_COLUMNS = [
    "k",
    "model",
    "depth",
    "d_model",
    "control",
    "min_length",
    "max_length",
    "exact_match",
    "exact_match_min",
    "token_accuracy",
    "majority",
]


def law(cfg: CraspConfig, acc: pd.DataFrame, predicted_depth: Callable[[int], int], columns: list[str]) -> pd.DataFrame:
    """One row per width and k (see the module's docstring) in ``columns``; ``predicted_depth`` is the family's."""
    keys = ["d_model", "k"]
    solve, train = acc[acc["max_length"] == cfg.solve_at], acc[acc["max_length"] == cfg.eval_lengths[0]]
    law = measured_depths(solve, keys, cfg)
    law["predicted_depth"] = law["k"].map(predicted_depth)
    law["difference"] = law["measured_depth"] - law["predicted_depth"]
    lo_solve = dict((hi, lo) for lo, hi in cfg.ranges)[cfg.solve_at]
    law["solve_range"] = [f"{max(lo_solve, k)}-{cfg.solve_at}" for k in law["k"]]
    in_distribution = measured_depths(train, keys, cfg).rename(columns={"measured_depth": "in_distribution_depth"})
    control = (
        solve[solve["control"].astype(bool)]
        .groupby("k")
        .agg(
            control_depth=("depth", "first"),
            control_d_model=("d_model", "first"),
            control_exact_match=("accuracy", "mean"),
        )
    )
    one = train[(train["depth"] == 1) & ~train["control"].astype(bool)]  # depth 1 at the training range
    one = one.groupby(keys).agg(
        depth1_exact_match=("accuracy", "mean"), depth1_token_accuracy=("token_accuracy", "mean")
    )
    law = (
        law.merge(in_distribution, on=keys, how="left")
        .merge(control, on="k", how="left")
        .merge(one, on=keys, how="left")
    )
    law["depth1_string_cap"], law["depth1_token_cap"] = zip(*(depth_one_caps(cfg, k) for k in law["k"]), strict=True)
    rounded = [
        "control_exact_match",
        "depth1_exact_match",
        "depth1_string_cap",
        "depth1_token_accuracy",
        "depth1_token_cap",
    ]
    law[rounded] = law[rounded].astype(float).map(round, ndigits=4)
    return law[columns].astype({"control_depth": "Int64", "control_d_model": "Int64"})


def depth_one_caps(cfg: CraspConfig, k: int) -> tuple[float, float]:
    """Depth 1's exact limits without positions at the training range (:mod:`probes.data.crasp_cap`):
    per string (k <= 4; nan beyond) and per token."""
    from depthprobe.probes.data import crasp_cap

    lo, hi = max(cfg.nmin, k), cfg.eval_lengths[0]
    string_cap = 1.0 if k <= 3 else crasp_cap.string_cap_l4(lo, hi)[0] if k == 4 else math.nan
    return string_cap, crasp_cap.token_cap(k, lo, hi)


def by_depth(acc: pd.DataFrame, ranges: pd.DataFrame) -> pd.DataFrame:
    """Per k, model (depth, or the control) and range: the accuracies over seeds and the majority."""
    if acc.empty:
        return pd.DataFrame(columns=DEPTH_COLUMNS)
    if ranges.empty:
        acc = acc.assign(min_length=math.nan, majority=math.nan)
    else:
        acc = acc.merge(ranges, on=["member", "max_length"], how="left")
    out = acc.groupby(["k", "control", "depth", "d_model", "max_length"], sort=True).agg(
        min_length=("min_length", "min"),
        exact_match=("accuracy", "mean"),
        exact_match_min=("accuracy", "min"),
        token_accuracy=("token_accuracy", "mean"),
        majority=("majority", "mean"),
    )
    out = out.reset_index()
    out["model"] = [
        f"control: depth {depth}, d_model {d}" if control else f"depth {depth}"
        for control, depth, d in zip(out["control"], out["depth"], out["d_model"], strict=True)
    ]
    rounded = ["exact_match", "exact_match_min", "token_accuracy", "majority"]
    out[rounded] = out[rounded].map(round, ndigits=4)
    return out[DEPTH_COLUMNS]


def depths_section(tables: dict[str, pd.DataFrame]) -> list[str]:
    """Exact-match accuracy per model and range (depths.csv), between the heatmaps and the curves."""
    from depthprobe.probes.render.html import table as html_table

    depths = tables.get("depths.csv", pd.DataFrame())
    if depths.empty:
        return []
    wide = depths.pivot_table(index=["k", "model"], columns="max_length", values="exact_match", aggfunc="first")
    records = wide.rename(columns=lambda hi: f"exact match, lengths to {hi}").reset_index().to_dict("records")
    return ["<h2>Exact-match accuracy by model and length</h2>" + html_table(records)]
