"""GAP (``--data file.tsv``, detected by extension or header): one pass over the whole text,
attention from the pronoun (mean over its pieces) to A and to B (sum over the pieces found by
character overlap), the larger wins; baselines nearest and first candidate, by pronoun gender.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.scores import head_label
from depthprobe.probes.data import gap as gap_data
from depthprobe.probes.engine.task import Batch, Context, HeatmapPanel, Output, ViewPanel, tidy
from depthprobe.tasks.coref.common import best_head, clark, heatmap_rows, pct

GENDERS = ("masculine", "feminine", "other")


@dataclass(frozen=True)
class GapItem:
    id: str
    names: tuple[str, str, str]  # pronoun, A, B
    ids: tuple[int, ...]
    pronoun: tuple[int, ...]  # piece positions (in ids)
    a: tuple[int, ...]
    b: tuple[int, ...]
    label: int  # 0 = A, 1 = B
    gender: int  # index into GENDERS
    nearest: int  # the nearest baseline's pick
    line: int


def gap_nearest(ex: gap_data.GapExample) -> int:
    """0 (A) or 1 (B): the candidate whose span boundary is closer to the pronoun's; ties -> the
    candidate appearing first in the text."""
    sp = ex.spans()
    p0, p1 = sp["pronoun"]

    def gap(s: int, e: int) -> int:
        return p0 - e if e <= p0 else s - p1 if s >= p1 else 0

    da, db = gap(*sp["A"]), gap(*sp["B"])
    if da != db:
        return 0 if da < db else 1
    return 0 if ex.a_offset <= ex.b_offset else 1


def gap_items(
    model, examples: Sequence[gap_data.GapExample], limit: int, path: Path
) -> tuple[list[GapItem], dict[str, int]]:
    tok = model.require_tokenizer("coref (GAP)")
    if not getattr(tok, "is_fast", False):
        raise ProbeError("GAP needs a fast tokenizer (character offsets); use a model with tokenizer.json")
    usable = [ex for ex in examples if ex.answerable]
    enc = tok([ex.text for ex in usable], add_special_tokens=False, return_offsets_mapping=True)
    n_head = 0 if model.cls_id is None else 1  # [CLS] or BOS before the text
    items, too_long = [], 0
    for ex, ids, offsets in zip(usable, enc["input_ids"], enc["offset_mapping"], strict=True):
        seq = model.frame(ids)
        if len(seq) > limit:
            too_long += 1
            continue
        pos = {}
        for key, (s, e) in ex.spans().items():
            pos[key] = tuple(n_head + t for t, (ps, pe) in enumerate(offsets) if ps < e and pe > s)
            if not pos[key]:
                raise ProbeError(f"{ex.path or path}:{ex.line}: {key} span [{s}, {e}) covers no token of the text")
        items.append(
            GapItem(
                ex.id,
                (ex.pronoun, ex.a, ex.b),
                seq,
                pos["pronoun"],
                pos["A"],
                pos["B"],
                0 if ex.a_coref else 1,
                GENDERS.index(ex.gender),
                gap_nearest(ex),
                ex.line,
            )
        )
    return items, {"rows": len(examples), "unanswerable": len(examples) - len(usable), "too_long": too_long}


@dataclass
class GapState:
    n_layers: int
    n_heads: int
    views_wanted: int
    counts: dict[str, Any] = field(default_factory=dict)  # what loading counted
    kind: str = "gap"
    correct: torch.Tensor = field(init=False)  # [gender, layer, head]
    n: list[int] = field(default_factory=lambda: [0, 0, 0])
    base: list[list[int]] = field(default_factory=lambda: [[0, 0, 0], [0, 0, 0]])  # nearest, first
    views: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.correct = torch.zeros(len(GENDERS), self.n_layers, self.n_heads, dtype=torch.long)


def gap_scores(pattern: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor, to: torch.Tensor) -> torch.Tensor:
    """pattern: [batch, head, q, k] of one layer; rows/weights: [batch, r] the pronoun's piece
    positions and their mean weights (0 for padding); to: [batch, cand, k] 0/1 piece indicators.
    Returns float64 [batch, head, cand]: mean over pronoun rows, sum over candidate columns."""
    b, h, _, k = pattern.shape
    idx = rows[:, None, :, None].expand(b, h, rows.shape[1], k)  # [batch, head, r, k]
    picked = pattern.gather(2, idx).to(torch.float64)  # [batch, head, r, k]
    frm = (picked * weights[:, None, :, None]).sum(2)  # [batch, head, k]
    return frm @ to.transpose(1, 2)  # [batch, head, k] @ [batch, k, cand] -> [batch, head, cand]


def gap_accumulate(state: GapState, batch: Batch, acts, names: list[str]) -> None:
    items: list[GapItem] = list(batch.items)
    n_pos = batch.input_ids.shape[1]
    width = max(len(it.pronoun) for it in items)
    rows = torch.zeros(len(items), width, dtype=torch.long)
    weights = torch.zeros(len(items), width, dtype=torch.float64)
    to = torch.zeros(len(items), 2, n_pos, dtype=torch.float64)  # A, B piece indicators
    for b, it in enumerate(items):
        rows[b, : len(it.pronoun)] = torch.tensor(it.pronoun)
        weights[b, : len(it.pronoun)] = 1.0 / len(it.pronoun)
        to[b, 0, list(it.a)] = 1.0
        to[b, 1, list(it.b)] = 1.0
    att = torch.stack([gap_scores(acts[n].cpu(), rows, weights, to) for n in names], 1)  # [batch, layer, head, cand]
    label = torch.tensor([it.label for it in items])
    nearest = torch.tensor([it.nearest for it in items])
    pred = torch.where(
        att[..., 1] > att[..., 0], 1, torch.where(att[..., 0] > att[..., 1], 0, nearest[:, None, None])
    )  # [b, l, h]
    ok = (pred == label[:, None, None]).long()
    gender = torch.tensor([it.gender for it in items])
    state.correct.index_add_(0, gender, ok)
    for it in items:
        state.n[it.gender] += 1
        state.base[0][it.gender] += int(it.nearest == it.label)
        state.base[1][it.gender] += int(it.label == 0)
    for b, it in enumerate(items):
        if len(state.views) >= state.views_wanted:
            break
        state.views.append({"item": it, "att": att[b].float()})


def gap_output(state: GapState, ctx: Context) -> Output:
    n = state.n
    total = sum(n)
    tot = state.correct.sum(0)
    layer, head = best_head(tot)
    m_i, f_i = GENDERS.index("masculine"), GENDERS.index("feminine")

    def line(method: str, hd: str, all_k: int, by: Sequence[int]) -> dict:
        acc_m, acc_f = pct(by[m_i], n[m_i]), pct(by[f_i], n[f_i])
        return {
            "method": method,
            "head": hd,
            "clark_head": clark(layer, head) if hd else "",
            "all": pct(all_k, total),
            "masculine": acc_m,
            "feminine": acc_f,
            "F/M": round(acc_f / acc_m, 3) if acc_m and acc_f is not None else None,
        }

    rows = [
        {
            "method": "examples",
            "head": "",
            "clark_head": "",
            "all": total,
            "masculine": n[m_i],
            "feminine": n[f_i],
            "F/M": None,
        }
    ]
    rows.append(
        line("best head", head_label(layer, head), int(tot[layer, head]), state.correct[:, layer, head].tolist())
    )
    for i, name in enumerate(("nearest", "first candidate")):
        rows.append(line(name, "", sum(state.base[i]), state.base[i]))
    summary = pd.DataFrame(rows)
    scores = tidy(heatmap_rows(state.correct, n, GENDERS, "gender"), ctx.config.model, "coref")
    c = state.counts
    notes = [
        f"GAP: {total} examples with exactly one true candidate ({n[m_i]} masculine, {n[f_i]} feminine); "
        f"{c.get('unanswerable', 0)} of {c.get('rows', 0)} rows have no or two true candidates and are not used",
        f"best head {head_label(layer, head)} (Clark {clark(layer, head)}): {pct(int(tot[layer, head]), total)}% vs "
        f"nearest {pct(sum(state.base[0]), total)}%, first candidate {pct(sum(state.base[1]), total)}%",
    ]
    headline = {
        "n_examples": total,
        "best_head": head_label(layer, head),
        "best_head_clark": clark(layer, head),
        "gap": {r["method"]: {k: r[k] for k in ("all", "masculine", "feminine", "F/M")} for r in rows[1:]},
    }
    heatmaps: list[HeatmapPanel] = [{"title": "GAP accuracy, all", "metric": "accuracy", "where": {"gender": "all"}}]
    heatmaps += [
        {"title": f"GAP accuracy, {g}", "metric": "accuracy", "where": {"gender": g}}
        for k, g in enumerate(GENDERS)
        if n[k]
    ]
    views = [_gap_view(v, layer, head) for v in state.views]
    return Output(scores=scores, summary=summary, notes=notes, headline=headline, heatmaps=heatmaps, views=views)


def _gap_view(v: dict, layer: int, head: int) -> ViewPanel:
    it: GapItem = v["item"]
    att = v["att"][layer, head]
    return {
        "title": f"GAP {it.id}: pronoun -> A {att[0]:.3f}, B {att[1]:.3f}; true {'AB'[it.label]}",
        "tokens": [f"{it.names[0]} (pronoun)", f"{it.names[1]} (A)", f"{it.names[2]} (B)"],
        # one head; only the pronoun's row is meaningful: attention to A and to B
        "pattern": [[[0.0, float(att[0]), float(att[1])], [0.0] * 3, [0.0] * 3]],
        "heads": [f"{head_label(layer, head)} (Clark {clark(layer, head)})"],
        "causal": False,
    }
