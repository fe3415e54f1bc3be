"""This tool's own checkpoints and the folders it loads from: saving a native model (safetensors +
depthprobe.json, switched atomically), reading a checkpoint's config and folder, checking its
weights against its config, attaching a study's tokenizer, and the checks on a Hugging Face folder
(no custom code, no pickles, size from the safetensors headers) before it is loaded."""

from __future__ import annotations

import errno
import json
import math
import os
import re
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from depthprobe.probes.base.artifacts import replace_file
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.models.device import check_size

if TYPE_CHECKING:
    import torch

    from depthprobe.probes.models.model import Model

CHECKPOINT_CONFIG = "depthprobe.json"
CHECKPOINT_WEIGHTS = "model.safetensors"
SPA_FORMAT = "depthprobe-spa/1"
TOKENIZER_FILE = "tokenizer.json"


def save_checkpoint(
    model: Model,
    directory: str | Path,
    extra: dict[str, Any] | None = None,
    write_more: Callable[[Path], Any] | None = None,
) -> Path:
    """Write a native model as safetensors + depthprobe.json (never pickled), atomically as a whole.

    Every file goes into a fresh folder ``ckpt-...`` inside ``directory``; then ``directory/depthprobe.json``,
    which names that folder under the key ``checkpoint``, is replaced in one ``os.replace``: that rename
    is the single switch from the previous checkpoint to the new one. An interrupt at any moment leaves
    one complete checkpoint behind, and no partial folder: it is removed as the interrupt unwinds.
    Older ``ckpt-*`` folders are removed after the switch.
    ``write_more(folder)`` writes further files (optimizer state, loss log) into the new folder.
    """
    from safetensors.torch import save_file

    if model.info.native is None:
        raise ProbeError("only native models can be saved as depthprobe checkpoints")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"format": "depthprobe-native/1", "native": model.info.native, **(extra or {})}
    step = (extra or {}).get("training", {}).get("step") if isinstance((extra or {}).get("training"), dict) else None
    name = "ckpt-" + (f"{int(step):08d}-" if step is not None else "") + secrets.token_hex(4)
    tmp = out / f".{name}.tmp"
    tmp.mkdir()  # mode 0o777 & ~umask
    try:
        state = {k: v.detach().cpu().contiguous() for k, v in model.bridge.state_dict().items()}
        save_safetensors(save_file, state, tmp / CHECKPOINT_WEIGHTS)
        if write_more is not None:
            write_more(tmp)
        (tmp / CHECKPOINT_CONFIG).write_text(json.dumps(meta, indent=2))
        os.rename(tmp, out / name)  # a complete folder, not yet current
    except BaseException:  # an error or an interrupt (Ctrl-C, SIGTERM) leaves no partial folder behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_text(out / CHECKPOINT_CONFIG, json.dumps({**meta, "checkpoint": name}, indent=2))  # the switch
    _prune(out, keep=name)
    return out


def save_safetensors(save_file: Callable[..., Any], tensors: dict[str, torch.Tensor], path: Path) -> None:
    """safetensors writes files with mode 600; give them the umask's mode like every other file.
    Its I/O failures (a full disk) come back as OSError, so the writers name them in one line."""
    try:
        save_file(tensors, str(path))
    except Exception as exc:
        if type(exc).__name__ != "SafetensorError" or "I/O error" not in str(exc):
            raise
        code = re.search(r"os error (\d+)", str(exc))
        number = int(code[1]) if code else errno.EIO
        raise OSError(number, os.strerror(number), str(path)) from None
    os.chmod(path, 0o666 & ~current_umask())


def current_umask() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # no /proc: read it by setting it, then restore at once
    os.umask(mask)
    return mask


def atomic_write_text(path: Path, text: str) -> None:
    replace_file(path, lambda tmp: tmp.write_text(text))


LEGACY_FILES = ("model.safetensors", "optimizer.safetensors", "optimizer.json")


def _prune(out: Path, keep: str) -> None:
    """Remove what the current checkpoint does not use: older ckpt-* folders, unfinished
    .ckpt-*.tmp folders and temporary files of interrupted saves, files of the flat layout."""
    for p in out.iterdir():
        if p.name == keep:
            continue
        if p.is_dir() and (p.name.startswith("ckpt-") or (p.name.startswith(".ckpt-") and p.name.endswith(".tmp"))):
            shutil.rmtree(p, ignore_errors=True)
        elif p.is_file() and (
            p.name in LEGACY_FILES
            or (p.name.startswith(".") and p.name.endswith(".tmp"))
            or p.name.endswith((".safetensors.tmp", ".json.tmp", ".csv.tmp"))
        ):
            p.unlink(missing_ok=True)


def checkpoint_meta(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / CHECKPOINT_CONFIG
    try:
        meta = json.loads(path.read_text())
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
        return meta
    except (OSError, ValueError) as exc:
        study = Path(directory).name == "checkpoint" and (Path(directory).parent / "member.json").exists()
        fix = resave_hint({"study": {}} if study else {})
        raise ProbeError(f"{path} is not a valid depthprobe checkpoint config ({exc}); {fix}") from None


def checkpoint_files(directory: str | Path, meta: dict[str, Any] | None = None) -> Path:
    """The folder holding the current checkpoint's files: ``ckpt-...`` named by depthprobe.json,
    or the directory itself (a flat checkpoint)."""
    d = Path(directory)
    meta = checkpoint_meta(d) if meta is None else meta
    sub = meta.get("checkpoint")
    if sub is None:
        return d
    if not isinstance(sub, str) or Path(sub).name != sub or sub in ("", ".", ".."):
        raise ProbeError(f"{d / CHECKPOINT_CONFIG}: 'checkpoint' must name a folder inside {d}, got {sub!r}")
    if not (d / sub).is_dir():
        raise ProbeError(
            f"{d / CHECKPOINT_CONFIG} names the folder {sub}, which is missing from {d}; restore it or train afresh"
        )
    if not (d / sub).resolve().is_relative_to(d.resolve()):
        raise ProbeError(
            f"{d / CHECKPOINT_CONFIG} names {sub}, a link to {(d / sub).resolve()} outside {d}; "
            f"put the checkpoint's own folder there (or re-save the model)"
        )
    return d / sub


def resave_hint(meta: dict[str, Any]) -> str:
    """How to rebuild a checkpoint: a study member's by rerunning its study, any other by probe train."""
    if isinstance(meta.get("study"), dict):
        return "rerun its study (the same probe study command and --out) to rebuild the member"
    return "re-save it with probe train"


def attach_tokenizer(model: Model, folder: Path) -> Model:
    """Give a checkpoint's model the tokenizer saved beside its weights (``tokenizer.json``, a
    byte-level BPE trained by a study), so text tasks run on it; without one it stays None. A
    tokenizer with more entries than the model's vocabulary (a file from another model) is refused."""
    if (folder / TOKENIZER_FILE).exists():
        from depthprobe.probes.data import corpus

        tok = corpus.load_tokenizer(folder / TOKENIZER_FILE)
        vocab = getattr(getattr(model.bridge, "cfg", None), "d_vocab", None)
        if isinstance(vocab, int) and tok.get_vocab_size() > vocab:
            raise ProbeError(
                f"{folder / TOKENIZER_FILE} has {tok.get_vocab_size()} entries but the model's vocabulary is "
                f"{vocab}; it belongs to another model: restore the tokenizer.json saved with this checkpoint"
            )
        model.tokenizer = corpus.hf_tokenizer(tok)
        model.special_ids = frozenset(model.tokenizer.all_special_ids)
    return model


def _check_shapes(
    expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]], config: Path, weights: Path
) -> None:
    for key, shape in expected.items():
        if key not in found:
            raise ProbeError(
                f"{config} does not match {weights}: tensor {key} (shape {list(shape)}) is missing "
                "from the weights; the config and the weights come from different models"
            )
        if found[key] != shape:
            raise ProbeError(
                f"{config} does not match {weights}: {key} should be {list(shape)} by the config "
                f"but is {list(found[key])} in the weights; restore the matching depthprobe.json"
            )
    extra = sorted(set(found) - set(expected))
    if extra:
        raise ProbeError(
            f"{config} does not match {weights}: the weights hold {extra[0]}, which the config's "
            "model lacks; restore the matching depthprobe.json"
        )


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def _convert_hint(path: Path) -> str:
    return (
        f'convert it once on a trusted machine: python -c "from transformers import AutoModel; '
        f"AutoModel.from_pretrained('{path}').save_pretrained('{path}', safe_serialization=True)\""
    )


def check_hf_folder(path: Path, name: str, dev: torch.device | None = None) -> None:
    """Refuse custom code (auto_map) and pickle-only weights; check the size from the safetensors headers."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ProbeError(f"{path / 'config.json'} is not readable JSON ({exc}); restore the model folder") from None
    if isinstance(config, dict) and config.get("auto_map"):
        raise ProbeError(
            f"{path / 'config.json'} asks for custom model code (auto_map); depthprobe loads only "
            "safetensors and never runs custom code: use a model whose architecture is built into "
            "transformers"
        )
    tensors = sorted(path.glob("*.safetensors"))
    if not tensors:
        pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise ProbeError(
                f"{path} holds pickle weights ({', '.join(pickles)}) and no .safetensors; depthprobe "
                f"loads only safetensors and never runs custom code; {_convert_hint(path)}"
            )
        return
    n = sum(_safetensors_numel(p) for p in tensors)
    check_size(n, 4 * n, f"model {name}", dev)


def _safetensors_numel(path: Path) -> int:
    """Element count from a safetensors header (8-byte length + JSON), without reading the tensors."""
    try:
        with path.open("rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            if not 2 <= size <= 100_000_000:
                raise ValueError(f"header length {size}")
            header = json.loads(fh.read(size))
        total = 0
        for key, info in header.items():
            if key != "__metadata__":
                total += math.prod(int(x) for x in info["shape"])
        return total
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ProbeError(f"{path} is not a valid safetensors file ({exc}); re-download or re-save it") from None
