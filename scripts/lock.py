"""Write the lock (constraints.txt) from ``pip freeze``, or say how a freeze differs from it.

    pip freeze --exclude-editable | python scripts/lock.py write constraints.txt   (make lock)
    pip freeze --exclude-editable | python scripts/lock.py diff constraints.txt    (make upgrade-check)

The lock is a pip constraints file: ``name==version`` for every package of an environment the test
suite passed in. Local version labels are dropped (``torch==2.13.0+cpu`` is written
``torch==2.13.0``): which build of torch to install is the Makefile's TORCH (the CPU one by
default), and ``torch==2.13.0`` admits the CPU build and the CUDA build of that version alike.
A package installed from a URL or a folder cannot be pinned for another machine: it is refused.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;+]+)(\+[^\s;]+)?$")
HEADER = """\
# The lock: the version of every package of an environment the test suite passed in (Python {python}).
# make install, make wheel-check and so .ci/run install with it (pip install -c constraints.txt);
# pyproject.toml keeps the ranges a user's own install resolves. Do not edit by hand: run
# `make upgrade-check` (the newest versions in the ranges, and the suite on them), then `make lock`.
"""


def parse(lines: list[str]) -> dict[str, str]:
    """name (lower case) -> version, from ``pip freeze`` or lock lines; comments and blanks skipped."""
    pins, bad = {}, []
    for line in (raw.strip() for raw in lines):
        if not line or line.startswith("#"):
            continue
        m = PIN.match(line)
        if m is None:
            bad.append(line)
            continue
        pins[m.group(1).lower().replace("_", "-")] = f"{m.group(1)}=={m.group(2)}"
    if bad:
        sys.exit("lock: cannot pin for another machine (installed from a URL or a folder?): " + "; ".join(bad))
    return pins


def write(path: Path, frozen: dict[str, str], python: str) -> None:
    path.write_text(HEADER.format(python=python) + "".join(f"{pin}\n" for pin in frozen.values()), encoding="utf-8")
    print(f"lock: wrote {len(frozen)} pins to {path}")


def diff(path: Path, frozen: dict[str, str]) -> None:
    locked = parse(path.read_text(encoding="utf-8").splitlines()) if path.exists() else {}
    moved = [
        f"  {name}: {locked.get(name, '(not locked)').split('==')[-1]} -> {frozen.get(name, '(gone)').split('==')[-1]}"
        for name in sorted(set(locked) | set(frozen))
        if locked.get(name) != frozen.get(name)
    ]
    if moved:
        print(f"lock: {len(moved)} package(s) differ from {path} (locked -> newest in the ranges):", *moved, sep="\n")
    else:
        print(f"lock: the newest versions in the ranges are the locked ones ({len(frozen)} packages)")


def main(argv: list[str]) -> None:
    if len(argv) != 3 or argv[1] not in ("write", "diff"):
        sys.exit("usage: pip freeze --exclude-editable | python scripts/lock.py write|diff constraints.txt")
    frozen = parse(sys.stdin.read().splitlines())
    if argv[1] == "write":
        write(Path(argv[2]), frozen, ".".join(map(str, sys.version_info[:2])))
    else:
        diff(Path(argv[2]), frozen)


if __name__ == "__main__":
    main(sys.argv)
