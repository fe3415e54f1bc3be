"""Raw text -> dependency-parsed spaCy ``Doc``s, with an installed spaCy pipeline.

A pipeline is named like ``en_core_web_sm`` (an installed package) or given as the path of a
pipeline directory (what ``nlp.to_disk`` writes: ``config.cfg``, ``meta.json``, component folders).
It must have a dependency parser. Input: a UTF-8 text file, one paragraph per non-empty line;
the pipeline splits each line into sentences.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.data.text import nonempty_lines


def text_lines(path: str | Path) -> list[str]:
    """Non-empty lines of a UTF-8 text file (stripped); a bad file fails with a one-line reason."""
    return nonempty_lines(Path(path), "one paragraph")


def _looks_like_path(name: str) -> bool:
    return "/" in name or "\\" in name or name.startswith((".", "~"))


def load_pipeline(name: str):
    """An installed spaCy pipeline (package name or directory) that has a dependency parser."""
    import spacy

    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.cfg").exists():
            raise ProbeError(
                f"{name} is a directory but not a spaCy pipeline (no config.cfg); "
                "point --parser at a folder written by nlp.to_disk, or name an installed pipeline"
            )
        target: str | Path = path
    elif _looks_like_path(name) or path.exists():
        raise ProbeError(
            f"spaCy pipeline directory {name} does not exist; check the path, "
            "or name an installed pipeline such as en_core_web_sm"
        )
    else:
        target = name
    try:
        nlp = spacy.load(target)
    except OSError as exc:
        if target is name and "E050" in str(exc):
            raise ProbeError(
                f"spaCy pipeline {name!r} is not installed; install it with "
                f"`python -m spacy download {name}` (or pass a pipeline directory to --parser)"
            ) from None
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ProbeError(f"cannot load spaCy pipeline {name!r}: {first}") from None
    if "parser" not in nlp.pipe_names:
        raise ProbeError(
            f"spaCy pipeline {name!r} has no dependency parser (components: "
            f"{', '.join(nlp.pipe_names) or 'none'}); use one with a parser, e.g. en_core_web_sm"
        )
    return nlp


def parse_text(path: str | Path, parser: str, batch_size: int = 64) -> Iterator:
    """Parse every non-empty line of a text file; yields one Doc per line."""
    lines = text_lines(path)  # bad input fails before the pipeline is loaded
    nlp = load_pipeline(parser)
    for doc in nlp.pipe(lines, batch_size=batch_size):
        doc.user_data["source"] = str(path)
        doc.user_data["parser"] = parser
        yield doc
