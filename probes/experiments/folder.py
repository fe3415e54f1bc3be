"""The study folder, the same for every family: its rules and its member folders.

::

    OUT/study.json        family, preset, the resolved config, the plan's member names, what the
                          family records (a corpus's digest); a rerun must match them
    OUT/members.csv       one row per member that has run (ok or failed with its one-line error)
    OUT/<table>.csv       the family's study tables (Experiment.tables)
    OUT/plan.csv          --dry-run: one row per member with its estimated cost
    OUT/report.html       the offline report
    OUT/members/<name>/   member.json (its row and the SHA-256 of every other file) and its files

A finished member is kept by a rerun when every file its ``member.json`` lists is there with its
digest; a damaged one is trained again, a failed one run again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from depthprobe.probes.base import artifacts
from depthprobe.probes.base.errors import ProbeError

if TYPE_CHECKING:
    import pandas as pd

STUDY_JSON = "study.json"
MEMBERS_CSV = "members.csv"
PLAN_CSV = "plan.csv"
MEMBERS = "members"
MEMBER_JSON = "member.json"
REPORT = "report.html"
LOCK = ".study.lock"  # the pid of the run that holds the folder


@dataclass(frozen=True)
class MemberOutput:
    """What one member returns: its row (``members.csv``) and its files (path inside
    ``members/<name>/`` -> bytes; empty when the member wrote ``job.dest`` itself)."""

    row: dict[str, Any]
    files: dict[str, bytes]


@contextlib.contextmanager
def locked(folder: Path) -> Iterator[None]:
    """Hold the study folder for this run: an exclusive ``flock`` on ``OUT/.study.lock`` (which
    holds this run's pid for the message), dropped by the kernel when the process ends, however it
    ends, so a killed run leaves no lock behind. A folder held by another run is refused (two runs
    on one folder would overwrite each other's members). A folder this run created and left
    holding nothing but its lock is removed again.

    The lock is never followed anywhere: it is opened with ``O_NOFOLLOW`` inside the folder, and an
    existing one is used only when it is what a run of this program leaves (:func:`lock_problem`:
    a regular file of this user with one link, holding a pid), so a ``.study.lock`` planted in a
    shared folder (a symlink, a hard link, a FIFO, a folder) cannot aim a run at another file: it
    is refused with one line and left as it is. Folder, lock and disk failures (a folder that
    cannot be written, ``ENOLCK``, a full disk) are one line each, with nothing left behind."""
    created = not os.path.lexists(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = open_lock(folder)
    except BaseException as exc:
        if created:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty: this run created it and wrote nothing there
        if isinstance(exc, OSError):
            raise disk_error(folder, exc) from None
        raise
    try:
        yield
    finally:
        (folder / LOCK).unlink(missing_ok=True)
        os.close(fd)
        if created:
            with contextlib.suppress(OSError):
                folder.rmdir()


def lock_problem(path: Path, st: os.stat_result) -> str | None:
    """Why an existing ``.study.lock`` is not one this program left (None: it is)."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file (a folder, FIFO or device)"
    if st.st_nlink != 1:
        return f"has {st.st_nlink} hard links"
    if st.st_uid != os.geteuid():
        return f"belongs to another user (uid {st.st_uid})"
    text = path.read_bytes()[:64].strip() if st.st_size <= 32 else b"-"
    return None if not text or text.isdigit() else "holds something other than a pid"


def open_lock(folder: Path) -> int:
    """Take the lock (its descriptor, this run's pid written in it); a lock this run created is
    removed again when taking it fails."""
    import fcntl

    path = folder / LOCK
    try:
        why = lock_problem(path, os.lstat(path))
    except FileNotFoundError:
        why, made = None, True
    else:
        made = False
    if why is not None:
        raise ProbeError(
            f"--out {folder}: {path.name} {why}, not a lock this program left; it was not touched: remove it "
            "if it is yours, or pass another --out"
        )
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or os.fstat(fd).st_nlink != 1:  # swapped since lstat
            raise ProbeError(f"--out {folder}: {path.name} changed while it was opened; pass another --out")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.lstat(path).st_ino != os.fstat(fd).st_ino:  # its holder removed it meanwhile
                raise BlockingIOError
        except (BlockingIOError, FileNotFoundError):
            made = False  # another run's
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise ProbeError(
                f"--out {folder} is in use by another probe study (pid {pid}); wait for it to finish, or pass "
                "another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        if made:
            path.unlink(missing_ok=True)
        raise
    return fd


def disk_error(folder: Path, exc: OSError) -> ProbeError:
    """One line for a folder, lock or disk failure under ``--out`` (``exc``: what the system said)."""
    code = exc.errno
    if code in (errno.ENOSPC, errno.EDQUOT):
        why = "the disk holding it is full (no space left)"
        fix = "free space there and rerun the same command (finished members are kept), or pass another --out"
    elif code == errno.ENOLCK:
        why = f"its file system cannot lock files (ENOLCK: {LOCK}; NFS without a lock daemon)"
        fix = "pass an --out on a local disk"
    elif code in (errno.EACCES, errno.EPERM, errno.EROFS):
        why = f"it cannot be written ({exc.strerror})"
        fix = "pass another --out"
    elif code in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
        why = f"{LOCK} is not a regular file ({exc.strerror})"
        fix = "remove it if it is yours, or pass another --out"
    else:
        why = f"{exc.strerror or type(exc).__name__}"
        fix = "pass another --out"
    return ProbeError(f"--out {folder}: {why}; {fix}")


@contextlib.contextmanager
def disk_errors(folder: Path) -> Iterator[None]:
    """A disk that fills (or turns read-only) while the study writes: one line (:func:`disk_error`)."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            raise
        raise disk_error(folder, exc) from None


def forget_new_study(folder: Path) -> None:
    """Undo :func:`open_study`'s new study.json when no member has started (a Ray cluster refused
    the run at join time): a refusal leaves nothing half-written."""
    members = folder / MEMBERS
    if members.is_dir() and any(members.iterdir()):
        return
    if members.is_dir():
        members.rmdir()
    (folder / STUDY_JSON).unlink(missing_ok=True)


def check_folder(folder: Path, family: str, config: Any, resumable: tuple[str, ...]) -> dict[str, Any] | None:
    """Check ``--out`` before any work: a new folder that can be written (None), or an existing
    study of the same family and settings (its study.json)."""
    meta = folder / STUDY_JSON
    if folder.exists() and not folder.is_dir():
        raise ProbeError(f"--out {folder} is a file, not a folder; choose another --out")
    if folder.is_dir():
        artifacts.check_out(folder, "--out", may_exist=True)  # a study to continue must take files
    if not meta.exists():
        if folder.exists() and any(p.name not in (PLAN_CSV, LOCK) for p in folder.iterdir()):  # a dry run's plan
            raise ProbeError(f"--out {folder} exists and holds no study ({STUDY_JSON}); pass a new --out")
        artifacts.check_out(folder, "--out", may_exist=True)
        return None
    saved = saved_study(meta)
    if saved.get("family") != family:
        raise ProbeError(f"{folder} holds a {saved.get('family')} study, not {family}; pass a new --out")
    old = dict(saved["config"])
    defaults = {f.name: f.default for f in dataclasses.fields(config)}  # settings added since it ran
    now = dataclasses.asdict(config)
    clash = [k for k, v in now.items() if k not in resumable and _norm(old.get(k, defaults.get(k))) != _norm(v)]
    if clash:
        what = ", ".join(f"{k} {old.get(k)!r} (now {now[k]!r})" for k in clash[:3])
        raise ProbeError(
            f"{folder} holds another study ({what}); rerun with the same options to continue it, or pass a new --out"
        )
    return saved


def saved_study(meta: Path) -> dict[str, Any]:
    try:
        saved = dict(json.loads(meta.read_text()))
        dict(saved["config"])
        return saved
    except (OSError, ValueError, KeyError, TypeError):
        raise ProbeError(f"{meta} is unreadable; pass a new --out (or remove that folder)") from None


def _norm(v: Any) -> Any:
    return list(v) if isinstance(v, tuple | list) else v


def write_study_json(folder: Path, payload: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    artifacts.replace_file(folder / STUDY_JSON, lambda p: artifacts.write_json(p, payload))


def member_json(folder: Path, name: str) -> dict[str, Any] | None:
    try:
        meta = json.loads((folder / MEMBERS / name / MEMBER_JSON).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def finished_members(folder: Path) -> tuple[set[str], dict[str, str]]:
    """The finished (ok) members whose files are intact, and the damaged ones with what is wrong
    (hidden folders are members being written)."""
    done: set[str] = set()
    damaged: dict[str, str] = {}
    for member in sorted((folder / MEMBERS).glob("[!.]*")):
        meta = member_json(folder, member.name)
        if meta is None or meta.get("row", {}).get("status") != "ok":
            continue
        why = member_damage(member, meta)
        if why is None:
            done.add(member.name)
        else:
            damaged[member.name] = why
    return done, damaged


def member_damage(member: Path, meta: dict[str, Any]) -> str | None:
    """What is wrong with a finished member's files (None: nothing): each file its member.json
    lists must be there with its SHA-256."""
    files = meta.get("files")
    if not isinstance(files, dict):
        return f"its {MEMBER_JSON} lists no files"
    for rel, digest in files.items():
        path = member / rel
        if not path.is_file():
            return f"{rel} is missing"
        if hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            return f"{rel} is not the file the member wrote"
    return None


def measure_member(
    job: Any, row: dict[str, Any], measure: Callable[[Path, dict[str, Any]], dict[str, Any]], t0: float | None = None
) -> MemberOutput:
    """Run ``measure(folder, row)`` (a family's ``measure`` of ``job``, or a batched member's
    finish) in the member's folder: with ``job.dest`` (the local backend) that folder itself,
    written atomically (a failed attempt's record replaced); without (a Ray task) a temporary
    folder whose files come back as bytes. ``row`` starts as the member's ``base_row`` and ends
    ``ok`` with its wall seconds (since ``t0``: its batch's start, or now). The one digest writer:
    ``member.json`` holds the row, the entries ``measure`` returned and the SHA-256 of every other
    file."""
    start = time.perf_counter() if t0 is None else t0
    with contextlib.ExitStack() as stack:
        if job.dest is None:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="depthprobe-member-")))
        else:
            folder = stack.enter_context(replaced(Path(job.dest)))
        extra = measure(folder, row)
        row.update(status="ok", error="", wall_s=time.perf_counter() - start)
        artifacts.write_json(folder / MEMBER_JSON, {"row": row, **extra, "files": artifacts.file_digests(folder)})
        paths = sorted(folder.rglob("*")) if job.dest is None else []
        files = {str(p.relative_to(folder)): p.read_bytes() for p in paths if p.is_file()}
    return MemberOutput(row=row, files=files)


def replaced(final: Path) -> contextlib.AbstractContextManager[Path]:
    """A member folder written whole (:func:`artifacts.atomic_dir`), replacing a failed attempt's record."""
    if final.exists():
        shutil.rmtree(final)
    return artifacts.atomic_dir(final)


MAX_NAME = 200  # characters of a member's name (file systems allow 255 bytes per folder name)


def member_name_problem(name: Any) -> str | None:
    """Why ``name`` cannot be a member's folder under ``members/`` (None: it can)."""
    if not isinstance(name, str) or not name:
        return "is not a non-empty string"
    if "/" in name or "\\" in name or name.startswith("."):
        return "is not a plain folder name (no / or \\, no leading dot); the member would leave members/"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "holds a control character"
    if len(name) > MAX_NAME:
        return f"is longer than {MAX_NAME} characters"
    return None


def member_folder(folder: Path, name: Any) -> Path:
    """``folder/members/<name>``, never anywhere else (the plan's names were checked up front;
    a row that names another member is refused here too)."""
    why = member_name_problem(name)
    if why is not None:
        raise ProbeError(f"member name {name!r} {why}")
    return folder / MEMBERS / name


def write_member(folder: Path, output: MemberOutput) -> None:
    """A finished member's folder from its files as bytes."""
    with replaced(member_folder(folder, output.row["member"])) as tmp:
        for rel, data in output.files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(data)


def write_failed(folder: Path, row: dict[str, Any], error: str, device: Any) -> None:
    row = {**row, "status": "failed", "error": " ".join(error.split()), "device": str(device or "auto")}
    with replaced(member_folder(folder, row["member"])) as tmp:
        artifacts.write_json(tmp / MEMBER_JSON, {"row": row})


def read_members(folder: Path, columns: list[str]) -> pd.DataFrame:
    """members.csv's rows: one per member that has run, in plan order."""
    import pandas as pd

    meta = json.loads((folder / STUDY_JSON).read_text())
    rows = [m["row"] for name in meta["members"] if (m := member_json(folder, name)) is not None]
    return pd.DataFrame(rows, columns=columns)


def write_table(folder: Path, name: str, table: pd.DataFrame) -> None:
    artifacts.replace_file(folder / name, lambda p: artifacts.write_csv(p, table))


def gather(folder: Path, members: pd.DataFrame, name: str) -> pd.DataFrame:
    """One table of the finished members (``members/<m>/<name>``), in plan order."""
    import pandas as pd

    paths = [folder / MEMBERS / m / name for m in members.loc[members.status == "ok", "member"]]
    parts = [t for p in paths if p.is_file() and not (t := pd.read_csv(p)).empty]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def left_behind(folder: Path) -> str:
    """What an interrupted study leaves, as it is on disk."""
    if not (folder / STUDY_JSON).exists():
        return "nothing was written"
    done, _ = finished_members(folder)
    return f"finished members are kept in {folder} ({len(done)} so far): rerun the same command to continue"
