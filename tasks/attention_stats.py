"""attention-stats (Clark et al. 2019, §3): where each head puts its attention.

Per head, averaged over every real token of the input (special tokens included as queries):
attention to [CLS] (encoders) or BOS (decoders), to [SEP] (encoders), to punctuation, to the
previous token, to the next token, to itself, and the entropy of the attention row in nats.
Input: the built-in sample, or a UTF-8 text file with one example per non-empty line.
"""
from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import pandas as pd
import torch

from probes.capture import pattern_names
from probes.errors import ProbeError
from probes.metrics import attention_stat_sums
from probes.options import ranged
from probes.task import Context, Examples, Output, Task, register, tidy

SAMPLE = Path(__file__).parent / "data" / "sample.txt"


@dataclass(frozen=True)
class Options:
    top: int = ranged(5, min=1)  # heads listed per metric in the summary


def read_lines(path: Path) -> list[str]:
    """Non-empty lines of a UTF-8 text file; bad files fail with a one-line reason."""
    if path.is_dir():
        raise ProbeError(f"{path} is a directory; attention-stats reads one text file (one example per line)")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ProbeError(f"{path}: not UTF-8 text (byte {exc.start}); re-save the file as UTF-8") from None
    except OSError as exc:
        raise ProbeError(f"cannot read {path}: {exc.strerror}") from None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ProbeError(f"{path} is empty; give a text file with one example per line")
    return lines


@lru_cache(maxsize=8)
def punct_ids(tokenizer) -> frozenset[int]:
    """Vocabulary ids whose surface form is all punctuation (wordpiece/BPE markers stripped)."""
    out = set()
    specials = set(tokenizer.all_special_ids)
    for i, tok in enumerate(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))):
        if i in specials or tok is None:
            continue
        s = tok.removeprefix("##").lstrip("\u0120\u2581 ")
        if s and all(unicodedata.category(c).startswith("P") for c in s):
            out.add(i)
    return frozenset(out)


@dataclass
class State:
    model: object
    punct: torch.Tensor  # vocabulary ids of punctuation tokens
    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    tokens: int = 0


@register
class AttentionStats(Task):
    name = "attention-stats"
    description = "Per-head attention to [CLS]/BOS, [SEP], punctuation, previous/next token, self; entropy"
    Options = Options

    def load(self, model, ctx: Context) -> Examples:
        lines = read_lines(ctx.data) if ctx.data else read_lines(SAMPLE)
        tok = model.tokenizer
        pieces = tok(lines, add_special_tokens=False)["input_ids"]
        tail = [model.sep_id] if model.sep_id is not None else []
        seqs = [tuple([model.cls_id, *p, *tail]) for p in pieces]
        limit = min(ctx.config.max_len, model.info.max_len)
        kept = [s for s in seqs if len(s) <= limit]
        if not kept:
            raise ProbeError(f"every example is longer than --max-len {limit} pieces; raise --max-len "
                             f"(model limit {model.info.max_len}) or split the lines")
        return Examples(kept, skipped=len(seqs) - len(kept), why=f"longer than {limit} pieces")

    def hook_names(self, model, ctx):
        return pattern_names(model.info.n_layers)

    def start(self, model, ctx, examples):
        return State(model=model, punct=torch.tensor(sorted(punct_ids(model.tokenizer)), dtype=torch.long))

    def accumulate(self, state: State, batch, acts) -> None:
        model = state.model
        ids, mask = batch.input_ids, batch.attention_mask.bool()
        first = torch.zeros_like(mask)
        first[:, 0] = True
        sep = (ids == model.sep_id) & mask if model.sep_id is not None else None
        punct = torch.isin(ids, state.punct) & mask
        for layer, name in enumerate(pattern_names(model.info.n_layers)):
            a = acts[name]  # [b, head, q, k]; one layer at a time, no stacked copy
            dev = a.device
            sums = attention_stat_sums(a[:, None], mask.to(dev), first.to(dev),
                                       None if sep is None else sep.to(dev), punct.to(dev))
            for k, v in sums.items():  # v: [1, head]
                state.sums.setdefault(k, torch.zeros(model.info.n_layers, v.shape[1], dtype=torch.float64))
                state.sums[k][layer] += v[0].cpu()
        state.tokens += int(mask.sum())

    def finalize(self, state: State, ctx: Context) -> Output:
        rename = {"to_first": "to_bos" if state.model.info.causal else "to_cls"}
        rows = []
        means = {rename.get(k, k): v / max(state.tokens, 1) for k, v in state.sums.items()}
        for metric, m in means.items():
            for layer in range(m.shape[0]):
                for head in range(m.shape[1]):
                    rows.append({"layer": layer, "head": head, "metric": metric, "value": float(m[layer, head])})
        scores = tidy(rows, ctx.config.model, self.name)
        summary = self._summary(scores, ctx.options.top)
        notes = [f"{state.tokens} tokens averaged (every real token is a query, specials included)"]
        headline = {"n_tokens": state.tokens}
        if "to_sep" in means:
            by_layer = means["to_sep"].mean(1)
            headline["to_sep_by_layer"] = [round(float(x), 4) for x in by_layer]
        heatmaps = [{"title": f"attention {m.replace('_', ' ')}" if m != "entropy" else "entropy (nats)",
                     "metric": m, "where": {}} for m in means]
        return Output(scores=scores, summary=summary, notes=notes, headline=headline, heatmaps=heatmaps)

    @staticmethod
    def _summary(scores: pd.DataFrame, top: int) -> pd.DataFrame:
        """Per metric: the layer mean range and the top heads by value."""
        out = []
        for metric, g in scores.groupby("metric", sort=False):
            best = g.nlargest(top, "value")
            out.append({
                "metric": metric,
                "mean": round(g["value"].mean(), 4),
                "heads_over_0.5": int((g["value"] > 0.5).sum()),
                "top_heads": ", ".join(f"{r.layer}-{r.head} ({r.value:.2f})" for r in best.itertuples()),
            })
        return pd.DataFrame(out)
