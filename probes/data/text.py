"""Plain-text inputs: one example per line."""

from __future__ import annotations

from pathlib import Path

from depthprobe.probes.engine.errors import ProbeError


def read_lines(path: Path) -> list[str]:
    """Non-empty lines of a UTF-8 text file; bad files fail with a one-line reason."""
    if path.is_dir():
        raise ProbeError(f"{path} is a directory; attention-stats reads one text file (one example per line)")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ProbeError(f"{path}: not UTF-8 text (byte {exc.start}); re-save the file as UTF-8") from None
    except OSError as exc:
        raise ProbeError(f"cannot read {path}: {exc.strerror}") from None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ProbeError(f"{path} is empty; give a text file with one example per line")
    return lines
