"""Coreference data: CoNLL-U ``Entity=`` chains, CoNLL-2012 ``*_conll`` files and GAP TSV.

Chains become spaCy ``Doc``s: every chain is a span group ``doc.spans["coref_<id>"]`` and the
head word of every mention is kept in ``doc.user_data["coref_heads"][(start, end)]`` (``end``
exclusive, as in spaCy spans). :func:`mentions` reads them back as :class:`Mention`s.

CoNLL-U (OntoGUM, UD 2.x coreference releases): the ``Entity=`` value of the MISC column holds
brackets read left to right: ``(1`` opens a mention of entity 1, ``1)`` closes the most
recently opened mention of entity 1, ``(1)`` is a one-word mention. CorefUD-style brackets
(``(e12-person-1-...``) use the part before the first ``-`` as the id (``e12``); a
discontinuous-part suffix ``[1/2]`` is dropped, each part becomes its own mention. Chain ids
are per document (``# newdoc id``; a file without one is one document). Entity brackets on
multiword-token range lines and empty nodes are ignored (they are skipped as words).
Head word = the first word of the span whose UD head lies outside the span (or is the root).

CoNLL-2012 (``#begin document`` ... ``#end document``, whitespace-separated columns, the word in
column 4, the PTB part-of-speech tag in column 5, coreference in the last column as ``(12``,
``12)``, ``(12)`` or ``-``, several separated by ``|``): the files carry no dependency trees, so
the head word is found by a rule on the PTB tags (see :func:`ptb_head`); the UPOS used for the
mention type and the morphology used by the rule-based baseline are mapped from the PTB tag.

GAP TSV: header ``ID Text Pronoun Pronoun-offset A A-offset A-coref B B-offset B-coref URL``;
character offsets are checked against the names. Every problem is ``file:line: reason``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.data.conllu import Sentence, by_document, read_conllu, to_doc

SPAN_PREFIX = "coref_"


@dataclass(frozen=True, order=True)
class Mention:
    """A mention: words ``start..end`` (inclusive, document word indices) of chain ``chain``."""

    start: int
    end: int
    chain: str
    head: int  # document word index of the head word
    line: int = 0  # source line of the opening bracket (0 when unknown)


def _fail(path: str | Path, line: int, what: str) -> ProbeError:
    return ProbeError(f"{path}:{line}: {what}")


# ---------------------------------------------------------------- bracket parsing


def entity_id(text: str) -> str:
    """``e12-person-1-...`` -> ``e12``; ``7`` -> ``7``; ``e5[1/2]`` -> ``e5``."""
    ident = text.split("-", 1)[0].strip()
    if "[" in ident:
        ident = ident[: ident.index("[")]
    return ident


def parse_brackets(value: str, path: str | Path, line: int) -> list[tuple[str, str]]:
    """An ``Entity=`` / CoNLL-2012 coreference value -> [(kind, id)], kind in open/close/single,
    in reading order. ``|`` separators (CoNLL-2012) are allowed between brackets."""
    out: list[tuple[str, str]] = []
    i, n = 0, len(value)
    while i < n:
        if value[i] == "|":
            i += 1
            continue
        if value[i] == "(":
            j = i + 1
            while j < n and value[j] not in "()|":
                j += 1
            kind = "single" if j < n and value[j] == ")" else "open"
            body, i = value[i + 1 : j], j + (kind == "single")
        else:
            j = i
            while j < n and value[j] not in "()|":
                j += 1
            if j >= n or value[j] != ")":
                raise _fail(
                    path,
                    line,
                    f"cannot read coreference brackets {value!r} at {value[i:]!r}; expected (ID, ID) or (ID)",
                )
            kind, body, i = "close", value[i:j], j + 1
        ident = entity_id(body)
        if not ident:
            raise _fail(path, line, f"coreference bracket without an entity id in {value!r}")
        out.append((kind, ident))
    return out


class _Chains:
    """Opens and closes mentions of one document; closing pops the latest open of that id."""

    def __init__(self, path: str | Path) -> None:
        self.path = path
        self.open: dict[str, list[tuple[int, int]]] = {}
        self.spans: list[tuple[int, int, str, int]] = []  # (start, end incl, id, line)

    def feed(self, brackets: Iterable[tuple[str, str]], word: int, line: int) -> None:
        for kind, ident in brackets:
            if kind == "open":
                self.open.setdefault(ident, []).append((word, line))
            elif kind == "single":
                self.spans.append((word, word, ident, line))
            else:
                stack = self.open.get(ident)
                if not stack:
                    raise _fail(
                        self.path,
                        line,
                        f"closing bracket {ident}) has no open mention of entity "
                        f"{ident}; add the opening ({ident} or remove it",
                    )
                start, start_line = stack.pop()
                self.spans.append((start, word, ident, start_line))

    def finish(self) -> list[tuple[int, int, str, int]]:
        for ident, stack in self.open.items():
            if stack:
                _, line = stack[0]
                raise _fail(
                    self.path,
                    line,
                    f"mention of entity {ident} opened here is never closed; add the closing bracket {ident})",
                )
        return self.spans


def entity_value(misc: str) -> str | None:
    for item in misc.split("|"):
        if item.startswith("Entity="):
            return item[len("Entity=") :]
    return None


# ---------------------------------------------------------------- heads and the Doc


def tree_head(doc, start: int, end: int) -> int:
    """First word of ``start..end`` whose head is outside the span or which is a root."""
    for i in range(start, end + 1):
        h = doc[i].head.i
        if h == i or not start <= h <= end:
            return i
    return start  # unreachable for a tree: some word of every span leaves it


def attach_chains(doc, spans: Iterable[tuple[int, int, str, int]], heads: dict[tuple[int, int], int] | None = None):
    """Put mentions (start, end incl, chain, line) into ``doc`` as span groups + heads."""
    groups: dict[str, list] = {}
    head_of = doc.user_data.setdefault("coref_heads", {})
    lines = doc.user_data.setdefault("coref_lines", {})
    for start, end, chain, line in sorted(spans, key=lambda s: (s[0], s[1], s[2])):
        key = (start, end + 1)
        span = doc[start : end + 1]
        if any(s.start == span.start and s.end == span.end for s in groups.get(chain, [])):
            continue  # the same mention written twice
        groups.setdefault(chain, []).append(span)
        head_of[key] = heads[key] if heads is not None else tree_head(doc, start, end)
        lines.setdefault(key, line)
    for chain, group in groups.items():
        doc.spans[SPAN_PREFIX + chain] = group
    return doc


def mentions(doc) -> list[Mention]:
    """Every mention of a Doc built here, sorted by (start, end, chain)."""
    heads = doc.user_data.get("coref_heads", {})
    lines = doc.user_data.get("coref_lines", {})
    out = []
    for key, group in doc.spans.items():
        if not key.startswith(SPAN_PREFIX):
            continue
        chain = key[len(SPAN_PREFIX) :]
        for span in group:
            k = (span.start, span.end)
            out.append(Mention(span.start, span.end - 1, chain, heads[k], lines.get(k, 0)))
    return sorted(out)


def sentence_bounds(doc) -> list[tuple[int, int]]:
    """(first word, end exclusive) of every sentence."""
    return [(s.start, s.end) for s in doc.sents]


# ---------------------------------------------------------------- CoNLL-U


def conllu_doc(sentences: list[Sentence], vocab=None):
    """One document's sentences -> Doc with its Entity chains."""
    doc = to_doc(sentences, vocab)
    chains = _Chains(sentences[0].path)
    word = 0
    for s in sentences:
        for t in s.tokens:
            value = entity_value(t.misc)
            if value:
                chains.feed(parse_brackets(value, s.path, t.line), word, t.line)
            word += 1
    return attach_chains(doc, chains.finish())


def read_conllu_chains(path: str | Path, vocab=None) -> list:
    """Docs (one per ``# newdoc id`` document) of one CoNLL-U file."""
    return [conllu_doc(group, vocab) for group in by_document(read_conllu(path))]


# ---------------------------------------------------------------- CoNLL-2012

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
    chains: _Chains


def _conll12_docs(path: Path) -> Iterator[_Conll12Doc]:
    from depthprobe.probes.data.conllu import _lines

    cur: _Conll12Doc | None = None
    new_sentence = True
    for lineno, raw in enumerate(_lines(path), 1):
        line = raw.rstrip("\r")
        if line.startswith("#begin document"):
            if cur is not None:
                raise _fail(
                    path,
                    lineno,
                    f"#begin document inside document {cur.name!r} (line {cur.line}); add the missing #end document",
                )
            cur = _Conll12Doc(line[len("#begin document") :].strip(), lineno, [], [], [], _Chains(path))
            new_sentence = True
        elif line.startswith("#end document"):
            if cur is None:
                raise _fail(path, lineno, "#end document without #begin document")
            if cur.words:
                yield cur
            cur = None
        elif not line.strip():
            new_sentence = True
        elif line.startswith("#"):
            continue
        else:
            if cur is None:
                raise _fail(path, lineno, "token line outside #begin document ... #end document")
            cols = line.split()
            if len(cols) < 5:
                raise _fail(
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
        raise _fail(path, cur.line, f"document {cur.name!r} has no #end document; add it")


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


# ---------------------------------------------------------------- files and formats


def is_conll2012(path: Path) -> bool:
    return path.name.endswith(("_conll", ".conll")) or path.suffix == ".conll"


def chain_files(path: str | Path) -> list[Path]:
    """A CoNLL-U / CoNLL-2012 file, or those in a folder (sorted)."""
    p = Path(path)
    if not p.exists():
        raise ProbeError(f"data path {p} does not exist; check the path")
    if not p.is_dir():  # a file or a pipe
        return [p]
    files = sorted(f for f in p.iterdir() if f.is_file() and (f.suffix == ".conllu" or is_conll2012(f)))
    if not files:
        raise ProbeError(f"{p} holds no .conllu or *_conll files; point --data at a file or a folder of them")
    return files


def sniff(path: Path) -> str:
    """'conllu', 'conll2012' or 'gap' for one file (extension first, then the first line)."""
    if path.suffix == ".tsv":
        return "gap"
    if path.suffix == ".conllu":
        return "conllu"
    if is_conll2012(path):
        return "conll2012"
    from depthprobe.probes.data.text import read_input

    if path.is_file():
        try:
            with path.open(encoding="utf-8-sig", errors="replace") as fh:
                first = next((ln for ln in fh if ln.strip()), "")
        except OSError as exc:
            raise ProbeError(f"cannot read {path}: {exc.strerror}") from None
    else:  # a pipe: read once, kept for the reader
        text = read_input(path).decode("utf-8-sig", errors="replace")
        first = next((ln for ln in text.split("\n") if ln.strip()), "")
    if first.startswith("#begin document"):
        return "conll2012"
    if first.split("\t")[:3] == ["ID", "Text", "Pronoun"]:
        return "gap"
    return "conllu"


def read_chain_docs(path: str | Path, vocab=None, kind: str | None = None) -> list:
    """Every document of a CoNLL-U / CoNLL-2012 file or folder, as Docs with chains. ``kind``
    ('conllu' or 'conll2012') forces the reader; by default each file is sniffed."""
    from spacy.vocab import Vocab

    vocab = vocab or Vocab()
    docs = []
    for f in chain_files(path):
        fkind = kind or sniff(f)
        if fkind == "gap":
            raise ProbeError(f"{f} is GAP TSV; pass it on its own as --data (not mixed with chain files)")
        docs.extend(read_conll2012(f, vocab) if fkind == "conll2012" else read_conllu_chains(f, vocab))
    if not any(len(d) for d in docs):
        raise ProbeError(f"{path} contains no words; give CoNLL-U or CoNLL-2012 files with coreference")
    return docs


# ---------------------------------------------------------------- pronoun table (rule-based sieve)

# lower-cased form -> (Number, Gender, Person); "" = unknown / compatible with anything
PRONOUNS: dict[str, tuple[str, str, str]] = {
    **{w: ("Sing", "Masc", "3") for w in ("he", "him", "his", "himself")},
    **{w: ("Sing", "Fem", "3") for w in ("she", "her", "hers", "herself")},
    **{w: ("Sing", "Neut", "3") for w in ("it", "its", "itself")},
    **{w: ("Plur", "", "3") for w in ("they", "them", "their", "theirs", "themselves")},
    **{w: ("Sing", "", "1") for w in ("i", "me", "my", "mine", "myself")},
    **{w: ("Plur", "", "1") for w in ("we", "us", "our", "ours", "ourselves")},
    **{w: ("", "", "2") for w in ("you", "your", "yours")},
    "yourself": ("Sing", "", "2"),
    "yourselves": ("Plur", "", "2"),
    **{w: ("Sing", "", "3") for w in ("this", "that")},
    **{w: ("Plur", "", "3") for w in ("these", "those")},
}


# ---------------------------------------------------------------- GAP

GAP_COLUMNS = ["ID", "Text", "Pronoun", "Pronoun-offset", "A", "A-offset", "A-coref", "B", "B-offset", "B-coref", "URL"]
MASCULINE = frozenset({"he", "him", "his", "himself"})
FEMININE = frozenset({"she", "her", "hers", "herself"})


@dataclass(frozen=True)
class GapExample:
    id: str
    text: str
    pronoun: str
    pronoun_offset: int
    a: str
    a_offset: int
    a_coref: bool
    b: str
    b_offset: int
    b_coref: bool
    line: int
    path: str = ""

    @property
    def gender(self) -> str:
        p = self.pronoun.lower()
        return "masculine" if p in MASCULINE else "feminine" if p in FEMININE else "other"

    @property
    def answerable(self) -> bool:
        """Exactly one true candidate (A-coref xor B-coref)."""
        return self.a_coref != self.b_coref

    def spans(self) -> dict[str, tuple[int, int]]:
        """Character spans [start, end) of the pronoun and the two candidates."""
        return {
            "pronoun": (self.pronoun_offset, self.pronoun_offset + len(self.pronoun)),
            "A": (self.a_offset, self.a_offset + len(self.a)),
            "B": (self.b_offset, self.b_offset + len(self.b)),
        }


def _bool(path: Path, line: int, col: str, value: str) -> bool:
    v = value.strip().upper()
    if v not in ("TRUE", "FALSE"):
        raise _fail(path, line, f"{col} is {value!r}; expected TRUE or FALSE")
    return v == "TRUE"


def _offset(path: Path, line: int, text: str, col: str, name: str, value: str) -> int:
    try:
        off = int(value)
    except ValueError:
        raise _fail(path, line, f"{col} {value!r} is not an integer character offset") from None
    if not 0 <= off <= len(text) - len(name):
        raise _fail(path, line, f"{col} {off} is outside the text ({len(text)} characters)")
    if text[off : off + len(name)] != name:
        found = text[off : off + len(name)]
        raise _fail(
            path,
            line,
            f"{col} {off} does not point at {name!r} (the text there reads {found!r}); fix the offset or the name",
        )
    return off


def read_gap(path: str | Path) -> list[GapExample]:
    """Every row of a GAP TSV file, validated (file:line errors)."""
    from depthprobe.probes.data.conllu import _lines

    path = Path(path)
    lines = _lines(path)
    header = lines[0].rstrip("\r").split("\t") if lines else []
    if header[:10] != GAP_COLUMNS[:10]:
        raise _fail(path, 1, "not a GAP header; expected the columns " + " ".join(GAP_COLUMNS))
    out = []
    for lineno, raw in enumerate(lines[1:], 2):
        line = raw.rstrip("\r")
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) < 10:
            raise _fail(path, lineno, f"expected {len(GAP_COLUMNS)} tab-separated columns, found {len(cols)}")
        text = cols[1]
        out.append(
            GapExample(
                id=cols[0],
                text=text,
                pronoun=cols[2],
                pronoun_offset=_offset(path, lineno, text, "Pronoun-offset", cols[2], cols[3]),
                a=cols[4],
                a_offset=_offset(path, lineno, text, "A-offset", cols[4], cols[5]),
                a_coref=_bool(path, lineno, "A-coref", cols[6]),
                b=cols[7],
                b_offset=_offset(path, lineno, text, "B-offset", cols[7], cols[8]),
                b_coref=_bool(path, lineno, "B-coref", cols[9]),
                line=lineno,
                path=str(path),
            )
        )
    if not out:
        raise ProbeError(f"{path} has a GAP header but no rows; give a file with examples")
    return out
