"""attention-stats (Clark et al. 2019, §3): where each head puts its attention.

Per head: attention to [CLS] (encoders) or BOS (decoders), to [SEP] (encoders), to
punctuation, to the previous token, to the next token, to itself, and the entropy of the
attention row in nats. Two protocols (``-O protocol=``):

- ``pooled`` (default): one mean over every real token of the input (special tokens included
  as queries), so long lines weigh more; punctuation is any all-punctuation token; plain entropy.
- ``clark``: Clark et al.'s General_Analysis code: the mean over each line's queries, then the
  plain mean over lines; punctuation is only ``.`` and ``,``; entropy of rows smoothed as
  0.9999 a + 1e-4 / n. Adds entropy_cls, sep_to_sep, other_to_sep, js_distance_mean (the
  pairwise table goes to ``js_distances.csv``) and the uniform-attention entropy (headline).

Input: the built-in sample, a UTF-8 text file with one example per non-empty line, or in memory
(``probes.run(data=...)``): a list of lines, or token ids ``[example, pos]`` as the model sees them.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import pandas as pd
import torch

from depthprobe.probes.base.batching import Batch
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.scores import head_label
from depthprobe.probes.engine.inputs import text_sequences
from depthprobe.probes.engine.task import Context, Examples, HeatmapPanel, Output, Task, add_sums, tidy
from depthprobe.probes.hooks.capture import Captured, pattern_names
from depthprobe.probes.measures.metrics import (
    attention_stat_sums,
    clark_stat_sums,
    js_distance_mean,
    uniform_entropy_sum,
)
from depthprobe.probes.models.model import Model
from depthprobe.tasks.cards import CARDS, AttentionStatsOptions

SAMPLE = Path(__file__).parent / "data" / "sample.txt"


TITLES = {
    "entropy": "entropy (nats)",
    "entropy_cls": "entropy from [CLS] (nats)",
    "sep_to_sep": "attention [SEP] to [SEP]",
    "other_to_sep": "attention other to [SEP]",
    "js_distance_mean": "mean JS distance to the other heads (nats)",
}
CLARK_PUNCT = frozenset({".", ","})  # General_Analysis: token == "." or token == ","


Options = AttentionStatsOptions  # tasks/cards.py: the options, readable without importing this module


def is_punct(token: str, protocol: str = "pooled") -> bool:
    """Whether a vocabulary token counts as punctuation.

    pooled: every character of its surface form (``##``, ``Ġ``, ``▁`` markers stripped) is
    Unicode punctuation, so ``'`` and ``(`` count. clark: the token is ``.`` or ``,`` (a leading
    ``Ġ``/``▁`` space marker stripped, for BPE/sentencepiece vocabularies)."""
    if protocol == "clark":
        return token.lstrip("\u0120\u2581") in CLARK_PUNCT
    s = token.removeprefix("##").lstrip("\u0120\u2581 ")
    return bool(s) and all(unicodedata.category(c).startswith("P") for c in s)


@lru_cache(maxsize=8)
def punct_ids(tokenizer, protocol: str = "pooled") -> frozenset[int]:
    """Vocabulary ids of punctuation tokens under ``protocol`` (special tokens never count)."""
    specials = set(tokenizer.all_special_ids)
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return frozenset(
        i for i, tok in enumerate(tokens) if i not in specials and tok is not None and is_punct(tok, protocol)
    )


@dataclass
class State:
    model: Model
    punct: torch.Tensor  # vocabulary ids of punctuation tokens
    protocol: str = "pooled"
    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    tokens: int = 0
    sentences: int = 0
    uniform: float = 0.0  # clark: sum over lines of the uniform-attention entropy
    js: torch.Tensor | None = None  # clark: sum over lines of [head, head] JS distances


class AttentionStats(Task[Options, State]):
    name = "attention-stats"
    description = CARDS["attention-stats"].description
    memory_kinds = frozenset({"lines", "tokens"})

    def load(self, model: Model, ctx: Context[Options]) -> Examples:
        seqs = text_sequences(model, ctx, SAMPLE)
        limit = model.input_limit(ctx.config.max_len)
        kept = [s for s in seqs if len(s) <= limit]
        if not kept:
            raise ProbeError(
                f"every example is longer than --max-len {limit} pieces; raise --max-len "
                f"(model limit {model.info.max_len}) or split the lines"
            )
        return Examples(kept, skipped=len(seqs) - len(kept), why=f"longer than {limit} pieces")

    def hook_names(self, model: Model, ctx: Context[Options]) -> list[str]:
        return pattern_names(model.info.n_layers)

    def start(self, model: Model, ctx: Context[Options], examples: Examples) -> State:
        protocol = ctx.options.protocol
        ids = punct_ids(model.tokenizer, protocol)
        return State(model=model, punct=torch.tensor(sorted(ids), dtype=torch.long), protocol=protocol)

    def accumulate(self, state: State, batch: Batch, acts: Captured) -> None:
        model = state.model
        ids, mask = batch.input_ids, batch.attention_mask.bool()
        first = torch.zeros_like(mask)
        first[:, 0] = True
        sep = (ids == model.sep_id) & mask if model.sep_id is not None else None
        punct = torch.isin(ids, state.punct) & mask
        stat_sums = clark_stat_sums if state.protocol == "clark" else attention_stat_sums
        names = pattern_names(model.info.n_layers)
        for layer, name in enumerate(names):
            a = acts[name]  # [b, head, q, k]; one layer at a time, no stacked copy
            dev = a.device
            sums = stat_sums(
                a[:, None], mask.to(dev), first.to(dev), None if sep is None else sep.to(dev), punct.to(dev)
            )
            for k, v in sums.items():  # v: [1, head]
                state.sums.setdefault(k, torch.zeros(model.info.n_layers, v.shape[1], dtype=torch.float64))
                state.sums[k][layer] += v[0].cpu()
        state.tokens += int(mask.sum())
        state.sentences += int(mask.shape[0])
        if state.protocol == "clark":
            state.uniform += uniform_entropy_sum(mask, model.info.causal)
            for b, n in enumerate(mask.sum(1).tolist()):  # one line at a time: [all heads, n, n]
                js = js_distance_mean(torch.cat([acts[name][b, :, :n, :n] for name in names])).cpu()
                state.js = js if state.js is None else state.js + js

    def merge(self, a: State, b: State) -> State:
        a.sums = add_sums(a.sums, b.sums)
        a.tokens += b.tokens
        a.sentences += b.sentences
        a.uniform += b.uniform
        a.js = b.js if a.js is None else a.js if b.js is None else a.js + b.js
        return a

    def finalize(self, state: State, ctx: Context[Options]) -> Output:
        causal = state.model.info.causal
        rename = {"to_first": "to_bos" if causal else "to_cls", "entropy_first": "entropy_cls"}
        clark = state.protocol == "clark"
        rows, files = [], {}
        sums = {k: v for k, v in state.sums.items() if not (causal and k == "entropy_first")}
        means = {rename.get(k, k): v / max(state.sentences if clark else state.tokens, 1) for k, v in sums.items()}
        if clark and state.js is not None:
            js = state.js / max(state.sentences, 1)
            n_l, n_h = means["entropy"].shape
            n = js.shape[0]
            means["js_distance_mean"] = (js.sum(1) / max(n - 1, 1)).view(n_l, n_h)
            files["js_distances.csv"] = _js_csv(js, n_h).encode()
        for metric, m in means.items():
            for layer in range(m.shape[0]):
                for head in range(m.shape[1]):
                    rows.append({"layer": layer, "head": head, "metric": metric, "value": float(m[layer, head])})
        scores = tidy(rows, ctx.config.model, self.name)
        summary = self._summary(scores, ctx.options.top)
        if clark:
            notes = [
                f"protocol clark: per-line means over {state.tokens} tokens, then the plain mean over "
                f"{state.sentences} lines; punctuation = '.' and ','; smoothed entropy",
                "js_distances.csv: Jensen-Shannon distance (nats) between every pair of heads",
            ]
        else:
            notes = [
                f"protocol pooled: {state.tokens} tokens averaged (every real token is a query, specials included)"
            ]
        headline = {"protocol": state.protocol, "n_tokens": state.tokens, "n_lines": state.sentences}
        if clark:
            headline["uniform_entropy"] = round(state.uniform / max(state.sentences, 1), 4)
            notes.append(f"uniform-attention entropy (reference): {headline['uniform_entropy']} nats")
        if "to_sep" in means:
            by_layer = means["to_sep"].mean(1)
            headline["to_sep_by_layer"] = [round(float(x), 4) for x in by_layer]
        heatmaps: list[HeatmapPanel] = [
            {"title": TITLES.get(m, f"attention {m.replace('_', ' ')}"), "metric": m, "where": {}} for m in means
        ]
        return Output(scores=scores, summary=summary, notes=notes, headline=headline, heatmaps=heatmaps, files=files)

    @staticmethod
    def _summary(scores: pd.DataFrame, top: int) -> pd.DataFrame:
        """Per metric: the layer mean range and the top heads by value."""
        out = []
        for metric, g in scores.groupby("metric", sort=False):
            best = g.nlargest(top, "value")
            out.append(
                {
                    "metric": metric,
                    "mean": round(g["value"].mean(), 4),
                    "heads_over_0.5": int((g["value"] > 0.5).sum()),
                    "top_heads": ", ".join(f"{head_label(r.layer, r.head)} ({r.value:.2f})" for r in best.itertuples()),
                }
            )
        return pd.DataFrame(out)


def _js_csv(js: torch.Tensor, n_heads: int) -> str:
    """The [head, head] JS distance table as tidy CSV rows (every ordered pair, diagonal included)."""
    n = js.shape[0]
    idx = torch.arange(n)
    li, lj = torch.meshgrid(idx, idx, indexing="ij")
    df = pd.DataFrame(
        {
            "layer": (li // n_heads).flatten().numpy(),
            "head": (li % n_heads).flatten().numpy(),
            "other_layer": (lj // n_heads).flatten().numpy(),
            "other_head": (lj % n_heads).flatten().numpy(),
            "js_distance": js.flatten().numpy(),
        }
    )
    return df.to_csv(index=False)
