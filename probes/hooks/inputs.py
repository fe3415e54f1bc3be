"""Inputs of the research API, checked before any forward pass: texts (encoded with
``model.encode``) or token ids [batch, pos] (or [pos]) of integers inside the vocabulary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.models.model import Model


def vocab_size(model: Model) -> int:
    return int(getattr(model.bridge.cfg, "d_vocab", 0) or model.bridge.W_E.shape[0])


def _as_ids(model: Model, texts_or_ids: Any) -> torch.Tensor:
    try:
        ids = texts_or_ids if isinstance(texts_or_ids, torch.Tensor) else torch.as_tensor(texts_or_ids)
    except (TypeError, ValueError, RuntimeError):
        raise ProbeError(
            f"give texts (a string or a list of strings) or token ids [batch, pos], got {type(texts_or_ids).__name__}"
        ) from None
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ProbeError(
            f"token ids must be integers, got {str(ids.dtype).removeprefix('torch.')}; "
            "convert with ids.long() or pass texts"
        )
    ids = ids.long()
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.numel() == 0:
        raise ProbeError("give texts (a string or a list of strings) or token ids [batch, pos]")
    vocab = vocab_size(model)
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab:
        bad = low if low < 0 else high
        raise ProbeError(f"token id {bad} is outside the vocabulary of {model.name}: ids run from 0 to {vocab - 1}")
    if ids.shape[1] > model.info.max_len:
        raise ProbeError(
            f"{ids.shape[1]} tokens is longer than {model.name} takes ({model.info.max_len}); shorten the input"
        )
    return ids


def inputs(model: Model, texts_or_ids: Any, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) on the model's device, or a one-line ProbeError naming the fix."""
    if isinstance(texts_or_ids, str) or (
        isinstance(texts_or_ids, Sequence) and texts_or_ids and all(isinstance(t, str) for t in texts_or_ids)
    ):
        if attention_mask is not None:
            raise ProbeError("attention_mask goes with token ids; texts are padded and masked by model.encode")
        return model.encode(cast(Any, texts_or_ids))
    ids = _as_ids(model, texts_or_ids)
    mask = torch.ones_like(ids) if attention_mask is None else torch.as_tensor(attention_mask)
    if mask.shape != ids.shape:
        raise ProbeError(f"attention_mask has shape {list(mask.shape)} but the ids {list(ids.shape)}")
    return ids.to(model.device), mask.to(model.device)
