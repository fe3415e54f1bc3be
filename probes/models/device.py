"""Where and how big a model may be: ``--dtype`` and ``--device`` resolution, and the size check
(``--max-params`` within :func:`size_limit`, and the memory free on the device) that refuses a model
before it is built."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from depthprobe.probes.base.errors import ProbeError, suggest

if TYPE_CHECKING:
    from depthprobe.probes.models.model import NativeConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(name: str | torch.dtype | None) -> torch.dtype:
    """``--dtype`` by name (float32, bfloat16, float16); None means float32."""
    if name is None:
        return torch.float32
    if isinstance(name, torch.dtype):
        if name not in DTYPES.values():
            raise ProbeError(f"dtype {name} is not supported; use one of {', '.join(DTYPES)}")
        return name
    key = str(name).strip().lower().removeprefix("torch.")
    if key not in DTYPES:
        raise ProbeError(f"unknown --dtype {name!r}; use one of {', '.join(DTYPES)}{suggest(key, list(DTYPES))}")
    return DTYPES[key]


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ProbeError(f"bad --device {device!r}; use cpu, cuda, cuda:N or auto") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ProbeError(f"--device {device} asked for CUDA, but no GPU is visible; use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ProbeError(f"--device {device}: only {torch.cuda.device_count()} GPU(s) visible")
    if dev.type == "mps" and not _mps_available():
        raise ProbeError(
            f"--device {device}: this PyTorch build has no MPS (Apple GPU) support; "
            f"available devices: {', '.join(available_devices())}"
        )
    if dev.type not in ("cpu", "cuda", "mps"):
        raise ProbeError(f"bad --device {device!r}; available devices: {', '.join(available_devices())}")
    return dev


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def available_devices() -> list[str]:
    """What --device accepts on this machine (auto always)."""
    found = ["cpu"]
    if torch.cuda.is_available():
        found += ["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if _mps_available():
        found.append("mps")
    return [*found, "auto"]


# ----------------------------------------------------------------------------- size check

_MAX_PARAMS: ContextVar[int | None] = ContextVar("max_params", default=None)


@contextmanager
def size_limit(max_params: int | None) -> Iterator[None]:
    """Refuse, within the block, models with more than ``max_params`` parameters (None: no limit)."""
    if max_params is not None and max_params < 1:
        raise ProbeError(f"--max-params must be at least 1, got {max_params}")
    token = _MAX_PARAMS.set(max_params)
    try:
        yield
    finally:
        _MAX_PARAMS.reset(token)


# TransformerBridge's Python wrappers and hook points per block (measured: about 150 KB a layer)
BRIDGE_BYTES_PER_LAYER = 200_000


def native_bytes(cfg: NativeConfig, training: bool = False) -> int:
    """float32 weights (x4 when training: gradients and AdamW's two moments), causal masks and
    the bridge's per-block objects; building the model also holds a second copy of its largest
    matrix for a moment (the embedding at a large vocabulary), measured with
    ``ru_maxrss``: a build peaks at 323 MB for 213 MB of weights (d_vocab 50000, d_model 512)
    and 692 MB for 479 MB (d_vocab 50000, d_model 1024), about weights + that matrix."""
    d_ff = 0 if cfg.attn_only else (cfg.d_mlp or 4 * cfg.d_model)
    largest = 4 * cfg.d_model * max(cfg.d_vocab, cfg.n_ctx, d_ff, cfg.heads * cfg.head_dim)
    per_layer = cfg.layers * (cfg.n_ctx**2 + BRIDGE_BYTES_PER_LAYER)
    return (16 if training else 4) * cfg.n_params() + largest + per_layer


def available_memory(dev: torch.device | None = None) -> int | None:
    """Bytes free for a new model: free GPU memory on CUDA; on CPU the least of MemAvailable (psutil or
    /proc/meminfo), the address space ``ulimit -v`` leaves and the memory cgroup's room (a container's
    limit). None when none of them is known."""
    if dev is not None and dev.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(dev)[0])
        except (RuntimeError, AssertionError):  # no query available (driver, build): do not guess
            return None
    known = [n for n in (_mem_available(), address_space_left(), cgroup_memory_left()) if n is not None]
    return min(known) if known else None  # none known (unknown platform): only --max-params applies


def _mem_available() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def address_space_left() -> int | None:
    """Bytes of address space ``RLIMIT_AS`` (``ulimit -v``) still allows: the limit less what the process
    maps already (VmSize); None without a limit."""
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    except (ImportError, OSError, ValueError):  # no resource module (Windows)
        return None
    if limit == resource.RLIM_INFINITY or limit < 0:
        return None
    mapped = _field("/proc/self/status", "VmSize:")
    return max(limit - (mapped or 0) * 1024, 0)


CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
NO_CGROUP_LIMIT = 2**60  # cgroup v1 writes "no limit" as a number near 2**63


def cgroup_memory_left(root: Path = CGROUP_ROOT, proc: Path = PROC_CGROUP) -> int | None:
    """Bytes this process's memory cgroup, or any parent of it, still allows: the least, over them, of
    the limit (v2 ``memory.max``, v1 ``memory.limit_in_bytes``) less the usage, not counting file cache
    the kernel can reclaim (``inactive_file``); None when no cgroup sets a limit."""
    left = [n for d in _cgroup_dirs(root, proc) if (n := _cgroup_room(d)) is not None]
    return min(left) if left else None


def _cgroup_dirs(root: Path, proc: Path) -> list[Path]:
    """The process's memory cgroup folders and their parents up to the mount (its root when the
    recorded path is not visible, as in a cgroup namespace)."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        lines = []
    out: list[Path] = []
    for line in lines:
        _, controllers, rel = [*line.split(":", 2), "", ""][:3]
        if controllers and "memory" not in controllers.split(","):
            continue
        mount = root if not controllers else root / "memory"
        d = mount / rel.strip().lstrip("/")
        if not d.is_dir():
            d = mount
        out += [d, *[p for p in d.parents if p.is_relative_to(mount)]]
    return out


def _cgroup_room(d: Path) -> int | None:
    for limit_file, usage_file, cache_key in (
        ("memory.max", "memory.current", "inactive_file"),
        ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
    ):
        try:
            text = (d / limit_file).read_text().strip()
        except OSError:
            continue
        if not text.isdigit() or int(text) >= NO_CGROUP_LIMIT:  # "max": no limit here
            return None
        usage = _read_int(d / usage_file) or 0
        cache = _field(d / "memory.stat", cache_key + " ") or 0  # memory.stat counts bytes
        return max(int(text) - usage + min(cache, usage), 0)
    return None


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _field(path: str | Path, key: str) -> int | None:
    """The number after ``key`` in a file of ``key value`` lines (/proc/self/status, memory.stat)."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return int(line[len(key) :].split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return None


def human_size(n: float, unit: str = "") -> str:
    for suffix in ("", "K", "M", "G", "T", "P"):
        if abs(n) < 1000 or suffix == "P":
            return f"{n:.3g}{suffix}{unit}" if suffix else f"{n:.0f}{unit}"
        n /= 1000
    return str(n)


def check_size(n_params: int, n_bytes: int, what: str, dev: torch.device | None = None) -> None:
    """Refuse a model above ``--max-params`` or above the memory available, before building it."""
    limit = _MAX_PARAMS.get()
    if limit is not None and n_params > limit:
        raise ProbeError(
            f"{what} has {n_params:,} parameters, above --max-params {limit:,}; make it smaller or raise --max-params"
        )
    free = available_memory(dev)
    if free is not None and n_bytes > free:
        room = f"{human_size(free, 'B')} available"
        if dev is not None and dev.type == "cuda":
            where = f"the GPU has {room}"
        else:
            where = f"this process has {room} (the least of free memory, ulimit -v and the container's memory limit)"
        raise ProbeError(
            f"{what} needs about {human_size(n_bytes, 'B')} ({n_params:,} parameters) but {where}; "
            "make the model smaller (fewer layers or a smaller width) "
            "or use a bigger machine"
        )


ALLOCATION_FAILURES = ("can't allocate memory", "out of memory", "cannot allocate memory")


@contextmanager
def allocation_errors(what: str) -> Iterator[None]:
    """Turn a failed allocation within the block (MemoryError, torch's CPU allocator or CUDA out of
    memory) into a one-line :class:`ProbeError`: the size check estimates, the allocator decides."""
    try:
        yield
    except (MemoryError, RuntimeError) as exc:
        error = out_of_memory_error(exc, what)
        if error is None:
            raise
        raise error from None


def out_of_memory_error(exc: BaseException, what: str) -> ProbeError | None:
    """The one-line error for a failed allocation, or None when ``exc`` is something else."""
    text = str(exc).lower()
    if not isinstance(exc, MemoryError) and not any(m in text for m in ALLOCATION_FAILURES):
        return None
    size = re.search(r"tried to allocate (?:(\d+) bytes|([0-9.]+ ?[KMGT]i?B))", str(exc))
    amount = "" if size is None else human_size(int(size[1]), "B") if size[1] else size[2]
    return ProbeError(
        f"{what} ran out of memory"
        + (f" (it tried to allocate {amount})" if amount else "")
        + "; use a smaller model or --batch-size, or a machine (or ulimit -v, container limit) with more memory"
    )
