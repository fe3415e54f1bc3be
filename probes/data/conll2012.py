"""The CoNLL-2012 ``*_conll`` reader: documents with coreference chains, head words from PTB tags.

CoNLL-2012 (``#begin document`` ... ``#end document``, whitespace-separated columns, the word in
column 4, the PTB part-of-speech tag in column 5, coreference in the last column as ``(12``,
``12)``, ``(12)`` or ``-``, several separated by ``|``): the files carry no dependency trees, so
the head word is found by a rule on the PTB tags (see :func:`ptb_head`); the UPOS used for the
mention type and the morphology used by the rule-based baseline are mapped from the PTB tag.
Chains are built as in :mod:`.coref_chains`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from depthprobe.probes.data.coref_chains import PRONOUNS, Chains, attach_chains, fail, parse_brackets

PTB_UPOS = {
    "PRP": "PRON",
    "PRP$": "PRON",
    "WP": "PRON",
    "WP$": "PRON",
    "EX": "PRON",
    "NNP": "PROPN",
    "NNPS": "PROPN",
    "NN": "NOUN",
    "NNS": "NOUN",
    "CD": "NUM",
    "DT": "DET",
    "PDT": "DET",
    "WDT": "DET",
    "JJ": "ADJ",
    "JJR": "ADJ",
    "JJS": "ADJ",
    "IN": "ADP",
    "TO": "PART",
    "RB": "ADV",
    "RBR": "ADV",
    "RBS": "ADV",
    "WRB": "ADV",
    "CC": "CCONJ",
    "MD": "AUX",
    "POS": "PART",
    "RP": "ADP",
    "UH": "INTJ",
    "SYM": "SYM",
    "FW": "X",
    "LS": "X",
}
PTB_NUMBER = {"NN": "Sing", "NNP": "Sing", "NNS": "Plur", "NNPS": "Plur"}
_NOMINAL = {"NN", "NNS", "NNP", "NNPS", "PRP", "PRP$", "WP", "WP$", "CD", "EX"}
_POSTMOD = {"IN", "TO", "WDT", "WP", "WP$", "WRB", "CC", ",", ":", "-LRB-", "-RRB-", "``", "''", "HYPH"}


def ptb_upos(tag: str) -> str:
    if tag.startswith("VB"):
        return "VERB"
    if tag in PTB_UPOS:
        return PTB_UPOS[tag]
    return "PUNCT" if tag and not tag[0].isalpha() else "X"


def ptb_head(tags: list[str]) -> int:
    """Head word offset of a span from PTB tags, Collins-style for noun phrases: cut the span
    before its first post-modifier (a word after the first tagged IN, TO, WDT, WP, WP$, WRB,
    CC, punctuation or a verb), then take the last noun/pronoun/number of the rest, else its
    last word. ``the president of the company`` -> president; ``his mother`` -> mother."""
    cut = len(tags)
    for k in range(1, len(tags)):
        if tags[k] in _POSTMOD or tags[k].startswith("VB"):
            cut = k
            break
    for k in range(cut - 1, -1, -1):
        if tags[k] in _NOMINAL:
            return k
    return cut - 1


@dataclass
class _Conll12Doc:
    name: str
    line: int
    words: list[str]
    tags: list[str]
    sent_starts: list[bool | int | None]  # spaCy Doc(sent_starts=...)
    chains: Chains


def _conll12_docs(path: Path) -> Iterator[_Conll12Doc]:
    from depthprobe.probes.data.text import all_lines

    cur: _Conll12Doc | None = None
    new_sentence = True
    for lineno, raw in enumerate(all_lines(path), 1):
        line = raw.rstrip("\r")
        if line.startswith("#begin document"):
            if cur is not None:
                raise fail(
                    path,
                    lineno,
                    f"#begin document inside document {cur.name!r} (line {cur.line}); add the missing #end document",
                )
            cur = _Conll12Doc(line[len("#begin document") :].strip(), lineno, [], [], [], Chains(path))
            new_sentence = True
        elif line.startswith("#end document"):
            if cur is None:
                raise fail(path, lineno, "#end document without #begin document")
            if cur.words:
                yield cur
            cur = None
        elif not line.strip():
            new_sentence = True
        elif line.startswith("#"):
            continue
        else:
            if cur is None:
                raise fail(path, lineno, "token line outside #begin document ... #end document")
            cols = line.split()
            if len(cols) < 5:
                raise fail(
                    path, lineno, f"expected at least 5 columns (word in column 4, coreference last), found {len(cols)}"
                )
            coref = cols[-1]
            if coref not in ("-", "_"):
                cur.chains.feed(parse_brackets(coref, path, lineno), len(cur.words), lineno)
            cur.words.append(cols[3])
            cur.tags.append(cols[4] if len(cols) >= 6 else "")
            cur.sent_starts.append(new_sentence)
            new_sentence = False
    if cur is not None:
        raise fail(path, cur.line, f"document {cur.name!r} has no #end document; add it")


def _pronoun_feats(word: str) -> str:
    info = PRONOUNS.get(word.lower())
    if info is None:
        return ""
    number, gender, person = info
    feats = [
        f"Gender={gender}" if gender else "",
        f"Number={number}" if number else "",
        f"Person={person}" if person else "",
    ]
    return "|".join(f for f in feats if f)


def read_conll2012(path: str | Path, vocab=None) -> list:
    """Docs of one CoNLL-2012 file (one per #begin document ... #end document)."""
    from spacy.tokens import Doc
    from spacy.vocab import Vocab

    path = Path(path)
    vocab = vocab or Vocab()
    docs = []
    for d in _conll12_docs(path):
        pos = [ptb_upos(t) for t in d.tags]
        morphs = [
            _pronoun_feats(w) if p == "PRON" else (f"Number={PTB_NUMBER[t]}" if t in PTB_NUMBER else "")
            for w, t, p in zip(d.words, d.tags, pos, strict=False)
        ]
        doc = Doc(vocab, words=d.words, pos=pos, tags=d.tags, morphs=morphs, sent_starts=d.sent_starts)
        doc.user_data.update({"doc_id": d.name, "source": str(path), "head_rule": "ptb"})
        spans = d.chains.finish()
        heads = {(s, e + 1): s + ptb_head(d.tags[s : e + 1]) for s, e, _, _ in spans}
        docs.append(attach_chains(doc, spans, heads))
    return docs
