"""hop-attention: how a model trained on k-hop induction (Sanford, Hsu and Telgarsky 2024; the
``khop`` study family) uses its depth.

Inputs are the family's own format (:mod:`probes.data.khop`): the hop-count token of k (``-O hop``)
then N letters (``-O length``) over A letters (``-O letters``), read from the evaluation stream of
the run seed ``-O seed`` (never a training batch). For each head and hop j = 1..J (``-O max_hop``)
the task reads the mean attention from the query at 1 + i to the key at 1 + p^j(i), over the
(sequence, i) where p^j(i) is defined, with its chance level (1 / the keys the causal query sees),
and per layer the largest hop some head resolves (mean attention >= ``-O threshold`` and >= 3x
chance; :mod:`probes.measures.hops`), and per head the attention to the previous token (i - 1)
and to the previous occurrence of X_i (p(i) - 1), each with its chance level. Depth floor(log2 k)
+ 2 suffices because positions hold pointers as well as answers: in a construction reaching it,
layer 0 attends to i - 1, layer 1 to p(i) and layer l >= 2 to p^(2^(l-1))(i), reading the pointer
and answers held there (2^(L-1) - 1 hops after L layers; largest hops by layer 0, 1, 2, 4, ...);
this task reports where the heads look, next to the depth law, and asserts nothing about use
(attention is not use).

The model's accuracy on the same sequences is in the headline: the argmax at position 1 + i
against hop_k(X)_i (the family's targets, unshifted), over letter answers and over all positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from depthprobe.probes.base.batching import Batch
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.scores import head_label
from depthprobe.probes.data import khop
from depthprobe.probes.engine.task import Context, Examples, HeatmapPanel, Output, Task, add_sums, tidy
from depthprobe.probes.hooks.capture import Captured, pattern_names
from depthprobe.probes.measures.hops import (
    NEIGHBOURS,
    RATIO,
    hop_attention_from_sums,
    hop_attention_sums,
    neighbour_positions,
    target_means,
)
from depthprobe.probes.models.model import Model
from depthprobe.probes.render.charts import heatmap_svg
from depthprobe.tasks.cards import CARDS, HopAttentionOptions

Options = HopAttentionOptions  # tasks/cards.py: the options, readable without importing this module
OFFSET = 1  # X starts after the hop-count token


@dataclass
class State:
    model: Model
    options: Options
    sums: dict[str, torch.Tensor] = field(default_factory=dict)  # hop_attention_sums, added
    near: dict[str, torch.Tensor] = field(default_factory=dict)  # the same sums for NEIGHBOURS' targets
    counts: dict[str, float] = field(default_factory=dict)  # right/total answers, letters and all
    n: int = 0


def check_model(model: Model, o: Options, max_len: int) -> None:
    """One-line errors for a model that cannot read the khop inputs of these options."""
    if model.tokenizer is not None or not model.info.causal:
        raise ProbeError(
            f"hop-attention needs a causal token-level model trained on the khop family (probe study "
            f"--family khop, or a native: model), got {model.name!r}"
        )
    vocab = getattr(getattr(model.bridge, "cfg", None), "d_vocab", None)
    need = khop.vocab_size(o.letters, o.hop)
    if isinstance(vocab, int) and vocab < need:
        raise ProbeError(
            f"hop-attention: letters={o.letters} and hop={o.hop} need a vocabulary of {need} "
            f"(letters + none + hop tokens), but model {model.name!r} has {vocab}; use the khop settings it was "
            f"trained with (-O letters=..., -O hop=...)"
        )
    limit = model.input_limit(max_len)
    if 1 + o.length > limit:
        raise ProbeError(
            f"hop-attention: length={o.length} makes {1 + o.length} tokens, over the limit {limit} "
            f"(--max-len / model context); use -O length={limit - 1} or less"
        )


class HopAttention(Task[Options, State]):
    name = "hop-attention"
    description = CARDS["hop-attention"].description
    needs_text = False

    def wants_logits(self, model: Model) -> bool:
        return True  # the accuracy in the headline

    def load(self, model: Model, ctx: Context[Options]) -> Examples:
        o = ctx.options
        if ctx.config.data is not None:
            raise ProbeError("hop-attention makes its own khop sequences; drop --data")
        check_model(model, o, ctx.config.max_len)
        inputs, _ = khop.eval_batch(o.hop, o.sequences, o.length, o.letters, o.hop, o.seed)
        return Examples([tuple(row) for row in inputs.tolist()])

    def hook_names(self, model: Model, ctx: Context[Options]) -> list[str]:
        return pattern_names(model.info.n_layers)

    def start(self, model: Model, ctx: Context[Options], examples: Examples) -> State:
        return State(model=model, options=ctx.options)

    def accumulate(self, state: State, batch: Batch, acts: Captured) -> None:
        o = state.options
        x = batch.input_ids[:, OFFSET:].cpu()  # [b, N] the letters
        patterns = acts.stacked(pattern_names(state.model.info.n_layers)).transpose(1, 2)  # [L, H, b, T, T]
        hops = torch.stack([khop.hop_positions(x, j) for j in range(1, o.max_hop + 1)])  # [J, b, N]
        state.sums = add_sums(state.sums, hop_attention_sums(patterns, hops, OFFSET))
        near = neighbour_positions(khop.pointer(x))  # [2, b, N]
        state.near = add_sums(state.near, hop_attention_sums(patterns, near, OFFSET))
        targets = khop.hop_targets(x, o.hop, o.letters)  # [b, N]
        pred = acts["logits"][:, OFFSET:].argmax(-1).cpu()  # [b, N]
        right = pred == targets
        letter = targets < o.letters
        batch_counts = {
            "letters_right": float(right[letter].sum()),
            "letters": float(letter.sum()),
            "all_right": float(right.sum()),
            "all": float(right.numel()),
        }
        state.counts = add_sums(state.counts, batch_counts)
        state.n += x.shape[0]

    def merge(self, a: State, b: State) -> State:
        a.sums = add_sums(a.sums, b.sums)
        a.near = add_sums(a.near, b.near)
        a.counts = add_sums(a.counts, b.counts)
        a.n += b.n
        return a

    def finalize(self, state: State, ctx: Context[Options]) -> Output:
        o = state.options
        res = hop_attention_from_sums(state.sums, o.threshold, RATIO)
        near = target_means(state.near)
        scores = tidy(score_rows(res) + near_rows(near), ctx.config.model, self.name)
        scores["head"] = scores["head"].astype("Int64")  # integer heads beside the per-layer rows' blanks
        summary = summarise(res, near)
        c = state.counts
        accuracy = c["letters_right"] / c["letters"] if c["letters"] else float("nan")
        headline = {
            "hop": o.hop,
            "accuracy": round(accuracy, 4),
            "accuracy_all": round(c["all_right"] / c["all"], 4),
            "largest_hop_by_layer": [int(v) for v in res["largest_hop"]],
            **{
                f"{target}_by_layer": [round(float(v), 4) for v in near["attention"][:, :, t].amax(dim=1)]
                for t, target in enumerate(NEIGHBOURS)
            },
            "n_sequences": state.n,
            "letters": o.letters,
            "length": o.length,
            "threshold": o.threshold,
        }
        J = o.max_hop
        heatmaps: list[HeatmapPanel] = [
            {"title": f"attention from i to p^{j}(i)", "metric": f"hop_{j}_attention", "where": {}}
            for j in range(1, J + 1)
        ]
        return Output(
            scores=scores,
            summary=summary,
            notes=notes(res, o),
            headline=headline,
            heatmaps=heatmaps,
            plots={"hop_attention": hop_heatmap(res["attention"])},
        )


def head_rows(att: torch.Tensor, chance: torch.Tensor, targets: list[str]) -> list[dict[str, object]]:
    """Tidy rows per layer, head and target: ``<target>_attention`` from ``att`` (layer x head x
    target), each with the target's ``chance``."""
    L, H, _ = att.shape
    return [
        {
            "layer": layer,
            "head": h,
            "metric": f"{target}_attention",
            "value": float(att[layer, h, t]),
            "chance": float(chance[t]),
        }
        for layer in range(L)
        for h in range(H)
        for t, target in enumerate(targets)
    ]


def score_rows(res: dict[str, torch.Tensor]) -> list[dict[str, object]]:
    """Tidy rows: per head and hop ``hop_j_attention`` (with ``chance``), per layer
    ``largest_hop_resolved`` (head empty)."""
    att = res["attention"]
    rows = head_rows(att, res["chance"], [f"hop_{j + 1}" for j in range(att.shape[2])])
    rows += [
        {"layer": layer, "head": None, "metric": "largest_hop_resolved", "value": int(res["largest_hop"][layer])}
        for layer in range(att.shape[0])
    ]
    return rows


def near_rows(near: dict[str, torch.Tensor]) -> list[dict[str, object]]:
    """Tidy rows per head: ``previous_token_attention`` and ``previous_occurrence_attention``
    (:data:`NEIGHBOURS`), each with its ``chance``."""
    return head_rows(near["attention"], near["chance"], list(NEIGHBOURS))


def summarise(res: dict[str, torch.Tensor], near: dict[str, torch.Tensor]) -> pd.DataFrame:
    """Per layer: the largest hop some head resolves (0: none), the heads that resolve it (L-H)
    and the best one's attention and the hop's chance (blank where the layer resolves no hop);
    then per :data:`NEIGHBOURS` target the layer's largest attention over heads and the target's
    chance (``previous_token``, ``previous_token_chance``, ...)."""
    att, chance, resolved = res["attention"], res["chance"], res["resolved"]
    rows = []
    for layer, top in enumerate(res["largest_hop"].tolist()):
        row: dict[str, object] = {"layer": layer, "largest_hop": top, "heads": "", "attention": "", "chance": ""}
        for t, target in enumerate(NEIGHBOURS):
            row[target] = round(float(near["attention"][layer, :, t].max()), 4)
            row[f"{target}_chance"] = round(float(near["chance"][t]), 4)
        if top:
            j = top - 1
            heads = [h for h in range(att.shape[1]) if resolved[layer, h, j]]
            heads.sort(key=lambda h: -float(att[layer, h, j]))
            row["heads"] = ", ".join(head_label(layer, h) for h in heads)
            row["attention"] = round(float(att[layer, heads[0], j]), 4)
            row["chance"] = round(float(chance[j]), 4)
        rows.append(row)
    return pd.DataFrame(rows)


def hop_heatmap(att: torch.Tensor) -> str:
    """SVG heatmap: one row per head (L-H), one column per hop j."""
    L, H, J = att.shape
    labels = [head_label(layer, h) for layer in range(L) for h in range(H)]
    values = np.asarray(att.reshape(L * H, J), dtype=np.float64)  # [L*H, J]
    return heatmap_svg(values, labels, list(range(1, J + 1)), row_title="head (L-H)", col_title="hop j")


def notes(res: dict[str, torch.Tensor], o: Options) -> list[str]:
    count = [int(c) for c in res["count"].tolist()]
    out = [
        f"hop j: attention from position 1 + i to 1 + p^j(i), mean over the (sequence, i) where p^j(i) is "
        f"defined ({', '.join(f'j={j + 1}: {c}' for j, c in enumerate(count))} positions); chance: the mean "
        "of 1 / (keys the causal query sees) over the same positions",
        f"a head resolves hop j when its mean attention is >= {o.threshold} and >= {RATIO:g}x chance; a layer's "
        "largest hop is the largest j some head of it resolves (0: none)",
        "previous_token / previous_occurrence: the attention from 1 + i to 1 + (i - 1) and to 1 + (p(i) - 1), the "
        "last position before i holding X_i, with chance over the same positions; per layer the largest over heads",
        "a construction reaching floor(log2 k) + 2 layers (pointers as well as answers): layer 0 attends to i - 1, "
        "layer 1 to p(i), layer l >= 2 to p^(2^(l-1))(i), holding 2^l - 1 hops after layer l "
        "(docs/hop-attention.md); read this next to the depth law: attention shows where a head looks, not that "
        "the model uses it",
        f"inputs: hop-count token k={o.hop}, then {o.length} letters over {o.letters}, the khop evaluation "
        f"stream of seed {o.seed}",
    ]
    if any(c == 0 for c in count):
        out.append("hops defined nowhere in these sequences have no score (nan): raise -O length or lower -O max_hop")
    return out
