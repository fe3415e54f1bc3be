"""Scoring the chains protocol: per head, the candidate whose head word gets the most attention
from M's head word (ties: the nearer) is the prediction, correct when it is in M's chain.

Running counts per mention type and head (:class:`ChainState`), the gathered word-level
attention of one batch (float64), the views of a few evaluated mentions, and the output: the
summary against Clark et al.'s Table 2, tidy per-head accuracies, notes and the headline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from depthprobe.probes.base.scores import head_label
from depthprobe.probes.data.align import unit_matrix, word_attention
from depthprobe.probes.engine.task import Batch, Context, HeatmapPanel, Output, ViewPanel, tidy
from depthprobe.tasks.coref.chains import BASELINES, TYPES, Query, Window
from depthprobe.tasks.coref.common import best_head, clark, heatmap_rows, pct

# Clark et al. 2019 Table 2, BERT-base on CoNLL-2012: All / Pronoun / Proper / Nominal (%)
CLARK = {
    "head 5-4": (65, 64, 73, 58),
    "nearest": (27, 29, 29, 19),
    "head match": (52, 47, 67, 40),
    "rule-based": (69, 70, 77, 60),
}


@dataclass
class ChainState:
    n_layers: int
    n_heads: int
    views_wanted: int
    counts: dict[str, Any] = field(default_factory=dict)  # what loading counted
    kind: str = "chains"
    correct: torch.Tensor = field(init=False)  # [type, layer, head] int64
    n_windows: int = 0
    n: list[int] = field(default_factory=lambda: [0, 0, 0])
    base: list[list[int]] = field(default_factory=lambda: [[0, 0, 0] for _ in BASELINES])  # [baseline][type]
    views: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.correct = torch.zeros(len(TYPES), self.n_layers, self.n_heads, dtype=torch.long)


def query_index(windows: Sequence[Window], n_pos: int) -> dict[str, Any]:
    """Index tensors over every query of a batch. Each window's distinct query head words get a
    slot; ``pieces`` [batch, r] are those words' piece positions, ``slot_of`` [batch, r] their
    slot and ``weight`` [batch, r] 1/(pieces of the word) (0 for padding); ``unit_of`` [batch, pos]
    is every position's word unit (padding -> an extra unit). Candidates are padded to the widest query."""
    qs = [(b, q) for b, w in enumerate(windows) for q in w.queries]
    slots = [list(dict.fromkeys(q.head + 1 for q in w.queries)) for w in windows]
    n_units = max(w.encoded.n_units for w in windows)
    unit_of = torch.full((len(windows), n_pos), n_units, dtype=torch.long)
    picked = []
    for b, (w, s) in enumerate(zip(windows, slots, strict=True)):
        unit_of[b, : len(w.encoded)] = torch.tensor(w.encoded.unit_of_piece)
        pos = [[p for p, u in enumerate(w.encoded.unit_of_piece) if u == unit] for unit in s]
        picked.append([(p, k, 1.0 / len(ps)) for k, ps in enumerate(pos) for p in ps])
    n_r = max(len(p) for p in picked)
    pieces = torch.zeros(len(windows), n_r, dtype=torch.long)
    slot_of = torch.zeros(len(windows), n_r, dtype=torch.long)
    weight = torch.zeros(len(windows), n_r, dtype=torch.float64)
    for b, picks in enumerate(picked):
        for r, (p, k, wt) in enumerate(picks):
            pieces[b, r], slot_of[b, r], weight[b, r] = p, k, wt
    width = max([len(q.cands) for _, q in qs] + [1])
    rows, slot, cands, valid, correct, kind = [], [], [], [], [], []
    for b, q in qs:
        pad_n = width - len(q.cands)
        rows.append(b)
        slot.append(slots[b].index(q.head + 1))
        cands.append([c.head + 1 for c in q.cands] + [0] * pad_n)
        valid.append([True] * len(q.cands) + [False] * pad_n)
        correct.append(list(q.correct) + [False] * pad_n)
        kind.append(q.kind)
    return {
        "row": torch.tensor(rows),
        "slot": torch.tensor(slot),
        "cands": torch.tensor(cands),
        "valid": torch.tensor(valid),
        "correct": torch.tensor(correct),
        "kind": torch.tensor(kind),
        "pieces": pieces,
        "slot_of": slot_of,
        "weight": weight,
        "unit_of": unit_of,
        "n_slots": max(len(s) for s in slots),
        "n_units": n_units,
    }


def query_attention(patterns: Sequence[torch.Tensor], ix: dict) -> torch.Tensor:
    """Word-level attention (docs/syntax.md, float64) from the query head words only.
    patterns: per layer [batch, head, q, k]. Returns [batch, layer, head, slot, unit]: rows are
    the mean over the word's pieces, columns the sum over the word's pieces (padding dropped)."""
    b, h, _, k = patterns[0].shape
    r = ix["pieces"].shape[1]
    idx = ix["pieces"][:, None, :, None].expand(b, h, r, k)  # [batch, head, r, k]
    rows = torch.stack([p.gather(2, idx) for p in patterns], 1)  # [batch, layer, head, r, k]
    n_l = rows.shape[1]
    rows = rows.to(torch.float64) * ix["weight"][:, None, None, :, None]
    frm = rows.new_zeros(b, n_l, h, ix["n_slots"], k)
    frm.scatter_add_(3, ix["slot_of"][:, None, None, :, None].expand(b, n_l, h, r, k), rows)  # mean rows
    out = rows.new_zeros(b, n_l, h, ix["n_slots"], ix["n_units"] + 1)
    out.scatter_add_(4, ix["unit_of"][:, None, None, None, :].expand(b, n_l, h, ix["n_slots"], k), frm)
    return out[..., :-1]  # [batch, layer, head, slot, unit]


def head_predictions(qa: torch.Tensor, ix: dict[str, torch.Tensor]) -> torch.Tensor:
    """qa: [batch, layer, head, slot, unit] -> predicted candidate index per (query, layer, head),
    [query, layer, head]; ties go to the lower index (the nearer candidate)."""
    rows = qa[ix["row"], :, :, ix["slot"]]  # [query, layer, head, unit]
    q, n_l, h, _ = rows.shape
    idx = ix["cands"][:, None, None, :].expand(q, n_l, h, -1)  # [query, layer, head, cand]
    scores = rows.gather(-1, idx).masked_fill(~ix["valid"][:, None, None, :], float("-inf"))
    return scores.argmax(-1)  # first maximum = nearest among ties


def chain_accumulate(state: ChainState, batch: Batch, acts, names: list[str]) -> None:
    windows: list[Window] = list(batch.items)
    n_pos = batch.input_ids.shape[1]
    ix = query_index(windows, n_pos)
    patterns = [acts[name].cpu() for name in names]  # per layer [batch, head, q, k]
    pred = head_predictions(query_attention(patterns, ix), ix)  # [query, layer, head]
    q, n_l, h = pred.shape
    ok = ix["correct"].gather(1, pred.reshape(q, n_l * h)).reshape(q, n_l, h)  # [query, layer, head]
    ok &= ix["valid"].any(1)[:, None, None]
    state.correct.index_add_(0, ix["kind"], ok.long())
    for k in ix["kind"].tolist():
        state.n[k] += 1
    state.n_windows += len(windows)
    for w in windows:
        for qu in w.queries:
            for i, good in enumerate(qu.baselines):
                state.base[i][qu.kind] += int(good)
    view_rows = _view_targets(state, windows)
    if view_rows:
        vb = [b for b, _ in view_rows]
        units = unit_matrix([windows[b].encoded for b in vb], n_pos)  # [view, unit, pos]
        wa = torch.stack([word_attention(p[vb], units).float() for p in patterns], 1)  # [view, layer, head, u, u]
        for j, (b, qu) in enumerate(view_rows):
            state.views.append(_chain_view(windows[b], qu, wa[j]))


def _view_targets(state: ChainState, windows: Sequence[Window]) -> list[tuple[int, Query]]:
    """Up to the wanted number of (row, query) pairs: the first query with 2+ candidates per window."""
    out: list[tuple[int, Query]] = []
    for b, w in enumerate(windows):
        if len(state.views) + len(out) >= state.views_wanted:
            break
        q = next((q for q in w.queries if len(q.cands) >= 2), None)
        if q is not None:
            out.append((b, q))
    return out


def _chain_view(w: Window, q: Query, wa: torch.Tensor) -> dict:
    """Word-level attention of every head over the words from the first candidate to M; the best
    head is chosen in finalize. wa: [layer, head, unit, unit]."""
    lo = min(c.start for c in q.cands)
    hi = q.end + 1
    sub = wa[:, :, lo + 1 : hi + 1, lo + 1 : hi + 1]  # [layer, head, word, word] of words lo..hi-1
    return {
        "doc": w.doc,
        "tokens": list(w.words[lo:hi]),
        "query": q.head - lo,
        "mention": " ".join(w.words[q.start : q.end + 1]),
        "type": TYPES[q.kind],
        "candidates": [
            {"text": " ".join(w.words[c.start : c.end + 1]), "head": c.head - lo, "in_chain": ok}
            for c, ok in zip(q.cands, q.correct, strict=True)
        ],
        "_all": sub,
    }


def chain_output(state: ChainState, ctx: Context) -> Output:
    n = state.n
    layer, head = best_head(state.correct.sum(0))
    best = [int(state.correct.sum(0)[layer, head])] + [int(state.correct[k, layer, head]) for k in range(3)]
    rows = _chain_rows(state, layer, head, best)
    scores = tidy(heatmap_rows(state.correct, n, TYPES, "type"), ctx.config.model, "coref")
    notes = _chain_notes(state, layer, head, best)
    headline = _chain_headline(state, layer, head, best)
    heatmaps: list[HeatmapPanel] = [
        {"title": "antecedent accuracy, all mentions", "metric": "accuracy", "where": {"type": "all"}}
    ]
    heatmaps += [
        {"title": f"antecedent accuracy, {t}s", "metric": "accuracy", "where": {"type": t}}
        for k, t in enumerate(TYPES)
        if n[k]
    ]
    views = [_finish_chain_view(v, layer, head) for v in state.views]
    return Output(
        scores=scores, summary=pd.DataFrame(rows), notes=notes, headline=headline, heatmaps=heatmaps, views=views
    )


def _chain_rows(state: ChainState, layer: int, head: int, best: Sequence[int]) -> list[dict]:
    """The summary table: mentions evaluated, the best head and the baselines, with Clark's numbers."""
    n, total = state.n, sum(state.n)
    rows = [
        {
            "method": "mentions evaluated",
            "head": "",
            "clark_head": "",
            "all": total,
            "pronoun": n[0],
            "proper": n[1],
            "nominal": n[2],
            "clark_et_al": "All/Pron/Prop/Nom",
        }
    ]
    rows.append(
        {
            "method": "best head",
            "head": head_label(layer, head),
            "clark_head": clark(layer, head),
            "all": pct(best[0], total),
            **{t: pct(best[k + 1], n[k]) for k, t in enumerate(TYPES)},
            "clark_et_al": "head 5-4: " + "/".join(map(str, CLARK["head 5-4"])),
        }
    )
    for i, name in enumerate(BASELINES):
        b = state.base[i]
        rows.append(
            {
                "method": name,
                "head": "",
                "clark_head": "",
                "all": pct(sum(b), total),
                **{t: pct(b[k], n[k]) for k, t in enumerate(TYPES)},
                "clark_et_al": "/".join(map(str, CLARK[name])),
            }
        )
    return rows


def _chain_notes(state: ChainState, layer: int, head: int, best: Sequence[int]) -> list[str]:
    n, total = state.n, sum(state.n)
    c = state.counts
    return [
        f"{total} mentions evaluated ({n[0]} pronoun, {n[1]} proper, {n[2]} nominal) of "
        f"{c.get('mentions', 0)} in {c.get('documents', 0)} documents; {c.get('windows', 0)} windows, "
        f"{state.n_windows} of them with an evaluated mention (only those are run)",
        f"best head {head_label(layer, head)} (0-indexed; Clark's 1-indexed layer-head {clark(layer, head)}): "
        f"{pct(best[0], total)}% vs nearest {pct(sum(state.base[0]), total)}%, head match "
        f"{pct(sum(state.base[1]), total)}%, rule-based {pct(sum(state.base[2]), total)}%",
        "Clark et al. 2019 (BERT-base, CoNLL-2012), All/Pronoun/Proper/Nominal: head 5-4 65/64/73/58; "
        "nearest 27/29/29/19; head match 52/47/67/40; rule-based 69/70/77/60",
    ]


def _chain_headline(state: ChainState, layer: int, head: int, best: Sequence[int]) -> dict:
    n, total = state.n, sum(state.n)
    return {
        "n_mentions": total,
        "n_by_type": dict(zip(TYPES, n, strict=False)),
        "best_head": head_label(layer, head),
        "best_head_clark": clark(layer, head),
        "accuracy": pct(best[0], total),
        "accuracy_by_type": {t: pct(best[k + 1], n[k]) for k, t in enumerate(TYPES)},
        "baselines": {
            name: {
                "all": pct(sum(state.base[i]), total),
                **{t: pct(state.base[i][k], n[k]) for k, t in enumerate(TYPES)},
            }
            for i, name in enumerate(BASELINES)
        },
        "clark_et_al": {k: dict(zip(("all", *TYPES), v, strict=False)) for k, v in CLARK.items()},
    }


def _finish_chain_view(v: dict, layer: int, head: int) -> ViewPanel:
    m = v["_all"][layer, head]  # [word, word]
    row = m[v["query"]]
    cands = [{**c, "attention": round(float(row[c["head"]]), 4)} for c in v["candidates"]]
    top = max(range(len(cands)), key=lambda i: (cands[i]["attention"], -i))
    pick = cands[top]
    return {
        "title": f'{v["doc"]}: "{v["mention"]}" ({v["type"]}) -> "{pick["text"]}" '
        f"({'correct' if pick['in_chain'] else 'wrong'}), head {head_label(layer, head)}",
        "tokens": v["tokens"],
        "pattern": [m.tolist()],
        "heads": [f"{head_label(layer, head)} (Clark {clark(layer, head)})"],
        "causal": False,
        "query": v["query"],
        "candidates": cands,
    }
