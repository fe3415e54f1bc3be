"""The GAP TSV reader (Webster et al. 2018): pronoun, two candidate names, which one it refers to.

GAP TSV: header ``ID Text Pronoun Pronoun-offset A A-offset A-coref B B-offset B-coref URL``;
character offsets are checked against the names. Every problem is ``file:line: reason``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.data.coref_chains import fail

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
        raise fail(path, line, f"{col} is {value!r}; expected TRUE or FALSE")
    return v == "TRUE"


def _offset(path: Path, line: int, text: str, col: str, name: str, value: str) -> int:
    try:
        off = int(value)
    except ValueError:
        raise fail(path, line, f"{col} {value!r} is not an integer character offset") from None
    if not 0 <= off <= len(text) - len(name):
        raise fail(path, line, f"{col} {off} is outside the text ({len(text)} characters)")
    if text[off : off + len(name)] != name:
        found = text[off : off + len(name)]
        raise fail(
            path,
            line,
            f"{col} {off} does not point at {name!r} (the text there reads {found!r}); fix the offset or the name",
        )
    return off


def read_gap(path: str | Path) -> list[GapExample]:
    """Every row of a GAP TSV file, validated (file:line errors)."""
    from depthprobe.probes.data.text import all_lines

    path = Path(path)
    lines = all_lines(path)
    header = lines[0].rstrip("\r").split("\t") if lines else []
    if header[:10] != GAP_COLUMNS[:10]:
        raise fail(path, 1, "not a GAP header; expected the columns " + " ".join(GAP_COLUMNS))
    out = []
    for lineno, raw in enumerate(lines[1:], 2):
        line = raw.rstrip("\r")
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) < 10:
            raise fail(path, lineno, f"expected {len(GAP_COLUMNS)} tab-separated columns, found {len(cols)}")
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
