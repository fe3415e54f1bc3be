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

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pandas as pd

from depthprobe.probes.experiments.laws import measured_depth

if TYPE_CHECKING:
    from depthprobe.probes.experiments.crasp import CraspConfig

LAW_COLUMNS = [
    "d_model",
    "k",
    "predicted_depth",
    "measured_depth",
    "difference",
    "solve_range",
    "in_distribution_depth",
    "control_depth",
    "control_d_model",
    "control_exact_match",
    "depth1_exact_match",
    "depth1_string_cap",
    "depth1_token_accuracy",
    "depth1_token_cap",
]
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


def law(cfg: CraspConfig, acc: pd.DataFrame, predicted_depth: Callable[[int], int]) -> pd.DataFrame:
    """One row per width and k (see the module's docstring); ``predicted_depth`` is the family's."""
    if acc.empty:
        return pd.DataFrame(columns=LAW_COLUMNS)
    lo_solve = dict((hi, lo) for lo, hi in cfg.ranges)[cfg.solve_at]
    main, ctrl = acc[~acc["control"].astype(bool)], acc[acc["control"].astype(bool)]
    rows = []
    for (d, k), at in main.groupby(["d_model", "k"], sort=True):
        k = int(k)
        measured = measured_depth(at[at["max_length"] == cfg.solve_at], cfg.threshold, cfg.seeds)
        predicted = predicted_depth(k)
        control = ctrl[(ctrl["k"] == k) & (ctrl["max_length"] == cfg.solve_at)]
        row: dict[str, Any] = {
            "d_model": d,
            "k": k,
            "predicted_depth": predicted,
            "measured_depth": measured,
            "difference": None if measured is None else measured - predicted,
            "solve_range": f"{max(lo_solve, k)}-{cfg.solve_at}",
            "in_distribution_depth": measured_depth(
                at[at["max_length"] == cfg.eval_lengths[0]], cfg.threshold, cfg.seeds
            ),
            "control_depth": int(control["depth"].iloc[0]) if len(control) else None,
            "control_d_model": int(control["d_model"].iloc[0]) if len(control) else None,
            "control_exact_match": round(float(control["accuracy"].mean()), 4) if len(control) else None,
        }
        row.update(depth_one(cfg, k, at))
        rows.append(row)
    return pd.DataFrame(rows, columns=LAW_COLUMNS).astype(
        {
            "measured_depth": "Int64",
            "difference": "Int64",
            "in_distribution_depth": "Int64",
            "control_depth": "Int64",
            "control_d_model": "Int64",
        }
    )


def depth_one(cfg: CraspConfig, k: int, at: pd.DataFrame) -> dict[str, Any]:
    """Depth 1 at the training range (mean over seeds) beside its exact limit without positions."""
    from depthprobe.probes.data import crasp_cap

    lo, hi = max(cfg.nmin, k), cfg.eval_lengths[0]
    one = at[(at["depth"] == 1) & (at["max_length"] == hi)]
    string_cap = 1.0 if k <= 3 else crasp_cap.string_cap_l4(lo, hi)[0] if k == 4 else None
    return {
        "depth1_exact_match": round(float(one["accuracy"].mean()), 4) if len(one) else None,
        "depth1_string_cap": None if string_cap is None else round(string_cap, 4),
        "depth1_token_accuracy": round(float(one["token_accuracy"].mean()), 4) if len(one) else None,
        "depth1_token_cap": round(crasp_cap.token_cap(k, lo, hi), 4),
    }


def by_depth(acc: pd.DataFrame, ranges: pd.DataFrame) -> pd.DataFrame:
    """Per k, model (depth, or the control) and range: the accuracies over seeds and the majority."""
    if acc.empty:
        return pd.DataFrame(columns=DEPTH_COLUMNS)
    acc = (
        acc.merge(ranges, on=["member", "max_length"], how="left")
        if not ranges.empty
        else acc.assign(min_length=None, majority=None)
    )
    rows = []
    for (k, control, depth, d, hi), at in acc.groupby(["k", "control", "depth", "d_model", "max_length"], sort=True):
        rows.append(
            {
                "k": int(k),
                "model": f"control: depth {depth}, d_model {d}" if control else f"depth {depth}",
                "depth": int(depth),
                "d_model": int(d),
                "control": bool(control),
                "min_length": at["min_length"].min(),
                "max_length": int(hi),
                "exact_match": round(float(at["accuracy"].mean()), 4),
                "exact_match_min": round(float(at["accuracy"].min()), 4),
                "token_accuracy": round(float(at["token_accuracy"].mean()), 4),
                "majority": round(float(at["majority"].mean()), 4) if at["majority"].notna().any() else None,
            }
        )
    return pd.DataFrame(rows, columns=DEPTH_COLUMNS)


def depths_section(tables: dict[str, pd.DataFrame]) -> list[str]:
    """Exact-match accuracy per model and range (depths.csv), between the heatmaps and the curves."""
    from depthprobe.probes.render.html import table as html_table

    depths = tables.get("depths.csv", pd.DataFrame())
    if depths.empty:
        return []
    wide = depths.pivot_table(index=["k", "model"], columns="max_length", values="exact_match", aggfunc="first")
    records = [
        {"k": k, "model": m, **{f"exact match, lengths to {c}": v for c, v in row.items()}}
        for (k, m), row in wide.iterrows()
    ]
    return ["<h2>Exact-match accuracy by model and length</h2>" + html_table(records)]
