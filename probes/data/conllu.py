"""CoNLL-U reading and validation, and conversion to spaCy ``Doc``s.

Multiword-token ranges (``3-4``) and empty nodes (``8.1``) are skipped: the words are the
integer-ID lines. Every problem is reported as ``file:line: what is wrong`` before any model
runs. Sentence ids (``# sent_id``) and document ids (``# newdoc id``) are kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.data.text import all_lines


@dataclass(frozen=True)
class Token:
    id: int  # 1-based position in the sentence
    form: str
    lemma: str
    upos: str
    xpos: str
    feats: str
    head: int  # 0 = root
    deprel: str
    misc: str
    line: int  # line number in the file (1-based)


@dataclass(frozen=True)
class Sentence:
    tokens: tuple[Token, ...]
    sent_id: str
    doc_id: str | None
    path: str
    line: int  # line of the first token

    @property
    def words(self) -> list[str]:
        return [t.form for t in self.tokens]

    def __len__(self) -> int:
        return len(self.tokens)


def _fail(path: Path, line: int, what: str) -> ProbeError:
    return ProbeError(f"{path}:{line}: {what}")


def _check_tree(path: Path, tokens: list[Token]) -> None:
    n = len(tokens)
    for t in tokens:
        if not 0 <= t.head <= n:
            raise _fail(path, t.line, f"HEAD {t.head} points outside the sentence of {n} words")
        if t.head == t.id:
            raise _fail(path, t.line, f"word {t.id} is its own head")
    for t in tokens:  # every word must reach the root without revisiting a word
        seen, cur = set(), t
        while cur.head != 0:
            if cur.id in seen:
                raise _fail(path, t.line, f"the heads of word {t.id} form a cycle (via word {cur.id})")
            seen.add(cur.id)
            cur = tokens[cur.head - 1]
    if not any(t.head == 0 for t in tokens):
        raise _fail(path, tokens[0].line, "sentence has no root (no word with HEAD 0)")


def _token(path: Path, lineno: int, cols: list[str], expected_id: int) -> Token:
    try:
        tid = int(cols[0])
    except ValueError:
        raise _fail(path, lineno, f"ID {cols[0]!r} is not an integer, range or decimal") from None
    if tid != expected_id:
        raise _fail(path, lineno, f"word ID {tid} out of order (expected {expected_id})")
    if not cols[1]:
        raise _fail(path, lineno, "FORM (column 2) is empty; write the word there (or _ for an unknown word)")
    try:
        head = int(cols[6])
    except ValueError:
        raise _fail(path, lineno, f"HEAD {cols[6]!r} is not an integer") from None
    return Token(tid, cols[1], cols[2], cols[3], cols[4], cols[5], head, cols[7], cols[9], lineno)


def read_conllu(path: str | Path) -> list[Sentence]:
    """All sentences of one CoNLL-U file, validated."""
    path = Path(path)
    sentences: list[Sentence] = []
    tokens: list[Token] = []
    sent_id, doc_id, start = None, None, 0

    def close() -> None:
        nonlocal tokens, sent_id
        if tokens:
            _check_tree(path, tokens)
            sid = sent_id or f"{path.stem}-{len(sentences) + 1}"
            sentences.append(Sentence(tuple(tokens), sid, doc_id, str(path), start))
        tokens, sent_id = [], None

    for lineno, line in enumerate(all_lines(path), 1):
        line = line.rstrip("\r")
        if not line.strip():
            close()
            continue
        if line.startswith("#"):
            key, _, value = line[1:].partition("=")
            key = key.strip()
            if key == "sent_id":
                sent_id = value.strip()
            elif key in ("newdoc id", "newdoc"):
                close()
                doc_id = value.strip() or f"{path.stem}-doc{len(sentences)}"
            continue
        cols = line.split("\t")
        if len(cols) != 10:
            raise _fail(path, lineno, f"expected 10 tab-separated columns, found {len(cols)}")
        if "-" in cols[0] or "." in cols[0]:
            continue  # multiword-token range or empty node
        if not tokens:
            start = lineno
        tokens.append(_token(path, lineno, cols, len(tokens) + 1))
    close()
    return sentences


def conllu_files(path: str | Path, suffixes: Iterable[str] = (".conllu",)) -> list[Path]:
    """A file, or the matching files of a folder (sorted)."""
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file() and f.suffix in tuple(suffixes))
        if not files:
            raise ProbeError(f"{p} holds no {'/'.join(suffixes)} files; point --data at a file or a folder of them")
        return files
    if not p.exists():
        raise ProbeError(f"data path {p} does not exist; check the path")
    return [p]


def read_treebank(path: str | Path) -> list[Sentence]:
    """Every sentence of a CoNLL-U file or folder; empty input is an error."""
    out: list[Sentence] = []
    for f in conllu_files(path):
        out.extend(read_conllu(f))
    if not out:
        raise ProbeError(f"{path} contains no sentences; give a CoNLL-U file with at least one sentence")
    return out


def by_document(sentences: Iterable[Sentence]) -> Iterator[list[Sentence]]:
    """Group consecutive sentences by (file, document id)."""
    group: list[Sentence] = []
    for s in sentences:
        if group and (s.path, s.doc_id) != (group[-1].path, group[-1].doc_id):
            yield group
            group = []
        group.append(s)
    if group:
        yield group


_UPOS = {
    "ADJ",
    "ADP",
    "ADV",
    "AUX",
    "CCONJ",
    "DET",
    "INTJ",
    "NOUN",
    "NUM",
    "PART",
    "PRON",
    "PROPN",
    "PUNCT",
    "SCONJ",
    "SYM",
    "VERB",
    "X",
}


def to_doc(sentences: list[Sentence], vocab=None):
    """Sentences (usually one document) -> a spaCy Doc with heads, deps, POS, tags, morphology,
    lemmas and sentence boundaries. ``doc.user_data`` keeps sentence ids and source lines."""
    from spacy.tokens import Doc
    from spacy.vocab import Vocab

    words: list[str] = []
    spaces: list[bool] = []
    heads: list[int] = []
    deps: list[str] = []
    pos: list[str] = []
    tags: list[str] = []
    morphs: list[str] = []
    lemmas: list[str] = []
    starts: list[bool | int | None] = []
    for s in sentences:
        base = len(words)
        for t in s.tokens:
            words.append(t.form)
            spaces.append("SpaceAfter=No" not in t.misc.split("|"))
            heads.append(base + (t.head - 1 if t.head else t.id - 1))
            deps.append(t.deprel if t.deprel != "_" else "dep")
            pos.append(t.upos if t.upos in _UPOS else "X")
            tags.append(t.xpos if t.xpos != "_" else "")
            morphs.append(t.feats if t.feats != "_" else "")
            lemmas.append(t.lemma if t.lemma != "_" else t.form)
            starts.append(t.id == 1)
    doc = Doc(
        vocab or Vocab(),
        words=words,
        spaces=spaces,
        heads=heads,
        deps=deps,
        pos=pos,
        tags=tags,
        morphs=morphs,
        lemmas=lemmas,
        sent_starts=starts,
    )
    doc.user_data["sent_ids"] = [s.sent_id for s in sentences]
    doc.user_data["doc_id"] = sentences[0].doc_id if sentences else None
    doc.user_data["source"] = sentences[0].path if sentences else None
    return doc
