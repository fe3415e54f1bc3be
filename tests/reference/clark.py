"""Independent plain-numpy references for attention-stats, one sentence at a time.

``clark_reference`` follows Clark et al.'s General_Analysis notebook (token stats and entropy
cells) and head_distances.py line by line, with two stated generalisations: the [SEP]->[SEP]
and other->[SEP] denominators are the number of [SEP] tokens and of the other tokens (his inputs
always held two [SEP]s, hence his 2 and n - 2), and JS distances are averaged over the tokens
of each sentence and then over sentences instead of summed. ``pooled_reference`` is one mean
over every token of every sentence.
"""

from __future__ import annotations

import unicodedata

import numpy as np


def clark_reference(docs):
    """docs: list of (tokens, attns [layer, head, n, n]) -> dict of [layer, head] arrays + scalars."""
    n_docs = len(docs)
    shape = docs[0][1].shape[:2]
    avg = {k: np.zeros(shape) for k in ["self", "right", "left", "sep", "sep_sep", "rest_sep", "cls", "punct"]}
    for tokens, attns in docs:
        n_tokens = attns.shape[-1]
        seps, clss, puncts = (np.zeros(n_tokens) for _ in range(3))
        for position, token in enumerate(tokens):
            if token == "[SEP]":
                seps[position] = 1
            if token == "[CLS]":
                clss[position] = 1
            if token == "." or token == ",":
                puncts[position] = 1
        sep_seps = np.ones((n_tokens, n_tokens)) * seps[np.newaxis] * seps[:, np.newaxis]
        rest_seps = np.ones((n_tokens, n_tokens)) * (np.ones(n_tokens) - seps)[:, np.newaxis] * seps[np.newaxis]
        selectors = {
            "self": np.eye(n_tokens, n_tokens),
            "right": np.eye(n_tokens, n_tokens, 1),
            "left": np.eye(n_tokens, n_tokens, -1),
            "sep": np.tile(seps[np.newaxis], [n_tokens, 1]),
            "sep_sep": sep_seps,
            "rest_sep": rest_seps,
            "cls": np.tile(clss[np.newaxis], [n_tokens, 1]),
            "punct": np.tile(puncts[np.newaxis], [n_tokens, 1]),
        }
        for key, selector in selectors.items():
            if key == "sep_sep":
                denom = seps.sum()
            elif key == "rest_sep":
                denom = n_tokens - seps.sum()
            else:
                denom = n_tokens
            avg[key] += (attns * selector[np.newaxis, np.newaxis]).sum(-1).sum(-1) / (n_docs * denom)

    uniform_attn_entropy = 0.0
    entropies = np.zeros(shape)
    entropies_cls = np.zeros(shape)
    for tokens, attns in docs:
        attns = 0.9999 * attns + (0.0001 / attns.shape[-1])
        uniform_attn_entropy -= np.log(1.0 / attns.shape[-1])
        entropies -= (attns * np.log(attns)).sum(-1).mean(-1)
        entropies_cls -= (attns * np.log(attns))[:, :, 0].sum(-1)
    uniform_attn_entropy /= n_docs
    entropies /= n_docs
    entropies_cls /= n_docs

    n_heads = shape[0] * shape[1]
    js_distances = np.zeros([n_heads, n_heads])
    for tokens, attns in docs:
        attns_flat = attns.reshape([n_heads, attns.shape[2], attns.shape[3]])
        for head in range(n_heads):
            head_attns = np.expand_dims(attns_flat[head], 0)
            head_attns_smoothed = (0.001 / head_attns.shape[1]) + (head_attns * 0.999)
            attns_flat_smoothed = (0.001 / attns_flat.shape[1]) + (attns_flat * 0.999)
            m = (head_attns_smoothed + attns_flat_smoothed) / 2
            js = -head_attns_smoothed * np.log(m / head_attns_smoothed)
            js += -attns_flat_smoothed * np.log(m / attns_flat_smoothed)
            js /= 2
            js = js.sum(-1).mean(-1)  # head_distances.py sums over the tokens here
            js_distances[head] += js / n_docs

    return {
        "to_cls": avg["cls"],
        "to_sep": avg["sep"],
        "to_punct": avg["punct"],
        "to_prev": avg["left"],
        "to_next": avg["right"],
        "to_self": avg["self"],
        "entropy": entropies,
        "entropy_cls": entropies_cls,
        "sep_to_sep": avg["sep_sep"],
        "other_to_sep": avg["rest_sep"],
        "js_distances": js_distances,
        "uniform_entropy": uniform_attn_entropy,
    }


def _pooled_punct(token: str) -> bool:
    s = token.removeprefix("##")
    return bool(s) and token not in ("[CLS]", "[SEP]") and all(unicodedata.category(c).startswith("P") for c in s)


def pooled_reference(docs):
    """One mean over all tokens of all docs; punctuation = all-Unicode-punctuation tokens; plain entropy."""
    shape = docs[0][1].shape[:2]
    sums = {k: np.zeros(shape) for k in ["to_cls", "to_sep", "to_punct", "to_prev", "to_next", "to_self", "entropy"]}
    total = 0
    for tokens, attns in docs:
        n = attns.shape[-1]
        total += n
        for q in range(n):
            row = attns[:, :, q, :]
            for k, tok in enumerate(tokens):
                sums["to_cls"] += row[..., k] * (tok == "[CLS]")
                sums["to_sep"] += row[..., k] * (tok == "[SEP]")
                sums["to_punct"] += row[..., k] * _pooled_punct(tok)
            if q > 0:
                sums["to_prev"] += row[..., q - 1]
            if q + 1 < n:
                sums["to_next"] += row[..., q + 1]
            sums["to_self"] += row[..., q]
            with np.errstate(divide="ignore", invalid="ignore"):
                sums["entropy"] -= np.where(row > 0, row * np.log(row), 0.0).sum(-1)
    return {k: v / total for k, v in sums.items()}
