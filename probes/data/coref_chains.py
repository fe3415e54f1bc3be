"""Coreference chains on spaCy ``Doc``s, and the ``Entity=`` bracket syntax with its CoNLL-U reader.

Chains become spaCy ``Doc``s: every chain is a span group ``doc.spans["coref_<id>"]`` and the
head word of every mention is kept in ``doc.user_data["coref_heads"][(start, end)]`` (``end``
exclusive, as in spaCy spans). :func:`mentions` reads them back as :class:`Mention`s. The
bracket parser and :class:`Chains` serve the CoNLL-2012 reader too (:mod:`.conll2012`); the
pronoun table serves its morphology and the rule-based baseline.

CoNLL-U (OntoGUM, UD 2.x coreference releases): the ``Entity=`` value of the MISC column holds
brackets read left to right: ``(1`` opens a mention of entity 1, ``1)`` closes the most
recently opened mention of entity 1, ``(1)`` is a one-word mention. CorefUD-style brackets
(``(e12-person-1-...``) use the part before the first ``-`` as the id (``e12``); a
discontinuous-part suffix ``[1/2]`` is dropped, each part becomes its own mention. Chain ids
are per document (``# newdoc id``; a file without one is one document). Entity brackets on
multiword-token range lines and empty nodes are ignored (they are skipped as words).
Head word = the first word of the span whose UD head lies outside the span (or is the root).
"""

from __future__ import annotations

from collections.abc import Iterable
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


def fail(path: str | Path, line: int, what: str) -> ProbeError:
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
                raise fail(
                    path,
                    line,
                    f"cannot read coreference brackets {value!r} at {value[i:]!r}; expected (ID, ID) or (ID)",
                )
            kind, body, i = "close", value[i:j], j + 1
        ident = entity_id(body)
        if not ident:
            raise fail(path, line, f"coreference bracket without an entity id in {value!r}")
        out.append((kind, ident))
    return out


class Chains:
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
                    raise fail(
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
                raise fail(
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
    chains = Chains(sentences[0].path)
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
