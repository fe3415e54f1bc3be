"""The text corpus of a depth study: reading it, its byte-level BPE tokenizer, the training and
validation token streams, the batches every family member trains on, and validation loss.

Choices (the design leaves them open; they are fixed here):

- **Corpus.** ``--corpus`` is a UTF-8 text file or a folder; without it, the built-in Tiny Shakespeare
  (``tasks/data/tinyshakespeare.txt``, about 1.1 MB, public domain). A folder stands for every
  regular, non-hidden file below it (hidden files and folders, whose names start with ``.``, are
  skipped), read in order of their relative paths compared component by component, and joined with
  one newline; a link (to a file or a folder) whose target lies outside the folder is refused,
  naming it, and links to folders are not followed. Files are read as UTF-8 (a byte-order mark is
  dropped; bad bytes are reported as ``file:line``).
- **Split.** By characters, in two contiguous blocks: the training text is the first
  ``floor(len(text) * (1 - val_fraction))`` characters, the validation text the rest (the last 10%
  by default). The fraction must lie in (0, 0.5].
- **Tokenizer.** Byte-level BPE from the ``tokenizers`` library, trained on the training text only:
  a BPE model, the byte-level pre-tokenizer without a prefix space (GPT-2's splitting rule), the
  byte-level decoder, all 256 bytes in the initial alphabet, and one special token ``<|bos|>`` with
  id 0. The vocabulary is 1024 by default and at least 257 (256 bytes and ``<|bos|>``). A training
  text too small to learn that many merges keeps the smaller vocabulary it reaches;
  :attr:`Corpus.vocab` is always the real size. Training is deterministic: the same text gives the
  same tokenizer file, byte for byte. The corpus streams never contain ``<|bos|>``: a literal
  ``<|bos|>`` in the text is encoded as ordinary bytes.
- **Cache.** A trained tokenizer is kept in ``$DEPTHPROBE_CACHE/tokenizers`` (or
  ``~/.cache/depthprobe/tokenizers`` when ``DEPTHPROBE_CACHE`` is unset) as
  ``bpe-<key[:16]>-v<vocab>.json``; the key is the SHA-256 of a format version, the vocabulary
  size and the training text's UTF-8 bytes. The file is written whole or not at all; a cached file
  that cannot be read is trained again and replaced; a cache folder that cannot be written only
  costs the training time.
- **Training batches.** A pure function of (seed, step), so that every member of a family sees the
  same tokens in the same order and a resumed run continues exactly. The training stream is cut
  back to back into ``n = len(ids) // (context - 1)`` windows of ``context - 1`` tokens (a short
  tail is never used); each row of a batch is ``<|bos|>`` followed by one window. Sample
  ``i = step * batch + j`` is window ``order[i % n]`` of epoch ``i // n``, where ``order`` is a
  ``torch.randperm(n)`` seeded with a 63-bit mix of the seed and the epoch: within an epoch every
  window appears exactly once.
- **Validation.** The validation stream is cut back to back into windows the same way, from its
  start (optionally at most ``limit`` of them, evenly spread). Every position after ``<|bos|>`` is a
  target (``<|bos|>`` never is). ``val_loss`` is the mean cross-entropy in nats per predicted token;
  ``val_bpb`` (bits per byte) is the summed cross-entropy in bits divided by the number of UTF-8
  bytes the target tokens stand for, which makes it comparable across tokenizers. Byte-level BPE
  makes that count exact: every character of a token's string stands for one byte.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from depthprobe.probes.base.artifacts import cache_root, replace_file
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.data.text import read_text

# the repository root in a checkout or an editable install, site-packages/depthprobe in a wheel install:
# either way tasks/ (package data included) sits beside probes/
BUILTIN = Path(__file__).resolve().parents[2] / "tasks" / "data" / "tinyshakespeare.txt"
BUILTIN_LABEL = "tinyshakespeare"
BOS_TOKEN = "<|bos|>"
MIN_VOCAB = 257  # 256 bytes and <|bos|>
FORMAT = "depthprobe-bpe-1"  # part of the cache key: change it when the tokenizer recipe changes
_MASK63 = (1 << 63) - 1
_MASK64 = (1 << 64) - 1


# ---------------------------------------------------------------- reading and splitting


def _corpus_files(folder: Path) -> list[Path]:
    """Regular, non-hidden files below ``folder``, in order of their relative paths. A link whose
    target lies outside ``folder`` is refused; links to folders are not followed."""
    found: list[tuple[tuple[str, ...], Path]] = []
    inside = folder.resolve()
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in [*dirs, *(f for f in files if not f.startswith("."))]:
            _check_link(Path(root) / name, inside, folder)
        for name in files:
            path = Path(root) / name
            if not name.startswith(".") and path.is_file():
                found.append((path.relative_to(folder).parts, path))
    return [p for _, p in sorted(found)]


def _check_link(path: Path, inside: Path, folder: Path) -> None:
    if path.is_symlink() and not path.resolve().is_relative_to(inside):
        raise ProbeError(
            f"--corpus {folder}: {path} is a link to {path.resolve()}, outside the folder; "
            "copy that file into the folder or remove the link"
        )


def read_corpus(path: str | Path | None) -> tuple[str, str]:
    """The corpus text and its label: the built-in Tiny Shakespeare (``None``), a UTF-8 file, or
    every regular, non-hidden file below a folder, joined with newlines."""
    if path is None:
        return read_text(BUILTIN), BUILTIN_LABEL
    path = Path(path)
    if not path.exists():
        raise ProbeError(
            f"--corpus {path} does not exist; give a UTF-8 text file or folder "
            "(or omit --corpus for the built-in Tiny Shakespeare)"
        )
    if path.is_dir():
        files = _corpus_files(path)
        if not files:
            raise ProbeError(f"--corpus {path} is a folder with no (non-hidden) files; put UTF-8 text files in it")
        text = "\n".join(read_text(f) for f in files)
    else:
        text = read_text(path)
    if not text.strip():
        raise ProbeError(f"--corpus {path} holds no text (empty or only whitespace); give a UTF-8 text file or folder")
    return text, path.resolve().name or str(path)


def corpus_stamp(path: str | Path | None) -> tuple[tuple[str, int, int], ...]:
    """(path, size, mtime) of every regular file :func:`read_corpus` reads: it changes when a file
    is edited, added or removed. A pipe has none (it can be read once only)."""
    if path is None or not Path(path).exists():
        return ()
    files = _corpus_files(Path(path)) if Path(path).is_dir() else [Path(path)]
    stats = [(str(f), f.stat()) for f in files]
    return tuple((name, st.st_size, st.st_mtime_ns) for name, st in stats if stat.S_ISREG(st.st_mode))


def split_text(text: str, val_fraction: float = 0.1) -> tuple[str, str]:
    """(training, validation) text: two contiguous blocks, the validation text being the last
    ``val_fraction`` of the characters (cut at ``floor(len(text) * (1 - val_fraction))``)."""
    if not 0.0 < val_fraction <= 0.5:
        raise ProbeError(f"validation fraction {val_fraction} is outside (0, 0.5]; pass a fraction such as 0.1")
    cut = math.floor(len(text) * (1.0 - val_fraction))
    train, val = text[:cut], text[cut:]
    if not train or not val:
        raise ProbeError(
            f"a text of {len(text)} characters is too short to split into training and validation text; "
            "give a larger --corpus"
        )
    return train, val


# ---------------------------------------------------------------- tokenizer


def _check_vocab(vocab: int) -> None:
    if vocab < MIN_VOCAB:
        raise ProbeError(
            f"vocabulary {vocab} is too small for byte-level BPE (256 bytes and {BOS_TOKEN}); "
            f"pass a vocabulary of at least {MIN_VOCAB}"
        )


def cache_dir_default() -> Path:
    return cache_root() / "tokenizers"


def text_digest(text: str) -> str:
    """SHA-256 (hex) of the whole corpus text, both splits: what a study records to know its corpus."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def corpus_key(train_text: str, vocab: int) -> str:
    """The cache key of a tokenizer: SHA-256 of the format version, the vocabulary and the text."""
    h = hashlib.sha256()
    h.update(f"{FORMAT}\0{vocab}\0".encode())
    h.update(train_text.encode("utf-8"))
    return h.hexdigest()


def _train(train_text: str, vocab: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[BOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([train_text], trainer=trainer)
    return tok


def _valid(tok: Tokenizer, vocab: int) -> bool:
    return tok.token_to_id(BOS_TOKEN) == 0 and MIN_VOCAB <= tok.get_vocab_size() <= vocab


def train_tokenizer(train_text: str, vocab: int = 1024, cache_dir: Path | None = None) -> Tokenizer:
    """Byte-level BPE trained on ``train_text`` (``<|bos|>`` = id 0), read from the cache when this
    text and vocabulary were trained before. The result may hold fewer than ``vocab`` entries when
    the text is too small to learn that many merges."""
    _check_vocab(vocab)
    folder = Path(cache_dir) if cache_dir is not None else cache_dir_default()
    path = folder / f"bpe-{corpus_key(train_text, vocab)[:16]}-v{vocab}.json"
    if path.is_file():
        try:
            cached = Tokenizer.from_file(str(path))
        except Exception:  # a damaged cache file is trained again and replaced
            cached = None
        if cached is not None and _valid(cached, vocab):
            return cached
    tok = _train(train_text, vocab)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        replace_file(path, lambda tmp: tok.save(str(tmp)))
    except OSError:
        pass  # an unwritable cache only costs the training time next run
    return tok


def save_tokenizer(tok: Tokenizer, folder: str | Path) -> Path:
    """Write ``folder/tokenizer.json`` whole or not at all; returns its path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return replace_file(folder / "tokenizer.json", lambda tmp: tok.save(str(tmp)))


def load_tokenizer(folder_or_file: str | Path) -> Tokenizer:
    """A tokenizer saved by :func:`save_tokenizer` (a folder holding ``tokenizer.json``, or the file)."""
    path = Path(folder_or_file)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise ProbeError(f"no tokenizer at {path}; give a folder holding tokenizer.json or the file itself")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ProbeError(
            f"{path} is not a readable tokenizer file ({first}); remove it and save the tokenizer again"
        ) from None


def hf_tokenizer(tok: Tokenizer) -> Any:
    """The tokenizer as a ``transformers.PreTrainedTokenizerFast`` with ``<|bos|>`` as its BOS and pad
    token; ``tokenizer(text, add_special_tokens=False)["input_ids"]`` gives the plain BPE ids."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(tok.to_str()), bos_token=BOS_TOKEN, pad_token=BOS_TOKEN
    )


def token_bytes(tok: Tokenizer) -> torch.Tensor:
    """[vocab] int64: how many bytes of text each id stands for (special tokens: 0). In byte-level
    BPE each character of a token's string stands for exactly one byte."""
    out = torch.zeros(tok.get_vocab_size(), dtype=torch.int64)
    special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    for token, i in tok.get_vocab().items():
        if i not in special:
            out[i] = len(token)
    return out


def encode(tok: Tokenizer, text: str) -> torch.Tensor:
    """1-D int64 ids of ``text`` in one call; a literal ``<|bos|>`` in the text is encoded as bytes."""
    plain = Tokenizer.from_str(tok.to_str())
    plain.encode_special_tokens = True
    return torch.tensor(plain.encode(text, add_special_tokens=False).ids, dtype=torch.int64)


# ---------------------------------------------------------------- the corpus


@dataclass(frozen=True)
class Corpus:
    """A tokenized corpus: the tokenizer (trained on ``train`` only) and both token streams."""

    label: str
    key: str  # the tokenizer's cache key (SHA-256 hex)
    digest: str  # text_digest of the whole text (both splits)
    vocab: int  # the real vocabulary size (may be below the one asked for on a tiny corpus)
    tokenizer: Tokenizer
    train_ids: torch.Tensor  # 1-D int64, never holds bos
    val_ids: torch.Tensor
    train_bytes: int  # UTF-8 bytes of the training text
    val_bytes: int
    token_bytes: torch.Tensor  # [vocab] int64
    train_text_chars: int
    val_text: str
    bos: int = 0


def load_corpus(
    path: str | Path | None = None, vocab: int = 1024, val_fraction: float = 0.1, cache_dir: Path | None = None
) -> Corpus:
    """Read, split, tokenize (training the tokenizer on the training split, or reading it from the cache)."""
    _check_vocab(vocab)
    text, label = read_corpus(path)
    train, val = split_text(text, val_fraction)
    tok = train_tokenizer(train, vocab, cache_dir)
    return Corpus(
        label=label,
        key=corpus_key(train, vocab),
        digest=text_digest(text),
        vocab=tok.get_vocab_size(),
        tokenizer=tok,
        train_ids=encode(tok, train),
        val_ids=encode(tok, val),
        train_bytes=len(train.encode("utf-8")),
        val_bytes=len(val.encode("utf-8")),
        token_bytes=token_bytes(tok),
        train_text_chars=len(train),
        val_text=val,
    )


# ---------------------------------------------------------------- batches


def _mix(seed: int, epoch: int) -> int:
    """A 63-bit generator seed from (seed, epoch): splitmix64's finalizer over both."""
    x = (seed * 0x9E3779B97F4A7C15 + (epoch + 1) * 0xD1B54A32D192ED03) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) & _MASK63


@functools.lru_cache(maxsize=4)
def _order(n: int, seed: int, epoch: int) -> torch.Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(_mix(seed, epoch)))


def _check_context(context: int) -> None:
    if context < 2:
        raise ProbeError(f"--context {context} leaves nothing to predict after {BOS_TOKEN}; pass --context 2 or more")


def _with_bos(windows: torch.Tensor, bos: int) -> torch.Tensor:
    col = torch.full((windows.shape[0], 1), bos, dtype=torch.int64)
    return torch.cat([col, windows.to(torch.int64)], dim=1)


def train_batch(ids: torch.Tensor, seed: int, step: int, batch: int, context: int, bos: int = 0) -> torch.Tensor:
    """[batch, context] int64: row j = ``bos`` then window ``order[i % n]`` of epoch ``i // n``, with
    ``i = step * batch + j`` and ``order`` a seeded permutation of the ``n`` back-to-back windows of
    ``context - 1`` tokens. A pure function of its arguments."""
    _check_context(context)
    if batch < 1 or step < 0:
        raise ProbeError(f"batch {batch} and step {step} must be a positive batch size and a step from 0")
    span = context - 1
    n = len(ids) // span
    if n < 1:
        raise ProbeError(
            f"--context {context} is longer than the training stream ({len(ids)} tokens) allows; "
            "pass a smaller --context or a larger --corpus"
        )
    idx = torch.arange(step * batch, (step + 1) * batch)
    epochs = idx // n
    windows = torch.empty(batch, dtype=torch.int64)
    for e in epochs.unique().tolist():
        rows = epochs == e
        windows[rows] = _order(n, seed, int(e))[idx[rows] % n]
    starts = windows * span
    return _with_bos(ids[starts[:, None] + torch.arange(span)], bos)


def val_windows(ids: torch.Tensor, context: int, bos: int = 0, limit: int | None = None) -> torch.Tensor:
    """[K, context] int64: ``bos`` then ``context - 1`` consecutive tokens, windows back to back from
    the start of ``ids`` (a short tail dropped); at most ``limit`` of them, evenly spread."""
    _check_context(context)
    span = context - 1
    w = len(ids) // span
    if w == 0:
        raise ProbeError(
            f"--context {context} needs {span} validation tokens but the validation text has {len(ids)}; "
            "pass a smaller --context or a larger --corpus"
        )
    k = w if limit is None else max(1, min(int(limit), w))
    pick = torch.tensor([j * w // k for j in range(k)], dtype=torch.int64)
    return _with_bos(ids[: w * span].view(w, span)[pick], bos)


def evaluate(
    logits_fn: Callable[[torch.Tensor], torch.Tensor],
    corpus: Corpus,
    context: int,
    batch: int = 16,
    limit: int | None = None,
    device: Any = None,
) -> dict[str, float]:
    """Validation loss of a model given as ``logits_fn`` ([B, context] ids -> [B, context, V] logits):
    ``val_loss`` (nats per predicted token), ``val_bpb`` (bits per byte of the predicted tokens),
    ``val_tokens`` and ``val_bytes``. Every position after ``bos`` is a target."""
    windows = val_windows(corpus.val_ids, context, corpus.bos, limit)
    nats = 0.0
    tokens = 0
    nbytes = 0
    with torch.no_grad():
        for rows in windows.split(max(1, batch)):
            x = rows.to(device) if device is not None else rows
            logits = logits_fn(x)[:, :-1].double()
            targets = x[:, 1:].to(logits.device)
            logp = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
            nats -= float(logp.sum())
            tokens += targets.numel()
            nbytes += int(corpus.token_bytes[rows[:, 1:]].sum())
    return {
        "val_loss": nats / tokens,
        "val_bpb": nats / math.log(2) / nbytes if nbytes else float("nan"),
        "val_tokens": tokens,
        "val_bytes": nbytes,
    }
