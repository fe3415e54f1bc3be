"""Where and how big a model may be: ``--dtype`` and ``--device`` resolution, and the size check
(``--max-params`` within :func:`size_limit`, and the memory free on the device) that refuses a model
before it is built."""

from __future__ import annotations

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
    the bridge's per-block objects."""
    return (16 if training else 4) * cfg.n_params() + cfg.layers * (cfg.n_ctx**2 + BRIDGE_BYTES_PER_LAYER)


def available_memory(dev: torch.device | None = None) -> int | None:
    """Bytes free for a new model: free GPU memory on CUDA; MemAvailable (psutil or /proc/meminfo) on CPU."""
    if dev is not None and dev.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(dev)[0])
        except (RuntimeError, AssertionError):  # no query available (driver, build): do not guess
            return None
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
    return None  # unknown platform: only --max-params applies


def _human(n: float, unit: str = "") -> str:
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
        where = "GPU" if dev is not None and dev.type == "cuda" else "machine"
        raise ProbeError(
            f"{what} needs about {_human(n_bytes, 'B')} ({n_params:,} parameters) but the {where} "
            f"has {_human(free, 'B')} available; make the model smaller (fewer layers or a smaller width) "
            "or use a bigger machine"
        )
