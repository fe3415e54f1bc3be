"""The atlas's rows: one per finding and level (``atlas.csv``), each with its verdict.

Pure functions of the tables the atlas's runs wrote (a law study's ``accuracy.csv`` and
``law.csv``, a sweep's or a run's ``summary.csv``), so the verdicts can be checked on planted
tables with known answers (tests/experiments/test_atlas.py). A verdict compares the measurement with the
prediction the row names; it never says more than that row's numbers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = ["finding", "paper", "level", "prediction", "measured", "seeds", "verdict", "command"]
AS_PREDICTED = "as predicted"
KERNEL_TOLERANCE = 0.03  # |measured - theory| of the final mean cosine still counted as the theory's (width 256: 0.029)
COLLAPSED = 0.99  # a final mean cosine at or above this is a collapsed kernel (docs/kernels.md's dotted line)
SPARE = 0.1  # a block whose skipping moves the final states by less than this (1 - cos) can be spared: our cut


def first_depths(acc: pd.DataFrame, key: str, threshold: float) -> pd.DataFrame:
    """Per ``key`` and seed (controls left out): the smallest depth whose accuracy is >= ``threshold``
    (empty when none is), one row each: ``key, seed, first_depth``."""
    import pandas as pd

    main = acc[~acc["control"].astype(bool)]
    rows = []
    for (level, seed), at in main.groupby([key, "seed"], sort=True):
        solved = at[at["accuracy"] >= threshold]["depth"]
        rows.append((level, int(seed), int(solved.min()) if len(solved) else None))
    return pd.DataFrame(rows, columns=[key, "seed", "first_depth"]).astype({"first_depth": "Int64"})


def law_verdict(predicted: int, per_seed: list[int | None]) -> str:
    """``as predicted`` when every seed's first depth equals ``predicted``; otherwise what differs."""
    if not per_seed:
        return "not measured (no seed finished)"
    hits = sum(1 for d in per_seed if d is not None and d == predicted)
    if hits == len(per_seed):
        return f"{AS_PREDICTED} in {hits} of {len(per_seed)} seeds"
    missing = sum(1 for d in per_seed if d is None)
    parts = [f"at the prediction in {hits} of {len(per_seed)} seeds"]
    if missing:
        parts.append(f"{missing} never solved it at the depths run")
    return "differs: " + "; ".join(parts)


def law_rows(finding: dict[str, str], law: pd.DataFrame, firsts: pd.DataFrame, key: str = "k") -> list[dict[str, Any]]:
    """One row per ``key`` of ``law.csv`` (the first width): the predicted and the measured first
    depth (in every seed; empty when no depth solved it in every seed), the seeds' first depths and
    the verdict. ``finding``: the row's finding, paper and command."""
    rows = []
    width = law["d_model"].min() if "d_model" in law and len(law) else None
    for _, row in law[law["d_model"] == width].iterrows() if width is not None else []:
        at = firsts[firsts[key].astype(float) == float(row[key])].sort_values("seed")
        per_seed = [None if _missing(d) else int(d) for d in at["first_depth"]]
        seed_ids = [int(s) for s in at["seed"]]
        predicted = int(row["predicted_depth"])
        measured = "" if _missing(row["measured_depth"]) else int(row["measured_depth"])
        rows.append(
            {
                **finding,
                "level": f"{key} = {_number(row[key])}",
                "prediction": predicted,
                "measured": measured,
                "seeds": "; ".join(
                    f"seed {i}: {'none' if d is None else d}" for i, d in zip(seed_ids, per_seed, strict=True)
                ),
                "verdict": law_verdict(predicted, per_seed),
            }
        )
    return rows


def induction_rows(finding: dict[str, str], summary: pd.DataFrame, chance: float, threshold: float) -> list[dict]:
    """Per depth of the induction sweep: one layer is predicted to form no induction head (its best
    score stays below ``threshold``), two or more to form one (at or above it)."""
    rows = []
    for _, row in summary.sort_values("depth").iterrows():
        depth, score = int(row["depth"]), float(row["best_induction"])
        head = depth >= 2
        prediction = f"induction head: best score >= {threshold:g}" if head else f"none: below {threshold:g}"
        verdict = AS_PREDICTED if (score >= threshold) == head else "differs"
        rows.append(
            {
                **finding,
                "level": f"depth {depth}",
                "prediction": prediction,
                "measured": f"{score:.3f} (chance {chance:.3f})",
                "seeds": "seed 0",
                "verdict": verdict,
            }
        )
    return rows


def kernel_rows(finding: dict[str, str], summary: pd.DataFrame, tolerance: float = KERNEL_TOLERANCE) -> list[dict]:
    """Per variant and depth of the kernels sweep: the final layer's mean cosine against its
    infinite-width theory (as predicted within ``tolerance``), and whether it has collapsed."""
    rows = []
    for _, row in summary.sort_values(["variant", "depth"], ascending=[False, True]).iterrows():
        measured, theory = float(row["final_cosine"]), float(row["theory_cosine"])
        state = "collapsed" if measured >= COLLAPSED else "not collapsed"
        close = abs(measured - theory) <= tolerance
        rows.append(
            {
                **finding,
                "level": f"{row['variant']}, depth {int(row['depth'])}",
                "prediction": f"{theory:.3f}",
                "measured": f"{measured:.3f} ({state})",
                "seeds": "seed 0",
                "verdict": f"{AS_PREDICTED} (within {tolerance:g})"
                if close
                else f"differs by {abs(measured - theory):.3f}",
            }
        )
    return rows


def usage_rows(finding: dict[str, str], summary: pd.DataFrame, spare: float = SPARE) -> list[dict]:
    """Per block of a depth-usage run: how much skipping it moves the last block's output
    (``skip_output``, 1 - cos) and whether it can be spared by :data:`SPARE`, our cut; then one row
    for Csordas et al.'s pattern in large pre-LN decoders: the later half of the blocks matters less
    than the earlier half (mean ``skip_output`` of each half)."""
    blocks = summary.sort_values("layer")
    rows = [
        {
            **finding,
            "level": f"block {int(row['layer'])}",
            "prediction": "none for one block",
            "measured": f"{float(row['skip_output']):.3f}",
            "seeds": "none (no training)",
            "verdict": f"can be spared (< {spare:g})" if float(row["skip_output"]) < spare else "needed",
        }
        for _, row in blocks.iterrows()
    ]
    half = len(blocks) // 2
    early, late = blocks["skip_output"].iloc[:half].mean(), blocks["skip_output"].iloc[half:].mean()
    rows.append(
        {
            **finding,
            "level": "later half against earlier half",
            "prediction": "later half matters less",
            "measured": f"mean {late:.3f} against {early:.3f}",
            "seeds": "none (no training)",
            "verdict": AS_PREDICTED if late < early else "differs: the later half matters more",
        }
    )
    return rows


def _number(value: Any) -> str:
    """A level as written: 3.0 -> '3'."""
    return str(int(value)) if float(value).is_integer() else str(value)


def _missing(value: Any) -> bool:
    import pandas as pd

    return value is None or bool(pd.isna(value))


__all__ = ["COLUMNS", "first_depths", "induction_rows", "kernel_rows", "law_rows", "law_verdict", "usage_rows"]
