"""Depth usage in every study member (docs/depth-usage.md, docs/study.md): the member's files and
the study's tables, the same for every family.

A member (text, law or a plugin's) calls :func:`write_depth_usage` after training on its
evaluation inputs (``depth_usage.csv``: the depth-usage task's tidy table with a ``member``
column); a law member also calls :func:`write_skipped_accuracy` (``skipped_accuracy.csv``: the
accuracy per task level, intact and with each single block skipped).
Both are switched off by the Config field ``depth_usage`` (every ``StudyConfig`` has it;
``--depth-usage false``). The runner gathers what the members wrote into study tables
(:func:`study_tables`) with the member's columns from members.csv, and draws them
(:mod:`probes.render.study_depth`) after the family's sections.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    import torch

    from depthprobe.probes.models.model import Model

DEPTH_USAGE_CSV = "depth_usage.csv"
SKIPPED_CSV = "skipped_accuracy.csv"
# per block: the depth-usage metrics of the study table (one column each, where the members have them)
LAYER_METRICS = ("relative_contribution", "cosine", "skip_output", "skip_kl", "skip_top1")


def write_depth_usage(
    model: Model, data: Sequence[str] | torch.Tensor, folder: Path, member: str, max_len: int = 128
) -> None:
    """``folder/depth_usage.csv``: the depth-usage table of the trained ``model`` on ``data`` (lines of
    text, or token ids [example, pos], every row one sequence)."""
    from depthprobe.probes.api.depth_usage import depth_usage_tables
    from depthprobe.probes.base.artifacts import write_csv

    write_csv(folder / DEPTH_USAGE_CSV, depth_usage_tables(model, data, member=member, max_len=max_len))


def write_skipped_accuracy(
    model: Model, evaluate: Callable[[int | None], Mapping[Any, float]], folder: Path, member: str, key: str = "level"
) -> None:
    """``folder/skipped_accuracy.csv``: ``member, skipped, <key>, accuracy, drop`` (``skipped`` empty
    for the intact model); ``evaluate(block)`` gives the accuracy per key with that block skipped
    (``None``: intact)."""
    from depthprobe.probes.api.depth_usage import skipped_table
    from depthprobe.probes.base.artifacts import write_csv

    intact = evaluate(None)
    table = skipped_table(intact, {s: evaluate(s) for s in range(model.info.n_layers)}, member)
    write_csv(folder / SKIPPED_CSV, table.rename(columns={"level": key}))


def study_tables(members: pd.DataFrame, folder: Path, id_columns: Sequence[str]) -> dict[str, pd.DataFrame]:
    """The study's depth tables from what its finished members wrote (none when none did):
    ``depth_usage.csv`` (per member and block: the member's ``id_columns``, ``layer`` and one column
    per metric of :data:`LAYER_METRICS`) and ``skipped_accuracy.csv`` (the members' rows with their
    ``id_columns``)."""
    from depthprobe.probes.experiments.folder import gather

    out: dict[str, pd.DataFrame] = {}
    usage = gather(folder, members, DEPTH_USAGE_CSV)
    if not usage.empty:
        out[DEPTH_USAGE_CSV] = per_layer(usage, members, id_columns)
    skipped = gather(folder, members, SKIPPED_CSV)
    if not skipped.empty:
        skipped["skipped"] = skipped["skipped"].astype("Int64")
        out[SKIPPED_CSV] = with_member_columns(skipped, members, id_columns)
    return out


def per_layer(usage: pd.DataFrame, members: pd.DataFrame, id_columns: Sequence[str]) -> pd.DataFrame:
    """The tidy member tables -> one row per member and block, one column per metric."""
    rows = usage[usage["metric"].isin(LAYER_METRICS) & usage["later"].isna()]
    wide = rows.pivot_table(index=["member", "layer"], columns="metric", values="value", aggfunc="first", sort=False)
    wide = wide.reset_index()
    wide.columns.name = None
    wide["layer"] = wide["layer"].astype(int)
    metrics = [m for m in LAYER_METRICS if m in wide]
    return with_member_columns(wide[["member", "layer", *metrics]], members, id_columns)


def with_member_columns(table: pd.DataFrame, members: pd.DataFrame, id_columns: Sequence[str]) -> pd.DataFrame:
    """``table`` with the members' ``id_columns`` (those members.csv has) after ``member``."""
    cols = [c for c in id_columns if c in members and c not in table and members[c].notna().any()]
    merged = table.merge(members[["member", *cols]], on="member", how="left")
    rest = [c for c in table.columns if c != "member"]
    return merged[["member", *cols, *rest]]


__all__ = [
    "DEPTH_USAGE_CSV",
    "SKIPPED_CSV",
    "study_tables",
    "write_depth_usage",
    "write_skipped_accuracy",
]
