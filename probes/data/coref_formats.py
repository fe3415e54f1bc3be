"""Coreference files and formats: which reader a file needs, and every chain document of a path.

Format detection: ``.tsv`` or a header starting ``ID Text Pronoun`` is GAP; ``.conllu`` is
CoNLL-U; names ending ``_conll``/``.conll`` or a first line ``#begin document`` are CoNLL-2012;
anything else is read as CoNLL-U. :func:`read_chain_docs` reads a CoNLL-U / CoNLL-2012 file or
folder with :mod:`.coref_chains` and :mod:`.conll2012`; GAP is read by :mod:`.gap`.
"""

from __future__ import annotations

from pathlib import Path

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.data.conll2012 import read_conll2012
from depthprobe.probes.data.coref_chains import read_conllu_chains


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
