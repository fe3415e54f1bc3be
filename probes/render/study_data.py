"""A depth study's folder, read (``study.json``, ``members.csv``, ``members/*/loss.csv``), and the
numbers its report shows: seed spreads, deep-minus-shallow differences, crossovers, table cells.

- ``study.json``: family, preset and the resolved config (``corpus``, petty's ``shrink``);
- ``members.csv``: one row per member (status ``ok`` or ``failed`` with its ``error``);
- ``members/<member>/loss.csv``: the training curve (step, loss, val_loss, lr, tokens, elapsed_s).

Means and spreads are over seeds: the error bar of a point runs from the smallest to the largest
seed's value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

MAX_CURVE_POINTS = 400  # a training curve is thinned to at most this many steps (the last one kept)


# ----------------------------------------------------------------------------------------------
# reading a study folder
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StudyData:
    """A study folder, read: its settings (study.json) and its member table (members.csv)."""

    folder: Path
    family: str
    preset: str | None
    config: dict[str, Any]
    table: pd.DataFrame  # members.csv, one row per member

    @property
    def ok(self) -> pd.DataFrame:
        """The finished members (status ok)."""
        return self.table[self.table["status"] == "ok"]


def thin(df: pd.DataFrame, n: int = MAX_CURVE_POINTS) -> pd.DataFrame:
    """At most ``n`` evenly spaced rows of ``df`` (the first and the last kept)."""
    if len(df) <= n:
        return df
    idx = np.unique(np.linspace(0, len(df) - 1, n).round().astype(int))
    return df.iloc[idx]


def read_losses(study: StudyData, members: Sequence[str]) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """member -> its loss.csv (step, loss; finite rows), and a note per member without a readable one."""
    out, notes = {}, []
    for m in members:
        path = study.folder / "members" / m / "loss.csv"
        if not path.is_file():
            notes.append(f"{m}: no loss.csv")
            continue
        try:
            df = pd.read_csv(path)
        except (OSError, ValueError) as exc:
            notes.append(f"{m}: loss.csv cannot be read ({type(exc).__name__})")
            continue
        if not {"step", "loss"} <= set(df.columns):
            notes.append(f"{m}: loss.csv has no step and loss columns")
            continue
        df = df.assign(step=pd.to_numeric(df["step"], errors="coerce"), loss=pd.to_numeric(df["loss"], errors="coerce"))
        bad = ~np.isfinite(df["loss"])
        if bad.any():
            first = df.loc[bad, "step"].iloc[0]
            notes.append(f"{m}: loss not finite from step {cell_text('step', first)} ({int(bad.sum())} steps left out)")
        out[m] = df[~bad & np.isfinite(df["step"])][["step", "loss"]]
    return out, notes


SHAPE = ("variant", "depth", "d_model", "d_ff", "n_heads", "d_head", "budget", "match")  # a configuration


def probe_members(study: StudyData) -> list[str]:
    """The finished members whose probe curves are drawn: one seed (the lowest) per configuration,
    a configuration being the member's shape columns (members.csv's, not its name)."""
    keys = [c for c in SHAPE if c in study.ok]
    ok = study.ok.assign(_seed=num(study.ok, "seed").fillna(0)).sort_values("_seed", kind="stable")
    return list(study.ok["member"][study.ok["member"].isin(ok.drop_duplicates(keys)["member"])])


# ----------------------------------------------------------------------------------------------
# numbers
# ----------------------------------------------------------------------------------------------


def num(df: pd.DataFrame, col: str) -> pd.Series:
    """A column as numbers (NaN where missing or not a number; all NaN when there is no such column)."""
    return pd.to_numeric(df[col], errors="coerce") if col in df.columns else pd.Series(np.nan, index=df.index)


def seed_spread(rows: pd.DataFrame, by: Sequence[str], value: str) -> pd.DataFrame:
    """Mean, min, max and count of ``value`` over the rows (seeds) of each ``by`` group; non-finite
    values are left out, and groups without a finite value are dropped."""
    v = pd.to_numeric(rows[value], errors="coerce")
    g = rows.assign(_v=v)[np.isfinite(v)].groupby(list(by), sort=True)["_v"]
    return pd.DataFrame({"mean": g.mean(), "lo": g.min(), "hi": g.max(), "n": g.count()}).reset_index()


def levine_differences(study: StudyData) -> pd.DataFrame:
    """Deep minus shallow validation loss per pair (L, 2L), budget and seed, then over seeds; the
    pairs are the finished depths L whose 2L finished too.

    One row per (pair, budget) where both depths finished for at least one seed: ``shallow``,
    ``deep``, ``budget``, ``mean``, ``lo``, ``hi`` (min and max over seeds), ``n`` (seeds) and
    ``per_seed`` (seed -> difference).
    """
    ok = study.ok.assign(
        budget=num(study.ok, "budget"),  # every levine member has its budget (its row, even failed)
        seed=num(study.ok, "seed").fillna(0).astype(int),
        depth=num(study.ok, "depth"),
        loss=num(study.ok, "val_loss"),
    )
    ok = ok[np.isfinite(ok["loss"])]
    loss = ok.groupby(["budget", "seed", "depth"])["loss"].mean().unstack("depth")
    frames = [
        (loss[2 * d] - loss[d]).rename("diff").dropna().reset_index().assign(shallow=int(d), deep=int(2 * d))
        for d in loss.columns
        if 2 * d in loss.columns
    ]
    diffs = pd.concat(frames) if frames else pd.DataFrame(columns=["shallow", "deep", "budget", "seed", "diff"])
    keys = ["shallow", "deep", "budget"]
    per_seed = {k: dict(zip(g["seed"], g["diff"], strict=True)) for k, g in diffs.groupby(keys)}
    out = seed_spread(diffs, keys, "diff")
    return out.assign(per_seed=[per_seed[k] for k in zip(out["shallow"], out["deep"], out["budget"], strict=True)])


def crossover(pair: pd.DataFrame) -> float | None:
    """The smallest budget from which every seed's deep-minus-shallow difference of the pair
    (its rows of :func:`levine_differences`) is below zero at that budget and at every larger one
    (None when there is none in the grid)."""
    not_below = pair.loc[pair["hi"] >= 0, "budget"]
    below = pair["budget"][pair["budget"] > not_below.max()] if len(not_below) else pair["budget"]
    return float(below.min()) if len(below) else None


_INT_COLUMNS = {"depth", "d_model", "d_ff", "n_heads", "d_head", "budget", "params_nonembed", "params_embed"}
_INT_COLUMNS |= {"params_total"}
_INT_COLUMNS |= {"tokens", "seed", "step"}
_SCI_COLUMNS = {"flops", "lr"}
_FLOAT_COLUMNS = {"wall_s", "tokens_per_s", "embed_share", "budget_miss", "d_ff_ratio", "passes"} | _SCI_COLUMNS


def whole_columns(table: pd.DataFrame) -> set[str]:
    """The numeric columns of ``table`` (not booleans, not those with a format of their own) whose
    values are all whole numbers: counts that a CSV round trip read as floats (``heads`` 2.0)."""
    out = set()
    for c in table.columns:
        if c in _FLOAT_COLUMNS or table[c].dtype == bool or not pd.api.types.is_numeric_dtype(table[c]):
            continue
        v = table[c].dropna().to_numpy(np.float64)
        if len(v) and np.isfinite(v).all() and (v == np.round(v)).all():
            out.add(str(c))
    return out


def cell_text(column: str, value: Any, whole: bool = False) -> str:
    """A members.csv cell as the member table shows it ('' for a missing value); ``whole``: the
    column holds whole numbers (:func:`whole_columns`), printed without decimals."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        v = float(value)
        if not math.isfinite(v):
            return str(v)
        if (whole or column in _INT_COLUMNS) and v == int(v):
            return f"{int(v):,}"
        if column in _SCI_COLUMNS:
            return f"{v:.3g}"
        if column in ("wall_s", "tokens_per_s"):
            return f"{v:,.1f}"
        if column == "embed_share":
            return f"{v:.1%}"
        if column == "budget_miss":
            return f"{v:+.2%}"
        if column in ("d_ff_ratio", "passes"):
            return f"{v:.2f}"
        return f"{v:.4f}"
    return str(value)


__all__ = [
    "StudyData",
    "cell_text",
    "crossover",
    "levine_differences",
    "num",
    "probe_members",
    "read_losses",
    "seed_spread",
    "thin",
    "whole_columns",
]
