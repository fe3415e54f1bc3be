"""An independent plain-Hugging-Face implementation of depth usage (docs/protocols.md §3.10), for the tests.

No depthprobe code: the model is run by transformers alone, one text at a time (a batch of one,
so no padding), with ``output_hidden_states`` for h_0, forward hooks on the layer modules for
h_{l+1} (GPT-2's last hidden state has ``ln_f`` applied, so it cannot serve) and a forward hook
that hands a skipped layer's input on as its output. Everything in float64 after the pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def _layers(hf: Any) -> Any:
    return hf.bert.encoder.layer if hasattr(hf, "bert") else hf.transformer.h


def _head(hf: Any, h: torch.Tensor) -> torch.Tensor:
    """The model's own head on a residual: BERT's MLM head, or GPT-2's ln_f then lm_head."""
    if hasattr(hf, "cls"):
        return hf.cls(h)
    return hf.lm_head(hf.transformer.ln_f(h))


def _sublayers(hf: Any, ids: torch.Tensor) -> dict[str, list[torch.Tensor]]:
    """GPT-2 (pre-LN): each block's attention and MLP outputs, [T, d] float64, read by hooks on
    ``h[l].attn`` and ``h[l].mlp``."""
    got: dict[str, list[torch.Tensor]] = {"attn": [], "mlp": []}
    handles = []
    for layer in hf.transformer.h:
        for kind in ("attn", "mlp"):
            out = got[kind]
            handles.append(
                getattr(layer, kind).register_forward_hook(
                    lambda m, a, o, out=out: out.append((o[0] if isinstance(o, tuple) else o)[0].double())
                )
            )
    try:
        with torch.no_grad():
            hf(input_ids=ids)
    finally:
        for h in handles:
            h.remove()
    return got


def _pass(hf: Any, ids: torch.Tensor, skip: int | None) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """One text [1, T]: (h_0..h_L as [T, d] float64, logits [T, vocab] float64 or None without a head)."""
    outs: list[torch.Tensor] = []
    handles = []

    def skipper(module: Any, args: Any, kwargs: Any, output: Any) -> Any:
        x = args[0] if args else kwargs["hidden_states"]
        return (x, *output[1:]) if isinstance(output, tuple) else x

    def keep(module: Any, args: Any, output: Any) -> None:
        outs.append(output[0] if isinstance(output, tuple) else output)

    for i, layer in enumerate(_layers(hf)):
        if i == skip:
            handles.append(layer.register_forward_hook(skipper, with_kwargs=True))
        handles.append(layer.register_forward_hook(keep))
    try:
        with torch.no_grad():
            out = hf(input_ids=ids, output_hidden_states=True)
    finally:
        for h in handles:
            h.remove()
    hidden = [out.hidden_states[0][0].double()] + [o[0].double() for o in outs]
    logits = getattr(out, "logits", None)
    return hidden, None if logits is None else logits[0].double()


def _cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    den = a.norm(dim=-1) * b.norm(dim=-1)
    return torch.where(den > 0, (a * b).sum(-1) / den.clamp_min(1e-300), torch.zeros_like(den))


def _rel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    den = b.norm(dim=-1)
    return torch.where(den > 0, a.norm(dim=-1) / den.clamp_min(1e-300), torch.zeros_like(den))


def _kl_top1(p: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    lp, lq = torch.log_softmax(p, -1), torch.log_softmax(q, -1)
    return (lp.exp() * (lp - lq)).sum(-1), (p.argmax(-1) == q.argmax(-1)).double()


def depth_usage(hf: Any, texts: Sequence[list[int]], lm_head: bool) -> dict[str, torch.Tensor]:
    """Means over every token of every text: relative_contribution [L], cosine [L], skip_later
    [L, L] (j > s), skip_output [L], and with ``lm_head`` skip_kl, skip_top1 [L], lens_kl,
    lens_top1 [L + 1]; GPT-2 also attn_/mlp_relative_contribution and attn_/mlp_cosine [L]."""
    hf.eval()
    L = len(_layers(hf))
    sums: dict[str, torch.Tensor] = {}
    n = 0

    def add(key: str, value: torch.Tensor) -> None:
        sums[key] = sums.get(key, 0) + value

    for row in texts:
        ids = torch.tensor([row])
        h, logits = _pass(hf, ids, None)
        c = [h[i + 1] - h[i] for i in range(L)]
        add("relative_contribution", torch.stack([_rel(c[i], h[i]).sum() for i in range(L)]))
        add("cosine", torch.stack([_cos(c[i], h[i]).sum() for i in range(L)]))
        if hasattr(hf, "transformer"):  # pre-LN: attention against h_l, the MLP against h_l + attention
            sub = _sublayers(hf, ids)
            for kind, base in (("attn", h[:L]), ("mlp", [h[i] + sub["attn"][i] for i in range(L)])):
                add(f"{kind}_relative_contribution", torch.stack([_rel(sub[kind][i], base[i]).sum() for i in range(L)]))
                add(f"{kind}_cosine", torch.stack([_cos(sub[kind][i], base[i]).sum() for i in range(L)]))
        later = torch.zeros(L, L, dtype=torch.float64)
        out = torch.zeros(L, 3, dtype=torch.float64)
        for s in range(L):
            h2, logits2 = _pass(hf, ids, s)
            for j in range(s + 1, L):
                later[s, j] = _rel(h2[j + 1] - h2[j] - c[j], c[j]).sum()
            out[s, 0] = (1 - _cos(h2[-1], h[-1])).sum()
            if logits is not None and logits2 is not None:
                kl, top1 = _kl_top1(logits, logits2)
                out[s, 1], out[s, 2] = kl.sum(), top1.sum()
        add("skip_later", later)
        add("skip_output", out[:, 0])
        if lm_head and logits is not None:
            add("skip_kl", out[:, 1])
            add("skip_top1", out[:, 2])
            with torch.no_grad():
                lens = [_kl_top1(logits, _head(hf, x.float()[None])[0].double()) for x in h]
            add("lens_kl", torch.stack([k.sum() for k, _ in lens]))
            add("lens_top1", torch.stack([t.sum() for _, t in lens]))
        n += len(row)
    return {k: v / n for k, v in sums.items()}
