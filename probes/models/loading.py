"""Model loading: every route from a name to a :class:`Model`. Aliases, the offline default,
Hugging Face ids and folders (through TransformerLens's TransformerBridge with eager attention, so
attention patterns are the real softmax weights, or read-only HF attentions for the architectures
the bridge lacks), native specs, model families by spec prefix, and this tool's own checkpoints."""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import torch

from depthprobe.probes.base.errors import ProbeError, suggest
from depthprobe.probes.models import native_attention
from depthprobe.probes.models.architectures import (
    ALIASES,
    DEFAULT_MODEL,
    SPEC_BUILDERS,
    _model_type,
    _route,
    _split_stack,
    architecture_of,
)
from depthprobe.probes.models.checkpoints import (
    CHECKPOINT_CONFIG,
    CHECKPOINT_WEIGHTS,
    SPA_FORMAT,
    _check_shapes,
    attach_tokenizer,
    check_hf_folder,
    checkpoint_files,
    checkpoint_meta,
    resave_hint,
)
from depthprobe.probes.models.device import allocation_errors, check_size, native_bytes, resolve_device
from depthprobe.probes.models.hub import (
    _hub_reachable,
    _offline_error,
    _weights_id,
    cached_snapshot,
    hash_file,
    minilm_path,
)
from depthprobe.probes.models.model import Model, ModelInfo, NativeConfig

log = logging.getLogger(__name__)


def _boot_hf(path_or_id: str, device: torch.device, dtype: torch.dtype | None) -> Any:
    from transformer_lens.model_bridge import TransformerBridge
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TransformerBridge.boot_transformers(path_or_id, device=device, dtype=dtype or torch.float32)


def _cfg_int(config: Any, *keys: str) -> int:
    for k in keys:
        v = getattr(config, k, None)
        if isinstance(v, int) and v > 0:
            return v
    raise ProbeError(f"config.json of {_model_type(config)} has none of {', '.join(keys)}; restore the model folder")


def _load_read_only(
    name: str,
    source: str,
    path_or_id: str,
    dev: torch.device,
    dtype: torch.dtype | None,
    stack: str | None,
    resolved: str | None = None,
) -> Model:
    """DistilBERT, ALBERT, ELECTRA, DeBERTa-v2 and one stack of T5/BART: HF attentions behind hook points."""
    import transformers
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from depthprobe.probes.models.hf_attentions import HFAttentions

    config = AutoConfig.from_pretrained(path_or_id)
    arch = architecture_of(_model_type(config))
    classes = [getattr(transformers, c, None) for c in (getattr(config, "architectures", None) or [])]
    cls = next((c for c in classes if c is not None), AutoModel)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = cls.from_pretrained(path_or_id, attn_implementation="eager", dtype=dtype or torch.float32)
    hf.to(dev).eval()
    tok = AutoTokenizer.from_pretrained(path_or_id)
    side = "decoder_" if stack == "decoder" else "encoder_" if stack == "encoder" else ""
    if stack == "decoder":
        n_layers = _cfg_int(config, "num_decoder_layers", "decoder_layers", "num_layers")
    else:
        n_layers = _cfg_int(config, f"{side}layers", "num_layers", "num_hidden_layers", "n_layers")
    n_heads = _cfg_int(config, f"{side}attention_heads", "num_heads", "num_attention_heads", "n_heads")
    d_model = _cfg_int(config, "d_model", "hidden_size", "dim")
    max_len = int(getattr(config, "max_position_embeddings", 0) or getattr(config, "n_positions", 0) or 512)
    label = f"{name} ({arch.name if arch else _model_type(config)}{', ' + stack + ' stack' if stack else ''})"
    causal = stack == "decoder"
    bridge = HFAttentions(
        hf, stack or "model", causal, n_layers, n_heads, d_model, int(config.vocab_size), max_len, label
    )
    path = Path(path_or_id)
    info = ModelInfo(
        name=name + (f"@{stack}" if stack else ""),
        source=source,
        resolved=resolved or path_or_id,
        causal=causal,
        n_layers=n_layers,
        n_heads=n_heads,
        d_model=d_model,
        max_len=max_len,
        weights=_weights_id(path) if path.is_dir() else "unknown",
    )
    return Model(bridge=bridge, tokenizer=tok, info=info, device=dev, special_ids=frozenset(tok.all_special_ids))


def _load_hf(
    name: str,
    source: str,
    path_or_id: str,
    dev: torch.device,
    dtype: torch.dtype | None,
    stack: str | None,
    resolved: str | None = None,
    folder: Path | None = None,
) -> Model:
    """Load a Hugging Face model through the route its architecture needs (see ARCHITECTURES)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path_or_id)
    route = _route(_model_type(config), name, stack)
    if route != "bridge":
        return _load_read_only(name, source, path_or_id, dev, dtype, stack, resolved)
    try:
        bridge = _boot_hf(path_or_id, dev, dtype)
    except ValueError as exc:
        if "supported architecture" not in str(exc):
            raise
        raise ProbeError(
            f"{name}: architecture {_model_type(config)!r} ({', '.join(config.architectures or [])}) is "
            "not supported by TransformerLens or by depthprobe's read-only route; "
            "`probe list architectures` shows what works"
        ) from None
    return _wrap_hf(name, source, folder or Path(path_or_id), bridge, dev, resolved=resolved)


def load(
    name: str | NativeConfig = DEFAULT_MODEL, device: str | None = None, dtype: torch.dtype | None = None
) -> Model:
    """Load a model by alias, Hugging Face id, local directory, native spec or checkpoint.

    An existing folder always wins over a spec; ``native:`` and ``spa:`` start specs. A model the
    size check lets through but the allocator cannot hold fails with one line (ProbeError)."""
    dev = resolve_device(device)
    with allocation_errors(f"loading model {name if isinstance(name, str) else _spec(name)}"):
        return _load(name, dev, dtype)


def _load(name: str | NativeConfig, dev: torch.device, dtype: torch.dtype | None) -> Model:
    if isinstance(name, NativeConfig):
        check_size(name.n_params(), native_bytes(name), f"native model {_spec(name)}", dev)
        return _load_native(name, "native", dev, dtype)
    if not name.strip():
        raise ProbeError("--model is empty: give an alias, a Hugging Face id, a folder or native:...")
    path = Path(name).expanduser()
    if path.is_dir():
        return _load_folder(name, path, dev, dtype)
    if "@" in name and not name.startswith(("native:", "spa:")):
        base, stack = _split_stack(name)
        if stack is not None:
            return _load_stack(base, stack, dev, dtype)
    if path.is_file():
        raise ProbeError(f"--model {name} is a file; give the model's folder (config.json or {CHECKPOINT_CONFIG})")
    if name.startswith("native:"):
        cfg = NativeConfig.parse(name)
        check_size(cfg.n_params(), native_bytes(cfg), f"native model {name}", dev)
        return _load_native(cfg, name, dev, dtype)
    if name.lower().startswith("native"):
        raise ProbeError(
            f"--model {name!r} is neither an existing folder nor a native spec "
            f"(did you mean {_native_guess(name)} or ./{name}?)"
        )
    family = name.partition(":")[0]
    if ":" in name and family in SPEC_BUILDERS:
        module, _, attr = SPEC_BUILDERS[family].partition(":")
        return getattr(importlib.import_module(module), attr)(name, dev)
    return _load_named(name, dev, dtype)


def _load_stack(name: str, stack: str, dev: torch.device, dtype: torch.dtype | None) -> Model:
    path = Path(name).expanduser()
    if path.is_dir():
        return _load_folder(name, path, dev, dtype, stack)
    return _load_named(name, dev, dtype, stack)


def _load_named(name: str, dev: torch.device, dtype: torch.dtype | None, stack: str | None = None) -> Model:
    """An alias or a Hugging Face id (from the local cache, else the hub)."""
    if name == DEFAULT_MODEL:
        p = minilm_path()
        return _load_hf(name, "alias", str(p), dev, dtype, stack, folder=p)
    if (os.sep in name and name.count("/") != 1) or name.startswith((".", "~")):
        raise ProbeError(f"model directory {name} does not exist; check the path or use --model minilm")
    repo_id = ALIASES[name][0] if name in ALIASES else name
    if "/" not in repo_id and name not in ALIASES and repo_id not in {v[0] for v in ALIASES.values()}:
        hint = suggest(name, ALIASES)
        if hint:  # a typo of an alias, not a hub id
            raise ProbeError(f"unknown model {name!r}{hint}; `probe list models` shows the aliases")
    snap = cached_snapshot(repo_id)
    if snap is not None:
        check_hf_folder(snap, name, dev)
        return _load_hf(name, "hub", str(snap), dev, dtype, stack, resolved=repo_id, folder=snap)
    if not _hub_reachable():
        raise _offline_error(name, repo_id)
    try:
        return _load_hf(name, "hub", repo_id, dev, dtype, stack, resolved=repo_id, folder=cached_snapshot(repo_id))
    except OSError as exc:
        raise ProbeError(f"could not load {repo_id!r} from the hub: {str(exc).splitlines()[0]}") from exc


def _native_guess(name: str) -> str:
    """'native;layers=6' -> 'native:layers=6'; 'native-run1' -> the default spec."""
    rest = name[len("native") :].lstrip(";:,.=_- ")
    return "native:" + rest if "=" in rest else "native:layers=2,d_model=64,heads=4"


def _load_folder(
    name: str, path: Path, dev: torch.device, dtype: torch.dtype | None, stack: str | None = None
) -> Model:
    if (path / CHECKPOINT_CONFIG).exists():
        if stack is not None:
            raise ProbeError(f"--model {name}@{stack}: a depthprobe checkpoint has one stack; drop @{stack}")
        return load_checkpoint(path, dev, dtype, name=name)
    if not (path / "config.json").exists():
        raise ProbeError(
            f"{name} is a directory but holds neither config.json (Hugging Face format) nor "
            f"{CHECKPOINT_CONFIG} (a depthprobe checkpoint); {_model_folder_hint(path)}"
        )
    check_hf_folder(path, name, dev)
    return _load_hf(name, "local", str(path), dev, dtype, stack, folder=path)


def _model_folder_hint(path: Path) -> str:
    """Where the model is when ``path`` is a study member's folder or a study's folder."""
    if (path / "checkpoint" / CHECKPOINT_CONFIG).exists():
        return f"a study member's model is in its checkpoint/ folder: --model {path / 'checkpoint'}"
    members = (
        sorted((path / "members").glob(f"*/checkpoint/{CHECKPOINT_CONFIG}")) if (path / "study.json").exists() else []
    )
    if members:
        return f"a study's members keep their models in members/<name>/checkpoint/, e.g. --model {members[0].parent}"
    return "point --model at the model folder"


def _wrap_hf(name: str, source: str, path: Path, bridge: Any, dev: torch.device, resolved: str | None = None) -> Model:
    bridge.eval()
    cfg = bridge.cfg
    tok = bridge.tokenizer
    causal = getattr(cfg, "attention_dir", "causal") != "bidirectional"
    hf_cfg = getattr(bridge.original_model, "config", None)
    max_len = int(getattr(hf_cfg, "max_position_embeddings", 0) or getattr(hf_cfg, "n_positions", 0) or cfg.n_ctx)
    info = ModelInfo(
        name=name,
        source=source,
        resolved=resolved or str(path),
        causal=causal,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        d_model=cfg.d_model,
        max_len=max_len,
        weights=_weights_id(path) if path.is_dir() else "unknown",
    )
    specials = frozenset(tok.all_special_ids) if tok is not None else frozenset()
    return Model(bridge=bridge, tokenizer=tok, info=info, device=dev, special_ids=specials)


def _load_native(
    cfg: NativeConfig, name: str, dev: torch.device, dtype: torch.dtype | None, weights: str | None = None
) -> Model:
    from transformer_lens.model_bridge import TransformerBridge

    # TransformerLens attaches boot_native to the class with setattr, out of the type checker's sight
    bridge = TransformerBridge.boot_native(cfg.to_tl(), device=dev, dtype=dtype)  # type: ignore[attr-defined]
    if cfg.positional == "none":
        drop_rotation(bridge)
    bridge.eval()
    native_attention.install(bridge)
    info = ModelInfo(
        name=name,
        source="native",
        resolved=_spec(cfg),
        causal=True,
        n_layers=cfg.layers,
        n_heads=cfg.heads,
        d_model=cfg.d_model,
        max_len=cfg.n_ctx,
        weights=weights or f"random-init:seed={cfg.seed}",
        native=dataclasses.asdict(cfg),
    )
    return Model(bridge=bridge, tokenizer=None, info=info, device=dev)


def drop_rotation(bridge: Any) -> None:
    """NoPE (``positional=none``): remove the rotary tables of a native model built rotary, so its
    blocks see no position at all (the causal mask and a BOS token are then the only anchors). The
    bridge's config still reads "rotary" (TransformerLens's word for "no position parameter"); the
    rotation buffers are not persistent, so checkpoints hold the same tensors either way."""

    def unwrap(module: Any) -> Any:  # the original module under the bridge's wrappers
        while "_original_component" in module._modules:
            module = module._modules["_original_component"]
        return module

    native = bridge.original_model
    native.rotary = None
    for wrapped in native.layers:
        unwrap(unwrap(wrapped).attn).rotary = None


def _spec(cfg: NativeConfig) -> str:
    return "native:" + ",".join(
        f"{k}={str(v).lower() if isinstance(v, bool) else v}"
        for k, v in dataclasses.asdict(cfg).items()
        if v is not None
    )


def load_checkpoint(
    directory: str | Path,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    name: str | None = None,
) -> Model:
    from safetensors import SafetensorError, safe_open

    d = Path(directory)
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    config = d / CHECKPOINT_CONFIG
    meta = checkpoint_meta(d)
    if meta.get("format") == SPA_FORMAT:
        module, _, _ = SPEC_BUILDERS["spa"].partition(":")
        model = importlib.import_module(module).load_checkpoint(d, dev, name=name)
        check_finite(model, d)
        return attach_tokenizer(model, d)
    try:
        cfg = NativeConfig(**meta["native"])
    except (KeyError, TypeError) as exc:
        raise ProbeError(f"{config} is not a valid depthprobe checkpoint config: {exc}") from None
    weights = checkpoint_files(d, meta) / CHECKPOINT_WEIGHTS
    if not weights.exists():
        raise ProbeError(f"checkpoint {d} has no {CHECKPOINT_WEIGHTS}; {resave_hint(meta)}")
    check_size(cfg.n_params(), native_bytes(cfg), f"checkpoint {d}", dev)
    try:
        with safe_open(str(weights), framework="pt", device="cpu") as fh:
            found = {k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()}  # noqa: SIM118 (safe_open is not iterable)
    except (SafetensorError, OSError, ValueError) as exc:
        raise ProbeError(
            f"{weights} is not a readable safetensors file ({str(exc).splitlines()[0]}); "
            "the file is truncated or corrupt: restore it or re-save with probe train"
        ) from None
    model = _load_native(cfg, name or str(d), dev, dtype, weights=hash_file(weights))
    expected = {k: tuple(v.shape) for k, v in model.bridge.state_dict().items()}
    _check_shapes(expected, found, config, weights)
    try:
        with safe_open(str(weights), framework="pt", device=str(dev)) as fh:
            state = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 (safe_open is not iterable)
    except (SafetensorError, OSError, ValueError) as exc:
        raise ProbeError(
            f"{weights} is not a readable safetensors file ({str(exc).splitlines()[0]}); "
            "the file is truncated or corrupt: restore it or re-save with probe train"
        ) from None
    model.bridge.load_state_dict(state)
    check_finite(model, weights)
    model.info = dataclasses.replace(model.info, source="checkpoint", resolved=str(d))
    return attach_tokenizer(model, checkpoint_files(d, meta))


def check_finite(model: Model, weights: Path) -> None:
    """Refuse a checkpoint whose weights hold NaN or infinity (a diverged training run, a damaged
    file): every score of such a model is NaN, so it is refused (exit 2) rather than warned about.
    A sum per tensor (NaN or infinity makes it non-finite; an overflow is told apart by the exact check),
    about 1 ns a weight on CPU, far below reading them."""
    for key, tensor in model.bridge.state_dict().items():
        if not tensor.is_floating_point() or bool(torch.isfinite(tensor.sum())):
            continue
        if not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise ProbeError(
                f"{weights} holds NaN or infinite weights ({bad:,} of {tensor.numel():,} values of {key}); "
                "training diverged or the file is damaged: restore it, or train again (a lower --lr helps)"
            )
