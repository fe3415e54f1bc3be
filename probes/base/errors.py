"""User-facing errors: one line that names the fix, exit code 2, no traceback."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ProbeError(Exception):
    """Bad input from the user. The message is one line and says how to fix it."""

    exit_code = 2


class MembersFailed(ProbeError):
    """Members of a sweep or study failed (a member process killed, out of memory, its own
    error) after the input was accepted: exit code 3, as ``probe study`` with failed members."""

    exit_code = 3


class Diverged(ProbeError):
    """Training whose loss (or weights) went NaN or infinite: a run that failed, exit code 3 (as for
    failed study members); the message names the step and the rate to lower."""

    exit_code = 3


def suggest(name: str, choices: Iterable[str]) -> str:
    """' (did you mean X?)' for the closest choices, or '' when nothing is close."""
    close = difflib.get_close_matches(name, list(choices), n=3, cutoff=0.5)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"


def unknown(kind: str, name: str, choices: Iterable[str]) -> ProbeError:
    choices = sorted(choices)
    return ProbeError(f"unknown {kind} {name!r}{suggest(name, choices)}; choose from: {', '.join(choices)}")
