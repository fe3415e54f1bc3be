"""Reading input text: the one place that opens data files for the readers.

Every reader (plain lines, CoNLL-U, CoNLL-2012, GAP, raw text for a parser) goes through
:func:`read_input` (a regular file is read whole; a pipe such as ``-d <(cat file)`` is read once
and kept, capped at ``MAX_STREAM``; devices are refused) and :func:`read_text` (UTF-8, a byte-order
mark accepted, a decoding error reported as ``file:line``).
"""

from __future__ import annotations

from pathlib import Path

from depthprobe.probes.base.errors import ProbeError

MAX_STREAM = 1 << 30  # bytes kept from a pipe (-d <(...)); regular files are read whole
_STREAMS: dict[tuple[str, int, int], bytes] = {}


def read_input(path: Path) -> bytes:
    """The bytes of an input file. A pipe (``-d <(cat file)``) is read once and kept, so that
    format detection and the reader see the same bytes; devices are refused."""
    import stat

    try:
        st = path.stat()
        if stat.S_ISREG(st.st_mode):
            return path.read_bytes()
        if not stat.S_ISFIFO(st.st_mode):
            raise ProbeError(f"{path} is not a regular file (a device or socket); give a file")
        key = (str(path), st.st_dev, st.st_ino)  # this pipe, not a later one under the same /dev/fd name
        if key not in _STREAMS:
            with path.open("rb") as fh:
                data = fh.read(MAX_STREAM + 1)
            if len(data) > MAX_STREAM:
                raise ProbeError(f"{path} is a stream longer than {MAX_STREAM >> 30} GiB; save it to a file first")
            while len(_STREAMS) >= 4:  # keep only the pipes of the current run
                _STREAMS.pop(next(iter(_STREAMS)))
            _STREAMS[key] = data
        return _STREAMS[key]
    except OSError as exc:
        raise ProbeError(f"cannot read {path}: {exc.strerror}") from None


def read_text(path: Path) -> str:
    """The input decoded as UTF-8 (a leading byte-order mark dropped); bad bytes name file:line."""
    if path.is_dir():
        raise ProbeError(f"{path} is a directory; give one file")
    raw = read_input(path)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ProbeError(f"{path}:{line}: not valid UTF-8; re-save the file as UTF-8") from None


def all_lines(path: Path) -> list[str]:
    """Every line of the input, blank ones included (split on ``\\n``), decoded as :func:`read_text` decodes it."""
    return read_text(path).split("\n")


def nonempty_lines(path: Path, what: str) -> list[str]:
    """Stripped non-empty lines; ``what`` says what a line is, for the directory and empty-file errors."""
    if path.is_dir():
        raise ProbeError(f"{path} is a directory; give one UTF-8 text file ({what} per line)")
    lines = [ln.strip() for ln in read_text(path).splitlines() if ln.strip()]
    if not lines:
        raise ProbeError(f"{path} is empty; give a text file with {what} per line")
    return lines


def read_lines(path: Path) -> list[str]:
    """Non-empty lines of a UTF-8 text file, one example per line."""
    return nonempty_lines(Path(path), "one example")
