"""The study report's depth sections (from ``depth_usage.csv`` and ``skipped_accuracy.csv``, the
study tables of probes/experiments/member_depth.py): per depth, the members' relative contribution
and the output effect of skipping each block as line charts; for law families, the accuracy per
task level with each single block skipped, beside the law. The page reports; it proves nothing.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from depthprobe.probes.render.html import esc
from depthprobe.probes.render.html import table as html_table
from depthprobe.probes.render.lines import Chart, Series, row_svg

SKIPPED_NOTE = (
    "Reported beside the law, never as proof of it: the law says which depth suffices, not which blocks a trained "
    "member uses; members may need every block even for levels a shallower depth solves, and deeper ones may have "
    "a block to spare. Accuracy on the final evaluation sets, with the block's output replaced by its input."
)


def _series(rows: pd.DataFrame, metric: str) -> list[Series]:
    ordered = rows.sort_values("layer", kind="stable")  # every member starts at block 0: their order is kept
    return [
        Series(str(member), tuple((float(x), float(y)) for x, y in zip(at["layer"], at[metric], strict=True)))
        for member, at in ordered.groupby("member", sort=False)
    ]


def usage_section(table: pd.DataFrame) -> str:
    """Per depth: relative contribution ||c_l|| / ||h_l|| and the output effect of skipping block l
    (``skip_kl`` where the members have an unembedding, else ``skip_output``), a line per member."""
    effect = "skip_kl" if "skip_kl" in table and table["skip_kl"].notna().any() else "skip_output"
    parts = [
        "<h2>Depth usage</h2><p class='meta'>depth_usage.csv: each member's depth-usage probe after training on "
        f"its evaluation inputs (docs/depth-usage.md); right: {esc(effect)}, the output's change when the block is "
        "skipped. Switch it off with --depth-usage false.</p>"
    ]
    by = table.groupby("depth", sort=True) if "depth" in table else [(None, table)]
    for depth, rows in by:
        charts = [
            Chart(tuple(_series(rows, m)), title, "block", m, width=420, height=240, legend_cols=2)
            for m, title in (("relative_contribution", "relative contribution"), (effect, "skipping the block"))
            if m in rows
        ]
        title = "" if depth is None else f"depth {int(depth)}"
        parts.append(f"<figure>{row_svg(charts, title=title)}</figure>")
    return "".join(parts)


def skipped_section(table: pd.DataFrame, key: str, threshold: float | None, law: pd.DataFrame | None) -> str:
    """Per member and level: the intact accuracy, the accuracy with each block skipped, and (with a
    threshold) the blocks it needs there: those whose skip takes a solved level below the threshold."""
    ids = [c for c in ("group", "k", "depth", "d_model", "seed", "control") if c in table and c != key]
    shown = table.groupby(["member", key], sort=False)[ids].first().reset_index()[["member", *ids, key]]
    at = pd.MultiIndex.from_frame(shown[["member", key]])
    intact = table[table["skipped"].isna()].set_index(["member", key])["accuracy"].reindex(at)
    skips = table[table["skipped"].notna()].pivot_table(index=["member", key], columns="skipped", values="accuracy")
    skips = skips.reindex(at)  # a column per block, in order; nan where the member has no such block
    predicted = _predicted(shown, key, law)
    if predicted is not None:
        shown["predicted_depth"] = predicted
    shown["intact"] = intact.map(round, ndigits=4).to_numpy()
    for block in skips:
        shown[f"skip {int(block)}"] = skips[block].map(round, ndigits=4).to_numpy()
    if threshold is not None:
        need = [", ".join(str(int(b)) for b in row.index[row < threshold]) for _, row in skips.iterrows()]
        shown["needs"] = [n if base >= threshold else "(not solved)" for n, base in zip(need, intact, strict=True)]
    note = "" if threshold is None else f" needs: blocks whose skip takes accuracy below the threshold {threshold}."
    return (
        f"<h2>Accuracy with each block skipped</h2><p class='meta'>skipped_accuracy.csv. {esc(SKIPPED_NOTE)}"
        f"{esc(note)}</p>" + html_table(shown.astype(object).where(shown.notna(), "").to_dict("records"))
    )


def _predicted(shown: pd.DataFrame, key: str, law: pd.DataFrame | None) -> list[Any] | None:
    """law.csv's predicted first depth of each row (by width and k, where law.csv and the rows have both)."""
    if law is None or not {"predicted_depth", "k", "d_model"} <= set(law) or not {"k", "d_model"} <= set(shown):
        return None
    pred = law.drop_duplicates(["d_model", "k"]).set_index(["d_model", "k"])["predicted_depth"]
    return [pred.get((d, k)) for d, k in zip(shown["d_model"], shown["k"], strict=True)]


__all__ = ["skipped_section", "usage_section"]
