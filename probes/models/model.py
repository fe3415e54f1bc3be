"""The model types: :class:`NativeConfig` (a from-scratch TransformerLens-native model),
:class:`ModelInfo` (the facts a run records about its model) and :class:`Model` (a loaded model:
its bridge, tokenizer, device and special tokens, with encoding and token strings for the Python
API). Loading them is :mod:`probes.models.loading`."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.options import check_choices, check_seed, coerce, field_types, parse_pairs


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
    norm: Literal["ln", "none"] = "ln"
    positional: Literal["learned", "rotary", "none"] = "learned"  # none: NoPE, no position signal at all
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
        check_choices(self, "native model:")
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
        if self.positional == "none":  # TransformerLens knows only standard and rotary: built rotary (no
            cfg["positional_embedding_type"] = "rotary"  # position parameter), its rotation then dropped
            cfg["rotary_dim"] = 2  # (probes.models.loading.drop_rotation)
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


def _is_ids(x: Any) -> bool:
    """Token ids: a non-empty list of ints, or a non-empty list of such lists (or a tensor)."""
    if isinstance(x, torch.Tensor):
        return x.dim() in (1, 2) and not x.is_floating_point()
    if not isinstance(x, (list, tuple)) or not x:
        return False
    first = x[0]
    if isinstance(first, (list, tuple)):
        return all(isinstance(r, (list, tuple)) and r and all(isinstance(i, int) for i in r) for r in x)
    return all(isinstance(i, int) and not isinstance(i, bool) for i in x)


@dataclass
class Model:
    """A loaded model: the TransformerBridge, its tokenizer (None for native models) and facts."""

    bridge: Any
    tokenizer: Any
    info: ModelInfo
    device: torch.device
    special_ids: frozenset[int] = field(default_factory=frozenset)
    _lm_head: bool | None = field(default=None, init=False, repr=False, compare=False)  # has_lm_head, once read

    def __repr__(self) -> str:
        i = self.info
        kind = "decoder" if i.causal else "encoder"
        return (
            f"Model({i.name!r}, {kind}, {i.n_layers} layers x {i.n_heads} heads, d_model {i.d_model}, "
            f"max_len {i.max_len}, {self.device})"
        )

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

    def encode(self, texts: Any, max_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokenize ``texts`` (one string or a list) as the model's tokenizer does (special tokens
        included), right-padded with the pad id into one batch: ``(ids, mask)``, both [batch, pos],
        on the model's device. Longer inputs than ``max_len`` (default: the model's limit) are refused.
        Token ids (a list of ids, or a list of such lists) are padded as they are, with or without
        a tokenizer: the way to feed a model that has none."""
        if _is_ids(texts):
            data = texts.tolist() if isinstance(texts, torch.Tensor) else list(texts)
            rows = [list(map(int, r)) for r in data] if isinstance(data[0], (list, tuple)) else [list(map(int, data))]
        else:
            tok = self.require_tokenizer("encode")
            texts = [texts] if isinstance(texts, str) else list(texts)
            if not texts or not all(isinstance(t, str) for t in texts):
                raise ProbeError("encode needs a string, a non-empty list of strings, or token ids")
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
        of ids, or of a 2-D batch (one list per row). Without a tokenizer, ids are shown as numbers."""
        if self.tokenizer is None and not isinstance(text_or_ids, str):
            got = text_or_ids.tolist() if isinstance(text_or_ids, torch.Tensor) else list(text_or_ids)
            if got and isinstance(got[0], (list, tuple)):
                return [[str(int(i)) for i in row] for row in got]
            return [str(int(i)) for i in got]
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

    # --- TransformerLens's tokenizer verbs: the bridge's own, so their answers are TransformerLens's ---

    def _tl_tokenizer(self, verb: str) -> Any:
        if self.tokenizer is None:
            raise ProbeError(
                f"{verb} needs a tokenizer and {self.name!r} has none (native models read token ids); "
                "pass ids, e.g. torch.tensor([[1, 2, 3]])"
            )
        return self.bridge

    def to_tokens(self, text: str | list[str], prepend_bos: bool | None = None, **kwargs: Any) -> torch.Tensor:
        """TransformerLens's ``to_tokens`` ([batch, pos]; a BOS first unless ``prepend_bos=False``;
        ``padding_side``, ``move_to_device``, ``truncate`` as there). :meth:`encode` adds what the
        tokenizer adds instead, and a mask."""
        return self._tl_tokenizer("to_tokens").to_tokens(text, prepend_bos=prepend_bos, **kwargs)

    def to_string(self, tokens: Any) -> str | list[str]:
        """TransformerLens's ``to_string``: ids ([pos] or [batch, pos]) decoded to text."""
        return self._tl_tokenizer("to_string").to_string(tokens)

    def to_single_token(self, string: str) -> int:
        """TransformerLens's ``to_single_token``: the id of a string that is one token (an error if
        not), read without the special tokens an encoder's tokenizer adds ([CLS], [SEP])."""
        self._tl_tokenizer("to_single_token")
        if not isinstance(string, str):
            raise ProbeError(f"to_single_token takes a string, got {type(string).__name__}")
        ids = self.tokenizer(string, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            pieces = self.tokenizer.convert_ids_to_tokens(ids)[:8]
            raise ProbeError(f"{string!r} is {len(ids)} tokens in {self.name}, not one: {pieces}; give one token")
        return int(ids[0])

    @property
    def has_lm_head(self) -> bool:
        """False when the checkpoint holds no trained head over the vocabulary (a sentence encoder
        such as minilm: transformers gives it a randomly initialised head, whose logits mean nothing).
        Read from the checkpoint's files once per model."""
        if self._lm_head is None:
            self._lm_head = self._reads_lm_head()
        return self._lm_head

    def _reads_lm_head(self) -> bool:
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
