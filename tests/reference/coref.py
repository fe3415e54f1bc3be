"""An independent plain-Python implementation of the coref protocol (docs/coref.md): its own
CoNLL-U reading, mention heads and agreement features, and plain loops over heads and candidates."""

import re
from pathlib import Path

import torch

from depthprobe.probes.data import coref_chains
from depthprobe.probes.hooks.capture import forward, pattern_names
from depthprobe.tasks.coref import chains as cr_chains

BRACKET = re.compile(r"\(([^()|]+)\)|\(([^()|]+)|([^()|]+)\)")
PRON = {
    "he": ("Sing", "Masc", "3"),
    "him": ("Sing", "Masc", "3"),
    "his": ("Sing", "Masc", "3"),
    "himself": ("Sing", "Masc", "3"),
}


def ref_documents(path: Path) -> list[dict]:
    """Plain reading of a CoNLL-U file: words, UPOS, FEATS, doc-level heads, sentences, mentions."""
    docs, sent = [], []

    def new_doc():
        docs.append({"words": [], "upos": [], "feats": [], "head": [], "sents": [], "mentions": [], "open": {}})

    def close_sent():
        nonlocal sent
        if not sent:
            return
        if not docs:
            new_doc()
        d = docs[-1]
        base = len(d["words"])
        for cols in sent:
            i = len(d["words"])
            d["words"].append(cols[1])
            d["upos"].append(cols[3])
            d["feats"].append(dict(kv.split("=") for kv in cols[5].split("|")) if cols[5] != "_" else {})
            h = int(cols[6])
            d["head"].append(base + h - 1 if h else None)
            for item in cols[9].split("|"):
                if not item.startswith("Entity="):
                    continue
                for single, opening, closing in BRACKET.findall(item[7:]):
                    if single:
                        d["mentions"].append((i, i, single.split("-")[0]))
                    elif opening:
                        d["open"].setdefault(opening.split("-")[0], []).append(i)
                    else:
                        ident = closing.split("-")[0]
                        d["mentions"].append((d["open"][ident].pop(), i, ident))
        d["sents"].append((base, len(d["words"])))
        sent = []

    for line in path.read_text(encoding="utf-8").split("\n"):
        if line.startswith("# newdoc"):
            close_sent()
            new_doc()
        elif line.startswith("#"):
            continue
        elif not line.strip():
            close_sent()
        else:
            cols = line.split("\t")
            if cols[0].isdigit():
                sent.append(cols)
    close_sent()
    return docs


def ref_head(d: dict, s: int, e: int) -> int:
    for i in range(s, e + 1):
        h = d["head"][i]
        if h is None or h < s or h > e:
            return i
    raise AssertionError("no head")


def ref_agree(d: dict, i: int) -> tuple[str, str, str]:
    w = d["words"][i].lower()
    if d["upos"][i] == "PRON" and w in coref_chains.PRONOUNS:
        return coref_chains.PRONOUNS[w]
    f = d["feats"][i]
    person = f.get("Person", "" if d["upos"][i] == "PRON" else "3")
    return f.get("Number", ""), f.get("Gender", ""), person


def ref_chains(model, path: Path, max_len: int) -> dict:
    """docs/coref.md with plain loops: counts[(type, layer, head)] correct, n[type], baselines."""
    tok = model.tokenizer
    L, H = model.info.n_layers, model.info.n_heads
    correct = {(t, layer_idx, h): 0 for t in cr_chains.TYPES for layer_idx in range(L) for h in range(H)}
    n = dict.fromkeys(cr_chains.TYPES, 0)
    base = {(b, t): 0 for b in cr_chains.BASELINES for t in cr_chains.TYPES}
    for d in ref_documents(path):
        pieces = []
        for w in d["words"]:
            p = tok(w, add_special_tokens=False)["input_ids"]
            pieces.append(p or [tok.unk_token_id])
        windows, cur, size = [], None, 2
        for s, e in d["sents"]:
            k = sum(len(pieces[i]) for i in range(s, e))
            if k + 2 > max_len:
                if cur:
                    windows.append(cur)
                cur, size = None, 2
                continue
            if cur and size + k > max_len:
                windows.append(cur)
                cur, size = None, 2
            cur = (cur[0], e) if cur else (s, e)
            size += k
        if cur:
            windows.append(cur)
        for lo, hi in windows:
            inside = [m for m in d["mentions"] if lo <= m[0] and m[1] < hi]
            evaluated = [m for m in inside if any(o[2] == m[2] and lo <= o[0] < m[0] for o in d["mentions"])]
            if not evaluated:
                continue
            ids, owner = [model.cls_id], [None]
            for i in range(lo, hi):
                ids += pieces[i]
                owner += [i] * len(pieces[i])
            ids.append(model.sep_id)
            owner.append(None)
            acts = forward(model, torch.tensor([ids]), None, pattern_names(L))
            att = [[acts[name][0, h].tolist() for h in range(H)] for name in pattern_names(L)]
            pos = {i: [p for p, o in enumerate(owner) if o == i] for i in range(lo, hi)}

            def word_att(layer_idx, h, frm, to, pos=pos, att=att):
                rows = pos[frm]
                return sum(sum(att[layer_idx][h][r][c] for c in pos[to]) for r in rows) / len(rows)

            spans = {}
            for s, e, ch in inside:
                spans.setdefault((s, e), set()).add(ch)
            for s, e, ch in evaluated:
                hd = ref_head(d, s, e)
                kind = "pronoun" if d["upos"][hd] == "PRON" else "proper" if d["upos"][hd] == "PROPN" else "nominal"
                n[kind] += 1
                cands = sorted([c for c in spans if c[1] < s], key=lambda c: (-c[0], -c[1]))
                ok = [ch in spans[c] for c in cands]
                heads = [ref_head(d, *c) for c in cands]
                for layer_idx in range(L):
                    for h in range(H):
                        best, best_v = None, None
                        for j, _c in enumerate(cands):
                            v = word_att(layer_idx, h, hd, heads[j])
                            if best_v is None or v > best_v:
                                best, best_v = j, v
                        correct[(kind, layer_idx, h)] += int(best is not None and ok[best])
                if not cands:
                    continue
                low = [w.lower() for w in d["words"]]
                hm = [j for j, c in enumerate(cands) if low[heads[j]] == low[hd]]
                ex = [j for j, c in enumerate(cands) if low[c[0] : c[1] + 1] == low[s : e + 1]]
                ag = [
                    j
                    for j, c in enumerate(cands)
                    if all(
                        x == "" or y == "" or x == y
                        for x, y in zip(ref_agree(d, hd), ref_agree(d, heads[j]), strict=False)
                    )
                ]
                base[("nearest", kind)] += ok[0]
                base[("head match", kind)] += ok[hm[0] if hm else 0]
                base[("rule-based", kind)] += ok[(ex or hm or ag or [0])[0]]
    return {"correct": correct, "n": n, "base": base}
