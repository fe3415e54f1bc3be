"""A depth study's folder, read (``study.json``, ``members.csv``, ``members/*/loss.csv``), and the
numbers its report shows: seed spreads, deep-minus-shallow differences, crossovers, table cells.

- ``study.json``: family, preset and the resolved config (``pairs`` for levine, ``corpus``);
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
    ok = study.ok.assign(_seed=num(study.ok, "seed").fillna(0))
    config = [
        ("|".join(map(str, row)) if keys else m)
        for m, row in zip(ok["member"], ok[keys].itertuples(index=False), strict=True)
    ]
    ok = ok.assign(_config=config)
    ok = ok.sort_values(["_config", "_seed"], kind="stable").drop_duplicates("_config")
    return list(study.ok["member"][study.ok["member"].isin(ok["member"])])


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
    rows = rows.assign(_v=v)[np.isfinite(v)]
    if rows.empty:
        return pd.DataFrame(columns=[*by, "mean", "lo", "hi", "n"])
    g = rows.groupby(list(by), sort=True)["_v"]
    return pd.DataFrame({"mean": g.mean(), "lo": g.min(), "hi": g.max(), "n": g.count()}).reset_index()


def _pairs(study: StudyData) -> list[tuple[int, int]]:
    raw = study.config.get("pairs")
    if isinstance(raw, list) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in raw):
        return [(int(a), int(b)) for a, b in raw]
    depths = sorted({int(d) for d in study.ok["depth"]})
    return [(d, 2 * d) for d in depths if 2 * d in depths]


def levine_differences(study: StudyData) -> pd.DataFrame:
    """Deep minus shallow validation loss per pair (L, 2L), budget and seed, then over seeds.

    One row per (pair, budget) where both depths finished for at least one seed: ``shallow``,
    ``deep``, ``budget``, ``mean``, ``lo``, ``hi`` (min and max over seeds), ``n`` (seeds) and
    ``per_seed`` (seed -> difference).
    """
    ok = study.ok.assign(
        _budget=num(study.ok, "budget").fillna(num(study.ok, "params_nonembed")),
        _seed=num(study.ok, "seed").fillna(0).astype(int),
        _loss=num(study.ok, "val_loss"),
        _depth=num(study.ok, "depth"),
    )
    ok = ok[np.isfinite(ok["_loss"]) & np.isfinite(ok["_budget"])]
    rows = []
    for shallow, deep in _pairs(study):
        a = ok[ok["_depth"] == shallow].groupby(["_budget", "_seed"])["_loss"].mean()
        b = ok[ok["_depth"] == deep].groupby(["_budget", "_seed"])["_loss"].mean()
        d = (b - a).dropna()
        for budget, per in d.groupby(level=0, sort=True):
            seeds = {int(s): float(v) for (_, s), v in per.items()}
            rows.append(
                {
                    "shallow": shallow,
                    "deep": deep,
                    "budget": float(budget),
                    "mean": float(np.mean(list(seeds.values()))),
                    "lo": min(seeds.values()),
                    "hi": max(seeds.values()),
                    "n": len(seeds),
                    "per_seed": seeds,
                }
            )
    return pd.DataFrame(rows, columns=["shallow", "deep", "budget", "mean", "lo", "hi", "n", "per_seed"])


def crossover(diffs: pd.DataFrame, shallow: int, deep: int) -> float | None:
    """The smallest budget from which every seed's deep-minus-shallow difference is below zero at
    that budget and at every larger one (None when there is none in the grid)."""
    d = diffs[(diffs["shallow"] == shallow) & (diffs["deep"] == deep)].sort_values("budget")
    found = None
    for budget, hi in zip(reversed(d["budget"].tolist()), reversed(d["hi"].tolist()), strict=True):
        if hi < 0:
            found = float(budget)
        else:
            break
    return found


_INT_COLUMNS = {"depth", "d_model", "d_ff", "n_heads", "d_head", "budget", "params_nonembed", "params_embed"}
_INT_COLUMNS |= {"params_total"}
_INT_COLUMNS |= {"tokens", "seed", "step"}
_SCI_COLUMNS = {"flops", "lr"}


def cell_text(column: str, value: Any) -> str:
    """A members.csv cell as the member table shows it ('' for a missing value)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        v = float(value)
        if not math.isfinite(v):
            return str(v)
        if column in _INT_COLUMNS and v == int(v):
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
]
